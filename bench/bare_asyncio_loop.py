"""A second floor: the bare msgspec loop of ``bare_loop.py`` on an asyncio event loop.

Same framing, same answers, no work; but it waits for input in the event loop's
``epoll`` and writes through the loop's pipe transport, as the daemon does (every
connection of a daemon that serves many clients waits in one loop), instead of blocking
in ``read`` on one pipe. ``bench_roundtrip.py`` prints the daemon against it beside the
goal's floor: what is left between the two floors is the price of serving many clients
from one loop, paid before any request is read.

Run: python bench/bare_asyncio_loop.py   (speaks on stdin/stdout)
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from bare_loop import answer_frames


async def serve() -> int:
    small = {"sessions": [], "total": 0, "serverInfo": {"name": "bare-asyncio", "version": "0"}}
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    out_transport, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, os.fdopen(sys.stdout.fileno(), "wb", 0))

    class Frames(asyncio.Protocol):
        def __init__(self) -> None:
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            out, self.buf, ended = answer_frames(self.buf + data, small)
            if out:
                out_transport.write(b"".join(out))
            if ended and not done.done():
                done.set_result(0)

        def connection_lost(self, exc: Any) -> None:
            if not done.done():
                done.set_result(0)

    await loop.connect_read_pipe(Frames, os.fdopen(sys.stdin.fileno(), "rb", 0))
    return await done


if __name__ == "__main__":
    sys.exit(asyncio.run(serve()))
