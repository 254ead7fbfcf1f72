"""The writer of one database: one thread that runs every write of this daemon to it,
committing appends in groups (SPEC §4.2).

Appends that arrive while a commit is in flight — from any connection — wait in the
queue and are committed together by the next group: one transaction, one sync, each
acknowledged only after that commit (``Store.append_group``: per-session seq and HEAD
as if appended one by one, failures isolated per unit). Any other write (``call``)
runs alone, in queue order with the appends around it. Waiting for the database (a
SQLite lock held by another process, a PostgreSQL server slow to answer) happens in
this thread only: it holds up the writers of this database and nobody else.

A lone append that finds the writer idle — nothing queued, nothing running — may run
on the submitter's own thread instead (``run_alone``): the group it would have formed is
itself, and the two thread hand-offs (there and back) were most of its wait when one
client appends in turn. Only when nothing makes it wait (``Store.append_alone``);
meanwhile the thread takes nothing, so queue order holds.

Completion is reported through ``notify``, once per group with every unit's result, so
the caller can wake its event loop once for the whole group. The ledger knows nothing
of the caller's waiters (an asyncio future and its loop, a threading event): they are
opaque here.

Architecture Invariant: no JSON-RPC and no SQL here (the store writes).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from dagctx.protocol.errors import DagctxError

from .appends import AppendOutcome, AppendRequest
from .store import Store

log = logging.getLogger("dagctx.ledger")

#: (waiter, ok, value): what ``notify`` receives for every finished item
Done = tuple[Any, bool, Any]

#: the most nodes one group commits (the rest go in the next group)
MAX_GROUP_NODES = 1024


def _retryable(exc: BaseException) -> bool:
    """A write refused because the database file was replaced under it: the store has
    reopened it (or will before the next write), so running it once more is right."""
    return isinstance(exc, DagctxError) and bool(exc.details and exc.details.get("reopen"))


class Writer:
    def __init__(self, store: Store, notify: Callable[[list[Done]], None],
                 cancelled: Callable[[Any], bool] = lambda waiter: False) -> None:
        self.store = store
        self._notify = notify
        self._cancelled = cancelled
        self._queue: deque[tuple[str, Any, Any]] = deque()
        self._cv = threading.Condition(threading.Lock())
        self._closed = False
        #: a write is running (in this thread, or a lone append in its submitter's)
        self._busy = False
        #: groups committed and units in them (``daemon/status``, benchmarks)
        self.groups = 0
        self.units = 0
        self._thread = threading.Thread(target=self._run, name="dagctx-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ submitting

    def append(self, unit: AppendRequest, waiter: Any) -> None:
        self._put(("append", unit, waiter))

    def run_alone(self, unit: AppendRequest) -> list[AppendOutcome] | BaseException | None:
        """Run ``unit`` now, on the caller's thread, when the writer is idle and the store
        can commit it without waiting (``Store.append_alone``): its outcomes, or the
        exception it answers — committed or refused exactly as by a group of one. None:
        not run (the writer is busy, or it would wait): ``append`` it — at once, its derived
        data not taken, when the store says at a glance that it would (``alone_likely``: the
        log near its checkpoint, a sync at COMMIT, PostgreSQL)."""
        if not self.store.alone_likely():
            return None
        with self._cv:
            if self._closed or self._queue or self._busy:
                return None
            self._busy = True
        result: list[AppendOutcome] | BaseException | None = None
        try:
            try:
                unit.derive_now()  # a group of itself: nothing to derive it beside
            except Exception as exc:  # its own error, as in a group
                result = exc
                return result
            result = self.store.append_alone(unit)
            if isinstance(result, BaseException) and _retryable(result):  # the file was replaced: the thread reopens it and runs it
                result = None
        finally:
            with self._cv:
                self._busy = False
                if result is not None:
                    self.groups += 1
                    self.units += 1
                if self._queue:
                    self._cv.notify()
        return result

    def call(self, fn: Callable[[], Any], waiter: Any) -> None:
        self._put(("call", fn, waiter))

    def _put(self, item: tuple[str, Any, Any]) -> None:
        with self._cv:
            if self._closed:
                raise DagctxError("StorageUnavailable", f"the database {self.store.path} is closing; retry",
                                  details={"database": self.store.path})
            self._queue.append(item)
            self._cv.notify()

    def withdraw(self, waiter: Any) -> bool:
        """Take a write whose ``waiter`` it is out of the queue: True when it was still
        there (it will never run), False when the thread has it already (it runs, or ran,
        and its waiter hears how it ended)."""
        with self._cv:
            for item in self._queue:
                if item[2] is waiter:
                    self._queue.remove(item)
                    return True
        return False

    @property
    def depth(self) -> int:
        """Writes waiting for the writer."""
        return len(self._queue)

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    # ------------------------------------------------------------ the thread

    def _take(self) -> list[tuple[str, Any, Any]] | None:
        with self._cv:
            while not self._queue or self._busy:
                if self._closed and not self._queue:
                    return None
                self._cv.wait()
            self._busy = True
            first = self._queue.popleft()
            if first[0] != "append":
                return [first]
            group = [first]
            n = len(first[1].nodes)
            while self._queue and self._queue[0][0] == "append" and n < MAX_GROUP_NODES:
                item = self._queue.popleft()
                group.append(item)
                n += len(item[1].nodes)
            return group

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                done = [self._run_call(items[0])] if items[0][0] == "call" else self._run_group(items)
            except BaseException as exc:  # never let the writer die: every waiter hears
                log.error("the writer of %s failed", self.store.path, exc_info=exc)
                done = [(w, False, exc) for _, _, w in items]
            with self._cv:
                self._busy = False  # before the waiters hear: the next lone append may run alone
            try:
                self._notify(done)
            except BaseException as exc:
                log.error("the writer of %s failed", self.store.path, exc_info=exc)
                try:
                    self._notify([(w, False, exc) for _, _, w in items])
                except BaseException:
                    pass

    def _run_call(self, item: tuple[str, Any, Any]) -> Done:
        _, fn, waiter = item
        if self._cancelled(waiter):
            return (waiter, False, None)
        for attempt in (1, 2):
            try:
                return (waiter, True, fn())
            except BaseException as exc:
                if attempt == 1 and _retryable(exc):
                    continue
                return (waiter, False, exc)
        raise AssertionError("unreachable")

    def _run_group(self, items: list[tuple[str, Any, Any]]) -> list[Done]:
        live = [it for it in items if not self._cancelled(it[2])]
        out: list[Done] = [(it[2], False, None) for it in items if self._cancelled(it[2])]
        if not live:
            return out
        derive_failed: list[Done] = []
        for it in [it for it in live if it[1].derive is not None]:
            try:
                it[1].derive_now()
            except Exception as exc:  # its own error: the group goes on without it (SPEC §4.2)
                live.remove(it)
                derive_failed.append((it[2], False, exc))
        out.extend(derive_failed)
        if not live:
            return out
        units = [it[1] for it in live]
        results = self.store.append_group(units)
        if any(_retryable(r) for r in results if isinstance(r, BaseException)):
            again = [k for k, r in enumerate(results) if isinstance(r, BaseException) and _retryable(r)]
            for k, r in zip(again, self.store.append_group([units[k] for k in again])):
                results[k] = r
        self.groups += 1
        self.units += len(units)
        for it, r in zip(live, results):
            out.append((it[2], not isinstance(r, BaseException), r))
        return out
