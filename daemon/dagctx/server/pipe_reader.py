"""A client's input read by a thread of its own (SPEC §1.4), not by the event loop.

A thread blocked on one client's pipe wakes as soon as the client writes, and answers
the quick reads at the head of what it read itself (``Incoming.feed_in_thread``); what
is left goes to the loop, in order, small bodies already checked and decoded. Measured
on the 2-core development machine (``bench/bench_roundtrip.py``, ``bench/bare_asyncio_loop.py``):
the same bare answering loop served ~46,000 sequential round trips/s from a thread that
blocks in ``poll`` on its pipe — as many as a bare process blocking in ``read`` — and
~25,000/s from an asyncio loop waiting in ``epoll``, before any work.

The thread owns its descriptor: it alone reads and closes it, so the number is never
read again after another file took it. ``close`` wakes it through a pipe of its own.

``feed`` may name something to poll beside the input (an object with ``fileno``: the
database path's watch, ``SqliteFile.nowait_mark``): when a poll wakes the thread for the
input alone, the next ``feed`` is told that nothing was queued there — the kernel's word,
given by the poll the thread makes anyway, instead of a second one per read (SPEC §1.4).
Once something is queued there it is not polled until a read went by (whoever reads the
queue empties it), so it never wakes the thread for nothing more than once.

Architecture Invariant: no JSON-RPC here; the thread hands bytes to ``feed`` and tells
``on_end`` once, from the loop, when the client's end closed.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dagctx.server")

#: Bytes read per system call: a pipe's own capacity (64 KiB unless raised). Not more:
#: ``os.read`` allocates the whole chunk before it reads, and glibc's malloc serves a
#: request over its mmap threshold (128 KiB) with ``mmap``, then shrinks and unmaps it —
#: a 256 KiB chunk cost ~15-20 µs a read on the development machine, against ~1 µs at
#: 64 KiB, most of what set a sequential round trip apart from a bare loop's.
CHUNK = 1 << 16


#: ``prctl(PR_SET_NAME, …)``: the calling thread's name as Linux shows it
_PR_SET_NAME = 15
_prctl: Any = None


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` where the operating system shows it (``top -H``,
    ``/proc/PID/task/TID/comm``; 15 bytes kept), so an operator — or a test — can tell a
    connection's reader from the daemon's other threads. Best effort: Linux only."""
    global _prctl
    if not sys.platform.startswith("linux"):
        return
    try:
        if _prctl is None:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl(_PR_SET_NAME, name.encode("utf-8", "replace")[:15], 0, 0, 0)
    except (OSError, AttributeError, TypeError):
        pass  # a name is a convenience; the reader works without one


class PipeReader:
    """Reads ``fd`` in a thread, handing each read to ``feed`` (in the thread); when the
    client's end closes, ``on_end`` runs on the loop (through ``post``)."""

    def __init__(self, fd: int, feed: Callable[[bytes, Any], Any], on_end: Callable[[], None],
                 post: Callable[..., Any], name: str) -> None:
        self.fd = fd
        self._feed = feed
        self._on_end = on_end
        self._post = post
        self._stop_r, self._stop_w = os.pipe()
        #: guards ``_stop_w`` between ``close`` and the thread's end (which closes it)
        self._lock = threading.Lock()
        self.closed = False
        os.set_blocking(fd, False)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stop reading (any thread): the thread wakes, closes the descriptor and ends."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._stop_w >= 0:
                try:
                    os.write(self._stop_w, b"x")
                except OSError:
                    pass

    def _run(self) -> None:
        name_os_thread(self.thread.name)
        fd = self.fd
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        poller.register(self._stop_r, select.POLLIN)
        #: what ``feed`` asked to be polled beside the input (an object with ``fileno``), and
        #: the descriptor it had when registered (-1: none)
        beside: Any = None
        beside_fd = -1
        ended = False
        try:
            while not self.closed:
                ready = poller.poll()
                if self.closed:
                    break
                if len(ready) == 1 and ready[0][0] == fd:
                    quiet = beside  # nothing queued beside the input when it woke us
                else:
                    quiet = None
                    if beside_fd >= 0 and any(f == beside_fd for f, _ in ready):
                        # something is queued there (or it was closed): not polled again until
                        # a read went by — whoever asks it empties it — or it would wake this
                        # thread for nothing until then
                        poller.unregister(beside_fd)
                        beside, beside_fd = None, -1
                try:
                    data = os.read(fd, CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    ended = True
                    break
                try:
                    wanted = self._feed(data, quiet)
                except Exception:  # noqa: BLE001 - the daemon never dies on a request
                    log.exception("reading a client's input failed")
                    wanted = beside
                if wanted is not beside:
                    beside, beside_fd = self._poll_beside(poller, beside_fd, wanted)
        finally:
            with self._lock:
                for own in (self.fd, self._stop_r, self._stop_w):
                    try:
                        os.close(own)
                    except OSError:
                        pass
                self._stop_w = -1
                tell = ended and not self.closed
            if tell:
                self._post(self._on_end)

    @staticmethod
    def _poll_beside(poller: Any, registered: int, wanted: Any) -> tuple[Any, int]:
        """Poll ``wanted`` (``fileno``) instead of the descriptor ``registered`` beside the
        input; ``(wanted, its descriptor)``, or ``(None, -1)`` when it has none now."""
        if registered >= 0:
            try:
                poller.unregister(registered)
            except (KeyError, ValueError, OSError):
                pass
        try:
            number = -1 if wanted is None else wanted.fileno()
            if number >= 0:
                poller.register(number, select.POLLIN)
                return wanted, number
        except (OSError, ValueError, AttributeError):
            pass
        return None, -1
