"""Reduction within a turn (SPEC §8) on real sessions and a generated 300-call turn.

For each session and window (32k, 128k) it prepares the newest head in-process
(``EngineCore`` with a stand-in summarizer that answers at once with the first words
of what it was sent) and prints:

* ``before → after``: the unreduced request and the prepared one (tokens), and the limit;
* ``calls``: summary calls of the first prepare (cached ones excluded), results
  summarized, steps in the checkpoint;
* ``reduction``: time inside the reduction minus the time inside the summarizer, and
  ``prepare``: the whole first prepare (aging plan and system prompt included) minus
  the summarizer, each against one cold render of the same head (fresh engine, no
  cache), medians of three runs each (``--runs``; the cold render measured in the same run) — goal ≤ 2×; ``warm``: a second prepare of the same head (everything from
  the carried reductions);
* ``stable``: over 20 consecutive steps appended to the turn, each followed by a
  prepare, the mean share of each request's tokens that is a byte-identical prefix
  of the previous request (``stablePrefix``), the requests that broke the prefix
  below half, and the summary calls those 20 requests made.

Then aging within a long turn (no LLM): the generated turn rendered after each of 20
more steps with ``minAgeSeconds: 0``, under three policies — ``turnUnit: "user"``
with the long-turn quanta (the default), the same without them (``longTurnSteps: 0``),
and ``turnUnit: "step"`` (every step moves the boundary): tokens freed by aging and
the mean stable-prefix share.

    python bench/bench_turn_reduction.py [--corpus DIR] [--steps 20] [--runs 3]
        [--only codex ...] [--windows w32k ...] [--no-aging]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

import msgspec

from _stand_in import StandInPeer

from dagctx.engine import imports
from dagctx.engine import turn_reduction as engine_reduction
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

REPO = Path(__file__).resolve().parents[1]
MODELS = {"w32k": {"contextWindow": 32000, "maxOutput": 4000}, "w128k": {"contextWindow": 128000, "maxOutput": 8000}}
SESSIONS = {
    "codex": "codex/rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl",
    "claude-code": "claude-code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl",
}


def condensed(text: str) -> str:
    """The stand-in summary: the first 30 words of what was sent (of its result or steps)."""
    hit = re.search(r"<(result|steps)>\n(.*?)\n</\1>", text, re.S)
    return "condensed: " + " ".join((hit.group(2) if hit else text).split()[:30])


class ReduceTimer:
    """Time spent inside ``engine.turn_reduction.reduce`` (the reduction itself)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._orig = engine_reduction.reduce
        engine_reduction.reduce = self._timed  # type: ignore[assignment]

    async def _timed(self, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._orig(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - t


TIMER = ReduceTimer()


def engine(path: str, peer: Any = None, aging: dict[str, Any] | None = None) -> EngineCore:
    eng = EngineCore(DaemonConfig(database=path), peer=peer)
    eng.initialize(m.InitializeParams(initialization_options=m.InitializationOptions(
        models={k: m.ModelSpec(context_window=v["contextWindow"], max_output=v["maxOutput"])
                for k, v in MODELS.items()},
        aging=None if aging is None else msgspec.convert(aging, m.AgingOptions))))
    return eng


def append(eng: EngineCore, sid: str, **kw: Any) -> str:
    return asyncio.run(eng.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw)))).node.id


def body(i: int) -> str:
    return f"# src/pkg/mod_{i}.py\n" + "\n".join(
        f"    line {k}: total_{i} = accumulate(values, step={k % 7})" for k in range(40))


def add_step(eng: EngineCore, sid: str, prev: str, i: int, model: str) -> str:
    llm = append(eng, sid, role="llm", name=model, output=f"Step {i}: reading src/pkg/mod_{i}.py.", predecessor=prev)
    append(eng, sid, role="code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"}, output=body(i), caller=llm,
           metadata={"toolCallId": f"call_{i}"})
    return llm


def generated(eng: EngineCore, n: int = 300) -> tuple[str, str]:
    s = eng.session_create(m.SessionCreateParams(title="generated"))
    if asyncio.iscoroutine(s):  # written by the database's writer (group commit)
        s = asyncio.run(s)
    prev = append(eng, s.session_id, role="user", output="Fix every failing test under src/pkg", predecessor=s.head)
    for i in range(n):
        prev = add_step(eng, s.session_id, prev, i, "w32k")
    return s.session_id, prev


def prepare(eng: EngineCore, sid: str, model: str) -> c.PrepareResult:
    out = eng.context_prepare(c.PrepareParams(session_id=sid, model=model, format="openai", prompt_mode="none"))
    return asyncio.run(out) if asyncio.iscoroutine(out) else out


#: runs per row, medians printed (``--runs``)
RUNS = 3


def cold_render(path: str, sid: str, model: str) -> float:
    times = []
    for _ in range(RUNS):
        eng = engine(path)
        t = time.perf_counter()
        eng.views.render(sid, fmt="openai", model=model, use_cache=False)
        times.append(time.perf_counter() - t)
        eng.close()
    return statistics.median(times)


def copy_db(path: str, tag: str) -> str:
    """A copy of a closed database (with its WAL), so every run starts with a cold cache."""
    out = f"{path}.{tag}"
    for ext in ("", "-wal", "-shm"):
        if os.path.exists(path + ext):
            shutil.copyfile(path + ext, out + ext)
    return out


def first_prepare(path: str, sid: str, model: str) -> tuple[float, float, int, c.PrepareResult, EngineCore, StandInPeer]:
    peer = StandInPeer(condensed)
    eng = engine(path, peer)
    # The copy's write-ahead log is started by one unrelated write first (a session of its
    # own), as it is in a database in use: otherwise the reduction's write of its summaries,
    # the first commit on the fresh copy, pays the log's start-up sync (0.5 ms, 1-6 ms under
    # I/O load), which a daemon pays once per database it opens, not per reduction.
    started = eng.session_create(m.SessionCreateParams(title="warm the write-ahead log"))
    if asyncio.iscoroutine(started):
        asyncio.run(started)
    TIMER.seconds = 0.0
    t = time.perf_counter()
    p = prepare(eng, sid, model)
    whole = time.perf_counter() - t - peer.seconds
    return TIMER.seconds - peer.seconds, whole, peer.calls, p, eng, peer


def measure(path: str, sid: str, model: str, steps: int, start: int) -> str:
    probe = engine(path)
    probe.store.reduction_summaries(["-"])  # the derived table exists (created once per database file)
    unreduced = probe.views.render(sid, fmt="openai", model=model, remember=False, use_cache=False).total
    probe.close()
    runs = []
    for k in range(RUNS):  # runs, each on a fresh copy (no cached summaries); medians printed
        red_s, whole, calls, p, eng, peer = first_prepare(copy_db(path, f"run{k}"), sid, model)
        runs.append((red_s, whole))
        if k < RUNS - 1:
            eng.close()
    reduction = statistics.median(r[0] for r in runs)
    first = statistics.median(r[1] for r in runs)
    t = time.perf_counter()
    prepare(eng, sid, model)
    warm = time.perf_counter() - t
    cold = cold_render(path, sid, model)
    r = p.reduction
    head = p.manifest["head"]
    shares, breaks, calls_before = [], 0, peer.calls
    for i in range(steps):
        head = add_step(eng, sid, head, start + i, model)
        q = prepare(eng, sid, model)
        share = (q.stable_prefix.tokens / q.budget.input_used) if q.stable_prefix and q.budget.input_used else 0.0
        shares.append(share)
        breaks += share < 0.5
    eng.close()
    ckpt = len(r.checkpoint.covers_ids) if r and r.checkpoint else 0
    return (f"{unreduced:>8,} → {p.budget.input_used:>7,} (limit {p.budget.input_budget - p.budget.safety_margin:>7,})"
            f"  calls {calls:>2} (results {len(r.results) if r else 0:>2}, checkpoint {ckpt:>3} steps)"
            f"  reduction {reduction * 1000:5.1f} ms = {reduction / cold:4.2f}× / prepare {first * 1000:5.1f} ms"
            f" = {first / cold:4.2f}× a cold render ({cold * 1000:4.1f} ms)"
            f"  warm {warm * 1000:5.1f} ms"
            f"  stable {mean(shares):5.1%} over {steps} steps, {breaks} breaks, {peer.calls - calls_before} calls")


def aging_effect(steps: int) -> None:
    print("\naging within a long turn (generated turn, minAgeSeconds 0, 128k, no LLM):")
    base = {"minAgeSeconds": 0, "minTokens": 200, "softTrimHeadChars": 300, "softTrimTailChars": 100}
    policies = {
        "user + long-turn quanta (default)": base,
        "user, longTurnSteps 0 (before)": {**base, "longTurnSteps": 0},
        "step (every step moves it)": {**base, "turnUnit": "step"},
    }
    for label, opts in policies.items():
        path = os.path.join(tempfile.mkdtemp(prefix="dagctx-bench-tr-"), "a.db")
        eng = engine(path, aging=opts)
        s = eng.session_create(m.SessionCreateParams(title="aging"))
        if asyncio.iscoroutine(s):
            s = asyncio.run(s)
        head = append(eng, s.session_id, role="user", output="Fix every failing test", predecessor=s.head)
        for i in range(60):
            head = add_step(eng, s.session_id, head, i, "w128k")
        shares, freed, ms = [], [], []
        for i in range(60, 60 + steps):
            head = add_step(eng, s.session_id, head, i, "w128k")
            t = time.perf_counter()
            r = eng.context_render(c.RenderParams(session_id=s.session_id, model="w128k", format="openai"))
            if asyncio.iscoroutine(r):
                r = asyncio.run(r)
            ms.append(time.perf_counter() - t)
            if i > 60:  # the first render has no previous render to share a prefix with
                shares.append(r.stable_prefix.tokens / r.tokens.total if r.tokens.total else 0.0)
            unaged = eng.views.render(s.session_id, fmt="openai", model="w128k", remember=False, use_cache=False).total
            freed.append(unaged - r.tokens.total)
        eng.close()
        print(f"  {label:<36} freed {mean(freed):>8,.0f} tokens/request  stable prefix {mean(shares):6.1%}"
              f"  min {min(shares):6.1%}  render {mean(ms) * 1000:5.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.environ.get("DAGCTX_CORPUS") or str(REPO.parent / "shared" / "corpus"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", nargs="*", help="rows to measure (generated-300, codex, claude-code); all by default")
    ap.add_argument("--windows", nargs="*", choices=list(MODELS), help="windows to measure; all by default")
    ap.add_argument("--runs", type=int, default=3, help="first prepares (and cold renders) per row, medians printed")
    ap.add_argument("--no-aging", action="store_true", help="skip the aging section")
    args = ap.parse_args()
    global RUNS
    RUNS = max(1, args.runs)
    corpus = Path(args.corpus)
    for model in args.windows or MODELS:
        print(f"\nwindow {MODELS[model]['contextWindow']:,} ({model}):")
        for name in ("generated-300", *SESSIONS):
            if args.only and name not in args.only:
                continue
            path = os.path.join(tempfile.mkdtemp(prefix="dagctx-bench-tr-"), "t.db")
            eng = engine(path)
            if name == "generated-300":
                sid, _ = generated(eng)
            else:
                if not (corpus / SESSIONS[name]).is_file():
                    print(f"  {name:<14} skipped: {corpus / SESSIONS[name]} not found")
                    continue
                res = asyncio.run(imports.session_import(eng, c.ImportParams(path=str(corpus / SESSIONS[name]))))
                sid = res.sessions[0].session_id
            eng.close()
            print(f"  {name:<14} {measure(path, sid, model, args.steps, 1000)}", flush=True)
    if not args.no_aging:
        aging_effect(args.steps)


if __name__ == "__main__":
    main()
