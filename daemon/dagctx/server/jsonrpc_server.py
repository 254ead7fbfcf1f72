"""The JSON-RPC server: pygls's ``JsonRPCServer`` with our protocol class plugged in.

pygls is extended at its two documented seams — ``protocol_cls`` and the writer —
and its request bookkeeping (``_request_futures`` for cancellation) is reused.
What stock pygls 2.1.1 gets wrong for a long-lived daemon is replaced here, each
with a subprocess test:

* a request without ``params`` (or ``params: null``) is answered, as ``{}``;
* header names are case-insensitive; a bad header is a parse error and the
  stream recovers at the next frame (``framing.FrameParser``);
* requests before ``initialize`` get -32002, after ``shutdown`` -32600;
* ``exit`` without ``shutdown`` exits 1; EOF on stdin exits cleanly;
* errors carry ``data.kind`` and a message, never a traceback;
* params are decoded by msgspec straight into the method's Struct, and a
  validation failure is -32602 naming the field path;
* stdin is read by an asyncio pipe protocol, not a thread hop per read.

One ``DagctxProtocol`` is one connection: standalone it is the process's stdio; in
the per-user daemon (``unix_daemon``) every accepted socket gets its own, with its own
lifecycle, capabilities, request ids, cancellation and progress (SPEC §1.4), over the
``Hub`` they share. Requests are dispatched from the method table
(``dagctx.protocol.methods``): whether a request runs in the background, in the
worker thread (``offload``), and whether it writes (subscribers hear of it) is read
there, never listed here.

The connection is three rooms: this module (its state, what it sends — answers,
notifications, its own requests to the client — and its lifecycle: ``initialize``,
``shutdown``, subscriptions, ``exit``, the end of the stream), ``incoming.py`` (frames
to checked, decoded messages; the door's lifecycle rules; the notifications it handles
itself) and ``requests.py`` (where and in which order a request runs, cancellation,
framing the answer).

Architecture Invariant: only this package knows JSON-RPC. Handlers translate and
delegate to the engine in one line each.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO

import cattrs
import msgspec
from pygls.io_ import StdoutWriter
from pygls.protocol import JsonRPCProtocol
from pygls.server import JsonRPCServer

from dagctx.context.cancel import CancelToken
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import codec
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.messages import InitializeParams

from . import guards, lsp
from .append_turns import AppendAnswers, AppendTurn
from .framing import FrameParser
from .hub import Hub
from .incoming import Incoming
from .pipe_reader import PipeReader
from .quick_answers import QuickAnswers
from .replay import Replays
from .requests import RequestRunner

log = logging.getLogger("dagctx.server")

#: The last frame of a forwarded connection: the forwarder swallows it and exits with
#: ``code`` (SPEC §1.3); a stream that ends without it means the daemon died.
CLOSING = "$/dagctx/closing"

#: ``drain``: the client's unread output a bulk announcement may leave behind it, and how
#: long it waits at most for a client that reads nothing
DRAIN_BELOW = 1 << 20
DRAIN_WAIT = 10.0


class DagctxProtocol(Incoming, QuickAnswers, RequestRunner, JsonRPCProtocol):
    """pygls protocol class whose wire handling is msgspec end to end."""

    def __init__(self, server: JsonRPCServer, converter: cattrs.Converter) -> None:
        super().__init__(server, converter)
        self.config: DaemonConfig = getattr(server, "dagctx_config", None) or DaemonConfig()
        self.hub: Hub = getattr(server, "dagctx_hub", None) or Hub()
        self.parser = FrameParser(self.config.max_frame_bytes)
        self.engine = EngineCore(self.config, peer=self, shared=self.hub.shared)
        self.connection_id = self.hub.register(self)
        self.engine.connection_id = self.connection_id
        self.engine.on_change = self._changed
        self.engine.heavy_runner = self._run_heavy
        self.engine.background_runner = lambda fn: self.hub.pool.submit(("memory-vectors",), fn)
        self.engine.in_worker = True  # handlers run in the pool: no hop of their own
        self.engine.frame_limit = lambda: self.parser.max_frame_bytes  # read at each request: attach may change it
        self.engine.subscribed = set()
        self.connected_at = time.time()
        self.attach: m.AttachParams | None = None
        #: the client's ``clientInfo`` as ``lsprotocol`` typed it (``lsp.client_params``)
        self.client_info: Any = None
        self.client_pid: int | None = None
        self.handlers: dict[str, Callable[[Any], Any]] = self.engine.handlers()
        self.handlers["initialize"] = self._on_initialize
        self.handlers["shutdown"] = self._on_shutdown
        self.handlers["session/subscribe"] = self._on_subscribe
        self.handlers["session/unsubscribe"] = self._on_unsubscribe
        self.handlers["daemon/status"] = lambda p: self.hub.status()
        self.handlers["daemon/stop"] = self._on_stop
        #: the reads answered on the loop when they need no wait (SPEC §1.4)
        self.quick: dict[str, Callable[[Any], Any]] = self.engine.quick_handlers()
        #: called once when the connection ends (exit, EOF, a dead client): the code
        self.on_finish: Callable[[int], None] | None = None
        self._cancel_tokens: dict[Any, CancelToken] = {}
        self._reads_in_flight: set[asyncio.Future[Any]] = set()
        self.initialized = False
        #: set while ``initialize`` runs in the worker: requests sent behind it wait their turn
        self.initializing = False
        self.shutting_down = False
        self.exit_code: int | None = None
        self.closed: asyncio.Future[int] | None = None
        self._ids = itertools.count(1)
        self._outgoing: dict[Any, asyncio.Future[Any]] = {}
        self._log_handler: logging.Handler | None = None
        self._ordered_tail: asyncio.Future[Any] | None = None
        self._last_append: AppendTurn | None = None
        #: its appends not answered yet, answered in arrival order (``append_turns``)
        self._append_answers = AppendAnswers()
        #: frames that arrived while a big body decodes in the pool, in order
        self._held: deque[Any] | None = None
        #: ordered requests already submitted to the ordered lane (its FIFO orders them)
        self._in_lane: set[asyncio.Future[Any]] = set()
        #: ordered requests waiting to be submitted, in arrival order
        self._backlog: deque[tuple[list[asyncio.Future[Any]], Callable[[], None]]] = deque()
        #: request id → (lane, pool future) while queued or running in the pool
        self._jobs: dict[Any, tuple[Any, Any, Any]] = {}
        #: request id → the coroutine part of a request, running on the loop
        self._tasks: dict[Any, asyncio.Future[Any]] = {}
        #: serialises every write to the client — the loop's and a worker's answer sent
        #: straight from the worker (``RequestRunner._send_now``) — and guards the two below
        self._out_lock = threading.RLock()
        #: ordered requests in the pool whose answers are not written yet, in arrival order:
        #: a worker writes its answer itself only when its request is the first of them
        self._owed: dict[Any, None] = {}
        #: notifications a worker thread posted to the loop, not written yet
        self._notes_posted = 0
        #: quick answers (``QuickAnswers._quickly``) not written yet: written together
        self._quick_out: list[bytes] = []
        self._quick_bodies: dict[str, tuple[Any, bytes]] = {}
        #: appends' answers not written yet (``hold``): written together at the loop's next turn
        self._answers_held: list[bytes] = []
        self._ordered_seq = self._tail_seq = 0
        self._sent_seq = -1
        self._handed_in = 0
        self._handed_done = 0
        self._loop_busy = 0
        self._replays = Replays()
        self._poll_beside: Any = None
        #: told (under ``_out_lock``) when the posted notifications are all written (``drain``)
        self._notes_written = threading.Condition(self._out_lock)
        #: a ``drain`` waited ``DRAIN_WAIT`` in vain: the next ones do not wait until it caught up
        self._drain_gave_up = False

    # ------------------------------------------------------------ Peer

    @property
    def can_sample(self) -> bool:
        caps = self.engine.client_capabilities
        return bool(caps.get("sampling") is not None and "sampling" in caps)

    def notify(self, method: str, params: Any = None) -> None:  # type: ignore[override]
        self._write(codec.Notification(method=method, params=params))

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        msg_id = f"dagctx-{next(self._ids)}"
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._outgoing[msg_id] = fut
        self._write(codec.Request(method=method, id=msg_id, params=params))
        try:
            raw = await asyncio.wait_for(fut, timeout)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            # Tell the client to stop working on it (LSP cancellation, both directions).
            self.notify("$/cancelRequest", lsp.cancel(msg_id))
            raise
        finally:
            self._outgoing.pop(msg_id, None)
        try:
            return codec.decode_params(result_type, raw)
        except msgspec.ValidationError as exc:
            raise DagctxError("SamplingFailed", f"the client's {method} result is malformed: {exc}") from exc

    def progress(self, token: int | str | None, value: dict[str, Any]) -> None:
        if token is not None:
            self.notify("$/progress", lsp.progress(token, value))

    # ------------------------------------------------------------ output

    def _write(self, message: Any) -> None:
        if not self.hub.on_loop():  # a view in the worker thread notifies
            with self._out_lock:  # no answer of a later request overtakes it (``_send_now``)
                self._notes_posted += 1
            self.hub.call_on_loop(self._write_posted, message)
            return
        self.write_bytes(guards.encode_message_safely(message))

    def _write_posted(self, message: Any) -> None:
        """On the loop: what another thread posted (``_notes_posted``) — a message to frame,
        or the reader thread's framed answers (``_write_from_thread``) — now written."""
        try:
            self.write_bytes(message if isinstance(message, bytes) else guards.encode_message_safely(message))
        finally:
            with self._out_lock:
                self._notes_posted -= 1
                if not self._notes_posted:
                    self._notes_written.notify_all()

    def drain(self) -> None:
        """From a worker announcing many nodes (an import, a page at a time): wait until the
        notifications it posted are written and the client's unread output is at most
        ``DRAIN_BELOW`` bytes, so what waits for the client is a page, never the session
        (SPEC §9 session/import). A client that read nothing for ``DRAIN_WAIT`` seconds is
        not waited for again until it has caught up (its output limit still applies, SPEC
        §1.4): a worker of the pool is never held long by one client."""
        if self.hub.on_loop():
            return
        buffered = getattr(self.writer, "buffered", None)
        if self._drain_gave_up and buffered is not None and buffered() > DRAIN_BELOW:
            return
        self._drain_gave_up = False
        deadline = time.monotonic() + DRAIN_WAIT
        with self._out_lock:
            while self._notes_posted and self.exit_code is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._drain_gave_up = True
                    return
                self._notes_written.wait(min(left, 0.1))
        while buffered is not None and self.exit_code is None and buffered() > DRAIN_BELOW:
            if time.monotonic() >= deadline:
                self._drain_gave_up = True
                return
            time.sleep(0.01)  # the loop writes as the client reads; a worker thread waits

    def set_writer(self, writer: Any, include_headers: bool = True) -> None:  # type: ignore[override]
        """The client's output; a writer with ``write_now`` also takes finished answers
        straight from the worker that framed them (``RequestRunner._send_now``)."""
        with self._out_lock:
            old = getattr(self, "writer", None)
            super().set_writer(writer, include_headers)
            if hasattr(writer, "out_lock"):
                writer.out_lock = self._out_lock
            if old is not None and old is not writer and hasattr(old, "release"):
                old.release()

    def hold(self, data: bytes) -> None:
        """An append's answer (on the event loop), written with the other answers that are
        ready in the same turn of the loop: a group commit settles many of a pipelining
        client's appends at once, and one write (one system call, one read for the client)
        carries their answers instead of one each. Anything else written meanwhile goes
        after them (``write_bytes``; a worker's own write waits for them, ``_send_now``)."""
        with self._out_lock:
            self._answers_held.append(data)
            first = len(self._answers_held) == 1
        if first:
            asyncio.get_running_loop().call_soon(self._flush_held)

    def _flush_held(self) -> None:
        with self._out_lock:
            out, self._answers_held = self._answers_held, []
        if out:
            self.write_bytes(out[0] if len(out) == 1 else b"".join(out))

    def write_bytes(self, data: bytes) -> None:
        """Queue one framed message for the client (on the event loop), after the appends'
        answers (``hold``) and the quick answers (``QuickAnswers._flush_quick``) held back
        before it."""
        if self._answers_held:
            self._flush_held()
        if self._quick_out:
            self._flush_quick()
        if self.writer is None or self.exit_code is not None:
            return
        try:
            with self._out_lock:
                self.writer.write(data)
        except (BrokenPipeError, ValueError, OSError):
            log.warning("connection %s: the client's end is gone; closing it", self.connection_id)
            self._finish(0 if self.shutting_down else 1)

    def _error(self, msg_id: Any, err: DagctxError) -> None:
        self._write(codec.ErrorResponse(id=msg_id, error=err.to_response_error()))

    def _respond(self, msg_id: Any, result: Any) -> None:
        self._write(codec.Response(id=msg_id, result=result))

    # ------------------------------------------------------------ lifecycle handlers

    def _on_initialize(self, p: InitializeParams) -> Any:
        if self.initialized or self.initializing:
            raise DagctxError("InvalidRequest", "initialize was already sent on this connection")
        typed = lsp.client_params(p)  # initialize's LSP part, typed by lsprotocol
        self.client_info = typed.client_info
        self.client_pid = typed.process_id
        self.initializing = True
        return self._initialize(p)

    async def _initialize(self, p: InitializeParams) -> Any:
        """Open the database and read a ``configFile`` in the worker (SPEC §1.4): a
        PostgreSQL server slow to answer or a slow disk never stalls the other connections.
        ``initialize`` is ordered, so requests sent behind it run after it."""
        try:
            lane = (self.connection_id, 2)
            result = await asyncio.wrap_future(self.hub.pool.submit(lane, lambda: self.engine.initialize(p)))
        finally:
            self.initializing = False
        result.methods = [name for name in result.methods if name in self.handlers]
        result.connection_id = self.connection_id
        self.initialized = True
        if self.engine.options.log_messages:
            self._install_log_forwarding()
        for warning in self.engine.database_warnings():
            # LSP allows window/showMessage before initialize's answer: the user sees it first
            self.notify("window/showMessage", lsp.show_message(logging.WARNING, warning))
        return lsp.initialize_result(result)

    def _on_shutdown(self, p: Any) -> None:
        self.shutting_down = True
        # A shutdown that waited for the ordered requests before it runs in a task of its
        # own: it cancels what is still in flight, never itself (it is answered).
        me = asyncio.current_task()
        for fut in list(self._request_futures.values()):
            if fut is not me:
                fut.cancel()
        return None

    def _on_subscribe(self, p: m.SessionRef) -> m.SubscribeResult:
        res = self.hub.subscribe(self, self.engine.database_key, p.session_id, self.engine.watch)
        self.engine.subscribed.add(p.session_id)  # type: ignore[union-attr]
        return res

    def _on_unsubscribe(self, p: m.SessionRef) -> m.SubscribeResult:
        self.engine.subscribed.discard(p.session_id)  # type: ignore[union-attr]
        return self.hub.unsubscribe(self, self.engine.database_key, p.session_id)

    def _on_stop(self, p: Any) -> m.DaemonStopResult:
        n = len(self.hub.connections)
        # answered first; the hub stops after in-flight writes finish
        asyncio.get_running_loop().call_soon(self.hub.request_stop, f"daemon/stop from connection {self.connection_id}")
        return m.DaemonStopResult(stopping=True, connections=n)

    def client_status(self) -> m.ClientStatus:
        info = self.client_info
        return m.ClientStatus(
            connection_id=self.connection_id,
            name=info.name if info else "",
            version=info.version if info else None,
            pid=self.client_pid if self.client_pid is not None else (self.attach.pid if self.attach else None),
            cwd=self.attach.cwd if self.attach else None,
            database=self.engine.db.key if self.engine.db is not None else None,
            sessions=self.hub.sessions_of(self),
            connected_at=self.connected_at,
            in_flight=len(self._request_futures),
        )

    def _install_log_forwarding(self) -> None:
        proto = self

        class _Forward(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                proto.notify("window/logMessage", lsp.log_message(record.levelno, record.getMessage()))

        self._log_handler = _Forward(level=logging.INFO)
        logging.getLogger("dagctx").addHandler(self._log_handler)

    def _finish(self, code: int, reason: str | None = None) -> None:
        """End this connection (``exit``, EOF, a client gone): once."""
        if self.exit_code is not None:
            return
        if self._answers_held:
            self._flush_held()  # answered before the closing frame
        with self._out_lock:  # no worker writes an answer after the closing frame (``_send_now``)
            if self.attach is not None and self.writer is not None:
                # tell the forwarder how this connection ended (it never reaches the client)
                params: dict[str, Any] = {"code": code}
                if reason:
                    params["reason"] = reason
                try:
                    self.writer.write(codec.encode_message(codec.Notification(method=CLOSING, params=params)))
                except (BrokenPipeError, ValueError, OSError):
                    pass
            self.exit_code = code
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(self.exit_code)
        if self.on_finish is not None:
            self.on_finish(code)

    def connection_lost(self) -> None:  # type: ignore[override]
        """The stream is gone: cancel this connection's work, leave the hub, free the engine."""
        if self.exit_code is None:
            self.exit_code = 0
        for token in list(self._cancel_tokens.values()):
            token.cancel()
        for fut in list(self._request_futures.values()):
            fut.cancel()
        for task in list(self._tasks.values()):
            task.cancel()
        for pool in {id(p): p for p in (self.pool, self.hub.pool)}.values():
            for lane in range(4):
                pool.forget((self.connection_id, lane))
        if self._log_handler is not None:
            logging.getLogger("dagctx").removeHandler(self._log_handler)
            self._log_handler = None
        self.engine.close()  # first: the hub then sees the database one user lighter
        self.hub.unregister(self)

    # ------------------------------------------------------------ running

    async def run(self, stdin: BinaryIO) -> int:
        loop = asyncio.get_running_loop()
        self.closed = loop.create_future()
        proto = self

        class _Pipe(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                proto.feed(data)

            def connection_lost(self, exc: Exception | None) -> None:
                # EOF: the client went away. Clean exit, like a closed editor.
                proto._finish(0)

        try:  # read by a thread of its own, which answers the quick reads itself (SPEC §1.4)
            fd = os.dup(stdin.fileno())
        except (AttributeError, OSError, ValueError):
            fd = -1
        if fd < 0:  # not a descriptor (a test's stream): the loop reads it
            transport, _ = await loop.connect_read_pipe(_Pipe, stdin)
        else:
            transport = PipeReader(fd, self.feed_in_thread, lambda: self._finish(0), self.hub.post,
                                   name="dagctx-in-stdio")
            transport.start()
        try:
            return await self.closed
        finally:
            transport.close()
            self.connection_lost()


class LockedStdoutWriter(StdoutWriter):
    """Standalone stdout: the loop's writes and a worker's finished answer
    (``write_now``, under the connection's output lock) go out whole, one at a time."""

    def write_now(self, data: bytes) -> bool:
        self.write(data)
        return True


class DagctxServer(JsonRPCServer):
    """pygls server carrying our config (and the daemon's hub) to the protocol it constructs."""

    def __init__(self, config: DaemonConfig, hub: Hub | None = None) -> None:
        self.dagctx_config = config
        self.dagctx_hub = hub
        super().__init__(DagctxProtocol, lambda: lsp.CONVERTER)


def serve(config: DaemonConfig, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """Serve one client over stdio until ``exit`` or EOF; returns the exit code."""
    out = stdout or sys.stdout.buffer
    inp = stdin or sys.stdin.buffer
    # Anything printed by mistake goes to stderr: stdout carries frames only.
    sys.stdout = sys.stderr
    hub = Hub(mode="standalone")
    server = DagctxServer(config, hub)
    proto: DagctxProtocol = server.protocol  # type: ignore[assignment]
    proto.set_writer(LockedStdoutWriter(out))

    async def main() -> int:
        hub.start()
        assert hub.stopped is not None
        hub.stopped.add_done_callback(lambda _: proto._finish(0))  # daemon/stop, standalone
        try:
            return await proto.run(inp)
        finally:
            await hub.close()

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 130
