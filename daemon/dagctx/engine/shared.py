"""What every connection of one daemon shares: one open store per database and its caches.

A per-user daemon serves many clients (SPEC §1.4); each has its own ``EngineCore``
(options, capabilities, models, the peer it may ask to sample), but two connections
naming the same database file use one ``Store`` — one graph cache, one token-count
cache, one registry of renders — so the second client pays nothing the first already
paid. ``open_store`` is the one place a store is constructed, so a different backend
slots in here.

How the store is called (SPEC §1.4): never on the event loop for a write. Each open
database has ONE writer thread (``dagctx.ledger.writer``: group commit of appends from
every connection, and every other write in queue order) reached through
``OpenDatabase.calls`` (awaitables), and an ``executor`` of a few threads where the
server runs that database's light reads. A database that is locked by another process
or a PostgreSQL server that stopped answering holds only its own threads.

Architecture Invariant: no SQL and no JSON-RPC here.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dagctx.context.cancel import stop_if_cancelled
from dagctx.ledger import AppendOutcome, AppendRequest, NodeDerived, Store, names_a_file
from dagctx.ledger.backends import open_backend
from dagctx.ledger.writer import Done, Writer
from dagctx.protocol.nodes import NodeInput

from .watch import told_nobody

T = TypeVar("T")

#: threads per database for the server's light reads (``OpenDatabase.executor``)
READ_THREADS = 2

#: Set by the server in the context of a ``node/append`` or ``node/appendBatch``: called on
#: the loop once the append is in its database's writer queue. The writer runs its queue in
#: order, so the connection's next append may be handed over from then on, without waiting
#: for this one's commit (SPEC §1.4, §4.2): a pipelining client's appends share a group.
APPEND_QUEUED: ContextVar[Callable[[], None] | None] = ContextVar("dagctx_append_queued", default=None)

#: An append whose payload is at most this long may be committed on the event loop when the
#: database's writer is idle (``StoreCalls._unit``, SPEC §4.2): its search row and commit
#: take well under a millisecond there, against two thread hand-offs.
ALONE_APPEND_CHARS = 16_000

#: Payloads larger than this are tokenized and mined for references (SPEC §8) in a worker
#: thread, off the event loop: 64 KB of identifier-dense text costs about 20 ms of each.
BIG_PAYLOAD_CHARS = 64_000

#: Set by the server beside ``APPEND_QUEUED``: whether this append is still the last its
#: connection sent. One with more behind it (a pipelining client) goes to the writer's queue,
#: where they share a group commit (SPEC §4.2), instead of committing alone.
APPEND_LAST: ContextVar[Callable[[], bool] | None] = ContextVar("dagctx_append_last", default=None)


def open_store(path: str, *, create_parent: bool, timeout: float | None = None) -> Store:
    """The store of a database path or ``postgresql://`` URL (SPEC §2.1; the ledger picks
    the backend). ``timeout``: how long a request waits for its database (None: default)."""
    store = Store(backend=open_backend(path, create_parent=create_parent, timeout=timeout))
    store.checkpoint = stop_if_cancelled  # a cancelled view stops in a graph load too
    return store


def _settle(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in items:
        if fut.done():
            continue  # cancelled meanwhile
        if type(fut) is QueuedAppend:
            fut.land(ok, value)  # its answer now, not at a later turn of the loop
        elif ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _notify(done: list[Done]) -> None:
    """From the writer thread: wake each event loop once for the whole group."""
    by_loop: dict[Any, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for waiter, ok, value in done:
        loop, fut = waiter
        by_loop.setdefault(loop, []).append((fut, ok, value))
    for loop, items in by_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_settle, items)


def _queued() -> None:
    note = APPEND_QUEUED.get()
    if note is not None:
        note()


def _last_sent() -> bool:
    """Whether this append is the last its connection sent (``APPEND_LAST``; True when no
    connection says otherwise)."""
    last = APPEND_LAST.get()
    return last is None or last()


def _alone_now() -> bool:
    """Whether an append may be the whole of its group: the last its connection sent, and
    the event loop has nothing else ready to run (another connection's request on its way
    to the writer would otherwise miss the group it could share). asyncio keeps what is
    ready in ``loop._ready``; a loop without it counts as having nothing ready."""
    last = APPEND_LAST.get()
    if last is not None and not last():
        return False
    return not getattr(asyncio.get_running_loop(), "_ready", None)


def _cancelled(waiter: Any) -> bool:
    return waiter[1].cancelled()


class StoreCalls:
    """The awaitable writes of one database, run by its writer thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.writer = Writer(store, _notify, _cancelled)

    def _waiter(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        return loop, loop.create_future()

    async def write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the writer thread, after the writes queued before it."""
        waiter = self._waiter()
        self.writer.call(lambda: fn(*args, **kwargs), waiter)
        return await self._outcome(waiter)

    async def append(self, session_id: str, node: NodeInput, *, move_head: bool | None = None,
                     derived: NodeDerived | None = None, alone: bool = False,
                     derive: Callable[[], NodeDerived] | None = None) -> AppendOutcome:
        """One append, committed with whatever other appends are waiting (group commit).
        ``alone``: small enough to commit on the loop when nothing else is (``_unit``).
        ``derive``: computes ``derived`` where the unit runs (``AppendRequest.derive``)."""
        out = await self._unit(AppendRequest(session_id, (node,), move_head, (derived,),
                                             derive=None if derive is None else lambda: (derive(),)), alone)
        return out[0]

    async def append_batch(self, session_id: str, nodes: Sequence[NodeInput], *, move_head: bool | None = None,
                           derived: Sequence[NodeDerived | None] | None = None,
                           alone: bool = False,
                           derive: Callable[[], Sequence[NodeDerived | None]] | None = None) -> list[AppendOutcome]:
        """Nodes of one session, all or none, in the next group."""
        return await self._unit(AppendRequest(session_id, tuple(nodes), move_head, derived, batch=True,
                                              derive=derive), alone)

    def start_unit(self, unit: AppendRequest, alone: bool,
                   finish: Callable[[list[AppendOutcome]], T]) -> Awaitable[T]:
        """``finish(await self._unit(unit, alone))``, with the unit in the writer's queue
        before this returns unless it may be the whole of its group (``alone``, and the last
        its connection sent: whether it is alone is decided at the coroutine's first step,
        ``_unit``, once the loop has run what was ready — as for one client appending in turn).
        A pipelining client's appends thus reach the queue as their frames are read, in
        order, not one turn of the event loop each (SPEC §4.2); the answer is a
        ``QueuedAppend``, which needs no task."""
        if alone and _last_sent():
            return self._finished(self._unit(unit, alone), finish)
        queued = QueuedAppend(self.writer, asyncio.get_running_loop(), finish)
        self.writer.append(unit, queued.waiter)
        _queued()
        return queued

    @staticmethod
    async def _finished(outcomes: Awaitable[list[AppendOutcome]],
                        finish: Callable[[list[AppendOutcome]], T]) -> T:
        return finish(await outcomes)

    async def _unit(self, unit: AppendRequest, alone: bool) -> list[AppendOutcome]:
        """A unit of the next group commit (SPEC §4.2). When ``alone`` and the writer is
        idle — no commit in flight, nothing queued — it is the whole group: committed here,
        on the loop, without the two thread hand-offs (``Writer.run_alone``; only when no
        lock, server or sync makes it wait). Acknowledged after its commit either way; run
        here, no cancel can come between its commit and its answer (SPEC §1.4)."""
        if alone and _alone_now():
            out = self.writer.run_alone(unit)
            if out is not None:
                _queued()
                if isinstance(out, BaseException):
                    raise out
                return out
        waiter = self._waiter()
        self.writer.append(unit, waiter)
        _queued()
        result: list[AppendOutcome] = await self._outcome(waiter)
        return result

    async def _outcome(self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]) -> Any:
        """How a queued write ended. A cancel (SPEC §1.4) takes it out of the queue when it
        is still there — then nothing is written and the request answers RequestCancelled;
        once the writer thread has it, it is committed or refused as if never cancelled,
        and that is the answer: "cancelled, nothing was written" would otherwise go out for
        a write that was committed."""
        fut = waiter[1]
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done() and self.writer.withdraw(waiter):
                fut.cancel()
                raise
        while not fut.done():  # the writer has it: its outcome is the answer
            try:
                await asyncio.wait([fut])
            except asyncio.CancelledError:
                continue  # cancelled again: still written or refused by then
        return fut.result()

    def close(self) -> None:
        self.writer.close()


class QueuedAppend(asyncio.Future):  # type: ignore[type-arg]
    """A request's answer whose unit is in its database's writer queue already
    (``StoreCalls.start_unit``): ``finish(outcomes)`` once the writer has run it, its error
    otherwise. It is its own waiter in the queue (``waiter``): the writer's word settles it
    directly (``land``, from ``_settle`` on the loop), with no future in between and no turn
    of the loop for it — a group commit's appends are answered in the turn that hears of it.
    Cancelling it (SPEC §1.4) takes the unit out of the queue while it is still there —
    nothing is written, the request answers RequestCancelled; once the writer has it, the
    cancel is refused and what the writer did is the answer, as ``StoreCalls._outcome``
    says of a queued write."""

    def __init__(self, writer: Writer, loop: asyncio.AbstractEventLoop, finish: Callable[[Any], Any]) -> None:
        super().__init__(loop=loop)
        self._writer = writer
        self._finish = finish
        #: what the writer's queue holds for it and hands back to ``_notify``
        self.waiter = (loop, self)

    def land(self, ok: bool, value: Any) -> None:
        """The writer ran it (on the loop): ``finish`` of its outcomes, or its error."""
        if self.done():
            return
        if not ok:
            self.set_exception(value)
            return
        try:
            result = self._finish(value)
        except Exception as err:  # noqa: BLE001 - the request's own error
            self.set_exception(err)
            return
        self.set_result(result)

    def cancel(self, msg: Any = None) -> bool:
        if self.done() or not self._writer.withdraw(self.waiter):
            return False
        return super().cancel(msg)


@dataclass
class AutoState:
    """Automatic compaction of one session: consecutive failures and the pause they cause."""

    failures: int = 0
    paused_until: float = 0.0
    last_error: str | None = None


@dataclass
class CompactionState:
    """The automatic-compaction cooldowns of one database's sessions (``compaction_pipeline``)."""

    auto: dict[str, AutoState] = field(default_factory=dict)

    def auto_paused(self, session_id: str) -> float:
        st = self.auto.get(session_id)
        return max(0.0, st.paused_until - time.time()) if st else 0.0


@dataclass
class ViewCaches:
    """The rebuildable caches of ``ContextService`` for one database (see views.py)."""

    renders: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    by_session: dict[str, Any] = field(default_factory=dict)
    tokens: dict[tuple[str, str], dict[str, tuple[int, int]]] = field(default_factory=dict)
    prefixes: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    updates_seen: dict[tuple[str, str], tuple[object, int]] = field(default_factory=dict)
    #: session id → code node id → its ranked references (SPEC §8); and per session the
    #: newest seq and the number of graph updates they were read up to
    refs: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    refs_seen: dict[str, tuple[int, int, object]] = field(default_factory=dict)
    aging: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    texts: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)
    #: session id → the stored character counts of its nodes (``TokenAccounting.node_chars``)
    chars: dict[str, Any] = field(default_factory=dict)

    def drop_session(self, session_id: str) -> None:
        """Forget what the views derived from one session (its graph was evicted); a
        ``renderId`` stays resolvable (its record is small and a later append names it)."""
        for cache in (self.tokens, self.prefixes, self.updates_seen, self.aging):
            for key in [k for k in list(cache) if k and k[0] == session_id]:
                cache.pop(key, None)
        self.refs.pop(session_id, None)
        self.refs_seen.pop(session_id, None)
        self.chars.pop(session_id, None)


@dataclass
class OpenDatabase:
    """One open database and what hangs off it; ``users`` counts the connections on it."""

    key: str
    store: Store
    caches: ViewCaches = field(default_factory=ViewCaches)
    compaction: CompactionState = field(default_factory=CompactionState)
    users: int = 0
    #: the writes (group commit), awaitable; see the module docstring
    calls: StoreCalls = field(init=False)
    #: where the server runs this database's light (synchronous) reads
    executor: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.calls = StoreCalls(self.store)
        self.executor = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="dagctx-db")

    def told_nobody(self, session_id: str) -> None:
        """A write to a session no connection watches was announced (``watch.told_nobody``)."""
        told_nobody(self.store, session_id)

    def cached_graphs(self) -> list[tuple[str, int, float]]:
        """``(session id, bytes, last used)`` of every session graph held in memory."""
        return self.store.cached_graphs()

    def evict(self, session_id: str) -> bool:
        """Drop a session's cached graph and what the views derived from it (the next read
        rebuilds both from the database)."""
        if not self.store.evict(session_id):
            return False
        self.caches.drop_session(session_id)
        return True

    def cached_counts(self) -> tuple[int, int, int]:
        """``(sessions, nodes, bytes)`` of the graphs this database holds in memory (daemon/status)."""
        return self.store.cached_counts()

    def close(self) -> None:
        self.calls.close()
        self.executor.shutdown(wait=True, cancel_futures=True)
        with self.store.lock:
            self.store.close()


def _key(path: str) -> str:
    return os.path.realpath(path) if names_a_file(path) else path


class EngineShared:
    """The daemon-wide state: open databases by real path, reference-counted."""

    def __init__(self) -> None:
        self._open: dict[str, OpenDatabase] = {}
        self._lock = threading.Lock()

    def acquire(self, path: str, *, create_parent: bool, timeout: float | None = None) -> OpenDatabase:
        """The open database of ``path`` (opened on first use), counted as one more user.
        ``timeout`` applies when this call opens it (the first user's)."""
        key = _key(path)
        with self._lock:
            db = self._open.get(key)
            if db is None or key == ":memory:":
                db = OpenDatabase(key, open_store(path, create_parent=create_parent, timeout=timeout))
                if key != ":memory:":
                    self._open[key] = db
            db.users += 1
            return db

    def release(self, db: OpenDatabase) -> None:
        """One user less. The store stays open (its caches stay warm for the next client)
        until ``close_all``: a view of a closed connection may still be running on it."""
        with self._lock:
            db.users = max(0, db.users - 1)
            if db.key == ":memory:" and db.users == 0:
                db.close()

    def warnings(self) -> list[str]:
        """What ``daemon/status`` warns about the open databases, as each backend says (a
        SQLite file other users may read: SPEC §2.1, what dagctx creates is 0600; an older or
        copied file may not be)."""
        return [w for db in self.databases() for w in db.store.warnings()]

    def close_unused(self, db: OpenDatabase) -> bool:
        """Close ``db`` when no connection uses it (its caches go with it); the next
        ``acquire`` opens it afresh. False when someone acquired it meanwhile."""
        with self._lock:
            if db.users > 0 or self._open.get(db.key) is not db:
                return False
            del self._open[db.key]
        with db.store.lock:
            db.store.close()
        db.caches = ViewCaches()
        from . import memory_vectors  # its vector matrices are caches of this database too

        memory_vectors.forget(db.key)
        return True

    def databases(self) -> list[OpenDatabase]:
        with self._lock:
            return list(self._open.values())

    def open_database(self, key: str) -> OpenDatabase | None:
        """The open database of ``key`` (a real path or URL), or None: one lookup, for what
        runs once per write (``Hub.changed``)."""
        return self._open.get(key)

    def close_all(self) -> None:
        """Close every store (the daemon is ending)."""
        with self._lock:
            dbs = list(self._open.values())
            self._open.clear()
        for db in dbs:
            db.close()
