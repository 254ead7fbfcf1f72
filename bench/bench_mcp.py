"""MCP ``tools/call search_history`` vs ``search/query`` straight to the daemon, on the corpus.

Run: python bench/bench_mcp.py [--corpus DIR] [--repeat R] [--limit N]

1. Import the shared transcript corpus (``DAGCTX_CORPUS``, default ``../shared/corpus``)
   into a fresh database through the daemon (``session/import``).
2. Baseline: ``search/query`` round trips from the Python client to a daemon on that
   database, for a fixed set of queries (English, code identifiers, Chinese words inside
   sentences), each repeated R times: p50/p95.
3. The same queries as ``tools/call search_history`` through ``dagctx mcp`` (its own
   daemon on the same file), driven by the official ``mcp`` SDK's stdio client: p50/p95.

The ratio is what the MCP face adds: the SDK's JSON-RPC on both ends, argument
validation, one more process hop, and the result serialized twice (structured + text).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from dagctx.client import DagctxClient

REPO = Path(__file__).resolve().parents[1]
QUERIES = ["error", "test", "import", "README", "config", "commit", "function", "python", "migration",
           "迁移", "数据库", "用户", "src/*", "TypeError", "pytest"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=os.environ.get("DAGCTX_CORPUS") or str(REPO.parent / "shared" / "corpus"))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--limit", type=int, default=10)
    args = ap.parse_args()
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        print(f"no corpus at {corpus}: set DAGCTX_CORPUS or pass --corpus", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench_mcp.db"
        client = await DagctxClient.spawn(db)
        try:
            t0 = time.perf_counter()
            imported = 0
            for sub in sorted(p for p in corpus.iterdir() if p.is_dir()):
                res = await client.import_path(str(sub))
                imported += len(res.sessions)
            nodes = sum(s.node_count for s in (await client.session_list(limit=1000)).sessions)
            print(f"corpus: {imported} sessions, {nodes:,} nodes imported in {time.perf_counter() - t0:.1f} s")

            direct: list[float] = []
            hits = 0
            for q in QUERIES:
                await client.search(q, limit=args.limit)  # warm
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    r = await client.search(q, limit=args.limit)
                    direct.append((time.perf_counter() - t) * 1000)
                hits += bool(r.hits)
        finally:
            await client.close()

        via_mcp: list[float] = []
        # The SDK hands the server only a minimal environment unless told otherwise; pass ours,
        # so the daemon choice (standalone, a private runtime dir) is this run's, not the user's.
        params = StdioServerParameters(command=sys.executable, args=["-P", "-m", "dagctx.cli", "mcp", "--db", str(db)],
                                        env=dict(os.environ))
        async with stdio_client(params) as streams, ClientSession(*streams) as session:
            await session.initialize()
            for q in QUERIES:
                await session.call_tool("search_history", {"query": q, "limit": args.limit})  # warm
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    res = await session.call_tool("search_history", {"query": q, "limit": args.limit})
                    via_mcp.append((time.perf_counter() - t) * 1000)
                    assert not res.is_error, res.content

    n = len(QUERIES) * args.repeat
    print(f"{len(QUERIES)} queries × {args.repeat} (limit {args.limit}; {hits} with hits), {n} calls each way")
    d50, d95 = statistics.median(direct), pct(direct, 0.95)
    m50, m95 = statistics.median(via_mcp), pct(via_mcp, 0.95)
    print(f"search/query (Python client → daemon):         p50 {d50:7.3f} ms   p95 {d95:7.3f} ms")
    print(f"tools/call search_history (mcp SDK → dagctx mcp): p50 {m50:7.3f} ms   p95 {m95:7.3f} ms")
    print(f"ratio MCP / direct: p50 {m50 / d50:.2f}×, p95 {m95 / d95:.2f}×  (+{m50 - d50:.3f} ms at p50)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
