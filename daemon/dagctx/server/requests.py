"""Running a connection's requests: where each runs, in which order, how it is answered.

Mixed into ``jsonrpc_server.DagctxProtocol`` (one connection). The method table decides
(SPEC §1.4): ordered requests run in the connection's ordered lane of the work pool and
are answered in arrival order, background ones in its background lane; a write never
overtakes a heavy read sent before it; the requests the connection answers itself
(``SERVER_HANDLED``) run on the loop, after the ordered requests sent before them, and
so do appends (``LOOP_WRITES``: their work is in the writer thread), in order. A
handler's coroutine part (waiting for the client's sampling answer) finishes on the
loop. ``$/cancelRequest`` drops a queued job, stops a running one at its next
checkpoint, cancels a coroutine part. An answer is framed in the worker; one over the
connection's frame limit is refused as ``ResponseTooLarge`` with how to page.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dagctx.context.cancel import CURRENT as CURRENT_CANCEL
from dagctx.context.cancel import CancelToken
from dagctx.engine.shared import APPEND_LAST, APPEND_QUEUED
from dagctx.protocol import codec
from dagctx.protocol.errors import INTERNAL_ERROR, DagctxError, ErrorData, ResponseError
from dagctx.protocol.methods import METHODS

from . import guards
from .append_turns import AppendAnswers, AppendTurn, settled
from .pool import FairPool

if TYPE_CHECKING:
    from dagctx.engine.core import EngineCore

    from .framing import FrameParser
    from .hub import Hub

log = logging.getLogger("dagctx.server")

#: Methods that must not hold back the requests behind them (everything else is answered
#: in arrival order): read off the method table, declared there once.
BACKGROUND_METHODS = frozenset(name for name, spec in METHODS.items() if spec.background)

#: Requests the server answers itself, on the loop (the connection's own state); every
#: other request runs its engine handler in the hub's pool.
SERVER_HANDLED = frozenset({"initialize", "shutdown", "daemon/status", "daemon/stop"})

#: Ordered writes whose handler only hands the work to the database's writer thread
#: (after deriving a small payload's counts, a big one's in a thread): started on the
#: loop, in order (SPEC §1.4) — a pool worker would only build the coroutine the loop
#: then runs, two thread hand-offs per append for nothing.
LOOP_WRITES = frozenset({"node/append", "node/appendBatch"})

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

class _Encoded:
    """An answer framed in the worker that produced it; the loop only writes it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _Sent:
    """An answer the worker that framed it wrote to the client itself (``_send_now``)."""

    __slots__ = ()


_SENT = _Sent()


def _unfinished(result: Any) -> bool:
    """A job's result the loop must still finish (a coroutine): its lane stays held until
    then. A framed answer frees the lane at once, so the worker runs the lane's next
    request without waiting for the loop (the answers reach the loop in order)."""
    return not isinstance(result, (_Encoded, _Sent))


class RequestRunner:
    """The request half of a connection (mixed into ``DagctxProtocol``, whose state it reads)."""

    hub: Hub
    engine: EngineCore
    parser: FrameParser
    connection_id: int
    exit_code: int | None
    _cancel_tokens: dict[Any, CancelToken]
    _reads_in_flight: set[asyncio.Future[Any]]
    _ordered_tail: asyncio.Future[Any] | None
    #: the last append this connection started (``_ordered_on_loop``)
    _last_append: AppendTurn | None
    _append_answers: AppendAnswers
    _in_lane: set[asyncio.Future[Any]]
    _backlog: deque[tuple[list[asyncio.Future[Any]], Callable[[], None]]]
    _jobs: dict[Any, tuple[Any, Any, Any]]
    _tasks: dict[Any, asyncio.Future[Any]]
    _request_futures: dict[Any, Any]
    _out_lock: Any
    _owed: dict[Any, None]
    _notes_posted: int
    _write_posted: Any
    _answers_held: list[bytes]
    _more_coming: bool
    hold: Callable[[bytes], None]
    #: every ordered request gets the next number (``_ordered_seq``); the last one's is
    #: ``_tail_seq``; a worker that wrote an ordered read's answer itself records its number
    #: (``_sent_seq``) before the loop has heard of it
    _ordered_seq: int
    _tail_seq: int
    _sent_seq: int
    writer: Any

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

    def _ordered_on_loop(self, msg_id: Any, method: str, spec: Any, handler: Callable[[Any], Any],
                         params: Any) -> None:
        """An ordered write (``LOOP_WRITES``) started on the loop with the pool's ordering
        (SPEC §1.4): after the answer of the ordered request before it — behind an append,
        once that one is in the writer's queue (``append_turns``) — never before a heavy view
        sent earlier; later ordered requests wait for its answer. Cancelled like a pool job:
        dropped while it waits, its coroutine cancelled once it runs."""
        loop = asyncio.get_running_loop()
        token = CancelToken()
        self._cancel_tokens[msg_id] = token
        ctx = contextvars.copy_context()
        ctx.run(CURRENT_CANCEL.set, token)
        done: asyncio.Future[Any] = loop.create_future()
        self._request_futures[msg_id] = done  # type: ignore[assignment]
        waits: list[asyncio.Future[Any]] = []
        tail, last = self._ordered_tail, self._last_append
        behind = last is not None and last.done is tail and tail is not None and not tail.done()
        if tail is not None and not tail.done():
            waits.append(last.queued if behind and last is not None else tail)
        if spec.writes and self._reads_in_flight:
            waits.extend(f for f in self._reads_in_flight if not f.done())
        self._ordered_tail = done
        me = self._last_append = self._append_answers.add(AppendTurn(loop, done))
        self._tail_seq = self._ordered_seq = self._ordered_seq + 1
        ctx.run(APPEND_QUEUED.set, me.mark_queued)
        # the last its connection sent: none after it, nor more frames of the read at hand —
        # and none before it unanswered (a pipelining client: its writer is busy with them)
        answers = self._append_answers
        ctx.run(APPEND_LAST.set,
                lambda: self._last_append is me and not self._more_coming and len(answers) <= 1)
        done.add_done_callback(me.mark_queued)

        def ended(task: asyncio.Future[Any]) -> None:
            me.mark_queued()  # it ended before the writer's queue: the next may go
            self._append_answers.settle()

        # a $/cancelRequest meets its task until it is answered: one written is answered so
        done.add_done_callback(lambda f: self._tasks.pop(msg_id, None))

        def start() -> None:
            if done.done():  # cancelled while it waited
                return
            try:
                result = ctx.run(handler, params)
            except Exception as exc:  # answered by _request_done, like a failed pool job
                result = exc
            if isinstance(result, asyncio.Future):  # queued already: settled by the writer (``QueuedAppend``)
                task = result
            else:
                task = loop.create_task(result if asyncio.iscoroutine(result) else settled(result), context=ctx)
            me.task = task
            self._tasks[msg_id] = task
            task.add_done_callback(ended)

        done.add_done_callback(lambda f, i=msg_id, mth=method, p=params: self._request_done(i, mth, f, p))
        if behind and last is not None and waits == [last.queued] and not self._backlog:
            if last.queued.done():  # the one before is in the writer's queue already: no hop
                start()
            else:
                last.queued.add_done_callback(lambda f: start())  # no backlog task: one hop
        elif waits or self._backlog:
            self._queue_ordered(waits, start)
        else:
            start()

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
        seq = 0
        if not background:
            self._ordered_tail = done
            self._tail_seq = seq = self._ordered_seq = self._ordered_seq + 1
            with self._out_lock:
                self._owed[msg_id] = None
        direct = not background and not spec.writes

        def start() -> None:
            if done.done():  # cancelled while it waited
                return
            if not background:
                self._in_lane.add(done)
                done.add_done_callback(self._in_lane.discard)
            try:
                pool = self.pool
                # the answers of a run of requests reach the loop with one wake-up (Hub.post)
                cf = pool.submit(lane, lambda: ctx.run(self._call, msg_id, method, handler, params,
                                                       (pool, lane, seq) if direct else None),
                                 hold=False if background else _unfinished,
                                 on_done=lambda f: self.hub.post(self._ran, msg_id, method, params, pool, lane, f,
                                                                 done))
            except RuntimeError:  # the pool is closed: the daemon is stopping
                done.cancel()
                return
            self._jobs[msg_id] = (pool, lane, cf)

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

    def _call(self, msg_id: Any, method: str, handler: Callable[[Any], Any], params: Any,
              direct: tuple[FairPool, Any, int] | None = None) -> Any:
        """In a worker: the handler, and the framed answer when it finished here — written
        to the client by this worker when ``direct`` and nothing may come before it.
        ``direct``: the (pool, lane) it ran in, when it may; not while more requests wait
        in the lane — a pipelining client's answers then reach the loop together
        (``Hub.post``) and are written in one pass, not one write and one wake-up each."""
        result = handler(params)
        if asyncio.iscoroutine(result):
            return result
        data = self._answer(msg_id, method, result)
        if direct is not None and not direct[0].waiting(direct[1]) and self._send_now(msg_id, data, direct[2]):
            return _SENT
        return _Encoded(data)

    def _send_now(self, msg_id: Any, data: bytes, seq: int = 0) -> bool:
        """In a worker: write the answer of an ordered read straight to the client, when
        every answer and notification due before it is out — the loop then only does the
        bookkeeping, and the client hears one thread hand-off sooner (SPEC §1.4: answers
        stay in arrival order). False: the loop writes it, as for any other answer."""
        writer = self.writer
        write_now = getattr(writer, "write_now", None)
        if write_now is None:
            return False
        with self._out_lock:
            if (self.exit_code is not None or self._notes_posted or self._answers_held
                    or next(iter(self._owed), None) != msg_id):
                return False
            try:
                if not write_now(data):
                    return False
            except (BrokenPipeError, ValueError, OSError):
                return False  # the loop meets the same error and closes the connection
            del self._owed[msg_id]
            self._sent_seq = seq  # the quick reads need not wait for the loop's bookkeeping
        return True

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
        if exc is not None:  # a job that failed never holds its lane
            if not done.done():
                done.set_exception(exc)
            return
        result = cf.result()
        if isinstance(result, (_Encoded, _Sent)):  # a finished answer never holds its lane (``_unfinished``)
            if not done.done():
                done.set_result(result)
            return
        # finished on the loop (sampling, a client's answer); its lane is held until then
        self._follow(msg_id, asyncio.ensure_future(result), done, then=lambda: pool.release(lane, cf))

    def _follow(self, msg_id: Any, task: asyncio.Future[Any], done: asyncio.Future[Any], *,
                then: Callable[[], None] | None = None) -> None:
        """Keep ``task`` (the rest of a request, running on the loop) cancellable as
        ``msg_id`` until it ends; then run ``then`` and settle ``done`` — the request's
        answer — with the task's result, error or cancellation, unless it is settled already."""
        self._tasks[msg_id] = task

        def finished(t: asyncio.Future[Any]) -> None:
            self._tasks.pop(msg_id, None)
            if then is not None:
                then()
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
        try:
            self._answer_done(msg_id, method, done, params)
        finally:
            if self._ordered_tail is done:  # the last ordered request is answered: none is owed
                self._ordered_tail = None
            if msg_id in self._owed:  # answered (or nobody to answer): a later answer may go now
                with self._out_lock:
                    self._owed.pop(msg_id, None)

    def _answer_done(self, msg_id: Any, method: str, done: asyncio.Future[Any], params: Any) -> None:
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
        if method not in LOOP_WRITES:  # an append told the hub itself (EngineCore.announce)
            self._wrote(method, params)
        result = done.result()
        if result is _SENT:
            return
        data = result.data if isinstance(result, _Encoded) else self._answer(msg_id, method, result)
        if method in LOOP_WRITES and (self._answers_held or self._append_answers or self._last_append is None
                                      or self._last_append.done is not done):
            self.hold(data)  # with the other answers of its group commit
        else:  # (an append with none held before it and none after it: alone, written now)
            self.write_bytes(data)

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
            self._tail_seq = self._ordered_seq = self._ordered_seq + 1
        task.add_done_callback(lambda t, i=msg_id, mth=method, p=params: self._async_done(i, mth, t, p))

    @staticmethod
    async def _after(waits: list[asyncio.Future[Any]], handler: Callable[[Any], Any], params: Any) -> Any:
        await asyncio.wait(waits)
        result = handler(params)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    def _changed(self, session_id: str, written: frozenset[str]) -> None:
        if self.engine.db is not None:
            self.hub.changed(self.engine.db.key, session_id, self.connection_id, written)

    def _wrote(self, method: str, params: Any) -> None:
        """After a request that may write: subscribers of its session hear what changed."""
        if METHODS[method].writes and self.engine.db is not None:
            sid = getattr(params, "session_id", None)
            if isinstance(sid, str):
                self.hub.changed(self.engine.db.key, sid, self.connection_id)

    def _async_done(self, msg_id: Any, method: str, task: asyncio.Future[Any], params: Any = None) -> None:
        self._request_futures.pop(msg_id, None)
        try:
            self._answer_async(msg_id, method, task, params)
        finally:
            if self._ordered_tail is task:  # answered: no ordered answer is owed any more
                self._ordered_tail = None

    def _answer_async(self, msg_id: Any, method: str, task: asyncio.Future[Any], params: Any = None) -> None:
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
        mapped = self.engine.storage_error_of(exc)
        if mapped is not None:  # a storage fault no backend call mapped: its documented kind (SPEC §3)
            log.warning("%s: %s", method, mapped)
            self._error(msg_id, mapped)
            return
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
