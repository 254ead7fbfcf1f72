"""What the connections of one daemon share: the registry, subscriptions, the worker.

A per-user daemon (SPEC §1) serves many connections on one event loop. The hub

* numbers connections (``c1``, ``c2`` …: the ``origin`` notifications carry) and lists
  them for ``daemon/status``;
* keeps subscriptions: a ``Watch`` per subscribed (database, session) remembers what
  its subscribers have heard (newest seq, updates, HEAD, title) and ``changed`` sends
  exactly what is new — after a write of this daemon at once, and every
  ``POLL_SECONDS`` for writes of other processes on the same file (another daemon, a
  standalone CI run), so they reach subscribers within 250 ms;
* owns the worker thread that runs heavy views off the event loop;
* arms the idle timer and stops the daemon (``daemon/stop``, SIGTERM, idle).

Architecture Invariant: only the server knows JSON-RPC; the hub encodes each
notification once and hands the same bytes to every subscriber.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dagctx.engine.shared import EngineShared
from dagctx.ledger import Store
from dagctx.ledger.graph import is_summary
from dagctx.protocol import codec
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.version import PROTOCOL_VERSION, __version__

from . import guards

if TYPE_CHECKING:
    from .jsonrpc_server import DagctxProtocol

log = logging.getLogger("dagctx.server")

#: How often other processes' writes to a watched session are looked for.
POLL_SECONDS = 0.1


@dataclass
class Watch:
    """What the subscribers of one session have been told so far."""

    store: Store
    session_id: str
    subscribers: set[DagctxProtocol] = field(default_factory=set)
    seq_seen: int = 0
    updates_seen: int = 0
    head: str | None = None
    title: str | None = None


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
        #: heavy views (render, prepare, search, replay) run here, one at a time
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dagctx-views")
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._poller: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self.stopped: asyncio.Future[str] | None = None

    # ------------------------------------------------------------ running

    def start(self) -> None:
        """Bind to the running loop; start the poller (and the idle timer when shared)."""
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.stopped = self.loop.create_future()
        self._poller = self.loop.create_task(self._poll_forever())
        self._arm_idle()

    def on_loop(self) -> bool:
        return self._loop_thread is None or threading.get_ident() == self._loop_thread

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the event loop (now when already there; else thread-safely)."""
        if self.on_loop() or self.loop is None:
            fn(*args)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def request_stop(self, why: str) -> None:
        if self.stopped is not None and not self.stopped.done():
            log.warning("stopping: %s", why)
            self.stopped.set_result(why)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._idle is not None:
            self._idle.cancel()
        self.worker.shutdown(wait=True, cancel_futures=True)
        self.shared.close_all()

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

    def subscribe(self, conn: DagctxProtocol, store: Store, session_id: str) -> m.SubscribeResult:
        info = store.get_session(session_id)  # SessionNotFound for a bad id
        key = (id(store), session_id)
        w = self.watches.get(key)
        if w is None:
            g = store.graph(session_id)
            w = Watch(store, session_id, seq_seen=g.by_seq[-1].seq if g.by_seq else 0,
                      updates_seen=len(g.updates), head=info.head, title=info.title)
            self.watches[key] = w
        w.subscribers.add(conn)
        return m.SubscribeResult(session_id=session_id, subscribed=True, head=info.head)

    def unsubscribe(self, conn: DagctxProtocol, store: Store, session_id: str) -> m.SubscribeResult:
        key = (id(store), session_id)
        w = self.watches.get(key)
        if w is not None:
            w.subscribers.discard(conn)
            if not w.subscribers:
                del self.watches[key]
        return m.SubscribeResult(session_id=session_id, subscribed=False)

    def sessions_of(self, conn: DagctxProtocol) -> list[str]:
        return sorted(w.session_id for w in self.watches.values() if conn in w.subscribers)

    def changed(self, store: Store, session_id: str, origin: str | None,
                written: frozenset[str] = frozenset()) -> None:
        """A write of ``origin`` touched the session: tell its subscribers what is new.

        Nodes named in ``written`` carry ``origin``; any other new node came from
        another process (``origin: null``). Safe to call from the worker thread.
        """
        if not self.on_loop():
            self.call_on_loop(self.changed, store, session_id, origin, written)
            return
        w = self.watches.get((id(store), session_id))
        if w is not None:
            self._diff(w, origin, written)

    def _diff(self, w: Watch, origin: str | None, written: frozenset[str]) -> None:
        sid = w.session_id
        try:
            info = w.store.get_session(sid)
            g = w.store.graph(sid)
        except DagctxError as err:
            if err.kind != "SessionNotFound":
                raise
            self._send(w, "session/didChange", m.SessionChange(session_id=sid, change="deleted", origin=origin))
            self.watches.pop((id(w.store), sid), None)
            return

        def who(node_id: str) -> str | None:
            return origin if not written or node_id in written else None

        start = bisect.bisect_right(g.by_seq, w.seq_seen, key=lambda n: n.seq)
        for node in g.by_seq[start:]:
            self._send(w, "node/didAppend", m.NodeNotification(session_id=sid, node=node, head=info.head,
                                                               origin=who(node.id)))
            if is_summary(node):
                self._send(w, "session/didChange", m.SessionChange(session_id=sid, change="summary",
                                                                   head=info.head, node_id=node.id,
                                                                   origin=who(node.id)))
            w.seq_seen = node.seq
        for nid in g.updates[w.updates_seen:]:
            self._send(w, "node/didUpdate", m.NodeNotification(session_id=sid, node=g.nodes[nid], head=info.head,
                                                               origin=who(nid)))
        w.updates_seen = len(g.updates)
        if info.head != w.head:
            w.head = info.head
            self._send(w, "session/didChange", m.SessionChange(session_id=sid, change="head", head=info.head,
                                                               origin=origin))
        if info.title != w.title:
            w.title = info.title
            self._send(w, "session/didChange", m.SessionChange(session_id=sid, change="renamed",
                                                               head=info.head, title=info.title, origin=origin))

    def _send(self, w: Watch, method: str, params: Any) -> None:
        data = guards.encode_message_safely(codec.Notification(method=method, params=params))
        for conn in list(w.subscribers):
            conn.write_bytes(data)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            for w in list(self.watches.values()):
                try:
                    self._diff(w, None, frozenset())
                except Exception as exc:  # a bad row must not end the poller
                    log.error("watching session %s failed", w.session_id, exc_info=exc)

    # ------------------------------------------------------------ status

    def status(self) -> m.DaemonStatus:
        now = time.time()
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
            warnings=self.shared.warnings(),
        )
