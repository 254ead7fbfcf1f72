"""The daemon's work pool: threads that serve the connections' lanes in turn (SPEC §1.4).

Every request handler runs here, off the event loop (but the appends, which only hand
their work to the writer thread, and the quick reads, which need no wait: SPEC §1.4).
Work is queued in *lanes* — a
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


_PENDING, _RUNNING, _CANCELLED, _FINISHED = range(4)


class Done:
    """The outcome of one job submitted with ``on_done`` — the few ``Future`` methods the
    server reads, without ``Future``'s lock and condition (one per request otherwise).
    ``on_done`` is called exactly once, in the thread that settled the job: the worker,
    or whoever dropped it while queued (``cancel_queued``, ``forget``, ``shutdown``)."""

    __slots__ = ("_state", "_value", "_exc", "_on_done")

    def __init__(self, on_done: Callable[[Done], Any]) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._exc: BaseException | None = None
        self._on_done: Callable[[Done], Any] | None = on_done

    def set_running_or_notify_cancel(self) -> bool:
        if self._state == _CANCELLED:
            return False
        self._state = _RUNNING
        return True

    def _settle(self, state: int) -> None:
        self._state = state
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            try:
                on_done(self)
            except Exception:  # noqa: BLE001 - a waiter's bug never kills the worker
                log.exception("a job's completion callback failed")

    def set_result(self, value: Any) -> None:
        self._value = value
        self._settle(_FINISHED)

    def set_exception(self, exc: BaseException) -> None:
        self._exc = exc
        self._settle(_FINISHED)

    def cancel(self) -> bool:
        if self._state != _PENDING:
            return False
        self._settle(_CANCELLED)
        return True

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def done(self) -> bool:
        return self._state in (_CANCELLED, _FINISHED)

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> Any:
        if self._exc is not None:
            raise self._exc
        return self._value


class _Job:
    __slots__ = ("fn", "future", "lane", "hold")

    def __init__(self, fn: Callable[[], Any], lane: _Lane, hold: bool | Callable[[Any], bool],
                 on_done: Callable[[Done], Any] | None = None) -> None:
        self.fn = fn
        self.future: Future[Any] | Done = Future() if on_done is None else Done(on_done)
        self.lane = lane
        self.hold = hold


class _Lane:
    __slots__ = ("key", "queue", "busy", "held")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.queue: deque[_Job] = deque()
        self.busy = False
        #: the future of the job that returned but still holds the lane
        self.held: Any = None


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
        #: wake-ups issued (notified or started threads) not yet taken up by a worker
        self._signalled = 0
        self._running = 0
        self._closed = False

    # ------------------------------------------------------------ submitting

    def submit(self, lane: Hashable, fn: Callable[[], Any], *,
               hold: bool | Callable[[Any], bool] = False,
               on_done: Callable[[Done], Any] | None = None) -> Any:
        """Queue ``fn`` on ``lane``; its future completes with ``fn()``. With ``hold`` the
        lane stays busy after ``fn`` returned until ``release(lane)``; ``hold`` may be a
        predicate of the result (hold only when the answer is not finished yet), so a
        lane of finished answers runs its next job at once in the same worker, without
        waiting for the loop to release it. With ``on_done`` the answer is a lock-free
        ``Done`` that calls it once settled, instead of a ``concurrent.futures.Future``."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the work pool is closed")
            ln = self._lanes.get(lane)
            if ln is None:
                ln = self._lanes[lane] = _Lane(lane)
            job = _Job(fn, ln, hold, on_done)
            ln.queue.append(job)
            if not ln.busy and len(ln.queue) == 1:
                self._ready.append(ln)
                self._wake_locked(0)
            return job.future

    def _wake_locked(self, taken: int) -> None:
        """A lane became ready: wake an idle worker for it, or start one, unless enough
        workers are already on their way (``taken``: 1 when the caller is a worker about
        to take the next ready lane itself). A job queued behind a busy lane wakes
        nobody: only one job of a lane runs at a time, and its worker takes the next."""
        if len(self._ready) <= self._signalled + taken:
            return
        if self._idle > self._signalled:
            self._signalled += 1
            self._cv.notify()
        elif len(self._threads) < self.workers:
            t = threading.Thread(target=self._work, args=(True,), name=f"{self.name}-{len(self._threads) + 1}",
                                 daemon=True)
            self._threads.append(t)
            self._signalled += 1
            t.start()

    def release(self, lane: Hashable, future: Any) -> None:
        """The held job ``future`` of ``lane`` is finished: the lane's next job may run.
        A job that did not hold its lane (it failed, or was cancelled) is ignored."""
        with self._cv:
            ln = self._lanes.get(lane)
            if ln is None or ln.held is not future:
                return
            ln.held = None
            self._done_locked(ln)

    def cancel_queued(self, lane: Hashable, future: Any) -> bool:
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

    def waiting(self, lane: Hashable) -> int:
        """Jobs queued on ``lane`` behind the running one (a lock-free glance: a hint)."""
        ln = self._lanes.get(lane)
        return len(ln.queue) if ln is not None else 0

    def threads(self) -> int:
        return len(self._threads)

    # ------------------------------------------------------------ workers

    def _done_locked(self, ln: _Lane, by_worker: bool = False) -> None:
        ln.busy = False
        if ln.queue:
            self._ready.append(ln)
            self._wake_locked(1 if by_worker else 0)
        else:
            self._lanes.pop(ln.key, None)

    def _work(self, started: bool = False) -> None:
        if started:
            with self._cv:
                self._signalled -= 1
        while True:
            with self._cv:
                while not self._ready and not self._closed:
                    self._idle += 1
                    self._cv.wait()  # woken by notify() only: one signal taken up
                    self._idle -= 1
                    self._signalled = max(0, self._signalled - 1)
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
                        self._done_locked(ln, by_worker=True)
                    job.future.set_exception(exc)
                else:
                    with self._cv:  # held before anyone can hear of the result and release
                        self._running -= 1
                        hold = job.hold
                        if hold is True or (hold is not False and hold(result)):
                            ln.held = job.future
                        else:
                            self._done_locked(ln, by_worker=True)
                    job.future.set_result(result)
            else:
                with self._cv:
                    self._running -= 1
                    self._done_locked(ln, by_worker=True)
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
