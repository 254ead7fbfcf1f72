"""Aging (and the compaction cut) on real transcripts: tokens freed per session.

Builds an in-memory SessionGraph from every corpus file the importers read
(``dagctx.transcripts.parse_file``; seq in transcript order, ``created_at`` from
the source timestamps), renders the imported head, commits the aging boundary as if
the last turn had just finished, and plans aging at 32k / 128k / 200k windows, one
hour after the last message. Tokens are cl100k (exact, offline).

    python bench/bench_aging.py [--corpus DIR] [--windows 32000,128000,200000] [--limit N]

Columns: ``turns`` user turns / top-level model calls (steps) on the branch,
``hist`` history tokens of the render (items + 4 per item), ``res`` tool results in
the view; then for each turn unit (``user``, the default; ``step``, opt-in): ``aged``
soft/hard/capped, ``cited`` results protected by a later reference, ``freed`` tokens
freed and share of the history; ``ms`` time of both ``plan_aging`` calls (render
excluded); ``cut`` what compaction would keep after the default aging (kept tail
tokens, covered user turns) or why it would not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from dagctx.context.aging import AgingPolicy, boundary_after_commit, plan_aging, result_text
from dagctx.context.compaction_plan import cut_decision
from dagctx.context.content import json_text
from dagctx.context.render import render_view
from dagctx.context.view import Item
from dagctx.context.tokens import default_counter
from dagctx.transcripts import parse_file
from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.nodes import ROOT_SENTINEL, Call

REPO = Path(__file__).resolve().parents[1]
ROOT_ID = "root"


def corpus_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    env = os.environ.get("DAGCTX_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


def build_graph(transcript: Any, session_id: str) -> tuple[SessionGraph, str, float]:
    """SessionGraph from a transcript: seq in order, created_at from the source timestamps."""
    g = SessionGraph(session_id, ROOT_ID)
    g.add(Call(id=ROOT_ID, seq=0, created_at=0.0, role="user", name="ROOT"))
    last = 0.0
    for seq, n in enumerate(transcript.nodes, 1):
        ts = n.metadata.get("timestamp")
        created = float(ts) if isinstance(ts, (int, float)) else last
        last = max(last, created)

        def fix(ref: str | None) -> str | None:
            return ROOT_ID if ref == ROOT_SENTINEL else ref

        g.add(
            Call(
                id=n.id or f"n{seq}",
                seq=seq,
                created_at=created,
                role=n.role,
                name=n.name,
                input=n.input,
                output=n.output,
                status=n.status,
                caller=fix(n.caller),
                predecessor=fix(n.predecessor),
                reads=list(n.reads),
                metadata=dict(n.metadata),
            )
        )
    head = transcript.head or g.main_tip()
    return g, (ROOT_ID if head == ROOT_SENTINEL else head), last


def sessions(corpus: Path, limit: int | None) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for path in sorted(corpus.rglob("*")):
        if not path.is_file() or path.suffix not in (".jsonl", ".json", ".traj") or "subagents" in path.parts:
            continue
        try:
            transcripts = parse_file(path)
        except Exception as exc:  # noqa: BLE001 - a bench reports and goes on
            print(f"skip {path.name}: {exc}", file=sys.stderr)
            continue
        # one line per file: the largest transcript (sharegpt demo files hold hundreds of tiny ones)
        best = max(transcripts, key=lambda t: len(t.nodes), default=None)
        if best is not None and best.nodes:
            out.append((f"{path.parent.name}/{path.name}", best))
    return out[:limit] if limit else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus")
    ap.add_argument("--windows", default="32000,128000,200000")
    ap.add_argument("--limit", type=int)
    args = ap.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    counter = default_counter()

    def count(text: str) -> int:
        return counter.count(text, "cl100k_base")

    policies = {"user": AgingPolicy(), "step": AgingPolicy(turn_unit="step")}
    corpus = corpus_dir(args.corpus)
    if not corpus.is_dir():
        sys.exit(f"corpus not found: {corpus} (set DAGCTX_CORPUS or --corpus)")

    cols = "  ".join(f"{u + ': aged s/h/c cited     freed':<34}" for u in policies)
    header = f"{'session':<44} {'turns':>9} {'window':>6} {'hist':>8} {'res':>4}  {cols} {'ms':>6}  cut (user aging)"
    print(header)
    print("-" * len(header))
    totals: dict[tuple[str, int], list[int]] = {(u, w): [0, 0] for u in policies for w in windows}
    for name, t in sessions(corpus, args.limit):
        g, head, last = build_graph(t, name)
        view = render_view(g, head)
        result_tokens: dict[str, int] = {}

        def token_of(node_id: str) -> int:
            if node_id not in result_tokens:
                result_tokens[node_id] = count(result_text(g.nodes[node_id]))
            return result_tokens[node_id]

        item_tokens: dict[tuple[str, str, str | None, str], int] = {}

        def tok(item: Item) -> int:
            body = item.text if item.kind != "tool_call" else f"{item.name} {json_text(item.input)}"
            key = (item.kind, item.node_id, item.part, body[:64] + str(len(body)))
            if key not in item_tokens:
                item_tokens[key] = count(body) + 4
            return item_tokens[key]

        hist = sum(tok(i) for i in view.items)
        results = sum(1 for i in view.items if i.kind == "tool_result" or (i.kind == "text_pair" and i.part == "result"))
        steps = sum(1 for n in g.chain(head) if n.role == "llm")
        turns = f"{view.turn_count}u/{steps}s"
        boundaries = {u: boundary_after_commit(view, g, p) for u, p in policies.items()}
        for w in windows:
            cells = []
            ms_total = 0.0
            cut_s = ""
            for unit, policy in policies.items():
                t0 = time.perf_counter()
                plan = plan_aging(
                    view, g, now=last + 3600, boundary_seq=boundaries[unit], policy=policy,
                    token_of=token_of, window=w, count=count,
                )
                ms_total += (time.perf_counter() - t0) * 1000
                st = plan.stats
                aged_view = render_view(g, head, aged=plan.aged)
                freed = hist - sum(tok(i) for i in aged_view.items)
                totals[(unit, w)][0] += hist
                totals[(unit, w)][1] += freed
                pct = 100 * freed / hist if hist else 0.0
                cells.append(
                    f"{st.soft_trimmed:>8}/{st.hard_cleared:>2}/{st.capped:>2} {st.references_protected:>5} "
                    f"{freed:>8,} {pct:>5.1f}%"
                )
                if unit == "user":
                    cut, reason = cut_decision(aged_view, g, tok, window=w)
                    cut_s = f"keep {cut.tokens_kept:,}, cover {cut.covered_turns} turns" if cut else reason
            print(
                f"{name[:44]:<44} {turns:>9} {w // 1000:>5}k {hist:>8,} {results:>4}  "
                + "  ".join(f"{c:<34}" for c in cells)
                + f" {ms_total:>6.1f}  {cut_s}"
            )
    print("-" * len(header))
    for (unit, w), (h, f) in totals.items():
        print(f"turn unit {unit:<4} at {w // 1000:>3}k: {f:>8,} of {h:,} history tokens freed ({100 * f / h if h else 0:.1f} %)")

if __name__ == "__main__":
    main()
