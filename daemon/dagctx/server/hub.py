"""What the connections of one daemon share: the registry, subscriptions, the worker.

A per-user daemon (SPEC §1) serves many connections on one event loop. The hub

* numbers connections (``c1``, ``c2`` …: the ``origin`` notifications carry) and lists
  them for ``daemon/status``;
* keeps subscriptions: a ``Watch`` per subscribed (database, session) holds the
  engine's cursor of what its subscribers have heard (``engine/watch.py``'s
  ``SessionWatch``: newest seq, updates, HEAD, title) and ``changed`` sends exactly
  what is new — after a write of this daemon at once, and every
  ``POLL_SECONDS`` for writes of other processes on the same file (another daemon, a
  standalone CI run), so they reach subscribers within 250 ms; a poll leaves a session
  alone while a write of this daemon to it is not yet announced (the store's
  ``WriteMarks``), so this daemon's nodes always carry their origin;
* owns the work pool (``pool.FairPool``) where every request runs off the event loop;
* bounds the session graphs the open databases cache (``DAGCTX_CACHE_BYTES``, least
  recently used evicted first; a database nobody uses is closed after
  ``DAGCTX_CACHE_IDLE_SECONDS``);
* arms the idle timer and stops the daemon (``daemon/stop``, SIGTERM, idle).

Architecture Invariant: only the server knows JSON-RPC; the hub encodes each
notification once and hands the same bytes to every subscriber.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dagctx.engine.shared import EngineShared
from dagctx.engine.watch import SessionWatch
from dagctx.protocol import codec
from dagctx.protocol import messages as m
from dagctx.protocol.version import PROTOCOL_VERSION, __version__

from . import guards
from .pool import FairPool
from .quick import QuickReads


class DagctxProtocol(Protocol):
    """What the hub uses of one connection (``jsonrpc_server.DagctxProtocol``): the hub
    sits below the connections it serves and never imports them."""

    connection_id: str | None

    def write_bytes(self, data: bytes) -> None: ...

    def client_status(self) -> m.ClientStatus: ...


log = logging.getLogger("dagctx.server")

#: How often other processes' writes to a watched session are looked for.
POLL_SECONDS = 0.1
#: Seconds a database stays open with no connection on it before it is closed and its
#: caches are freed (``DAGCTX_CACHE_IDLE_SECONDS``): memory returns when clients leave.
CACHE_IDLE_SECONDS = 60.0
#: The bound on the session graphs the open databases cache, in stored bytes
#: (``DAGCTX_CACHE_BYTES``); past it the least recently used go (SPEC §1.6).
CACHE_BYTES = 256 * 2**20
#: A graph used this recently is in use (a view may be walking it): never evicted.
IN_USE_SECONDS = 1.0
#: Polls between two looks at the cache bound.
TRIM_EVERY = 10
#: the tokenizers' warm-up waits for this long without input or a request in flight
QUIET_SECONDS = 0.25


def _proc_status() -> tuple[int, int]:
    """(RSS, peak RSS) in bytes from ``/proc/self/status``; zeros where there is none."""
    rss = peak = 0
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss, peak


def _give_back_memory(unfreeze: bool = False) -> None:
    """Empty the views' memo caches (``functools.lru_cache``s of dagctx modules: they only
    hold what can be recomputed) except those marked ``keep_when_idle`` (the tokenizers'
    encoders are not memo caches: ``context/tokens.py`` keeps them for the process, since
    rebuilding one holds the interpreter lock throughout), collect garbage and hand freed heap pages back to the
    system (glibc ``malloc_trim``)."""
    import functools
    import gc
    import sys

    for name, module in list(sys.modules.items()):
        if not name.startswith(("dagctx.context", "dagctx.engine", "dagctx.transcripts")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, functools._lru_cache_wrapper) and not getattr(value, "keep_when_idle", False):
                value.cache_clear()
    if unfreeze:
        # renders and big graph loads freeze what they allocated (engine/views.py, the
        # store's graph cache) so no collection walks it mid-request; with no database
        # open any more, one full collection may walk what is left of it
        gc.unfreeze()
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class Watch:
    """The subscribers of one session of one database and the engine's cursor of what
    they were told (``SessionWatch``)."""

    database: str
    cursor: SessionWatch
    subscribers: set[DagctxProtocol] = field(default_factory=set)
    #: one diff at a time (a writer's worker, the poller's job)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: a poll of this watch is queued or running in the pool
    polling: bool = False

    @property
    def session_id(self) -> str:
        return self.cursor.session_id


class Hub:
    def __init__(
        self,
        shared: EngineShared | None = None,
        *,
        mode: str = "standalone",
        socket: str | None = None,
        log_path: str | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.shared = shared or EngineShared()
        self.mode = mode
        self.socket = socket
        self.log_path = log_path
        self.idle_timeout = idle_timeout
        self.started_at = time.time()
        self.connections: dict[str, DagctxProtocol] = {}
        self._ids = itertools.count(1)
        self.watches: dict[tuple[int, str], Watch] = {}
        #: work before a connection has a database (initialize, big frames of a new client)
        self.pool = FairPool(name="dagctx-work")
        #: request handlers (but appends and quick reads) run off the loop in their database's
        #: pool, the connections served in turn: one database's trouble holds only its own threads
        self.pools: dict[str, FairPool] = {}
        self._pools_lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._poller: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self.stopped: asyncio.Future[str] | None = None
        self.baseline_rss = 0
        #: when a client last sent anything (``Incoming.feed``): the warm-up waits for quiet
        self.last_input = time.monotonic()
        try:
            self.cache_idle = float(os.environ.get("DAGCTX_CACHE_IDLE_SECONDS") or CACHE_IDLE_SECONDS)
        except ValueError:
            self.cache_idle = CACHE_IDLE_SECONDS
        try:
            self.cache_bytes = max(0, int(os.environ.get("DAGCTX_CACHE_BYTES") or CACHE_BYTES))
        except ValueError:
            self.cache_bytes = CACHE_BYTES
        self._trimming = False
        #: database key → when its last connection left
        self._unused_since: dict[str, float] = {}
        self._release: asyncio.TimerHandle | None = None
        #: calls posted to the loop by other threads (``post``), run in order
        self._posted: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._post_armed = False
        #: the quick reads' account: which may run on the loop, how many did (SPEC §1.4)
        self.quick = QuickReads()

    # ------------------------------------------------------------ running

    def start(self) -> None:
        """Bind to the running loop; start the poller (and the idle timer when shared)."""
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.stopped = self.loop.create_future()
        self._poller = self.loop.create_task(self._poll_forever())
        self.baseline_rss = _proc_status()[0]
        self._arm_idle()
        if self.mode == "shared":
            threading.Thread(target=self._warm_up, name="dagctx-warm-up", daemon=True).start()

    # ------------------------------------------------------------ warm-up

    def _warm_up(self) -> None:
        """The tokenizers' encoders, built before a request needs them (a thread of its own,
        started with the shared daemon): building one holds the interpreter lock for
        0.15–0.3 s, which every connection would feel in the middle of its work (the first
        append of a 50 MB output, say). Built at quiet moments (``wait_quiet``), so the
        first client's ``initialize`` is not slowed either."""
        from dagctx.context.tokens import default_counter

        try:
            built = default_counter().warm_up(self.wait_quiet)
        except Exception as exc:  # a vocabulary that cannot be read: a request says so later
            log.warning("tokenizers not built ahead of need: %s", exc)
            return
        if self.stopped is not None and self.stopped.done():
            return  # gave up: the daemon is stopping
        # a start-up milestone, logged like "listening" whatever --log-level says (and when
        # requests built every encoder first, so a reader can wait for this line either way)
        log.warning("tokenizers ready: %s", ", ".join(built) + " (built at a quiet moment, before a request "
                    "needed them)" if built else "every encoder was built by a request first")

    def wait_quiet(self) -> bool:
        """From a thread other than the loop's: wait until no client has sent anything for
        ``QUIET_SECONDS`` and no request is in flight; False once the daemon stops."""
        while True:
            if self.stopped is not None and self.stopped.done():
                return False
            idle = time.monotonic() - self.last_input
            if idle >= QUIET_SECONDS and not any(c._request_futures for c in list(self.connections.values())):
                return True
            time.sleep(max(0.02, QUIET_SECONDS - idle))

    def on_loop(self) -> bool:
        return self._loop_thread is None or threading.get_ident() == self._loop_thread

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the event loop (now when already there; else thread-safely)."""
        if self.on_loop() or self.loop is None:
            fn(*args)
        else:
            self.post(fn, *args)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """From any thread: run ``fn`` on the loop soon, in posting order. Calls posted
        while the loop has not yet run the earlier ones share one wake-up of the loop, so
        a worker finishing a run of small requests costs the loop one wake-up, not one
        per answer."""
        loop = self.loop
        if loop is None:
            fn(*args)
            return
        self._posted.append((fn, args))
        if not self._post_armed:
            self._post_armed = True
            try:
                loop.call_soon_threadsafe(self._run_posted)
            except RuntimeError:  # the loop is closed: the daemon is ending
                self._post_armed = False

    def _run_posted(self) -> None:
        self._post_armed = False  # first: a call posted from now on arms a new wake-up
        posted = self._posted
        while posted:
            fn, args = posted.popleft()
            try:
                fn(*args)
            except Exception:  # one failing callback never costs the others
                log.exception("callback %r failed on the loop", fn)

    def request_stop(self, why: str) -> None:
        if self.stopped is not None and not self.stopped.done():
            log.warning("stopping: %s", why)
            self.stopped.set_result(why)

    async def close(self) -> None:
        if self._release is not None:
            self._release.cancel()
        if self._poller is not None:
            self._poller.cancel()
        if self._idle is not None:
            self._idle.cancel()
        for pool in [self.pool, *self.pools.values()]:
            pool.shutdown()
        self.shared.close_all()

    def pool_for(self, database: str | None) -> FairPool:
        """The work pool of a database (by its key), made on first use."""
        if database is None:
            return self.pool
        pool = self.pools.get(database)
        if pool is None:
            with self._pools_lock:
                pool = self.pools.get(database)
                if pool is None:
                    pool = self.pools[database] = FairPool(name=f"dagctx-db{len(self.pools) + 1}")
        return pool

    def queue_depth(self) -> tuple[int, int]:
        """(jobs queued, jobs running) over every pool."""
        queued = running = 0
        for pool in [self.pool, *list(self.pools.values())]:
            q, r = pool.depth()
            queued += q
            running += r
        return queued, running

    # ------------------------------------------------------------ connections

    def register(self, conn: DagctxProtocol) -> str:
        cid = f"c{next(self._ids)}"
        self.connections[cid] = conn
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        return cid

    def unregister(self, conn: DagctxProtocol) -> None:
        self.connections.pop(conn.connection_id, None)
        for key, w in list(self.watches.items()):
            w.subscribers.discard(conn)
            if not w.subscribers:
                del self.watches[key]
        self._arm_idle()
        self._arm_release()

    # ------------------------------------------------------------ memory

    def _arm_release(self) -> None:
        """Look again for databases nobody uses once the youngest could have idled out."""
        if self.loop is None or self.mode != "shared":
            return
        now = time.monotonic()
        for db in self.shared.databases():
            if db.users <= 0:
                self._unused_since.setdefault(db.key, now)
            else:
                self._unused_since.pop(db.key, None)
        if self._unused_since and self._release is None:
            due = min(self._unused_since.values()) + self.cache_idle - now
            self._release = self.loop.call_later(max(0.05, due), self._release_unused)

    def _release_unused(self) -> None:
        """Close every database no connection has used for ``cache_idle`` seconds: its
        graphs, view caches, connections and pool go, and the freed memory goes back to
        the system (the next client reopens it; the record is all in the database)."""
        self._release = None
        now = time.monotonic()
        closed = []
        for db in self.shared.databases():
            since = self._unused_since.get(db.key)
            if db.users > 0 or since is None or now - since < self.cache_idle:
                continue
            pool = self.pools.get(db.key)
            if pool is not None and pool.depth() != (0, 0):
                continue  # a view of a gone connection still runs: next time
            if any(w.database == db.key for w in self.watches.values()):
                continue
            if self.shared.close_unused(db):
                closed.append(db.key)
                self._unused_since.pop(db.key, None)
                pool = self.pools.pop(db.key, None)
                if pool is not None:
                    pool.shutdown()
        if closed:
            log.info("closed %d database(s) no client used for %g s: %s", len(closed), self.cache_idle,
                     ", ".join(closed))
            _give_back_memory(unfreeze=not self.shared.databases())
        self._arm_release()

    def _trim_soon(self) -> None:
        """Look at the cache bound in the pool (the store's lock is never taken on the loop)."""
        if self._trimming:
            return
        self._trimming = True
        try:
            self.pool.submit(("trim",), self._trim_caches)
        except RuntimeError:
            self._trimming = False  # the pool is closed: the daemon is stopping

    def _trim_caches(self) -> None:
        """Evict the least recently used session graphs (and what the views derived from
        them) until the cached bytes are within ``cache_bytes``. A graph used in the last
        ``IN_USE_SECONDS`` or watched by a subscriber stays: the next read would only
        rebuild it. An evicted session is read again from the database when asked for."""
        try:
            watched = {(w.database, w.session_id) for w in list(self.watches.values())}
            total = 0
            candidates = []
            now = time.monotonic()
            for db in self.shared.databases():
                for sid, nbytes, used in db.cached_graphs():
                    total += nbytes
                    if (db.key, sid) not in watched and now - used >= IN_USE_SECONDS:
                        candidates.append((used, nbytes, sid, db))
            if total <= self.cache_bytes:
                return
            evicted = freed = 0
            for _used, nbytes, sid, db in sorted(candidates, key=lambda c: c[0]):
                if total <= self.cache_bytes:
                    break
                if db.evict(sid):
                    total -= nbytes
                    freed += nbytes
                    evicted += 1
            if evicted:
                log.info("evicted %d session graph(s) (%d bytes) over the cache bound of %d bytes", evicted,
                         freed, self.cache_bytes)
                _give_back_memory()
        except Exception as exc:  # a bound not kept this time is kept next time
            log.error("bounding the caches failed", exc_info=exc)
        finally:
            self._trimming = False

    def _arm_idle(self) -> None:
        if self.mode != "shared" or self.idle_timeout is None or self.loop is None or self.connections:
            return
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self.loop.call_later(self.idle_timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle = None
        if not self.connections:
            self.request_stop(f"no client connected for {self.idle_timeout:g} s (idle exit)")

    # ------------------------------------------------------------ subscriptions

    def subscribe(self, conn: DagctxProtocol, database: str, session_id: str,
                  open_cursor: Callable[[str], SessionWatch]) -> m.SubscribeResult:
        """Watch ``session_id`` of ``database`` (its key) for ``conn``; ``open_cursor`` is the
        engine's (``EngineCore.watch``): SessionNotFound for a bad id."""
        key = (database, session_id)
        w = self.watches.get(key)
        if w is None:
            w = Watch(database, open_cursor(session_id))
            self.watches[key] = w
        w.subscribers.add(conn)
        return m.SubscribeResult(session_id=session_id, subscribed=True, head=w.cursor.head)

    def unsubscribe(self, conn: DagctxProtocol, database: str, session_id: str) -> m.SubscribeResult:
        key = (database, session_id)
        w = self.watches.get(key)
        if w is not None:
            w.subscribers.discard(conn)
            if not w.subscribers:
                del self.watches[key]
        return m.SubscribeResult(session_id=session_id, subscribed=False)

    def sessions_of(self, conn: DagctxProtocol) -> list[str]:
        return sorted(w.session_id for w in self.watches.values() if conn in w.subscribers)

    def changed(self, database: str, session_id: str, origin: str | None,
                written: frozenset[str] = frozenset()) -> None:
        """A write of ``origin`` touched the session: tell its subscribers what is new.

        Nodes named in ``written`` carry ``origin``; any other new node came from
        another process (``origin: null``). Called in the worker that wrote, the reads
        run there (before its answer is queued, so the writer's subscribers hear of a
        write before its answer); called on the loop, they go to the pool: the loop
        never reads storage.
        """
        w = self.watches.get((database, session_id))
        if w is None:
            db = self.shared.open_database(database)
            if db is not None:
                db.told_nobody(session_id)  # this write's announcement is done: nobody to tell
            return
        if self.on_loop() and self.loop is not None:
            self.pool_for(database).submit(("watch", database, session_id),
                                           lambda: self._diff_locked(w, origin, written))
        else:
            self._diff_locked(w, origin, written)

    def _diff_locked(self, w: Watch, origin: str | None, written: frozenset[str], *, poll: bool = False) -> None:
        with w.lock:
            self._diff(w, origin, written, poll)

    def _diff(self, w: Watch, origin: str | None, written: frozenset[str], poll: bool = False) -> None:
        """Send what is new since the subscribers last heard (the engine's cursor decides,
        ``SessionWatch.changes``; a poll, ``poll``, is for other processes' writes)."""
        for method, params in w.cursor.changes(origin, written, poll=poll):
            self._send(w, method, params)
        if w.cursor.deleted:
            self.watches.pop((w.database, w.session_id), None)

    def _send(self, w: Watch, method: str, params: Any) -> None:
        data = guards.encode_message_safely(codec.Notification(method=method, params=params))
        self.call_on_loop(self._write_to, list(w.subscribers), data)

    @staticmethod
    def _write_to(conns: list[DagctxProtocol], data: bytes) -> None:
        for conn in conns:
            conn.write_bytes(data)

    def _poll(self, w: Watch) -> None:
        try:
            self._diff_locked(w, None, frozenset(), poll=True)
        except Exception as exc:  # a bad row must not end the watch
            log.error("watching session %s failed", w.session_id, exc_info=exc)
        finally:
            w.polling = False

    async def _poll_forever(self) -> None:
        """Every ``POLL_SECONDS``, each watch not already being looked at is diffed in the
        pool (a slow database delays its own watches, never the loop)."""
        rounds = 0
        while True:
            await asyncio.sleep(POLL_SECONDS)
            rounds += 1
            if rounds % TRIM_EVERY == 0:
                self._trim_soon()
            for w in list(self.watches.values()):
                if w.polling:
                    continue
                w.polling = True
                try:
                    self.pool_for(w.database).submit(("watch", w.database, w.session_id), lambda w=w: self._poll(w))
                except RuntimeError:
                    return  # the pool is closed: the daemon is stopping

    # ------------------------------------------------------------ status

    def status(self) -> m.DaemonStatus:
        now = time.time()
        rss, peak = _proc_status()
        queued, running = self.queue_depth()
        mono = time.monotonic()
        caches = []
        for db in self.shared.databases():
            sessions, nodes, nbytes = db.cached_counts()
            since = self._unused_since.get(db.key)
            caches.append(m.CacheStatus(
                database=db.key, users=db.users, sessions=sessions, nodes=nodes, bytes=nbytes,
                renders=len(db.caches.renders),
                idle_seconds=round(mono - since, 3) if since is not None and db.users <= 0 else None))
        clients = []
        for cid, conn in self.connections.items():
            clients.append(conn.client_status())
        return m.DaemonStatus(
            pid=os.getpid(),
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            mode="shared" if self.mode == "shared" else "standalone",
            socket=self.socket,
            log=self.log_path,
            started_at=self.started_at,
            uptime_seconds=round(now - self.started_at, 3),
            idle_timeout_seconds=self.idle_timeout if self.mode == "shared" else None,
            databases=sorted(db.key for db in self.shared.databases()),
            clients=clients,
            memory=m.MemoryStatus(rss_bytes=rss, peak_rss_bytes=peak, baseline_rss_bytes=self.baseline_rss,
                                  cache_limit_bytes=self.cache_bytes),
            queue=m.QueueStatus(queued=queued, running=running,
                                threads=sum(p.threads() for p in [self.pool, *list(self.pools.values())]),
                                answered_on_loop=self.quick.answered),
            caches=caches,
            warnings=self.shared.warnings(),
        )
