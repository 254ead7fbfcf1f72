"""Compaction overhead excluding the LLM, on a 10k-node session, vs a cold render.

Overhead = the whole ``context/compact`` pipeline (aging plan, cut selection, staged
summarizer prompts, validation render, conflict check, the write, the after-render)
minus the time spent inside the summarizer. The summarizer is an in-process
stand-in that returns an extractive summary at once (it keeps identifiers, so the
fidelity gate passes). Baseline: a cold render of the same head (fresh EngineCore),
the median of ``--cold`` of them (3 by default) measured just before each compaction.

Run: python bench/bench_compaction.py [--nodes 10000] [--model gpt-4o] [--runs 3] [--cold 3]

Each run measures three cold renders (each on a fresh EngineCore) and then one
compaction (on its own copy of the database); the run's ratio is the compaction's
overhead over the median of its cold renders (one render alone made the ratio swing
by a quarter on a loaded machine). It prints the medians of the runs and the median
of the runs' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stand_in import StandInPeer  # noqa: E402
from bench_render import build_session  # noqa: E402  (same 10k-node session as the render bench)

from dagctx.context.references import extract_references  # noqa: E402
from dagctx.engine.compaction_pipeline import compact  # noqa: E402
from dagctx.engine.config import DaemonConfig  # noqa: E402
from dagctx.engine.core import EngineCore  # noqa: E402
from dagctx.protocol import context_messages as c  # noqa: E402
from dagctx.protocol import messages as m  # noqa: E402
from dagctx.protocol.messages import InitializeParams  # noqa: E402


def identifiers(text: str) -> str:
    """The stand-in summary: every identifier it was shown (passes the fidelity gate)."""
    return "Summary. Identifiers: " + ", ".join(sorted(extract_references(text)))


#: the main thread's and the whole process's CPU time of the last ``cold_render`` (steadier
#: than its wall time on a loaded machine)
COLD_CPU = [0.0, 0.0]


def cold_render(path: str, sid: str, model: str) -> float:
    eng = EngineCore(DaemonConfig(database=path))
    eng.initialize(InitializeParams())
    t, cpu, proc = time.perf_counter(), time.thread_time(), time.process_time()
    eng.views.render(sid, fmt="neutral", model=model, use_cache=False)
    took = time.perf_counter() - t
    COLD_CPU[0] = time.thread_time() - cpu
    COLD_CPU[1] = time.process_time() - proc
    eng.close()
    return took


class _AnswerCPU:
    """The stand-in's answer function, keeping its CPU time (taken out of the compaction's)."""

    def __init__(self) -> None:
        self.cpu = 0.0

    def __call__(self, text: str) -> str:
        t = time.thread_time()
        try:
            return identifiers(text)
        finally:
            self.cpu += time.thread_time() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--model", default="gpt-4o")
    ap.add_argument("--runs", type=int, default=3, help="compactions (each on a copy); the median is printed")
    ap.add_argument("--cold", type=int, default=3,
                    help="cold renders measured before each compaction; the run's baseline is their median")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-compact-")
    path = os.path.join(tmp, "c.db")
    print(f"building a {args.nodes:,}-node session …", flush=True)
    sid, head, _ = build_session(path, args.nodes)
    # warm-up, not counted: one cold render and one compaction load what a running daemon
    # has loaded once for good (every tokenizer's tables — its first append counts with
    # each —, lazily imported modules, compiled patterns)
    cold_render(path, sid, args.model)
    warm = os.path.join(tmp, "warm.db")
    shutil.copyfile(path, warm)
    eng = EngineCore(DaemonConfig(database=warm), peer=StandInPeer(identifiers))
    eng.initialize(InitializeParams())
    asyncio.run(compact(eng, c.CompactParams(session_id=sid, model=args.model)))
    eng.close()

    # each run: one cold render, then one compaction on its own copy of the database (a
    # compaction writes its summary); the run's ratio is its overhead over the cold render
    # measured beside it, so load drifting between runs hits both alike
    overheads, totals, inside, colds, ratios = [], [], [], [], []
    cpu_ratios: list[float] = []
    proc_ratios: list[float] = []
    res = None
    sampler = StandInPeer(identifiers)
    for k in range(args.runs):
        # the run's baseline: the median of its cold renders (wall time, and each CPU time
        # on its own), measured just before its compaction
        cold_runs = []
        for _ in range(max(1, args.cold)):
            cold_runs.append((cold_render(path, sid, args.model), *COLD_CPU))
        cold, cold_cpu, cold_proc = (statistics.median(col) for col in zip(*cold_runs))
        copy = os.path.join(tmp, f"c{k}.db")
        shutil.copyfile(path, copy)
        answer = _AnswerCPU()
        sampler = StandInPeer(answer)
        eng = EngineCore(DaemonConfig(database=copy), peer=sampler)
        eng.initialize(InitializeParams())
        # the copy's write-ahead log started by one unrelated write (a session of its own),
        # as in a database in use: else the summary's write, the copy's first commit, pays
        # the log's start-up sync, which a daemon pays once per database it opens
        started = eng.session_create(m.SessionCreateParams(title="warm the write-ahead log"))
        if asyncio.iscoroutine(started):
            asyncio.run(started)
        t, cpu, proc = time.perf_counter(), time.thread_time(), time.process_time()
        res = asyncio.run(compact(eng, c.CompactParams(session_id=sid, model=args.model)))
        total = time.perf_counter() - t
        cpu_ratios.append((time.thread_time() - cpu - answer.cpu) / cold_cpu)
        proc_ratios.append((time.process_time() - proc - answer.cpu) / cold_proc)
        eng.close()
        overheads.append(total - sampler.seconds)
        totals.append(total)
        inside.append(sampler.seconds)
        colds.append(cold)
        ratios.append((total - sampler.seconds) / cold)
    med = statistics.median
    assert res is not None
    print(f"compaction: ok={res.ok} reason={res.reason} covered {res.summarised_count:,} nodes, "
          f"{res.tokens_before:,} → {res.tokens_after:,} tokens, {sampler.calls} summarizer calls (stages)")
    print(f"  total {med(totals) * 1000:.0f} ms, inside the stand-in summarizer {med(inside) * 1000:.0f} ms "
          f"(medians of {args.runs})")
    print(f"  overhead excluding the LLM {med(overheads) * 1000:.0f} ms (runs: "
          f"{', '.join(f'{o * 1000:.0f}' for o in overheads)}); a cold render {med(colds) * 1000:.0f} ms (runs, each "
          f"the median of its {max(1, args.cold)} cold renders: {', '.join(f'{o * 1000:.0f}' for o in colds)})")
    print(f"  overhead / cold render (each run's: over the median of its {max(1, args.cold)} cold renders): "
          f"{med(ratios):.2f}× (median of the runs' ratios: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; goal ≤ 2×: {'ok' if med(ratios) <= 2 else 'ABOVE'})")
    print(f"  main thread CPU time, the same ratio: {med(cpu_ratios):.2f}× (runs: "
          f"{', '.join(f'{r:.2f}' for r in cpu_ratios)}; the writer thread's append not counted)")
    print(f"  process CPU time (every thread: the append, the summary's count beside the validation), the "
          f"same ratio: {med(proc_ratios):.2f}× (runs: {', '.join(f'{r:.2f}' for r in proc_ratios)})")


if __name__ == "__main__":
    main()
