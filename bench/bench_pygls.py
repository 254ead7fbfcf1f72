"""pygls's own JSON-RPC machinery against the msgspec fast path, on the same small request.

Run: python bench/bench_pygls.py [--requests N] [--window W] [--rounds R]

Three servers answer a tiny request on stdio with LSP framing, driven by the same
minimal client (``bench_roundtrip.RawPeer``): a stock pygls 2.1.1 ``LanguageServer``
(its reader, cattrs/lsprotocol structuring and dispatch; ``bare_pygls.py``), the bare
msgspec loop (``bare_loop.py``), and the dagctx daemon (``session/list``, a real query
behind the msgspec path). Rounds alternate and each server keeps its best, so machine
load hits all alike. The ratios decide what of pygls the daemon may use on the request
path (ARCHITECTURE.md, "The card's packages"): the bar is the daemon's own, ≥ 0.5× the
bare loop sequential and ≥ 0.2× pipelined.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_roundtrip import BARE, DAEMON, PYGLS, RawPeer, init_params, pipelined, sequential, startup  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--startups", type=int, default=3)
    args = ap.parse_args()
    db = os.path.join(tempfile.mkdtemp(prefix="dagctx-bench-"), "bench.db")
    servers = {
        "pygls": (PYGLS, "bench/ping", None),
        "bare msgspec loop": (BARE, "bench/ping", None),
        "dagctx daemon": ([*DAEMON, "--db", db], "session/list", db),
    }
    peers = {}
    for name, (argv, _, d) in servers.items():
        peers[name] = await RawPeer.start(argv)
        await peers[name].call("initialize", init_params(d))
    seq = {n: 0.0 for n in servers}
    pip = {n: 0.0 for n in servers}
    for _ in range(args.rounds):
        for name, (_, method, _) in servers.items():
            params = {"limit": 1} if method == "session/list" else {}
            seq[name] = max(seq[name], await sequential(peers[name], method, params, args.requests))
            pip[name] = max(pip[name], await pipelined(peers[name], method, params, args.requests, args.window))
    for p in peers.values():
        await p.close()
    starts = {name: sorted([await startup(argv, d) for _ in range(args.startups)])[args.startups // 2]
              for name, (argv, _, d) in servers.items()}
    base = "bare msgspec loop"
    print(f"requests/s, best of {args.rounds} alternating rounds of {args.requests}; startup: median of {args.startups}")
    print(f"  {'':20} {'sequential':>11} {'ratio':>6} {'pipelined':>11} {'ratio':>6} {'startup ms':>11}")
    for name in servers:
        print(f"  {name:20} {seq[name]:11,.0f} {seq[name] / seq[base]:6.2f} {pip[name]:11,.0f} "
              f"{pip[name] / pip[base]:6.2f} {starts[name] * 1000:11,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
