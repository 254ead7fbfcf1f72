"""Whether a file's path may name another file now, told by the kernel (SPEC §1.4, §2.1).

A read that must never answer from a file the path no longer names (deleted, replaced by
a rename, a folder on the way moved) looks at the path's identity with ``stat`` — a
system call that walks the path, and in Python builds a result of some twenty fields:
the largest single cost of a quick read answered from what it kept. Where Linux's inotify
is at hand, ``PathWatch`` asks it instead: every folder from the file's own up to the
root (of the path as given and of the path it resolves to) is watched for a name
created, deleted or moved, and for the folder itself deleted or moved. Nothing can make
the path name another file without one of those events (a mount excepted) — and the
kernel queues an event before the call that caused it returns, so a client that
replaced the file and then sent a request finds it queued when that request is read.
``changed`` is then one ``poll`` with no wait: False while nothing was queued; True, and
the queue emptied, when anything was (any name in any of those folders: the caller then
looks with ``stat`` as it would have). Not thread-safe: the caller serializes.

Architecture Invariant: no SQL here; a path in, a yes or no out.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import sys
import threading
from typing import Any

log = logging.getLogger("dagctx.ledger")

# <sys/inotify.h>
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_IGNORED = 0x400, 0x800, 0x8000
#: an event saying a watch is gone or on a folder now elsewhere: the watch is made again
_LOST = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (the name follows)
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, getattr(os, "O_CLOEXEC", 0o2000000)
MASK = _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF

_libc: Any = None

#: inotify instances are a per-user budget (128 by default on Linux) that editors, file
#: watchers and other processes share: one process keeps at most this many open; a store
#: beyond them looks at its path with ``stat``, as without inotify
AT_MOST = 16
_open = 0
_open_lock = threading.Lock()


def _inotify() -> Any:
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.inotify_init1  # noqa: B018 - raises AttributeError where there is none
    return _libc


def folders(path: str) -> list[str]:
    """Every folder whose entries decide what ``path`` names: from its own to the root, of
    the path as given and of the path it resolves to (symbolic links followed)."""
    out: list[str] = []
    for p in (os.path.abspath(path), os.path.realpath(path)):
        d = os.path.dirname(p)
        while True:
            if d not in out:
                out.append(d)
            up = os.path.dirname(d)
            if up == d:
                break
            d = up
    return out


class PathWatch:
    """An inotify instance watching the folders of one path (``folders``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: a watched folder was deleted or moved (its watch is gone, or watches a folder
        #: elsewhere now): the owner opens a new watch of the path (``open``)
        self.stale = False
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    @classmethod
    def open(cls, path: str) -> PathWatch | None:
        """A watch of ``path``'s folders, or None where there can be none (not Linux, no
        inotify, the user's limit of instances or watches reached): the caller then looks
        with ``stat`` every time, as without one."""
        global _open
        if not sys.platform.startswith("linux"):
            return None
        with _open_lock:
            if _open >= AT_MOST:
                return None
            _open += 1
        fd = -1
        try:
            libc = _inotify()
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0 and all(libc.inotify_add_watch(fd, os.fsencode(d), MASK) >= 0 for d in folders(path)):
                return cls(fd)
        except (OSError, AttributeError, ValueError):
            pass
        if fd >= 0:
            os.close(fd)
        with _open_lock:
            _open -= 1
        return None

    def fileno(self) -> int:
        """The inotify descriptor (-1 once closed): readable while an event is queued, so a
        thread may poll it beside others (``SqliteFile.nowait_mark``'s ``quiet``)."""
        return self.fd

    def changed(self) -> bool:
        """Whether any name in the watched folders was created, deleted or moved (or a folder
        itself deleted or moved) since the last call; the events are consumed."""
        if not self._poll.poll(0):
            return False
        try:
            while data := os.read(self.fd, 1 << 16):
                at = 0
                while at + _EVENT.size <= len(data):
                    _, mask, _, size = _EVENT.unpack_from(data, at)
                    self.stale = self.stale or bool(mask & _LOST)
                    at += _EVENT.size + size
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.stale = True  # whatever it was, the caller looks, and watches anew
        return True

    def __del__(self) -> None:  # a store dropped without closing gives its place back
        self.close()

    def close(self) -> None:
        global _open
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            os.close(fd)
        except OSError:
            pass
        with _open_lock:
            _open -= 1
