"""Memory index and search through a real daemon (SPEC §5.1); ratios against baselines of the same run.

Run: python bench/bench_memory.py [--files 2860] [--lines 400] [--db PATH-or-URL] [--queries 50] [--keep]
     [--reuse FOLDER [--search-only]]   (a folder ``--keep`` printed: its workspaces and database, no build —
                         the build numbers are then of re-indexing unchanged files)

The defaults make about 100,000 chunks (35 per file); ``--files 20`` is a quick check.

Writes a temporary workspace of ``--files`` memory files (``--lines`` lines each, words drawn
from a fixed vocabulary with a seeded generator), then measures through one standalone daemon:

* index: a full build, then a re-index with nothing changed (content hashes only), then a
  re-index after one file changed; the incremental runs are quoted as ratios of the full build;
* embeddings: the full build with the local model's vectors (``embedding`` default) against
  the same build without (``provider: none``, FTS only) in a second workspace of the same files;
* search: ``memory/search`` p50/p95 of conversational queries in ``fts`` and ``hybrid`` mode,
  the same with temporal decay and MMR, against ``memory/status`` (a read-only round trip, the
  baseline) and the FTS query in the same run; the hybrid top 5 of each query (chunk ids, to
  compare across runs and code versions);
* a fresh daemon: the first hybrid query sent at once (it waits for the daemon's background
  read of the vectors) and sent once ``memory/status`` says ``vectorsLoaded``;
* memory: the daemon's resident memory (``daemon/status``) before and after the first hybrid
  query reads the workspace's vectors into its matrix, quoted per 100,000 vectors.

Numbers vary with the machine's load: read the ratios, not the milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dagctx.client import DagctxClient

VOCAB = ("cache eviction policy deploy pipeline rollback canary staging postgres migration index vector "
         "tokenizer budget summary compaction branch session memory workspace daemon socket latency "
         "throughput retention metrics dashboard alert incident postmortem release tag build test "
         "lint format schema protocol client server request response timeout retry backoff queue").split()


#: conversational queries (asked in turn): the keyword side runs the OR of their keywords
QUERIES = ("what did we decide about the rollback canary for staging?",
           "how do we handle the cache eviction policy when memory is tight",
           "which alert fired during the postgres migration incident",
           "where is the retry backoff for the request queue configured")


def _vocabulary(seed: int = 7) -> tuple[list[str], list[float]]:
    """``VOCAB`` among 4,000 filler words, drawn with Zipf's law (weight 1/rank): the domain
    words at ranks 150–4,000, so a query's keywords each occur in a few to ~20 % of the
    chunks, as in prose — not in every chunk, as a draw from ``VOCAB`` alone would make them."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "den", "par", "gul", "bet", "ox", "im", "stra"]
    fill: list[str] = []
    seen: set[str] = set(VOCAB)
    while len(fill) < 4_000:
        w = "".join(rng.choice(syll) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            fill.append(w)
    words = fill[:]
    for i, w in enumerate(VOCAB):
        words.insert(150 + i * (3_850 // len(VOCAB)), w)
    weights, total = [], 0.0
    for r in range(len(words)):
        total += 1.0 / (r + 1)
        weights.append(total)
    return words, weights


def make_workspace(root: Path, files: int, lines: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    words, cum = _vocabulary()
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Long-term memory\n\nWe decided the cache eviction policy is LRU.\n")
    for f in range(files):
        body = "\n".join(" ".join(rng.choices(words, cum_weights=cum, k=12)) for _ in range(lines))
        (root / "memory" / f"note-{f:04d}.md").write_text(f"# Note {f}\n\n{body}\n")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2860)
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--db", help="database (default: a temporary SQLite file)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (workspace and database)")
    ap.add_argument("--reuse", help="a folder kept by --keep: search its index again (kept afterwards)")
    ap.add_argument("--search-only", action="store_true", help="with --reuse: no index runs, the searches only")
    args = ap.parse_args()
    tmp = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp())
    args.keep = args.keep or bool(args.reuse)
    ws = tmp / "ws"
    plain_ws = tmp / "ws-fts"
    if not args.reuse:
        make_workspace(ws, args.files, args.lines)
        make_workspace(plain_ws, args.files, args.lines)
    c = await DagctxClient.spawn(args.db or str(tmp / "bench.db"), standalone=True)
    try:
        if args.search_only and args.reuse:
            full = await c.request("memory/status", {"workspace": str(ws)})
        else:
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
            (ws / "memory" / "note-0000.md").write_text(f"# Note 0\n\nedited: the zeppelin dashboard {time.time()}\n")
            t0 = time.perf_counter()
            one = await c.request("memory/index", {"workspace": str(ws)}, timeout=3600)
            t_one = time.perf_counter() - t0
            assert same.reindexed == 0 and one.reindexed == 1, (same, one)
            print(f"index: {full.files} files, {full.chunks} chunks; full build {t_full:.2f} s "
                  f"({full.chunks / t_full:,.0f} chunks/s); unchanged re-index {t_same / t_full:.3f}x of it; "
                  f"one file changed {t_one / t_full:.3f}x of it")

        async def timed(method: str, params: dict) -> list[float]:
            out = []
            for i in range(args.queries):
                t = time.perf_counter()
                await c.request(method, {**params, "query": QUERIES[i % len(QUERIES)]} if "query" in params else params)
                out.append((time.perf_counter() - t) * 1000)
            return out

        async def rss() -> int:
            st = await c.request("daemon/status", {})
            return int(st.memory.rss_bytes)

        base = await timed("memory/status", {"workspace": str(ws)})
        plain = await timed("memory/search", {"workspace": str(ws), "query": "", "mode": "fts"})
        before = await rss()
        t0 = time.perf_counter()
        await c.request("memory/search", {"workspace": str(ws), "query": QUERIES[0], "mode": "hybrid"}, timeout=600)
        t_load = time.perf_counter() - t0
        grown = await rss() - before
        hybrid = await timed("memory/search", {"workspace": str(ws), "query": "", "mode": "hybrid"})
        extra = await timed("memory/search", {"workspace": str(ws), "query": "", "mode": "hybrid",
                                              "temporalDecay": {"halfLifeDays": 30}, "mmr": {"lambda": 0.7}})
        plain2 = await timed("memory/search", {"workspace": str(ws), "query": "", "mode": "fts"})
        plain += plain2  # before and after the hybrid runs: the same load
        b50 = statistics.median(base)
        n = full.chunks
        print(f"vectors: the first hybrid query ({n:,} vectors, read in the background since the index run) took "
              f"{t_load:.2f} s; daemon RSS grew "
              f"{grown / 2**20:.1f} MiB = {grown / 2**20 * 100_000 / max(n, 1):.1f} MiB per 100k vectors "
              f"(float32 matrix alone: {256 * 4 * 100_000 / 2**20:.0f} MiB per 100k)")
        print(f"hybrid p50 / fts p50: {statistics.median(hybrid) / statistics.median(plain):.2f}x")
        for name, xs in (("memory/status (baseline)", base), ("memory/search fts", plain),
                         ("memory/search hybrid", hybrid), ("hybrid + decay + MMR", extra)):
            print(f"{name:30s} p50 {statistics.median(xs):7.2f} ms ({statistics.median(xs) / b50:5.2f}x baseline)"
                  f"  p95 {pct(xs, 0.95):7.2f} ms")
        tops = {}
        for q in QUERIES:
            r = await c.request("memory/search", {"workspace": str(ws), "query": q, "mode": "hybrid", "maxResults": 5})
            tops[q] = [h.chunk_id for h in r.hits]
        print("hybrid top 5 per query (compare across runs):", {q[:24]: [t[:6] for t in ids] for q, ids in tops.items()})
    finally:
        await c.close()
    # a fresh daemon: its background read of the vectors (SPEC §5.1), and the first hybrid query
    # sent at once (it waits for that read) or once the read is done
    for wait in (False, True):
        t0 = time.perf_counter()
        d = await DagctxClient.spawn(args.db or str(tmp / "bench.db"), standalone=True)
        try:
            t_up = time.perf_counter() - t0
            if wait:
                while not (await d.request("memory/status", {"workspace": str(ws)})).vectors_loaded:
                    await asyncio.sleep(0.05)
            t_ready = time.perf_counter() - t0
            t1 = time.perf_counter()
            r = await d.request("memory/search", {"workspace": str(ws), "query": QUERIES[1], "mode": "hybrid"},
                                timeout=600)
            t_first = time.perf_counter() - t1
            assert r.mode == "hybrid" and r.hits
            print(f"fresh daemon ({'after its background read' if wait else 'query at once'}): up in {t_up:.2f} s"
                  + (f", vectors held {t_ready:.2f} s after spawn" if wait else "")
                  + f"; first hybrid query {t_first * 1000:.0f} ms")
        finally:
            await d.close()
    if args.keep:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
