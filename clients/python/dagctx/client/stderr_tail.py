"""The last lines a spawned daemon wrote to stderr, kept so a client can say why it died.

A client that spawns the daemon reads its stderr into a small ring buffer (the newest
``LINES`` lines, each cut at ``LINE_CHARS``) instead of discarding it; when the
connection closes early or the daemon cannot start, the error quotes them.
"""

from __future__ import annotations

import asyncio
from collections import deque

LINES = 40
LINE_CHARS = 500


class StderrTail:
    """Drains a stream into a ring buffer of its last lines (so the pipe never fills)."""

    def __init__(self, stream: asyncio.StreamReader, lines: int = LINES) -> None:
        self.lines: deque[str] = deque(maxlen=lines)
        self._task = asyncio.ensure_future(self._drain(stream))

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        partial = b""
        try:
            while chunk := await stream.read(65536):
                partial += chunk
                *done, partial = partial.split(b"\n")
                for raw in done:
                    self._add(raw)
                if len(partial) > LINE_CHARS * 4:  # a line without end: keep its start
                    self._add(partial)
                    partial = b""
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if partial:
                self._add(partial)

    def _add(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if text.strip():
            self.lines.append(text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…")

    async def settle(self, timeout: float = 1.0) -> None:
        """Wait (briefly) until the stream ended, so the last lines are in."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass

    def text(self, n: int = 12) -> str:
        """The last ``n`` lines, indented, or '' when there were none."""
        last = list(self.lines)[-n:]
        return "\n".join("    " + line for line in last)

    def cancel(self) -> None:
        self._task.cancel()

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel the drain and let it finish, so no task of it outlives the caller's loop."""
        self._task.cancel()
        await asyncio.wait({self._task}, timeout=timeout)


def describe_exit(returncode: int | None, tail: StderrTail | None) -> str:
    """``the daemon closed the connection`` plus its exit code and last stderr lines."""
    msg = "the daemon closed the connection"
    if returncode is not None:
        msg += f" (it exited with code {returncode})" if returncode >= 0 else f" (it was killed by signal {-returncode})"
    lines = tail.text() if tail is not None else ""
    if lines:
        msg += "; its last stderr lines:\n" + lines
    elif tail is not None:
        msg += "; it wrote nothing to stderr"
    return msg
