"""Reading a connection's input: frames → checked bodies → requests, notifications, answers.

Mixed into ``jsonrpc_server.DagctxProtocol`` (one connection). Every body passes the
door check (``guards.check_body``) before anything decodes it; a request's params are
decoded by msgspec straight into the method's Struct, and a validation failure is
-32602 naming the field path. A body of ``BIG_BODY_BYTES`` or more is checked and
decoded in the pool, and the connection's later frames wait for it, so the loop keeps
serving other connections and this one keeps its order. The lifecycle rules at the door
(-32002 before ``initialize``, -32600 after ``shutdown``) and the notifications the
connection handles itself (``exit``, ``$/cancelRequest``, ``$/dagctx/attach``,
``initialized``) are here; how a request then runs is ``requests.py``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.protocol import codec
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.methods import METHODS, PRE_INITIALIZE

from . import bigbody, guards, lsp
from .framing import Body
from .replay import Replays
from .requests import LOOP_WRITES, SERVER_HANDLED

if TYPE_CHECKING:
    from dagctx.engine.config import DaemonConfig
    from dagctx.engine.core import EngineCore
    from dagctx.protocol import messages as m

    from .framing import FrameParser
    from .hub import Hub

log = logging.getLogger("dagctx.server")

_PATH_RE = re.compile(r"at `\$\.?([^`]*)`")
_MISSING_RE = re.compile(r"missing required field `([^`]+)`")

#: A body at least this big is checked and decoded in the pool, not on the loop.
BIG_BODY_BYTES = 1 << 20

_NOT_DECODED = object()


class _Decoded(tuple):  # type: ignore[type-arg]
    """A body the reader thread already checked and decoded (``Incoming._predecode``)."""

    __slots__ = ()


class Incoming:
    """The input half of a connection (mixed into ``DagctxProtocol``, whose state it reads)."""

    config: DaemonConfig
    hub: Hub
    engine: EngineCore
    parser: FrameParser
    connection_id: int
    attach: m.AttachParams | None
    initialized: bool
    initializing: bool
    shutting_down: bool
    _held: deque[Any] | None
    _outgoing: dict[Any, asyncio.Future[Any]]
    #: the quick reads (``EngineCore.quick_handlers``), answered on the loop when at hand
    quick: dict[str, Any]
    _quick_out: list[bytes]
    _flush_quick: Any
    _quickly: Any
    _quick_answer: Any
    _replayed: Any
    _write_from_thread: Any
    #: batches the reader thread handed to the loop, and how many the loop has dispatched
    #: (each counted by one side only: the thread answers quick reads only when they match)
    _handed_in: int
    _handed_done: int
    #: big bodies decoding in the pool, their frames behind them not dispatched yet
    _loop_busy: int
    #: the quick reads this connection sent alone, kept to be recognised by their bytes
    _replays: Replays
    #: what the reader thread polls beside the client's input (``EngineCore.quick_watch``),
    #: set when a replayed read's answer is kept; None while nothing is
    _poll_beside: Any

    #: while the frames of one read are dispatched: more of them follow the one at hand
    #: (``RequestRunner._ordered_on_loop``: an append with more behind it is queued at once)
    _more_coming: bool = False

    def feed(self, data: bytes) -> None:
        self.hub.last_input = time.monotonic()
        self._dispatch_events(self.parser.feed(data))
        if self._quick_out:  # the quick answers of this read, in one write
            self._flush_quick()

    def _dispatch_events(self, events: list[Any]) -> None:
        """The frames of one read, in order; ``_more_coming`` tells each but the last that
        others follow it."""
        last = len(events) - 1
        try:
            for i, event in enumerate(events):
                if self._held is not None:  # a big body is decoding in the pool: keep the order
                    self._held.append(event)
                else:
                    self._more_coming = i < last
                    self._event(event)
        finally:
            self._more_coming = False

    def feed_in_thread(self, data: bytes, quiet: Any = None) -> Any:
        """The client's input, read by its reader thread (``pipe_reader.PipeReader``, SPEC
        §1.4): the quick reads at the head of it answered here, when nothing this connection
        sent before them waits on the loop or is unanswered; everything from the first other
        frame on handed to the loop in arrival order, small bodies already checked and
        decoded (``_Decoded``) — the loop only dispatches them.

        ``quiet``: what the thread polled beside the input (the object returned here before)
        when the poll that woke it for ``data`` found nothing queued on it. It speaks for the
        first frame of ``data`` only — the one whose first byte was there at that poll — so
        only a read that is all of ``data`` (a replay) is given it. Returns what to poll
        beside the input from now on (None: nothing)."""
        self.hub.last_input = time.monotonic()
        if self.exit_code is not None:
            return None  # the connection ended: what the client still sent is not read
        quick = (self._handed_in == self._handed_done and self._held is None and not self._loop_busy
                 and self.initialized and not self.initializing and not self.shutting_down)
        if quick and self.parser.idle:
            again = self._replays.match(data)  # a quick read this connection sent before, new id
            if again is not None:
                try:
                    answer = self._replayed(again[0], again[1], quiet)
                except Exception:  # noqa: BLE001 - never lose a frame: read the usual way below
                    log.exception("a quick read failed in the reader thread; the loop answers it")
                    answer = None
                if answer is not None:
                    self._write_from_thread(answer)
                    return self._poll_beside
        events: list[Any] = self.parser.feed(data)
        answers: list[bytes] = []
        first = 0
        for i, event in enumerate(events):
            if not isinstance(event, Body) or len(event.data) >= BIG_BODY_BYTES:
                break  # the loop reads it as it would (a big body goes to the pool)
            try:
                decoded = self._predecode(event.data)
            except Exception:  # noqa: BLE001 - the loop meets it again and answers it
                break
            if quick:
                try:
                    answer = self._quick_decoded(decoded, bool(answers))
                except Exception:  # noqa: BLE001 - never lose a frame: the loop answers it
                    log.exception("a quick read failed in the reader thread; the loop answers it")
                    answer = None
                if answer is not None:
                    answers.append(answer)
                    first = i + 1
                    if len(events) == 1:  # a read alone in what the client wrote: kept to match
                        self._replays.learn(event.data, decoded[1].id, decoded[1].method, decoded[2])
                    continue
                quick = False
            events[i] = _Decoded(decoded)
        if answers:
            self._write_from_thread(answers[0] if len(answers) == 1 else b"".join(answers))
        if first < len(events):
            self._handed_in += 1
            self.hub.post(self._events_from_thread, events[first:])
        return self._poll_beside

    def _quick_decoded(self, decoded: tuple[Any, ...], same_batch: bool) -> bytes | None:
        """The answer of a decoded body when it is a well-formed quick read that can be
        answered now (``_quick_answer``); None for anything else."""
        if decoded[0] != "message":
            return None
        env, params = decoded[1], decoded[2]
        method, msg_id = env.method, env.id
        if (not isinstance(method, str) or env.jsonrpc != "2.0" or msg_id is msgspec.UNSET or msg_id is None
                or isinstance(msg_id, bool) or not isinstance(msg_id, (int, str))
                or params is _NOT_DECODED or isinstance(params, Exception)):
            return None
        quick = self.quick.get(method)
        if quick is None:
            return None
        return self._quick_answer(msg_id, method, quick, params, same_batch)

    def _events_from_thread(self, events: list[Any]) -> None:
        """On the loop: what the reader thread handed over, in order. Counted done only
        once every answer it produced here is written (the thread may answer next)."""
        try:
            if self.exit_code is not None:
                return  # the connection is gone: nobody to answer
            self._dispatch_events(events)
            if self._quick_out:
                self._flush_quick()
        finally:
            self._handed_done += 1

    def _event(self, event: Body | Any) -> None:
        if isinstance(event, _Decoded):
            try:
                self._dispatch_decoded(tuple(event))
            except Exception as exc:
                self._internal_error(None, "a message", exc)
            return
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
        self._loop_busy += 1  # until the frames held behind it are dispatched
        loop = asyncio.get_running_loop()
        cf = self.hub.pool.submit((self.connection_id, 3), lambda: self._predecode(body))
        cf.add_done_callback(lambda f: loop.call_soon_threadsafe(self._predecoded, f))

    def _predecoded(self, cf: Any) -> None:
        held, self._held = self._held, None
        try:
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
            if self._quick_out:
                self._flush_quick()
        finally:
            self._loop_busy -= 1

    def handle_body(self, body: bytes) -> None:
        self._dispatch_decoded(self._predecode(body))

    def _predecode(self, body: bytes) -> tuple[Any, ...]:
        """The pure part of reading a body (any thread): the door check, the envelope and a
        request's params. Returns what ``_dispatch_decoded`` acts on. A big request's long
        strings are decoded in pieces (``bigbody``), the rest as any body."""
        if len(body) >= BIG_BODY_BYTES:
            lifted = bigbody.predecode(body)
            if lifted is not None:
                return lifted
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
        if self._quick_out:  # the answers before an ``exit`` go out first
            self._flush_quick()
        if method == "exit":
            self._finish(0 if self.shutting_down else 1)
        elif method == "$/cancelRequest":
            try:
                request_id = lsp.cancelled_id(msgspec.json.decode(raw)) if raw is not msgspec.UNSET else None
            except (msgspec.DecodeError, TypeError):
                return
            if request_id is None:
                return
            self._cancel(request_id)
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
        quick = self.quick.get(method)
        if quick is not None and self._quickly(msg_id, method, quick, params):
            return
        if self._quick_out:  # before a worker may write an answer of its own
            self._flush_quick()
        if method in SERVER_HANDLED:
            self._on_loop(msg_id, method, handler, params)
        elif method in LOOP_WRITES:
            self._ordered_on_loop(msg_id, method, spec, handler, params)
        else:
            self._in_pool(msg_id, method, spec, handler, params)
