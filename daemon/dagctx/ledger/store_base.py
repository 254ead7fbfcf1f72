"""The store's footing: its backend, its locks, its write transactions and its graph cache.

``StoreBase`` is what every operation of ``store.Store`` stands on. A write is one
backend transaction (``_write``): any failure — a rule, a storage fault, a failing
``COMMIT`` — rolls back and drops the sessions' cached graphs before the store's lock is
released, so the cache never holds a node the database does not. A read compares the
session's revision with its cached ``SessionGraph`` and loads only the rows in between
(``_refresh``), so another process's writes are seen before every answer and nothing is
re-read. A database file deleted or replaced underneath is reopened before the next
request (``ensure_file``). The cache's weight and eviction serve the daemon's memory bound.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call

from .backend import (CHARS_KEY, Backend, BlobRow, NodeDerived, NodeRow, SessionRow, WouldWait, encode_meta,
                      encode_refs)
from .backends import open_backend
from .graph import SessionGraph
from .spill import SpillPolicy
from .write_marks import WriteMarks

log = logging.getLogger("dagctx.ledger")

#: the transaction key of writes that belong to no session (derived caches)
DERIVED_KEY = "\x00derived"


class StoreBase:
    """One database's backend, locks, write transactions and session-graph cache (the
    footing of ``store.Store``)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        backend: Backend | None = None,
        synchronous: str | None = None,
        spill: SpillPolicy | None = None,
        create_parent: bool = True,
    ) -> None:
        if backend is None:
            if path is None:
                raise ValueError("give a database path or URL, or a backend")
            backend = open_backend(os.fspath(path), synchronous=synchronous, create_parent=create_parent)
        self.backend: Backend = backend
        #: what initialize reports: the file path, or the URL without its password
        self.path = backend.location
        self.spill = spill or SpillPolicy()
        #: called every 512 rows of a graph load (the engine sets its cancellation check,
        #: SPEC §1.4): a cancelled view also stops while the session's graph is read (8,000
        #: turns took 0.15-0.25 s before the view's first check)
        self.checkpoint: Callable[[], None] | None = None
        self._graphs: dict[str, SessionGraph] = {}
        #: session id → created_at of the session each cached graph was built from, so a
        #: session deleted and re-created under the same id by another process is rebuilt.
        self._graph_born: dict[str, float] = {}
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(Call)
        #: the never-waiting reads' answers, each beside the backend's kept rows it was
        #: built from (``Store._nowait_answer``)
        self._nowait_answers: dict[Any, tuple[Any, Any]] = {}
        #: bumped whenever the database was reopened (caches above compare it)
        self.generation = 0
        #: Held while a cached graph is brought up to date, while a read uses the backend's
        #: reading connection, and over a write transaction from the moment its database
        #: lock is ours until it commits or rolls back: a refresh never sees half a write.
        #: Waiting for another process's lock (or a slow server) does not hold it.
        self.lock = threading.RLock()
        #: One write transaction of this store at a time (the database's writer thread,
        #: and in-process callers); always taken before ``lock``, never after it.
        self._wlock = threading.RLock()
        #: this process's writes per session, begun before each transaction, so a poller
        #: never mistakes one for another process's before it was announced (SPEC §1.5)
        self.marks = WriteMarks()

    @property
    def kind(self) -> str:
        return self.backend.kind

    def close(self) -> None:
        self.backend.close()

    # ------------------------------------------------------------ transactions

    @contextmanager
    def _write(self, session_id: str) -> Iterator[None]:
        """One write transaction of one session; any failure (COMMIT's included) rolls
        back and drops the session's cached graph, so the cache never holds a node the
        database does not (the next read rebuilds it from what was committed)."""
        with self._write_many((session_id,)):
            yield

    @contextmanager
    def _write_many(self, session_ids: Sequence[str], *, group: bool = False,
                    nowait: bool = False) -> Iterator[None]:
        """One write transaction touching ``session_ids``; a failure drops their graphs
        before the store's lock is released. ``nowait``: the backend's (``WouldWait``), and
        a file to reopen is not reopened here but refused the same way."""
        marked = [sid for sid in session_ids if sid != DERIVED_KEY]
        self.marks.begin(marked)
        committed = False
        try:
            with self._wlock:
                if not nowait:
                    self.ensure_file()
                elif self.backend.vanished():
                    raise WouldWait("the file is to be reopened")
                with self.backend.transaction(session_ids[0], guard=self._dropping(session_ids), group=group,
                                              nowait=nowait):
                    yield
            committed = True
        finally:
            self.marks.end(marked, committed)

    @contextmanager
    def _dropping(self, session_ids: Sequence[str]) -> Iterator[None]:
        with self.lock:
            try:
                yield
            except BaseException:
                for sid in session_ids:
                    self._graphs.pop(sid, None)
                    self._graph_born.pop(sid, None)
                raise

    def storage_error_of(self, exc: BaseException) -> DagctxError | None:
        """The documented error of a storage fault that reached a request without a
        backend call mapping it (a memory index query, say), or None (a bug); a fault
        saying the file's tables changed under us has it reopened before the next request."""
        return self.backend.storage_error_of(exc)

    def ensure_file(self) -> None:
        """A database file deleted or replaced under us is reopened (or created, SPEC §2.1)
        before the next request uses it, and every cached graph of the old file dropped."""
        if not self.backend.vanished():
            return
        with self._wlock, self.lock:
            if not self.backend.vanished():
                return
            log.warning("the database file %s was deleted or replaced, or its tables changed, while open: "
                        "opening the file the path names now (a missing one is created, an older schema "
                        "brought up to date)", self.path)
            self.backend.reopen()
            self._graphs.clear()
            self._graph_born.clear()
            self.generation += 1

    def _session_row(self, session_id: str, *, lock: bool = False) -> SessionRow:
        if not lock:  # a read, outside any write: the file may have been replaced
            self.ensure_file()
        with self.lock:
            row = self.backend.session(session_id, lock=lock)
        if row is None:
            self._graphs.pop(session_id, None)
            raise DagctxError(
                "SessionNotFound",
                f"session {session_id!r} does not exist; list sessions with session/list "
                "or create one with session/create",
                session_id=session_id,
            )
        return row

    # ------------------------------------------------------------ graph cache

    def graph(self, session_id: str) -> SessionGraph:
        """The session's graph, brought up to date with every committed write."""
        with self.lock:
            return self._refresh(self._session_row(session_id))

    def _refresh(self, row: SessionRow) -> SessionGraph:
        with self.lock:
            return self._refresh_locked(row)

    def _refresh_locked(self, row: SessionRow) -> SessionGraph:
        g = self._graphs.get(row.id)
        if (
            g is None
            or g.root_id != row.root_id
            or g.rev > row.rev
            or self._graph_born.get(row.id) != row.created_at
        ):
            g = SessionGraph(row.id, row.root_id)
            self._graphs[row.id] = g
            self._graph_born[row.id] = row.created_at
        if row.rev > g.rev:
            dec = self._dec.decode
            tick = self.checkpoint
            loaded = 0
            # Exactly the revisions the row names: a write committed after the row was
            # read is loaded by the next refresh, never half now.
            try:
                for body in self.backend.bodies_between(row.id, g.rev, row.rev):
                    if tick is not None and not loaded & 511:
                        tick()
                    g.add(dec(body))
                    g.nbytes += len(body)
                    loaded += 1
            except BaseException:
                self._graphs.pop(row.id, None)  # half read (a cancel): the next refresh reads it whole
                raise
            g.rev = row.rev
            if loaded >= 1000:
                # A big load is long-lived data: keep the cyclic GC from re-scanning it on
                # every render (it was a third of a warm render's time on 10k nodes).
                gc.freeze()
        g.used_at = time.monotonic()
        return g

    def cached_graphs(self) -> list[tuple[str, int, float]]:
        """``(session id, bytes, last used)`` of every cached session graph: what a bound on
        the daemon's memory weighs (bytes are the stored bodies the graph decoded; the
        objects weigh a small multiple of that), for ``evict`` to act on."""
        with self.lock:
            return [(sid, g.nbytes, g.used_at) for sid, g in self._graphs.items()]

    def cached_counts(self) -> tuple[int, int, int]:
        """``(sessions, nodes, bytes)`` of the session graphs held in memory (daemon/status;
        bytes are the stored bodies each graph decoded)."""
        with self.lock:
            graphs = list(self._graphs.values())
        return len(graphs), sum(len(g.nodes) for g in graphs), sum(g.nbytes for g in graphs)

    def cache_bytes(self) -> int:
        with self.lock:
            return sum(g.nbytes for g in self._graphs.values())

    def evict(self, session_id: str) -> bool:
        """Drop a session's cached graph (the next read rebuilds it from the database)."""
        with self.lock:
            self._graph_born.pop(session_id, None)
            return self._graphs.pop(session_id, None) is not None

    def forget(self, session_id: str) -> None:
        """Drop a session's cached graph (after rows were written around the rules: a copy)."""
        self._graphs.pop(session_id, None)
        self._graph_born.pop(session_id, None)

    def head(self, session_id: str) -> str:
        with self.lock:
            return self._session_row(session_id).head

    def _locked(self, session_id: str) -> tuple[SessionRow, SessionGraph]:
        """Inside a write: the latest committed row (locked) and the graph it names."""
        row = self._session_row(session_id, lock=True)
        return row, self._refresh(row)

    # ------------------------------------------------------------ rows

    def _node_row(
        self,
        sid: str,
        call: Call,
        *,
        rev: int,
        derived: NodeDerived | None = None,
        search_text: str | None,
    ) -> NodeRow:
        tokens = derived.tokens if derived is not None else None
        refs = derived.refs if derived is not None else None
        if tokens and derived is not None and derived.chars is not None:
            tokens = {**tokens, CHARS_KEY: derived.chars}
        return NodeRow(
            sid, call.id, call.seq, rev, call.role, call.name, call.status, call.caller, call.predecessor,
            call.created_at, self._enc.encode(call), encode_meta(tokens) if tokens else None,
            encode_refs(refs) if refs is not None else None, search_text,
        )

    @staticmethod
    def _blob(sid: str, node_id: str, spilled: dict[str, Any]) -> BlobRow:
        return BlobRow(sid, node_id, "output", spilled["chars"], spilled["lines"], spilled["data"])

    def _finish(self, row: SessionRow, g: SessionGraph) -> None:
        row.updated_at = time.time()
        self.backend.save_session(row)
        g.rev = row.rev
