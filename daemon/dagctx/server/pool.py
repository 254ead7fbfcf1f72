"""The daemon's work pool: threads that serve the connections' lanes in turn (SPEC §1.4).

Every request handler runs here, off the event loop. Work is queued in *lanes* — a
connection has one for its ordered requests and one for its background ones (heavy
views, an import's write, compaction's planning) — and the workers take the next job
from the lanes round robin, so a connection that queues many heavy jobs gets one turn
like every other connection: a small request never waits behind another connection's
heavy one. A lane runs one job at a time (its requests stay in order), and a job may
*hold* its lane after its function returned, until the loop releases it (a request
whose answer is finished by a coroutine on the loop).

Threads, not processes: measured with a cold 2,000-turn render on one connection and
`session/list` + a small render on another, the small requests' worst latency stays
within a few GIL switch intervals (ARCHITECTURE.md quotes the numbers), because a
heavy view is pure Python that yields the GIL every ``sys.getswitchinterval()``.

A job cancelled while queued never runs; a running job stops at its next
``stop_if_cancelled()`` (``dagctx.context.cancel``).

Architecture Invariant: no JSON-RPC here; jobs are plain callables.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("dagctx.server")

#: Default worker threads: enough that a few heavy jobs of different connections leave a
#: thread for everybody else; more only contend for the GIL.
DEFAULT_WORKERS = 4


class _Job:
    __slots__ = ("fn", "future", "lane", "hold")

    def __init__(self, fn: Callable[[], Any], lane: _Lane, hold: bool) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()
        self.lane = lane
        self.hold = hold


class _Lane:
    __slots__ = ("key", "queue", "busy", "held")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.queue: deque[_Job] = deque()
        self.busy = False
        #: the future of the job that returned but still holds the lane
        self.held: Future[Any] | None = None


class FairPool:
    """Worker threads serving per-connection lanes round robin."""

    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "dagctx-work") -> None:
        self.workers = max(1, workers)
        self.name = name
        self._cv = threading.Condition(threading.Lock())
        self._lanes: dict[Hashable, _Lane] = {}
        #: lanes with queued work and no job running, in the order they get their turn
        self._ready: deque[_Lane] = deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self._closed = False

    # ------------------------------------------------------------ submitting

    def submit(self, lane: Hashable, fn: Callable[[], Any], *, hold: bool = False) -> Future[Any]:
        """Queue ``fn`` on ``lane``; its future completes with ``fn()``. With ``hold`` the
        lane stays busy after ``fn`` returned until ``release(lane)``."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the work pool is closed")
            ln = self._lanes.get(lane)
            if ln is None:
                ln = self._lanes[lane] = _Lane(lane)
            job = _Job(fn, ln, hold)
            ln.queue.append(job)
            if not ln.busy and len(ln.queue) == 1:
                self._ready.append(ln)
            if self._idle:
                self._cv.notify()
            elif len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads) + 1}", daemon=True)
                self._threads.append(t)
                t.start()
            return job.future

    def release(self, lane: Hashable, future: Future[Any]) -> None:
        """The held job ``future`` of ``lane`` is finished: the lane's next job may run.
        A job that did not hold its lane (it failed, or was cancelled) is ignored."""
        with self._cv:
            ln = self._lanes.get(lane)
            if ln is None or ln.held is not future:
                return
            ln.held = None
            self._done_locked(ln)

    def cancel_queued(self, lane: Hashable, future: Future[Any]) -> bool:
        """Drop a job that has not started; True when it was dropped."""
        with self._cv:
            ln = self._lanes.get(lane)
            if ln is None:
                return False
            for job in ln.queue:
                if job.future is future:
                    ln.queue.remove(job)
                    if not ln.queue and not ln.busy:
                        try:
                            self._ready.remove(ln)
                        except ValueError:
                            pass
                        del self._lanes[lane]
                    break
            else:
                return False
        future.cancel()
        return True

    def forget(self, lane: Hashable) -> None:
        """The lane's owner is gone: drop what it still had queued."""
        with self._cv:
            ln = self._lanes.get(lane)
            if ln is None:
                return
            dropped = list(ln.queue)
            ln.queue.clear()
            if not ln.busy:
                try:
                    self._ready.remove(ln)
                except ValueError:
                    pass
                del self._lanes[lane]
        for job in dropped:
            job.future.cancel()

    # ------------------------------------------------------------ status

    def depth(self) -> tuple[int, int]:
        """(jobs queued, jobs running)."""
        with self._cv:
            return sum(len(ln.queue) for ln in self._lanes.values()), self._running

    def threads(self) -> int:
        return len(self._threads)

    # ------------------------------------------------------------ workers

    def _done_locked(self, ln: _Lane) -> None:
        ln.busy = False
        if ln.queue:
            self._ready.append(ln)
            if self._idle:
                self._cv.notify()
        else:
            self._lanes.pop(ln.key, None)

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._ready and not self._closed:
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                if self._closed and not self._ready:
                    return
                ln = self._ready.popleft()
                job = ln.queue.popleft()
                ln.busy = True
                self._running += 1
            if job.future.set_running_or_notify_cancel():
                try:
                    result = job.fn()
                except BaseException as exc:  # handed to whoever waits; the worker lives on
                    with self._cv:
                        self._running -= 1
                        self._done_locked(ln)
                    job.future.set_exception(exc)
                else:
                    with self._cv:  # held before anyone can hear of the result and release
                        self._running -= 1
                        if job.hold:
                            ln.held = job.future
                        else:
                            self._done_locked(ln)
                    job.future.set_result(result)
            else:
                with self._cv:
                    self._running -= 1
                    self._done_locked(ln)
            job = result = None  # type: ignore[assignment]  # drop references before waiting again

    def shutdown(self) -> None:
        """Stop the workers once the queued jobs are dropped (the daemon is ending)."""
        with self._cv:
            self._closed = True
            dropped = [job for ln in self._lanes.values() for job in ln.queue]
            for ln in self._lanes.values():
                ln.queue.clear()
            self._ready.clear()
            self._cv.notify_all()
        for job in dropped:
            job.future.cancel()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
