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

Architecture Invariant: only this package knows JSON-RPC. Handlers translate and
delegate to the engine in one line each.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO

import cattrs
import msgspec
from pygls.io_ import StdoutWriter
from pygls.protocol import JsonRPCProtocol
from pygls.server import JsonRPCServer

from dagctx.context.cancel import CURRENT as CURRENT_CANCEL
from dagctx.context.cancel import CancelToken
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import codec
from dagctx.protocol import messages as m
from dagctx.protocol.errors import INTERNAL_ERROR, DagctxError, ErrorData, ResponseError
from dagctx.protocol.methods import METHODS, PRE_INITIALIZE
from dagctx.protocol.messages import InitializeParams, LogMessageParams

from . import guards
from .framing import Body, FrameParser
from .hub import Hub
from .pool import FairPool

log = logging.getLogger("dagctx.server")

_PATH_RE = re.compile(r"at `\$\.?([^`]*)`")
_MISSING_RE = re.compile(r"missing required field `([^`]+)`")


#: Methods that must not hold back the requests behind them (everything else is answered
#: in arrival order): read off the method table, declared there once.
BACKGROUND_METHODS = frozenset(name for name, spec in METHODS.items() if spec.background)

#: The last frame of a forwarded connection: the forwarder swallows it and exits with
#: ``code`` (SPEC §1.3); a stream that ends without it means the daemon died.
CLOSING = "$/dagctx/closing"

#: Requests the server answers itself, on the loop (the connection's own state); every
#: other request runs its engine handler in the hub's pool.
SERVER_HANDLED = frozenset({"initialize", "shutdown", "daemon/status", "daemon/stop"})


#: How to ask again for an answer that was too large (``ResponseTooLarge``), per method.
PAGING = {
    "session/history": "Page the branch with `offset` and `limit` (the answer's `total` is its length).",
    "node/get": "Ask for fewer `ids` at a time, and read a long output in slices with `range` "
                "({offset, length} in characters).",
    "context/render": "Ask for the render in pieces with `range` ({offset, limit} in messages; the answer's "
                      "`messageCount` says how many there are; pass the same explicit `head` for every piece), "
                      "or render less: turn `aging` on, or pass `budget: true`.",
    "context/prepare": "Render less: keep `aging` on, or let the daemon compact the branch (`context/compact`).",
    "context/replay": "Read the call's inputs with `node/get` (`range` for long outputs) instead.",
    "session/export": "Export to a file with `path` instead of returning the content.",
    "search/query": "Ask for fewer results with `limit`.",
}
_PAGE_ANY = "Ask for less at a time, or raise the limit with `dagctx serve --max-frame-bytes`."

#: A body at least this big is checked and decoded in the pool, not on the loop.
BIG_BODY_BYTES = 1 << 20

_NOT_DECODED = object()


class _Encoded:
    """An answer framed in the worker that produced it; the loop only writes it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class DagctxProtocol(JsonRPCProtocol):
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
        self.engine.in_worker = True  # handlers run in the pool: no hop of their own
        self.engine.subscribed = set()
        self.connected_at = time.time()
        self.attach: m.AttachParams | None = None
        self.client_info: m.ClientInfo | None = None
        self.client_pid: int | None = None
        self.handlers: dict[str, Callable[[Any], Any]] = self.engine.handlers()
        self.handlers["initialize"] = self._on_initialize
        self.handlers["shutdown"] = self._on_shutdown
        self.handlers["session/subscribe"] = self._on_subscribe
        self.handlers["session/unsubscribe"] = self._on_unsubscribe
        self.handlers["daemon/status"] = lambda p: self.hub.status()
        self.handlers["daemon/stop"] = self._on_stop
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
        #: frames that arrived while a big body decodes in the pool, in order
        self._held: deque[Any] | None = None
        #: ordered requests already submitted to the ordered lane (its FIFO orders them)
        self._in_lane: set[asyncio.Future[Any]] = set()
        #: ordered requests waiting to be submitted, in arrival order
        self._backlog: deque[tuple[list[asyncio.Future[Any]], Callable[[], None]]] = deque()
        #: request id → (lane, pool future) while queued or running in the pool
        self._jobs: dict[Any, tuple[Any, Any]] = {}
        #: request id → the coroutine part of a request, running on the loop
        self._tasks: dict[Any, asyncio.Future[Any]] = {}

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
            self.notify("$/cancelRequest", {"id": msg_id})
            raise
        finally:
            self._outgoing.pop(msg_id, None)
        try:
            return codec.decode_params(result_type, raw)
        except msgspec.ValidationError as exc:
            raise DagctxError("SamplingFailed", f"the client's {method} result is malformed: {exc}") from exc

    def progress(self, token: int | str | None, value: dict[str, Any]) -> None:
        if token is not None:
            self.notify("$/progress", {"token": token, "value": value})

    # ------------------------------------------------------------ output

    def _write(self, message: Any) -> None:
        if not self.hub.on_loop():  # a view in the worker thread notifies
            self.hub.call_on_loop(self._write, message)
            return
        self.write_bytes(guards.encode_message_safely(message))

    def write_bytes(self, data: bytes) -> None:
        """Queue one framed message for the client (on the event loop)."""
        if self.writer is None or self.exit_code is not None:
            return
        try:
            self.writer.write(data)
        except (BrokenPipeError, ValueError, OSError):
            log.warning("connection %s: the client's end is gone; closing it", self.connection_id)
            self._finish(0 if self.shutting_down else 1)

    def _error(self, msg_id: Any, err: DagctxError) -> None:
        self._write(codec.ErrorResponse(id=msg_id, error=err.to_response_error()))

    def _respond(self, msg_id: Any, result: Any) -> None:
        self._write(codec.Response(id=msg_id, result=result))

    # ------------------------------------------------------------ input

    def feed(self, data: bytes) -> None:
        for event in self.parser.feed(data):
            if self._held is not None:  # a big body is decoding in the pool: keep the order
                self._held.append(event)
            else:
                self._event(event)

    def _event(self, event: Body | Any) -> None:
        if isinstance(event, Body):
            if len(event.data) >= BIG_BODY_BYTES and self.hub.loop is not None:
                self._decode_in_pool(event.data)
                return
            try:  # one bad body never costs the frames behind it (SPEC §1)
                self.handle_body(event.data)
            except Exception as exc:
                self._internal_error(None, "a message", exc)
        else:
            self._error(None, DagctxError(event.kind, event.message))

    def _decode_in_pool(self, body: bytes) -> None:
        """A big body (a 50 MB tool output) is checked and decoded in the pool, so the loop
        keeps serving the other connections; this connection's later frames wait for it."""
        self._held = deque()
        loop = asyncio.get_running_loop()
        cf = self.hub.pool.submit((self.connection_id, 3), lambda: self._predecode(body))
        cf.add_done_callback(lambda f: loop.call_soon_threadsafe(self._predecoded, f))

    def _predecoded(self, cf: Any) -> None:
        held, self._held = self._held, None
        try:
            self._dispatch_decoded(cf.result())
        except Exception as exc:
            self._internal_error(None, "a message", exc)
        while held and self._held is None:
            self._event(held.popleft())
        if held:  # another big body started decoding: the rest waits behind it
            assert self._held is not None
            held.extend(self._held)
            self._held = held

    def handle_body(self, body: bytes) -> None:
        self._dispatch_decoded(self._predecode(body))

    def _predecode(self, body: bytes) -> tuple[Any, ...]:
        """The pure part of reading a body (any thread): the door check, the envelope and a
        request's params. Returns what ``_dispatch_decoded`` acts on."""
        refused = guards.check_body(body)
        if refused is not None:
            return ("refused", refused)
        try:
            env = codec.envelope_decoder.decode(body)
        except msgspec.ValidationError:
            return ("error", None, DagctxError("InvalidRequest", "a message must be a JSON object (batches are not supported)"))
        except msgspec.DecodeError as exc:
            return ("error", None, DagctxError("ParseError", f"the message body is not valid JSON: {exc}"))
        params: Any = _NOT_DECODED
        if isinstance(env.method, str) and env.id is not msgspec.UNSET:
            spec = METHODS.get(env.method)
            if spec is not None and spec.direction == "client-to-server" and not spec.notification:
                try:
                    params = codec.decode_params(spec.params, env.params)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    params = exc
        return ("message", env, params)

    def _dispatch_decoded(self, decoded: tuple[Any, ...]) -> None:
        if decoded[0] == "refused":
            refused = decoded[1]
            r = refused.refusal
            pending = self._outgoing.get(refused.id)
            if pending is not None and not pending.done():  # the client's answer to our request
                pending.set_exception(DagctxError("SamplingFailed", f"the client's answer was refused: {r.message}"))
            else:
                self._error(refused.id, DagctxError(r.kind, r.message, path=r.path))
            return
        if decoded[0] == "error":
            self._error(decoded[1], decoded[2])
            return
        env, params = decoded[1], decoded[2]
        has_id = env.id is not msgspec.UNSET
        msg_id = env.id if has_id else None
        if has_id and msg_id is not None and (isinstance(msg_id, bool) or not isinstance(msg_id, (int, str))):
            self._error(None, DagctxError("InvalidRequest", "id must be a string, an integer or null (JSON-RPC 2.0)"))
            return
        if env.jsonrpc != "2.0":
            self._error(msg_id, DagctxError("InvalidRequest", 'every message needs "jsonrpc": "2.0"'))
            return
        if env.method is msgspec.UNSET:
            if has_id and (env.result is not msgspec.UNSET or env.error is not msgspec.UNSET):
                self._handle_client_response(msg_id, env)
            else:
                self._error(msg_id, DagctxError("InvalidRequest", "a message needs a method (or a result/error)"))
            return
        if not isinstance(env.method, str):
            self._error(msg_id, DagctxError("InvalidRequest", "method must be a string"))
            return
        if has_id:
            self._handle_request(msg_id, env.method, env.params, params)
        else:
            self._handle_note(env.method, env.params)

    def _handle_client_response(self, msg_id: Any, env: codec.Envelope) -> None:
        fut = self._outgoing.get(msg_id)
        if fut is None or fut.done():
            log.warning("response to unknown request %r ignored", msg_id)
            return
        if env.error is not msgspec.UNSET:
            err = env.error if isinstance(env.error, dict) else {}
            fut.set_exception(
                DagctxError(
                    "SamplingFailed",
                    f"the client answered with error {err.get('code')}: {err.get('message')}",
                    details={"code": err.get("code")},
                )
            )
        else:
            fut.set_result(env.result)

    def _handle_note(self, method: str, raw: Any) -> None:
        if method == "exit":
            self._finish(0 if self.shutting_down else 1)
        elif method == "$/cancelRequest":
            try:
                p = codec.decode_params(METHODS["$/cancelRequest"].params, raw)
            except msgspec.ValidationError:
                return
            self._cancel(p.id)
        elif method == "$/dagctx/attach":
            try:
                self.attach = codec.decode_params(METHODS[method].params, raw)
            except msgspec.ValidationError:
                return
            self.engine.client_database = self.attach.database
            self.engine.client_cwd = self.attach.cwd
            if self.attach.env is not None:
                self.engine.environ = self.attach.env
                self.attach.env = None  # kept by the engine only, never echoed by status
            if self.attach.max_frame_bytes and self.attach.max_frame_bytes > 0:
                cap = self.config.max_frame_cap
                if self.attach.max_frame_bytes > cap:
                    log.warning("connection %s asked for frames of up to %d bytes; capped at %d (--max-frame-cap)",
                                self.connection_id, self.attach.max_frame_bytes, cap)
                self.parser.max_frame_bytes = min(self.attach.max_frame_bytes, cap)
        elif method == "initialized" or method.startswith("$/"):
            return
        else:
            log.warning("ignoring notification %r", method)

    def _handle_request(self, msg_id: Any, method: str, raw: Any, decoded: Any = None) -> None:
        if not self.initialized and not self.initializing and method not in PRE_INITIALIZE:
            self._error(
                msg_id,
                DagctxError("ServerNotInitialized", f"{method} before initialize: send initialize first"),
            )
            return
        if self.shutting_down:
            self._error(
                msg_id,
                DagctxError(
                    "ShutdownInProgress",
                    f"{method} after shutdown: the daemon only accepts exit now; start a new daemon",
                ),
            )
            return
        spec = METHODS.get(method)
        handler = self.handlers.get(method)
        if spec is None or handler is None or spec.direction != "client-to-server" or spec.notification:
            self._error(
                msg_id,
                DagctxError("MethodNotFound", f"unknown method {method!r}; initialize lists the methods"),
            )
            return
        try:
            if decoded is None or decoded is _NOT_DECODED:
                params = codec.decode_params(spec.params, raw)
            elif isinstance(decoded, Exception):
                raise decoded
            else:
                params = decoded
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            text = str(exc)
            m = _PATH_RE.search(text)
            path = ("params." + m.group(1)).rstrip(".") if m else "params"
            missing = _MISSING_RE.search(text)
            if missing:  # name the missing field itself, not the object lacking it
                path += "." + missing.group(1)
            self._error(
                msg_id,
                DagctxError("InvalidParams", f"invalid params for {method}: {text}", path=path),
            )
            return
        if method in SERVER_HANDLED:
            self._on_loop(msg_id, method, handler, params)
        else:
            self._in_pool(msg_id, method, spec, handler, params)

    def _on_loop(self, msg_id: Any, method: str, handler: Callable[[Any], Any], params: Any) -> None:
        """The connection's own bookkeeping (initialize, subscriptions, status): on the
        loop, after the ordered requests sent before it."""
        tail = self._ordered_tail
        waits = [tail] if tail is not None and not tail.done() else []
        if waits:
            task = asyncio.ensure_future(self._after(waits, handler, params))
            self._track(msg_id, method, task)
            return
        try:
            result = handler(params)
        except DagctxError as err:
            self._error(msg_id, err)
            return
        except Exception as exc:  # the daemon never dies on a request
            self._internal_error(msg_id, method, exc)
            return
        if asyncio.iscoroutine(result):
            self._track(msg_id, method, asyncio.ensure_future(result), params)
        else:
            self._respond(msg_id, result)

    @property
    def pool(self) -> FairPool:
        """Where this connection's work runs: its database's pool once initialized (a
        database in trouble holds only its own threads), the hub's before."""
        return self.hub.pool_for(self.engine.db.key if self.engine.db is not None else None)

    def _in_pool(self, msg_id: Any, method: str, spec: Any, handler: Callable[[Any], Any], params: Any) -> None:
        """Run an engine handler in the hub's fair pool (SPEC §1.4): ordered requests in
        this connection's ordered lane, background ones in its background lane. The ordered
        lane stays held until the answer is written (a coroutine the handler returned
        finishes on the loop), so ordered requests keep their order; a background request's
        coroutine (compaction waiting for the client's sampling answer) frees its lane."""
        loop = asyncio.get_running_loop()
        token = CancelToken()
        self._cancel_tokens[msg_id] = token
        ctx = contextvars.copy_context()
        ctx.run(CURRENT_CANCEL.set, token)
        background = spec.background
        lane = (self.connection_id, 1 if background else 0)
        done: asyncio.Future[Any] = loop.create_future()
        self._request_futures[msg_id] = done  # type: ignore[assignment]
        waits: list[asyncio.Future[Any]] = []
        tail = self._ordered_tail
        if tail is not None and not tail.done() and (background or tail not in self._in_lane):
            waits.append(tail)  # after the ordered requests sent before it (writes included)
        if spec.writes and self._reads_in_flight:
            waits.extend(f for f in self._reads_in_flight if not f.done())  # never overtakes a read
        if spec.offload:  # a heavy view: later writes of this connection wait for it
            self._reads_in_flight.add(done)
            done.add_done_callback(self._reads_in_flight.discard)
        if not background:
            self._ordered_tail = done

        def start() -> None:
            if done.done():  # cancelled while it waited
                return
            if not background:
                self._in_lane.add(done)
                done.add_done_callback(self._in_lane.discard)
            try:
                pool = self.pool
                cf = pool.submit(lane, lambda: ctx.run(self._call, msg_id, method, handler, params), hold=not background)
            except RuntimeError:  # the pool is closed: the daemon is stopping
                done.cancel()
                return
            self._jobs[msg_id] = (pool, lane, cf)
            cf.add_done_callback(lambda f: loop.call_soon_threadsafe(self._ran, msg_id, method, params, pool, lane, f,
                                                                     done))

        done.add_done_callback(lambda f, i=msg_id, mth=method, p=params: self._request_done(i, mth, f, p))
        if waits or (not background and self._backlog):
            if background:
                asyncio.ensure_future(self._start_after(waits, start))
            else:
                self._queue_ordered(waits, start)
        else:
            start()

    def _queue_ordered(self, waits: list[asyncio.Future[Any]], start: Callable[[], None]) -> None:
        """An ordered request that must wait: it and every later ordered request are
        submitted in arrival order once what each waits for is done."""
        self._backlog.append((waits, start))
        if len(self._backlog) == 1:
            asyncio.ensure_future(self._drain_backlog())

    async def _drain_backlog(self) -> None:
        while self._backlog:
            waits, start = self._backlog[0]
            pending = [w for w in waits if not w.done()]
            if pending:
                await asyncio.wait(pending)
            self._backlog.popleft()
            start()

    @staticmethod
    async def _start_after(waits: list[asyncio.Future[Any]], start: Callable[[], None]) -> None:
        await asyncio.wait(waits)
        start()

    def _call(self, msg_id: Any, method: str, handler: Callable[[Any], Any], params: Any) -> Any:
        """In a worker: the handler, and the framed answer when it finished here."""
        result = handler(params)
        if asyncio.iscoroutine(result):
            return result
        return _Encoded(self._answer(msg_id, method, result))

    def _answer(self, msg_id: Any, method: str, result: Any) -> bytes:
        """The framed answer, or ``ResponseTooLarge`` when it would not fit the client's
        frame limit (SPEC §1.4): a client reading it would have to drop the connection."""
        data = guards.encode_message_safely(codec.Response(id=msg_id, result=result))
        limit = self.parser.max_frame_bytes
        if len(data) <= limit:
            return data
        log.warning("connection %s: the answer to %s is %d bytes, over its frame limit of %d; refused",
                    self.connection_id, method, len(data), limit)
        err = DagctxError("ResponseTooLarge", f"the answer to {method} is {len(data):,} bytes, more than this "
                          f"connection's frame limit of {limit:,}; nothing was sent. {PAGING.get(method, _PAGE_ANY)}",
                          details={"bytes": len(data), "limit": limit})
        return guards.encode_message_safely(codec.ErrorResponse(id=msg_id, error=err.to_response_error()))

    def _ran(self, msg_id: Any, method: str, params: Any, pool: FairPool, lane: Any, cf: Any,
             done: asyncio.Future[Any]) -> None:
        """On the loop: the worker finished (or the job was dropped before it ran)."""
        self._jobs.pop(msg_id, None)
        if cf.cancelled():
            if not done.done():
                done.cancel()
            return
        exc = cf.exception()
        if exc is not None:
            pool.release(lane, cf)
            if not done.done():
                done.set_exception(exc)
            return
        result = cf.result()
        if isinstance(result, _Encoded):
            pool.release(lane, cf)
            if not done.done():
                done.set_result(result)
            return
        task = asyncio.ensure_future(result)  # finished on the loop (sampling, a client's answer)
        self._tasks[msg_id] = task

        def finished(t: asyncio.Future[Any]) -> None:
            self._tasks.pop(msg_id, None)
            pool.release(lane, cf)
            if done.done():
                return
            if t.cancelled():
                done.cancel()
            elif t.exception() is not None:
                done.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                done.set_result(t.result())

        task.add_done_callback(finished)

    def _request_done(self, msg_id: Any, method: str, done: asyncio.Future[Any], params: Any) -> None:
        self._cancel_tokens.pop(msg_id, None)
        if self._request_futures.get(msg_id) is done:
            del self._request_futures[msg_id]
        if self.exit_code is not None:
            return  # the connection is gone: nobody to answer
        if done.cancelled():
            self._error(msg_id, DagctxError("RequestCancelled", f"{method} was cancelled; nothing was written"))
            return
        exc = done.exception()
        if exc is not None:
            if isinstance(exc, DagctxError):
                self._error(msg_id, exc)
            else:
                self._internal_error(msg_id, method, exc)
            return
        self._wrote(method, params)
        result = done.result()
        self.write_bytes(result.data if isinstance(result, _Encoded) else self._answer(msg_id, method, result))

    def _cancel(self, msg_id: Any) -> None:
        """``$/cancelRequest``: a queued job is dropped and answered at once; a running one
        stops at its next checkpoint; a coroutine part is cancelled."""
        token = self._cancel_tokens.get(msg_id)
        if token is not None:
            token.cancel()
        job = self._jobs.get(msg_id)
        if job is not None:
            pool, lane, cf = job
            pool.cancel_queued(lane, cf)  # its done callback answers RequestCancelled
        task = self._tasks.get(msg_id)
        if task is not None:
            task.cancel()
        fut = self._request_futures.get(msg_id)
        if fut is not None and job is None and task is None:
            fut.cancel()  # still waiting for an earlier request: never starts

    async def _run_heavy(self, fn: Callable[[], Any]) -> Any:
        """Heavy local work of an async operation (an import's write, compaction's
        planning), in this connection's third lane of the pool; cancelled with it."""
        token = CURRENT_CANCEL.get() or CancelToken()
        ctx = contextvars.copy_context()
        ctx.run(CURRENT_CANCEL.set, token)
        lane = (self.connection_id, 2)
        pool = self.pool
        cf = pool.submit(lane, lambda: ctx.run(fn))
        try:
            return await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            token.cancel()
            pool.cancel_queued(lane, cf)
            raise

    def _track(self, msg_id: Any, method: str, task: asyncio.Future[Any], params: Any = None) -> None:
        """Answer when ``task`` ends; ordered methods hold back later requests until then."""
        self._request_futures[msg_id] = task  # type: ignore[assignment]
        if method not in BACKGROUND_METHODS:
            self._ordered_tail = task
        task.add_done_callback(lambda t, i=msg_id, mth=method, p=params: self._async_done(i, mth, t, p))

    @staticmethod
    async def _after(waits: list[asyncio.Future[Any]], handler: Callable[[Any], Any], params: Any) -> Any:
        await asyncio.wait(waits)
        result = handler(params)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    def _changed(self, session_id: str, written: frozenset[str]) -> None:
        store = self.engine.db.store if self.engine.db is not None else None
        if store is not None:
            self.hub.changed(store, session_id, self.connection_id, written)

    def _wrote(self, method: str, params: Any) -> None:
        """After a request that may write: subscribers of its session hear what changed."""
        if METHODS[method].writes and self.engine.db is not None:
            sid = getattr(params, "session_id", None)
            if isinstance(sid, str):
                self.hub.changed(self.engine.db.store, sid, self.connection_id)

    def _async_done(self, msg_id: Any, method: str, task: asyncio.Future[Any], params: Any = None) -> None:
        self._request_futures.pop(msg_id, None)
        if self.exit_code is not None:
            return  # the connection is gone: nobody to answer
        if task.cancelled():
            self._error(msg_id, DagctxError("RequestCancelled", f"{method} was cancelled; nothing was written"))
            return
        exc = task.exception()
        if exc is None:
            self._wrote(method, params)
            self._respond(msg_id, task.result())
        elif isinstance(exc, DagctxError):
            self._error(msg_id, exc)
        else:
            self._internal_error(msg_id, method, exc)

    def _internal_error(self, msg_id: Any, method: str, exc: BaseException) -> None:
        log.error("internal error in %s", method, exc_info=exc)
        self._write(
            codec.ErrorResponse(
                id=msg_id,
                error=ResponseError(
                    code=INTERNAL_ERROR,
                    message=f"internal error while handling {method} ({type(exc).__name__}: {exc}); "
                    "the daemon is still running and the request wrote nothing — see its log",
                    data=ErrorData(kind="InternalError"),
                ),
            )
        )

    # ------------------------------------------------------------ lifecycle handlers

    def _on_initialize(self, p: InitializeParams) -> Any:
        if self.initialized or self.initializing:
            raise DagctxError("InvalidRequest", "initialize was already sent on this connection")
        self.client_info = p.client_info
        self.client_pid = p.process_id
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
        return result

    def _on_shutdown(self, p: Any) -> None:
        self.shutting_down = True
        for fut in list(self._request_futures.values()):
            fut.cancel()
        return None

    def _on_subscribe(self, p: m.SessionRef) -> m.SubscribeResult:
        res = self.hub.subscribe(self, self.engine.store, p.session_id)
        self.engine.subscribed.add(p.session_id)  # type: ignore[union-attr]
        return res

    def _on_unsubscribe(self, p: m.SessionRef) -> m.SubscribeResult:
        self.engine.subscribed.discard(p.session_id)  # type: ignore[union-attr]
        return self.hub.unsubscribe(self, self.engine.store, p.session_id)

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
                level = {logging.ERROR: 1, logging.WARNING: 2, logging.INFO: 3}.get(record.levelno, 4)
                proto.notify("window/logMessage", LogMessageParams(type=level, message=record.getMessage()))

        self._log_handler = _Forward(level=logging.INFO)
        logging.getLogger("dagctx").addHandler(self._log_handler)

    def _finish(self, code: int, reason: str | None = None) -> None:
        """End this connection (``exit``, EOF, a client gone): once."""
        if self.exit_code is not None:
            return
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

        transport, _ = await loop.connect_read_pipe(_Pipe, stdin)
        try:
            return await self.closed
        finally:
            transport.close()
            self.connection_lost()


class DagctxServer(JsonRPCServer):
    """pygls server carrying our config (and the daemon's hub) to the protocol it constructs."""

    def __init__(self, config: DaemonConfig, hub: Hub | None = None) -> None:
        self.dagctx_config = config
        self.dagctx_hub = hub
        super().__init__(DagctxProtocol, cattrs.Converter)


def serve(config: DaemonConfig, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """Serve one client over stdio until ``exit`` or EOF; returns the exit code."""
    out = stdout or sys.stdout.buffer
    inp = stdin or sys.stdin.buffer
    # Anything printed by mistake goes to stderr: stdout carries frames only.
    sys.stdout = sys.stderr
    hub = Hub(mode="standalone")
    server = DagctxServer(config, hub)
    proto: DagctxProtocol = server.protocol  # type: ignore[assignment]
    proto.set_writer(StdoutWriter(out))

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
