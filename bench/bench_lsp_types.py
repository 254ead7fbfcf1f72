"""What typing initialize's LSP part through ``lsprotocol`` costs (``server/lsp.py``):
``client_params`` (InitializeParams with ClientCapabilities) and ``initialize_result``
(InitializeResult with ServerCapabilities and ServerInfo) against the msgspec path alone,
and against a whole ``initialize`` round trip of a real daemon measured in the same run.

Run: python bench/bench_lsp_types.py [--rounds R] [--daemons D]

initialize is once per connection, so the bar is the round trip, not the msgspec path:
the typing must stay a small share (≤ 0.05×) of what a client waits for its answer.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("protocol", "daemon", "clients/python")]

from dagctx.client import DagctxClient  # noqa: E402
from dagctx.protocol import codec  # noqa: E402
from dagctx.protocol import messages as m  # noqa: E402
from dagctx.server import lsp  # noqa: E402

PARAMS = (b'{"processId": 4242, "clientInfo": {"name": "nvim", "version": "0.10.2"}, "rootUri": "file:///w",'
          b' "capabilities": {"window": {"workDoneProgress": true, "showMessage": {}}, "general": '
          b'{"positionEncodings": ["utf-16"]}, "sampling": {"completion": {"identity": "host:x"}}},'
          b' "initializationOptions": {"database": "/tmp/x.db", "logMessages": true}}')
RESULT = m.InitializeResult(
    server_info=m.ServerInfo(name="dagctx", version="0.1.0"), protocol_version="1.0",
    methods=["initialize", "shutdown", "session/create", "session/list"] * 8,
    notifications=["$/progress", "node/didAppend", "window/logMessage", "window/showMessage"],
    database="/tmp/x.db", connection_id="c1",
    capabilities={"observeNodes": True, "sampling": "client-or-endpoint", "search": "fulltext-cjk", "storage": "sqlite"})


def msgspec_only() -> bytes:
    codec.decode_params(m.InitializeParams, PARAMS)
    return codec.encode_message(codec.Response(id=1, result=RESULT))


def with_lsprotocol() -> bytes:
    p = codec.decode_params(m.InitializeParams, PARAMS)
    lsp.client_params(p)
    return codec.encode_message(codec.Response(id=1, result=lsp.initialize_result(RESULT)))


def best(fn, rounds: int, n: int = 2000) -> float:
    out = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out = min(out, (time.perf_counter() - t) / n)
    return out


async def round_trips(daemons: int) -> list[float]:
    out = []
    for i in range(daemons):
        c = await DagctxClient.spawn(initialize=False)
        try:
            t = time.perf_counter()
            await c.initialize(initialization_options={"database": str(Path(tempfile.mkdtemp()) / f"b{i}.db")})
            out.append(time.perf_counter() - t)
        finally:
            await c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--daemons", type=int, default=5)
    args = ap.parse_args()
    base, typed = float("inf"), float("inf")
    for _ in range(args.rounds):  # alternate, so load hits both alike
        base = min(base, best(msgspec_only, 1))
        typed = min(typed, best(with_lsprotocol, 1))
    trip = statistics.median(asyncio.run(round_trips(args.daemons)))
    extra = typed - base
    print(f"initialize, msgspec path only      {base * 1e6:9.1f} µs")
    print(f"initialize, LSP part via lsprotocol {typed * 1e6:9.1f} µs  ({typed / base:.2f}× the msgspec path)")
    print(f"initialize round trip (real daemon, median of {args.daemons}) {trip * 1e3:.1f} ms")
    print(f"lsprotocol's extra {extra * 1e6:.1f} µs = {extra / trip:.4f}× the round trip")


if __name__ == "__main__":
    main()
