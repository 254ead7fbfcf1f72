"""The forwarder's outbound relay (``dagctx serve``, SPEC §1.3): frames pass through byte for
byte whatever the read boundaries, large bodies piece by piece, and the daemon's closing
frame is swallowed and read."""

from __future__ import annotations

import json
import os
import random
import threading

from dagctx.server.forward import _Outbound


def _frame(obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def test_frames_pass_through_whatever_the_read_boundaries_and_the_closing_frame_is_caught() -> None:
    rng = random.Random(7)
    frames = [_frame({"jsonrpc": "2.0", "id": i, "result": "x" * rng.choice([0, 5, 100, 300, 5000, 300_000])})
              for i in range(120)]
    closing = _frame({"jsonrpc": "2.0", "method": "$/dagctx/closing", "params": {"code": 3, "reason": "stopped"}})
    stream = b"".join(frames) + closing
    for _ in range(10):
        r, w = os.pipe()
        got = bytearray()

        def read() -> None:
            while chunk := os.read(r, 1 << 20):
                got.extend(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        out = _Outbound(w)
        buf = bytearray(1 << 18)  # reused between reads, as run_forwarder does
        i = 0
        while i < len(stream):
            piece = stream[i : i + rng.randint(1, 70_000)]
            buf[: len(piece)] = piece
            out.feed(buf, len(piece))
            i += len(piece)
        os.close(w)
        reader.join()
        os.close(r)
        assert bytes(got) == b"".join(frames)
        assert out.closing == {"code": 3, "reason": "stopped"}
