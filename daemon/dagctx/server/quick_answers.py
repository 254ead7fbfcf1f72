"""Answering the quick reads (SPEC §1.4): on the event loop, or in the thread that reads the
connection's pipe, without a thread hand-off.

Mixed into ``jsonrpc_server.DagctxProtocol`` (one connection). A quick read
(``EngineCore.quick_handlers``) is answered when nothing the connection sent before it is
unanswered and the engine has its answer at hand without a wait; its encoding is reused
while the engine answers with the very same object. A read the connection sent before,
matched by its bytes (``replay.py``), is answered from the answer kept with the file's
mark while the mark is unchanged. What one may cost is bounded by ``quick.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dagctx.protocol import codec

from .replay import id_of

if TYPE_CHECKING:
    from dagctx.engine.core import EngineCore

    from .framing import FrameParser
    from .hub import Hub
    from .replay import Replay


class QuickAnswers:
    """The quick-read half of a connection (mixed into ``DagctxProtocol``, whose state it reads)."""

    hub: Hub
    engine: EngineCore
    parser: FrameParser
    exit_code: int | None
    writer: Any
    quick: dict[str, Any]
    _ordered_tail: Any
    _sent_seq: int
    _tail_seq: int
    _owed: dict[Any, None]
    _backlog: Any
    _notes_posted: int
    _answers_held: list[bytes]
    _out_lock: Any
    _write_posted: Any
    _answer: Any
    write_bytes: Any
    _quick_out: list[bytes]
    #: per quick method, the last result answered and its encoding (``_quick_encoded``)
    _quick_bodies: dict[str, tuple[Any, bytes]]

    def _quickly(self, msg_id: Any, method: str, quick: Callable[[Any, bool], Any], params: Any) -> bool:
        """On the loop: a quick read (``EngineCore.quick_handlers``) answered here when it can
        be (``_quick_answer``), held back to go out with the other quick answers of the same
        read (one write for a pipelining client's run). False sends it the usual way."""
        data = self._quick_answer(msg_id, method, quick, params, bool(self._quick_out))
        if data is None:
            return False
        self._quick_out.append(data)
        return True

    def _quick_open(self, method: str) -> Any:
        """The connection's database when a quick read of ``method`` may be answered now: nothing
        this connection sent before it is unanswered, its method is not sent to the pool
        (``quick.py``); else None."""
        db = self.engine.db
        tail = self._ordered_tail  # None once the last ordered request's answer is written
        if tail is not None and self._sent_seq != self._tail_seq:
            return None  # its answer is not written yet (by its worker: _sent_seq; by the loop: None)
        if (db is None or self._owed or self._backlog or self._notes_posted or self.exit_code is not None
                or not self.hub.quick.allowed(db.key, method)):
            return None
        return db

    def _replayed(self, token: bytes, replay: Replay, quiet: Any = None) -> bytes | None:
        """In the reader thread: the framed answer of a quick read this connection sent before
        (``replay.Replays``; ``token``: its new id's JSON bytes), or None (the usual way). An
        answer is kept with the file's mark read before it was given (``EngineCore.quick_marker``:
        the same file, and the header every commit rewrites, SPEC §1.4); while the mark reads
        the same, nothing was committed since, and the kept answer goes out with the new id —
        no statement, no lookup, nothing to time (``quick.py`` bounds what a read may cost).
        ``quiet``: the reader's word for the file's watch (``Incoming.feed_in_thread``)."""
        method = replay.method
        db = self._quick_open(method)
        if db is None:
            return None
        kept = replay.answer
        if kept is not None and kept[1] is not db:
            kept = None
        marker = kept[2] if kept is not None else self.engine.quick_marker()
        mark = None if marker is None else marker(quiet)
        if mark is not None and kept is not None and kept[0] == mark:
            head = b'{"id":' + token + kept[3]
            if len(head) < self.parser.max_frame_bytes - 40:
                self.hub.quick.answered += 1
                return b"Content-Length: %d\r\n\r\n%s" % (len(head), head)
        data = self._quick_answer(id_of(token), method, self.quick[method], replay.params, False)
        body = self._quick_bodies.get(method)
        replay.answer = None
        # not kept while suspect: the next read is timed by the CPU clock (quick.py)
        if data is not None and mark is not None and body is not None and not self.hub.quick.suspect(db.key, method):
            tail = b',"result":' + body[1] + b',"jsonrpc":"2.0"}'
            if data == codec.frame(b'{"id":' + token + tail):  # that encoding was sent (not a worded error)
                replay.answer = (mark, db, marker, tail)
                self._poll_beside = self.engine.quick_watch()  # polled by the reader from now on
        return data

    def _quick_answer(self, msg_id: Any, method: str, quick: Callable[[Any, bool], Any], params: Any,
                      same_batch: bool) -> bytes | None:
        """The framed answer of a quick read when its answer is at hand without a wait and
        nothing this connection sent before it is unanswered (SPEC §1.4): a small read then
        costs no thread hand-off. None sends it the usual way (the pool), which gives the
        same answer, or the error in its words — a quick handler never words one. Called on
        the loop, or by the connection's reader thread when nothing it read waits on the loop."""
        db = self._quick_open(method)
        if db is None:
            return None
        reads, on_loop = self.hub.quick, self.hub.on_loop()  # what it held (quick.py)
        clock = time.perf_counter if on_loop or not reads.suspect(db.key, method) else time.thread_time
        start = clock()
        try:
            result = quick(params, same_batch)
        except Exception:  # noqa: BLE001 - the usual way meets it again and answers it
            return None
        if result is None:
            return None
        data = self._quick_encoded(msg_id, method, result)
        reads.took(db.key, method, clock() - start, wall_in_thread=not on_loop and clock is time.perf_counter)
        return data

    def _quick_encoded(self, msg_id: Any, method: str, result: Any) -> bytes:
        """``_answer``, the encoding reused while the engine answers with the very same object
        (until a commit, SPEC §1.4); anything unusual worded by ``_answer`` as always."""
        kept = self._quick_bodies.get(method)
        try:
            body = kept[1] if kept is not None and kept[0] is result else codec.encoder.encode(result)
        except Exception:  # noqa: BLE001 - text that cannot be encoded as is: the usual encoding words it
            return self._answer(msg_id, method, result)
        self._quick_bodies[method] = (result, body)
        data = codec.frame(codec.encode_response(msg_id, body))
        return data if len(data) <= self.parser.max_frame_bytes else self._answer(msg_id, method, result)

    def _write_from_thread(self, data: bytes) -> None:
        """The reader thread's answers: straight to the client when nothing is queued before
        them, else through the loop like a worker's notification (``_notes_posted``), so
        whatever is written after them waits for them."""
        with self._out_lock:
            if self.exit_code is not None:
                return
            write_now = getattr(self.writer, "write_now", None)
            if not self._notes_posted and not self._answers_held and write_now is not None:
                try:
                    if write_now(data):
                        return
                except (BrokenPipeError, ValueError, OSError):
                    pass  # the loop meets the same error and closes the connection
            self._notes_posted += 1
        self.hub.post(self._write_posted, data)

    def _flush_quick(self) -> None:
        """Write the quick answers held back (``_quickly``): at the end of what the client
        sent, and before any other write or any request that may answer from a worker."""
        out, self._quick_out = self._quick_out, []
        self.write_bytes(out[0] if len(out) == 1 else b"".join(out))
