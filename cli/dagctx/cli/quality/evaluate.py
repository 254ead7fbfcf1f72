"""The run of ``dagctx eval``: a scratch daemon, the sources, the replays, the metrics.

The replay runs in a private daemon (``dagctx serve --standalone``) on a scratch SQLite
file in a temporary folder, deleted afterwards: its models are the windows of the run
(``initializationOptions.models``), aging's ``minAgeSeconds`` is 0 (a replay appends in
seconds what took hours; the other gates are the daemon's defaults), and its summaries
come from the stand-in (``summarizer.py``, through ``sampling/createMessage``) or from a
configured OpenAI-compatible endpoint (``samplingEndpoint``). Stored sessions are read
from the user's database through the usual connection and replayed in the scratch one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dagctx.cli.mcp_tools import HistoryTools
from dagctx.cli.quality import cache as cm
from dagctx.cli.quality import metrics as mx
from dagctx.cli.quality import replay as rp
from dagctx.cli.quality import summarizer
from dagctx.client import DagctxClient


@dataclass
class Config:
    paths: list[str] = field(default_factory=list)
    windows: list[rp.Window] = field(default_factory=lambda: [rp.parse_window("32k")])
    options: rp.Options = field(default_factory=rp.Options)
    ttl: float = cm.DEFAULT_TTL
    endpoint: dict[str, Any] | None = None
    #: "stand-in" (the deterministic stand-in answers sampling), "endpoint" (``endpoint``),
    #: "structural" (nobody samples: compaction writes the daemon's structural summary, and
    #: reduction within a turn has no summarizer)
    summarizer: str = "stand-in"
    #: skip M1's searches (the slowest metric)
    recall: bool = True
    max_sessions: int | None = None
    #: sessions replayed at once, each worker with its own scratch daemon and database
    jobs: int = 2
    #: the scratch daemons' environment (None: this one's); ``bench/bench_quality.py
    #: --baseline-src`` points PYTHONPATH at another checkout to replay its daemon's
    #: decisions with this eval's measurements
    daemon_env: dict[str, str] | None = None


def summarizer_label(cfg: Config) -> str:
    if cfg.endpoint:
        return f"endpoint {cfg.endpoint.get('model')} at {cfg.endpoint.get('baseUrl')}"
    if cfg.summarizer == "structural":
        return "structural (the daemon's fallback summary, no model; no summaries within a turn)"
    return "stand-in (deterministic, extractive, no model)"


async def spawn_scratch(cfg: Config, folder: str) -> DagctxClient:
    opts: dict[str, Any] = {
        "models": {w.model: w.spec() for w in cfg.windows},
        "aging": {"minAgeSeconds": 0},
    }
    caps: dict[str, Any] = {}
    if cfg.endpoint:
        opts["samplingEndpoint"] = cfg.endpoint
    elif cfg.summarizer != "structural":
        caps["sampling"] = {}
    client = await DagctxClient.spawn(os.path.join(folder, "eval.db"), standalone=True,
                                      initialization_options=opts, capabilities=caps, env=cfg.daemon_env)
    client.keep_notifications = False
    if not cfg.endpoint and cfg.summarizer != "structural":
        async def answer(params: Any) -> Any:
            out = summarizer.answer(params)
            SAMPLED.note(client, [m.content.text for m in params.messages], out["content"]["text"],
                         params.system_prompt)
            return out

        client.on_request("sampling/createMessage", answer)
    return client


class Sampled:
    """Tokens the stand-in was sent and wrote, per scratch client: what dagctx's summary
    calls (compaction, reduction within a turn) cost, counted in M5 beside the cache.
    Counted with cl100k as M5 counts requests; only for the stand-in (an endpoint's
    calls are not seen here)."""

    def __init__(self) -> None:
        self._by: dict[int, list[int]] = {}
        self._counter: cm.TokenCounter | None = None

    def note(self, client: Any, texts: list[str], answer: str, system: str | None) -> None:
        if self._counter is None:
            self._counter = cm.TokenCounter()
        c = self._counter
        tin = sum(c.text(t) + cm.FRAMING for t in texts) + (c.text(system) if system else 0)
        got = self._by.setdefault(id(client), [0, 0, 0])
        got[0] += tin
        got[1] += c.text(answer)
        got[2] += 1

    def of(self, client: Any) -> list[int]:
        return list(self._by.get(id(client), [0, 0, 0]))


SAMPLED = Sampled()


def _sum_class(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in rows:
        for cls, (k, t) in r["retention"].items():
            o = out.setdefault(cls, [0, 0])
            o[0] += k
            o[1] += t
    return out


async def evaluate_source(client: DagctxClient, src: rp.Source, cfg: Config, counter: cm.TokenCounter,
                          progress: Callable[[str], None]) -> dict[str, Any]:
    node_ids = mx.NodeIds(src)
    fmt = cfg.options.format
    clock = time.perf_counter()
    base = await rp.baseline(client, src, cfg.windows[-1].model, fmt, cfg.options.reasoning)
    base_seconds = time.perf_counter() - clock
    recorded = mx.m2_recorded(src, node_ids)
    out: dict[str, Any] = {"session": src.session_id, "title": src.title, "source": src.origin,
                           "modelCalls": src.model_calls, "nodes": len(src.nodes),
                           "recordedSummaries": recorded, "baselineSeconds": round(base_seconds, 2), "windows": []}

    async def connect() -> DagctxClient:
        return client

    tools = HistoryTools(connect)
    for w in cfg.windows:
        progress(f"{src.title[:40]}: replaying at {w.label}")
        clock = time.perf_counter()
        before = SAMPLED.of(client)
        # the daemon hears the replayed times' cache state, as M5 counts it (SPEC §7)
        opts = cfg.options if cfg.options.cache_ttl is not None else replace(cfg.options, cache_ttl=cfg.ttl)
        rep = await rp.replay(client, src, w, opts, progress)
        after = SAMPLED.of(client)
        sampled = cm.summarizer_cost(after[0] - before[0], after[1] - before[1], after[2] - before[2])
        timing = {"replay": rep.seconds}
        sent = [cm.Sent(r.at, r.system, r.messages, r.manifest, served=r.node_id is not None,
                        causes=list((r.cache_break or {}).get("causes") or [])) for r in rep.requests]
        econ = cm.economics(sent, counter, ttl=cfg.ttl, window=w.tokens, max_output=w.max_output)
        outs = [r.max_output_tokens or w.max_output for r in rep.requests]
        # the daemon's own prediction (``stablePrefix``, SPEC §6) against the measured prefix
        agree = checked = 0
        for r, row in zip(rep.requests, econ["rows"]):
            if row.get("served") and r.stable_prefix.get("previousRenderId") and r.index > 0:
                checked += 1
                measured = max(0, row["prefixUnits"] - (1 if r.system else 0))
                agree += int(measured == r.stable_prefix.get("messages"))
        m4 = cm.budget(sent, econ, w.tokens, outs)
        m4["refused"] = sum(1 for r in rep.requests if r.refused)
        m4["refusals"] = [r.refused for r in rep.requests if r.refused][:5]
        m4["daemonMaxPercentUsed"] = max((r.budget.get("percentUsed") or 0 for r in rep.requests if r.budget), default=None)
        # the baselines send the same system prompt as dagctx's requests
        system = next((r.system for r in rep.requests if r.system), None)
        base = [rp.BaselineRequest(b.index, b.at, system, b.messages) for b in base]
        none = cm.economics(cm.unmanaged(base, w.tokens, w.max_output, counter), counter, ttl=cfg.ttl)
        nseq, ncomp, nsampled = cm.naive(base, w.tokens, w.max_output, counter, summarizer.summarize)
        nai = cm.economics(nseq, counter, ttl=cfg.ttl)
        nai["totals"]["compactions"] = ncomp
        dag_all = round(econ["totals"]["cost"] + sampled["cost"], 2)
        nai_all = round(nai["totals"]["cost"] + nsampled["cost"], 2)
        timing["M4M5"] = time.perf_counter() - clock - rep.seconds
        clock = time.perf_counter()
        m7 = await rp.replay_nodes(client, rep)
        timing["M7"] = time.perf_counter() - clock
        clock = time.perf_counter()
        m1 = await mx.m1_recall(rep, tools, node_ids, progress) if cfg.recall else None
        timing["M1"] = time.perf_counter() - clock
        clock = time.perf_counter()
        m2 = await mx.m2_dagctx(client, rep, node_ids)
        m6 = mx.m6_regret(rep, node_ids)
        timing["M2M6"] = time.perf_counter() - clock
        dag = econ["totals"]
        out["windows"].append({
            "window": w.tokens, "label": w.label, "model": w.model, "requests": len(rep.requests),
            "compactions": {"attempted": len(rep.compactions),
                            "written": sum(1 for c in rep.compactions if c.get("ok") and c.get("summaryId")),
                            "reasons": sorted({str(c.get("reason")) for c in rep.compactions if not c.get("summaryId")})},
            "reductions": sum(1 for r in rep.requests if r.reduction),
            "M1": m1, "M2": {"summaries": m2, "byClass": _sum_class(m2)},
            "M3": {"filesEdited": sum(s["filesEdited"] for s in m2), "filesNamed": sum(s["filesNamed"] for s in m2)},
            "M4": m4,
            "M5": {"dagctx": {"totals": dag, "byCause": econ["byCause"], "breaks": econ["breaks"][:200]},
                   "unmanaged": {"totals": none["totals"], "byCause": none["byCause"]},
                   "naive": {"totals": nai["totals"], "byCause": nai["byCause"]},
                   "costVsNaive": round(dag["cost"] / nai["totals"]["cost"], 4) if nai["totals"]["cost"] else None,
                   # the summary calls too: what the summarizer read (1×) and wrote (5×)
                   "summarizer": {"dagctx": sampled, "naive": nsampled},
                   "costWithSummarizer": {"dagctx": dag_all, "naive": nai_all,
                                          "ratio": round(dag_all / nai_all, 4) if nai_all else None},
                   "stablePrefixPrediction": {"checked": checked, "agree": agree}},
            "M6": m6, "M7": m7,
            "seconds": {k: round(v, 2) for k, v in timing.items()},
            "series": {"dagctx": [row.get("tokens") for row in econ["rows"]],
                       "breaks": [row["index"] for row in econ["rows"] if row.get("break")],
                       # per request: warm cache (source time since the previous one within the
                       # lifetime), cost in base-input units, dagctx's and naive's
                       "warm": [row.get("warm") for row in econ["rows"]],
                       "cost": [row.get("cost") for row in econ["rows"]],
                       "naiveCost": [row.get("cost") for row in nai["rows"]],
                       "unmanaged": [row.get("tokens") for row in none["rows"]],
                       "naive": [row.get("tokens") for row in nai["rows"]],
                       "limit": w.tokens - w.max_output},
        })
    return out


def totals(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over sessions, per window label."""
    per: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for w in s["windows"]:
            t = per.setdefault(w["label"], {"sessions": 0, "requests": 0, "refused": 0, "compactions": 0,
                                            "M1": [0, 0], "M2": {}, "M3": [0, 0], "M4maxShare": 0.0,
                                            "M4maxOvershoot": 0, "M4overshootRequests": 0,
                                            "M5": {"dagctx": 0.0, "unmanaged": 0.0, "naive": 0.0,
                                                   "dagctxWithSummarizer": 0.0, "naiveWithSummarizer": 0.0,
                                                   "dagctxBreaks": 0,
                                                   "naiveBreaks": 0, "unmanagedServed": 0, "naiveServed": 0,
                                                   "dagctxServed": 0, "stablePrefixChecked": 0,
                                                   "stablePrefixAgree": 0, "byCause": {}},
                                            "M6": [0, 0], "M7": [0, 0]})
            t["sessions"] += 1
            t["requests"] += w["requests"]
            t["refused"] += w["M4"]["refused"]
            t["compactions"] += w["compactions"]["written"]
            if w["M1"]:
                t["M1"][0] += w["M1"]["recovered"]
                t["M1"][1] += w["M1"]["removed"]
            for cls, (k, n) in w["M2"]["byClass"].items():
                o = t["M2"].setdefault(cls, [0, 0])
                o[0] += k
                o[1] += n
            t["M3"][0] += w["M3"]["filesNamed"]
            t["M3"][1] += w["M3"]["filesEdited"]
            t["M4maxShare"] = max(t["M4maxShare"], w["M4"]["maxShare"] or 0)
            t["M4maxOvershoot"] = max(t["M4maxOvershoot"], w["M4"]["maxOvershoot"])
            t["M4overshootRequests"] += w["M4"]["overshootRequests"]
            m5 = w["M5"]
            t["M5"]["dagctx"] += m5["dagctx"]["totals"]["cost"]
            t["M5"]["unmanaged"] += m5["unmanaged"]["totals"]["cost"]
            t["M5"]["naive"] += m5["naive"]["totals"]["cost"]
            t["M5"]["dagctxWithSummarizer"] += m5["costWithSummarizer"]["dagctx"]
            t["M5"]["naiveWithSummarizer"] += m5["costWithSummarizer"]["naive"]
            t["M5"]["dagctxBreaks"] += m5["dagctx"]["totals"]["breaks"]
            t["M5"]["naiveBreaks"] += m5["naive"]["totals"]["breaks"]
            t["M5"]["dagctxServed"] += m5["dagctx"]["totals"]["served"]
            t["M5"]["unmanagedServed"] += m5["unmanaged"]["totals"]["served"]
            t["M5"]["naiveServed"] += m5["naive"]["totals"]["served"]
            t["M5"]["stablePrefixChecked"] += m5["stablePrefixPrediction"]["checked"]
            t["M5"]["stablePrefixAgree"] += m5["stablePrefixPrediction"]["agree"]
            for cause, c in m5["dagctx"]["byCause"].items():
                o = t["M5"]["byCause"].setdefault(cause, {"breaks": 0, "warm": 0, "invalidated": 0, "rewritten": 0})
                for k in o:
                    o[k] += c[k]
            t["M6"][0] += w["M6"]["regretted"]
            t["M6"][1] += w["M6"]["aged"]
            t["M7"][0] += w["M7"]["identical"]
            t["M7"][1] += w["M7"]["requests"]
    for t in per.values():
        for k in ("dagctx", "unmanaged", "naive", "dagctxWithSummarizer", "naiveWithSummarizer"):
            t["M5"][k] = round(t["M5"][k], 1)
        t["M5"]["costVsNaive"] = round(t["M5"]["dagctx"] / t["M5"]["naive"], 4) if t["M5"]["naive"] else None
        t["M5"]["withSummarizerVsNaive"] = (round(t["M5"]["dagctxWithSummarizer"] / t["M5"]["naiveWithSummarizer"], 4)
                                            if t["M5"]["naiveWithSummarizer"] else None)
    recorded = [r for s in sessions for r in s["recordedSummaries"]]
    return {"byWindow": per, "recorded": {"summaries": len(recorded), "byClass": _sum_class(recorded),
                                          "filesEdited": sum(r["filesEdited"] for r in recorded),
                                          "filesNamed": sum(r["filesNamed"] for r in recorded)}}


async def evaluate(cfg: Config, sources_from: Callable[[DagctxClient], Any] | None = None,
                   progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The whole run; ``sources_from(scratch_client)`` may add stored sessions (already loaded)."""
    t0 = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="dagctx-eval-")
    clients: list[DagctxClient] = []
    try:
        os.mkdir(os.path.join(folder, "0"))
        clients.append(await spawn_scratch(cfg, os.path.join(folder, "0")))
        sources, notes = await rp.import_sources(clients[0], cfg.paths)
        if sources_from is not None:
            sources.extend(await sources_from(clients[0]))
        sources = [s for s in sources if s.model_calls > 0]
        if cfg.max_sessions is not None:
            sources = sources[: cfg.max_sessions]
        for k in range(1, max(1, min(cfg.jobs, len(sources)))):
            os.mkdir(os.path.join(folder, str(k)))
            clients.append(await spawn_scratch(cfg, os.path.join(folder, str(k))))
        counter = cm.TokenCounter()
        results: list[Any] = [None] * len(sources)
        # the longest sessions first, so the workers finish together
        queue = sorted(range(len(sources)), key=lambda i: -len(sources[i].nodes))
        done = 0

        async def worker(client: DagctxClient) -> None:
            nonlocal done
            while queue:
                i = queue.pop(0)
                src = sources[i]
                results[i] = await evaluate_source(client, src, cfg, counter, progress)
                done += 1
                progress(f"session {done}/{len(sources)} done: {src.title[:50]} ({src.model_calls} model calls)")

        await asyncio.gather(*(worker(c) for c in clients))
        return {"tool": "dagctx eval", "summarizer": summarizer_label(cfg),
                "windows": [w.tokens for w in cfg.windows], "format": cfg.options.format,
                "compaction": cfg.options.compaction, "keepRecentTokens": cfg.options.keep_recent_tokens,
                "cacheTtlSeconds": cfg.ttl,
                "prices": {"write": cm.WRITE_PRICE, "read": cm.READ_PRICE},
                "notes": notes, "sessions": results, "totals": totals(results),
                "seconds": round(time.perf_counter() - t0, 1)}
    finally:
        for c in clients:
            await c.close()
        shutil.rmtree(folder, ignore_errors=True)
