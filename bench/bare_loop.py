"""The floor: a bare msgspec JSON-RPC loop on stdio with LSP framing.

It answers every request with a small result (``initialize`` included), exits on
``exit`` or EOF, and does nothing else: no validation, no database. The benchmarks
measure the daemon against this loop in the same run.

Run: python bench/bare_loop.py   (speaks on stdin/stdout)
"""

from __future__ import annotations

import os
import sys
from typing import Any

import msgspec


class Msg(msgspec.Struct):
    id: Any = None
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw(b"null")


class Reply(msgspec.Struct):
    id: Any
    result: Any
    jsonrpc: str = "2.0"


_decode = msgspec.json.Decoder(Msg).decode
_encode = msgspec.json.Encoder().encode


def answer_frames(buf: bytes, small: Any) -> tuple[list[bytes], bytes, bool]:
    """Every whole frame in ``buf`` answered with ``small``: (the framed answers, the
    bytes left over, whether ``exit`` came). Shared with ``bare_asyncio_loop.py``."""
    out = []
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            break
        length = 0
        for line in buf[:end].split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(buf) < end + 4 + length:
            break
        body, buf = buf[end + 4 : end + 4 + length], buf[end + 4 + length :]
        msg = _decode(body)
        if msg.method == "exit":
            return out, buf, True
        if msg.id is not None:
            data = _encode(Reply(msg.id, small))
            out.append(b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return out, buf, False


def main() -> int:
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    small = {"sessions": [], "total": 0, "serverInfo": {"name": "bare", "version": "0"}}
    buf = b""
    while True:
        chunk = os.read(fd_in, 1 << 16)
        if not chunk:
            return 0
        out, buf, ended = answer_frames(buf + chunk, small)
        if out:
            os.write(fd_out, b"".join(out))
        if ended:
            return 0


if __name__ == "__main__":
    sys.exit(main())
