"""Paraphrase recall of memory search over real session text (SPEC §5.1), through a real daemon.

Run: DAGCTX_CORPUS=/path/to/corpus python bench/bench_memory_recall.py [--db PATH-or-URL]

The assistant and user messages of two real Claude Code sessions (``$DAGCTX_CORPUS``,
read-only, never copied into the repository) become memory files of a temporary workspace,
one message a file. Each query below paraphrases one or a few of those messages without any
of their content words (checked at run time: a query that shares a word with its answer is
reported and left out), so keyword search can only find its answer by chance; a second set
of literal queries (phrases and identifiers found in their answers) is where keywords are
strong. Reported: recall@5 (the share of queries with an answer in the top 5) of both sets
for ``mode: fts`` (keywords
only, the baseline), ``vector`` (the local static model only) and ``hybrid`` (0.7·vector +
0.3·text, the SPEC §5.1 defaults), all in the same run. ``--sessions``: the same messages
as the nodes of one session instead of files, searched with ``sources: ["sessions"]``, and the query latency of each as a ratio of the FTS one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dagctx.client import DagctxClient

SESSIONS = ("claude-code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl", "claude-code/general-tool-calls.jsonl")

#: (query, substrings that identify its answers: a hit on any of those messages counts)
QUERIES: list[tuple[str, list[str]]] = [
    ("static analyser reported a fallback case that could never match, so it was dropped",
     ["so the catch-all clause is unreachable"]),
    ("print tracing data on screen while building locally",
     ["dev-specific configuration with console exporter", "So `stdout` is available"]),
    ("switch off instrumentation whenever specs execute", ["test configuration to disable tracing by default"]),
    ("check that the bash files parse without errors", ["verify that the shell scripts are syntactically correct"]),
    ("the routine had an excess of branches, so move the failure handling code out into a separate piece",
     ["cyclomatic complexity issue in tool_call", "extract the error_content processing"]),
    ("propagate tracing identifiers in HTTP requests sent by the shell hooks",
     ["notify-session.sh script to include trace context headers", "post_snapshot function to include headers",
      "commit event POST to include headers"]),
    ("what does asking the telemetry library for the active scope hand back?",
     ["returns a span context directly", "returns a `#span_ctx{}` record", "returns a `span_ctx` record directly"]),
    ("install more than one header carrier format for cross-service tracing",
     ["separately for each propagator", "setting multiple propagators", "configure propagators via application"]),
    ("every spec succeeded after the change",
     ["All tests pass. Now let me verify", "All tests pass. Now let me commit", "All green."]),
    ("delete the suppression list for the static analyser because it is obsolete now",
     ["remove the `.dialyzerignore` file since we no longer need it"]),
    ("keyword-style body supplied where a callable was wanted",
     ["The `do` block is being passed as an argument", "make `with_span` work with do blocks"]),
    ("find docs about starting tracing intervals in the BEAM language",
     ["how to use OpenTelemetry in Elixir", "search for span creation in OpenTelemetry"]),
]

#: literal queries: they share words (phrases, identifiers) with their answers, where keyword
#: search is strong — hybrid must keep what FTS finds while it adds what vectors find
LITERAL: list[tuple[str, list[str]]] = [
    ("catch-all clause unreachable", ["so the catch-all clause is unreachable"]),
    ("console exporter dev configuration", ["dev-specific configuration with console exporter"]),
    ("disable tracing by default in test configuration", ["test configuration to disable tracing by default"]),
    ("shell scripts syntactically correct", ["verify that the shell scripts are syntactically correct"]),
    ("cyclomatic complexity of tool_call", ["cyclomatic complexity issue in tool_call"]),
    ("trace context headers in notify-session.sh", ["notify-session.sh script to include trace context headers"]),
    ("remove the dialyzerignore file", ["remove the `.dialyzerignore` file since we no longer need it"]),
    ("OpenTelemetry in Elixir", ["how to use OpenTelemetry in Elixir"]),
    ("set_text_map_propagator", ["set_text_map_propagator"]),
    ("spotter_generate_traceparent", ["spotter_generate_traceparent"]),
    ("hex_trace_id", ["hex_trace_id"]),
    ("where is CLAUDE_ENV_FILE used", ["CLAUDE_ENV_FILE"]),
    ("put_trace_response_header", ["put_trace_response_header"]),
    ("set_attributes_safely", ["set_attributes_safely"]),
    ("enqueue_enrichment", ["enqueue_enrichment"]),
    ("gh gist create with GITHUB_TOKEN", ["gh gist create"]),
    ("bd sync --from-main", ["bd sync --from-main"]),
    ("opentelemetry_ash tracer config", ["opentelemetry_ash"]),
]

STOP = set("a an the and or of to in on for with by at from is are was were be been it its this that these those "
           "so as not no do does did what which who how when why where while after before about than then "
           "there their they we you i me my our us can could would should will may might must has have had "
           "any all every one more most some such into out up down over under again now only also very just "
           "let".split())


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP and len(w) > 1}


def messages(corpus: Path) -> list[str]:
    out: list[str] = []
    for rel in SESSIONS:
        for line in (corpus / rel).read_text().splitlines():
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("type") not in ("user", "assistant"):
                continue
            c = o["message"]["content"]
            t = c if isinstance(c, str) else " ".join(b.get("text", "") for b in c if isinstance(b, dict) and b.get("type") == "text")
            t = t.strip()
            if len(t) >= 40:
                out.append(t)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=None)
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds of every query per mode")
    ap.add_argument("--sessions", action="store_true",
                    help="the messages as nodes of a session, searched with sources [sessions] (no files)")
    args = ap.parse_args()
    corpus = Path(os.environ.get("DAGCTX_CORPUS", "/work/shared/corpus"))
    msgs = messages(corpus)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        (ws / "memory").mkdir(parents=True)
        for i, t in enumerate(msgs):
            (ws / "memory" / f"msg-{i:04d}.md").write_text(t + "\n")
        gold: list[tuple[str, set[str]]] = []
        for q, subs in QUERIES:
            files = {f"memory/msg-{i:04d}.md" for i, t in enumerate(msgs) if any(s in t for s in subs)}
            shared = words(q) & set().union(*(words(msgs[int(f[11:15])]) for f in files)) if files else set()
            if not files:
                print(f"skipped (no answer found in the corpus): {q!r}")
            elif shared:
                print(f"skipped (shares {sorted(shared)} with its answer): {q!r}")
            else:
                gold.append((q, files))
        db = args.db or str(Path(tmp) / "recall.db")
        c = await DagctxClient.spawn(db, standalone=True)
        where: dict[str, Any] = {"workspace": str(ws)}
        try:
            if args.sessions:
                # one node per message; a hit names its node, mapped back to the message's file name
                s = await c.session_create("recall")
                head, by_node = s.head, {}
                for i, t in enumerate(msgs):
                    got = await c.append(s.session_id, "user" if i % 2 == 0 else "llm",
                                         **({"input": t} if i % 2 == 0 else {"output": t}), predecessor=head)
                    head = got.node.id
                    by_node[head] = f"memory/msg-{i:04d}.md"
                where = {"sources": ["sessions"]}
                t0 = time.perf_counter()
                first = await c.request("memory/search", {**where, "query": "warm up", "maxResults": 1})
                build = time.perf_counter() - t0
                print(f"{len(msgs)} messages as session nodes; the first search took {build:.2f}s "
                      f"(it indexes and embeds them: {first.notes}); {len(gold)} paraphrase queries")
            else:
                t0 = time.perf_counter()
                idx = await c.request("memory/index", {"workspace": str(ws)})
                build = time.perf_counter() - t0
                print(f"{len(msgs)} messages → {idx.chunks} chunks, {idx.embedded} embedded ({idx.embedding}), "
                      f"index build {build:.2f}s; {len(gold)} paraphrase queries")

            def where_of(h: Any) -> str | None:
                return by_node.get(h.node_id or "") if args.sessions else h.path
            literal = [(q, {f"memory/msg-{i:04d}.md" for i, t in enumerate(msgs) if any(s in t for s in subs)})
                       for q, subs in LITERAL]
            literal = [(q, files) for q, files in literal if files]
            recall: dict[str, float] = {}
            lit: dict[str, float] = {}
            lat: dict[str, list[float]] = {}
            for mode in ("fts", "vector", "hybrid"):
                found = 0
                lat[mode] = []
                hits_lit = 0
                for q, files in literal:
                    r = await c.request("memory/search", {**where, "query": q, "mode": mode, "maxResults": 5})
                    hits_lit += any(where_of(h) in files for h in r.hits[:5])
                lit[mode] = hits_lit / len(literal) if literal else 0.0
                for q, files in gold:
                    r = await c.request("memory/search", {**where, "query": q, "mode": mode, "maxResults": 5})
                    found += any(where_of(h) in files for h in r.hits[:5])
                    for _ in range(args.repeat):
                        t0 = time.perf_counter()
                        await c.request("memory/search", {**where, "query": q, "mode": mode, "maxResults": 5})
                        lat[mode].append(time.perf_counter() - t0)
                recall[mode] = found / len(gold) if gold else 0.0
            base = statistics.median(lat["fts"])
            print(f"recall@5 over {len(gold)} paraphrase and {len(literal)} literal queries")
            print("mode     paraphrase  literal   p50 (× fts)   p95 (× fts p95)")
            for mode in ("fts", "vector", "hybrid"):
                print(f"{mode:7}  {recall[mode]:8.2f}  {lit[mode]:8.2f}   {statistics.median(lat[mode]) / base:10.2f}   "
                      f"{pct(lat[mode], 0.95) / pct(lat['fts'], 0.95):10.2f}")
            print(f"(fts p50 {base * 1000:.1f} ms in this run; the ratios are what to read)")
        finally:
            await c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
