"""Memory index and search through a real daemon (SPEC §5.1); ratios against baselines of the same run.

Run: python bench/bench_memory.py [--files 200] [--lines 400] [--db PATH-or-URL] [--queries 50]

Writes a temporary workspace of ``--files`` memory files (``--lines`` lines each, words drawn
from a fixed vocabulary with a seeded generator), then measures through one standalone daemon:

* index: a full build, then a re-index with nothing changed (content hashes only), then a
  re-index after one file changed; the incremental runs are quoted as ratios of the full build;
* embeddings: the full build with the local model's vectors (``embedding`` default) against
  the same build without (``provider: none``, FTS only) in a second workspace of the same files;
* search: ``memory/search`` p50/p95 of a conversational query in ``fts`` and ``hybrid`` mode,
  the same with temporal decay and MMR, against ``memory/status`` (a read-only round trip, the
  baseline) and the FTS query in the same run.

Numbers vary with the machine's load: read the ratios, not the milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from dagctx.client import DagctxClient

VOCAB = ("cache eviction policy deploy pipeline rollback canary staging postgres migration index vector "
         "tokenizer budget summary compaction branch session memory workspace daemon socket latency "
         "throughput retention metrics dashboard alert incident postmortem release tag build test "
         "lint format schema protocol client server request response timeout retry backoff queue").split()


def make_workspace(root: Path, files: int, lines: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Long-term memory\n\nWe decided the cache eviction policy is LRU.\n")
    for f in range(files):
        body = "\n".join(" ".join(rng.choice(VOCAB) for _ in range(12)) for _ in range(lines))
        (root / "memory" / f"note-{f:04d}.md").write_text(f"# Note {f}\n\n{body}\n")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--db", help="database (default: a temporary SQLite file)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    ws = tmp / "ws"
    make_workspace(ws, args.files, args.lines)
    plain_ws = tmp / "ws-fts"
    make_workspace(plain_ws, args.files, args.lines)
    c = await DagctxClient.spawn(args.db or str(tmp / "bench.db"), standalone=True)
    try:
        t0 = time.perf_counter()
        fts_only = await c.request("memory/index", {"workspace": str(plain_ws), "embedding": {"provider": "none"}},
                                   timeout=3600)
        t_fts = time.perf_counter() - t0
        t0 = time.perf_counter()
        full = await c.request("memory/index", {"workspace": str(ws)}, timeout=3600)
        t_full = time.perf_counter() - t0
        print(f"build: FTS only {fts_only.chunks / t_fts:,.0f} chunks/s; with {full.embedding} vectors "
              f"{full.chunks / t_full:,.0f} chunks/s ({t_full / t_fts:.1f}x the FTS-only time); "
              f"{full.embedded} vectors ≈ {full.embedded * 256 * 4 / 2**20:.1f} MiB as float32 "
              f"({256 * 4 * 100_000 / 2**20:.0f} MiB per 100k)")
        t0 = time.perf_counter()
        same = await c.request("memory/index", {"workspace": str(ws)}, timeout=3600)
        t_same = time.perf_counter() - t0
        (ws / "memory" / "note-0000.md").write_text("# Note 0\n\nedited: the zeppelin dashboard\n")
        t0 = time.perf_counter()
        one = await c.request("memory/index", {"workspace": str(ws)}, timeout=3600)
        t_one = time.perf_counter() - t0
        assert same.reindexed == 0 and one.reindexed == 1, (same, one)
        print(f"index: {full.files} files, {full.chunks} chunks; full build {t_full:.2f} s "
              f"({full.chunks / t_full:,.0f} chunks/s); unchanged re-index {t_same / t_full:.3f}x of it; "
              f"one file changed {t_one / t_full:.3f}x of it")

        async def timed(method: str, params: dict) -> list[float]:
            out = []
            for _ in range(args.queries):
                t = time.perf_counter()
                await c.request(method, params)
                out.append((time.perf_counter() - t) * 1000)
            return out

        base = await timed("memory/status", {"workspace": str(ws)})
        query = "what did we decide about the rollback canary for staging?"
        plain = await timed("memory/search", {"workspace": str(ws), "query": query, "mode": "fts"})
        hybrid = await timed("memory/search", {"workspace": str(ws), "query": query, "mode": "hybrid"})
        extra = await timed("memory/search", {"workspace": str(ws), "query": query, "mode": "hybrid",
                                              "temporalDecay": {"halfLifeDays": 30}, "mmr": {"lambda": 0.7}})
        b50 = statistics.median(base)
        print(f"hybrid p50 / fts p50: {statistics.median(hybrid) / statistics.median(plain):.2f}x")
        for name, xs in (("memory/status (baseline)", base), ("memory/search fts", plain),
                         ("memory/search hybrid", hybrid), ("hybrid + decay + MMR", extra)):
            print(f"{name:30s} p50 {statistics.median(xs):7.2f} ms ({statistics.median(xs) / b50:5.2f}x baseline)"
                  f"  p95 {pct(xs, 0.95):7.2f} ms")
    finally:
        await c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
