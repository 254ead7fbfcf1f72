"""Which writes of this process to a session its subscribers have heard of (SPEC §1.5).

A daemon tells subscribers of its own writes right after they commit, naming the writing
connection (``origin``); a poller finds other processes' writes (``origin: null``). Group
commit (SPEC §4.2) opens a gap between the two: the writer thread commits, and only then
does the writing connection announce. A poll that read in that gap would report the node
as another process's. ``WriteMarks`` closes the gap: the store marks a session *before*
its write transaction starts, and the announcement marks what it has told; a poll looks
only at a session whose every write of this process was announced, and throws its
reading away when a write began while it read.

A write whose announcement never comes (a unit of a group refused after its session was
locked, a caller that announces nothing) stops holding polls back after ``STALE_SECONDS``.

Architecture Invariant: plain counters; no I/O, no JSON-RPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

#: After this long, a write of this process nobody announced no longer holds polls back.
STALE_SECONDS = 1.0
#: Sessions remembered before the long-stale ones are forgotten.
KEEP = 1024


class WriteMarks:
    """Per session: writes begun, writes finished, finished writes announced, last begin."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._s: dict[str, list[float]] = {}

    def begin(self, session_ids: Sequence[str]) -> None:
        """A write transaction of these sessions is about to start (before its commit)."""
        now = time.monotonic()
        with self._lock:
            if len(self._s) > KEEP:  # sessions whose writes nobody watched (or announced)
                for sid, e in list(self._s.items()):
                    if now - e[3] > 60 * STALE_SECONDS and e[0] == e[1]:
                        del self._s[sid]
            for sid in session_ids:
                e = self._s.setdefault(sid, [0, 0, 0, now])
                e[0] += 1
                e[3] = now

    def end(self, session_ids: Sequence[str], committed: bool) -> None:
        """It ended: committed (its announcement is due), or rolled back (it wrote nothing)."""
        with self._lock:
            for sid in session_ids:
                e = self._s.get(sid)
                if e is None:
                    continue
                if committed:
                    e[1] += 1
                else:
                    e[0] -= 1
                self._settle(sid, e)

    def finished(self, session_id: str) -> int:
        """Writes committed so far: take it BEFORE reading what to announce."""
        with self._lock:
            e = self._s.get(session_id)
            return int(e[1]) if e is not None else 0

    def announced(self, session_id: str, finished: int) -> None:
        """Every write counted in ``finished`` (taken before the reading) was announced."""
        with self._lock:
            e = self._s.get(session_id)
            if e is not None and finished > e[2]:
                e[2] = finished
                self._settle(session_id, e)

    def settled(self, session_id: str) -> tuple[bool, int]:
        """(whether a poll may report the session now, writes begun so far)."""
        with self._lock:
            e = self._s.get(session_id)
            if e is None:
                return True, 0
            quiet = e[0] == e[2] or time.monotonic() - e[3] > STALE_SECONDS
            return quiet, int(e[0])

    def begun(self, session_id: str) -> int:
        with self._lock:
            e = self._s.get(session_id)
            return int(e[0]) if e is not None else 0

    def _settle(self, sid: str, e: list[float]) -> None:
        if e[0] == e[1] == e[2]:
            del self._s[sid]  # all told: forget the session
