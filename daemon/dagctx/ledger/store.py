"""The ledger: sessions of append-only ``Call`` DAGs, kept by a storage backend.

``Store`` composes three things: the rules (``rules.py``, plain functions over the
session graph), a ``Backend`` (``backend.py``: SQLite file or PostgreSQL server) that
keeps rows, and the in-memory ``SessionGraph`` cache. Every write is one backend
transaction serialised per session (``_write``); inside it the session row is read
(locked), the graph brought up to date, the rules checked, rows written, and the
session row saved with a new revision. Every read first compares the session's
revision with the cached graph and loads only the rows that changed, so a daemon sees
another process's writes before it answers and never re-reads what it has.

Invariants enforced (SPEC §4), each with a test: append-only (the one mutation fills a
running node), duplicate ids refused, ``PredecessorMissing``, edges point at existing
nodes of the right kind, HEAD has one writer and moves only on user-facing moves. A
failed write — a rule, a storage fault, a failing COMMIT — leaves the database and the
cache exactly as they were.

API Boundary: ``Store`` is the only way anything above reads or writes the record.
Architecture Invariant: nothing above the ledger knows SQL; nothing here knows
JSON-RPC, tokens or rendering.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.messages import BranchInfo, IdMatch, SearchHit, SessionInfo
from dagctx.protocol.nodes import ROOT_SENTINEL, SYSTEM_PROMPT_NAME, Call, NodeInput

from . import rules
from . import search as fts
from .backend import (
    Backend,
    BlobRow,
    NodeDerived,
    NodeRow,
    SessionRow,
    UsageRow,
    decode_meta,
    decode_refs,
    encode_meta,
    encode_refs,
)
from .backends import open_backend
from .graph import SessionGraph, is_spawn_root
from .text import node_text
from .write_marks import WriteMarks

log = logging.getLogger("dagctx.ledger")

__all__ = ["AppendOutcome", "AppendRequest", "NodeDerived", "SpillPolicy", "Store", "UsageRow", "spill_output"]

#: the transaction key of writes that belong to no session (derived caches)
_DERIVED = "\x00derived"


@dataclass(frozen=True)
class SpillPolicy:
    """Function and tool results of at least ``min_chars`` characters, whatever their
    line count, are stored whole in ``blobs`` and the node keeps head + tail with a marker
    (write path, once, deterministic; SPEC §4). A system prompt is never spilled."""

    min_chars: int = 32_000
    head_chars: int = 6_000
    tail_chars: int = 3_000


@dataclass
class AppendOutcome:
    node: Call
    head: str
    moved: bool


@dataclass
class AppendRequest:
    """One unit of a group commit: nodes appended to one session, all or none of them
    (``node/append`` is a unit of one, ``node/appendBatch`` a unit of many)."""

    session_id: str
    nodes: Sequence[NodeInput]
    move_head: bool | None = None
    #: per node, what the layers above derived (or None)
    derived: Sequence[NodeDerived | None] | None = None
    #: ``node/appendBatch``: errors name the node's index (``nodes[2].predecessor``)
    batch: bool = False


class _Redo(Exception):
    """A unit failed after it wrote: the group is rolled back and run again without it."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index = index
        self.error = error


class Store:
    """The record of every session in one database (a SQLite file or a PostgreSQL URL).

    Many stores — in this process or in other daemons, on other hosts for PostgreSQL —
    may open the same database; each sees the others' committed writes before it answers.
    """

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
        self._graphs: dict[str, SessionGraph] = {}
        #: session id → created_at of the session each cached graph was built from, so a
        #: session deleted and re-created under the same id by another process is rebuilt.
        self._graph_born: dict[str, float] = {}
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(Call)
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
    def _write_many(self, session_ids: Sequence[str], *, group: bool = False) -> Iterator[None]:
        """One write transaction touching ``session_ids``; a failure drops their graphs
        before the store's lock is released."""
        marked = [sid for sid in session_ids if sid != _DERIVED]
        self.marks.begin(marked)
        committed = False
        try:
            with self._wlock:
                self.ensure_file()
                with self.backend.transaction(session_ids[0], guard=self._dropping(session_ids), group=group):
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

    def ensure_file(self) -> None:
        """A database file deleted or replaced under us is reopened (or created, SPEC §2.1)
        before the next request uses it, and every cached graph of the old file dropped."""
        if not self.backend.vanished():
            return
        with self._wlock, self.lock:
            if not self.backend.vanished():
                return
            log.warning("the database file %s was deleted or replaced while open: opening the file the path "
                        "names now (a missing one is created)", self.path)
            self.backend.reopen()
            self._graphs.clear()
            self._graph_born.clear()
            self.generation += 1

    # ------------------------------------------------------------ sessions

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

    @staticmethod
    def _info(r: SessionRow) -> SessionInfo:
        return SessionInfo(
            session_id=r.id,
            title=r.title,
            root_id=r.root_id,
            head=r.head,
            created_at=r.created_at,
            updated_at=r.updated_at,
            node_count=r.node_count,
            metadata={k: v for k, v in r.metadata.items() if not k.startswith("_")},
        )

    def create_session(
        self,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        source_key: str | None = None,
        session_id: str | None = None,
    ) -> SessionInfo:
        sid = session_id or str(uuid.uuid4())
        with self._write(sid):
            self._create_locked(sid, title, metadata, source_key)
        return self.get_session(sid)

    def _create_locked(
        self, sid: str, title: str | None, metadata: dict[str, Any] | None, source_key: str | None
    ) -> tuple[SessionRow, Call]:
        root_id = f"root-{sid}"
        now = time.time()
        root = Call(id=root_id, seq=0, created_at=now, role="user", name="ROOT", metadata={"display": "root"})
        row = SessionRow(sid, title or "untitled", root_id, root_id, now, now, 1, 1, 1, source_key,
                         dict(metadata or {}))
        if not self.backend.insert_session(row):
            raise DagctxError(
                "Conflict",
                f"a session with id {sid!r} or source {source_key!r} already exists",
                session_id=sid,
            )
        self.backend.insert_node(self._node_row(sid, root, rev=1, search_text=None))
        return row, root

    def import_session(
        self,
        *,
        source_key: str,
        title: str,
        nodes: Sequence[NodeInput],
        head: str | None,
        metadata: dict[str, Any] | None = None,
        derived: dict[str, NodeDerived] | None = None,
        usage: Sequence[UsageRow] = (),
    ) -> tuple[SessionInfo, bool]:
        """Create a session from an imported transcript in ONE transaction.

        Idempotent: a session with the same ``source_key`` is returned as it is
        (``created=False``). Spawn-branch roots are allowed here (an import replays
        spawns that already happened); every other rule of ``append`` applies.
        """
        existing = self.find_by_source(source_key)
        if existing is not None:
            return existing, False
        sid = str(uuid.uuid4())
        with self._write(sid):
            row, root = self._create_locked(sid, title, metadata, source_key)
            g = SessionGraph(sid, row.root_id)
            g.add(root)
            g.rev = row.rev
            self._graphs[sid] = g
            self._graph_born[sid] = row.created_at
            for inp in nodes:
                d = derived.get(inp.id) if derived and inp.id is not None else None
                # An import replays history: a node keeps the time it happened at the source.
                when = inp.metadata.get("timestamp")
                self._append_locked(row, g, inp, False, d, spawn_ok=True,
                                    created_at=float(when) if isinstance(when, (int, float)) else None)
            if head is not None:
                target = g.get(rules.resolve(row.root_id, head) or head)
                rules.check_head_target(g, target)
                row.head = target.id
            for u in usage:
                if u.node_id in g.nodes:
                    self.backend.put_usage(sid, u)
            self._finish(row, g)
        return self.get_session(sid), True

    def find_by_source(self, source_key: str) -> SessionInfo | None:
        self.ensure_file()
        with self.lock:
            row = self.backend.session_by_source(source_key)
        return None if row is None else self._info(row)

    def get_session(self, session_id: str) -> SessionInfo:
        return self._info(self._session_row(session_id))

    def list_sessions(self, limit: int = 100, offset: int = 0) -> tuple[list[SessionInfo], int]:
        rules.check_list_window(limit, offset)
        self.ensure_file()
        unlocked = getattr(self.backend, "sessions_unlocked", None)
        got = unlocked(limit, offset) if unlocked is not None else None
        if got is None:
            with self.lock:
                got = self.backend.sessions(limit, offset)
        rows, total = got
        return [self._info(r) for r in rows], total

    def resolve_ids(self, prefix: str, kinds: str = "any", session_id: str | None = None,
                    limit: int = 20) -> tuple[list[IdMatch], bool]:
        """Sessions, then nodes, whose id starts with ``prefix`` (SPEC §4.3): an index range
        scan in each backend, at most ``limit`` in all; True when more match."""
        rules.check_id_prefix(prefix, limit)
        if session_id is not None:
            self._session_row(session_id)
        self.ensure_file()
        lo, hi = rules.prefix_range(prefix)
        matches: list[IdMatch] = []
        with self.lock:
            if kinds in ("any", "session") and session_id is None:
                for sid, title in self.backend.sessions_in_range(lo, hi, limit + 1):
                    matches.append(IdMatch(kind="session", session_id=sid, title=title))
            room = limit + 1 - len(matches)
            if kinds in ("any", "node") and room > 0:
                for sid, nid, role in self.backend.nodes_in_range(lo, hi, room, session_id):
                    matches.append(IdMatch(kind="node", session_id=sid, node_id=nid, role=role))
        # the range is exact for ids in byte order; the check costs nothing and keeps it so
        matches = [x for x in matches if (x.node_id or x.session_id).startswith(prefix)]
        return matches[:limit], len(matches) > limit

    def rename_session(self, session_id: str, title: str) -> SessionInfo:
        rules.check_title(title)
        with self._write(session_id):
            row = self._session_row(session_id, lock=True)
            row.title = title
            row.updated_at = time.time()
            self.backend.save_session(row)
        return self.get_session(session_id)

    def delete_session(self, session_id: str) -> int:
        with self._write(session_id):
            self._session_row(session_id, lock=True)
            n = self.backend.delete_session(session_id)
        self._graphs.pop(session_id, None)
        return n

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
            loaded = 0
            # Exactly the revisions the row names: a write committed after the row was
            # read is loaded by the next refresh, never half now.
            for body in self.backend.bodies_between(row.id, g.rev, row.rev):
                g.add(dec(body))
                g.nbytes += len(body)
                loaded += 1
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

    # ------------------------------------------------------------ appends

    def append(
        self,
        session_id: str,
        node: NodeInput,
        *,
        move_head: bool | None = None,
        derived: NodeDerived | None = None,
    ) -> AppendOutcome:
        with self._write(session_id):
            row, g = self._locked(session_id)
            outcome = self._append_locked(row, g, node, move_head, derived)
            self._finish(row, g)
        return outcome

    def append_many(
        self,
        session_id: str,
        nodes: Iterable[NodeInput],
        *,
        head: str | None = None,
        derived: dict[str, NodeDerived] | None = None,
    ) -> list[Call]:
        """Append a batch in one transaction (imports); HEAD moves to ``head`` if given.

        All or nothing: one invalid node rolls the whole batch back.
        """
        out: list[Call] = []
        with self._write(session_id):
            row, g = self._locked(session_id)
            for inp in nodes:
                d = derived.get(inp.id) if derived and inp.id is not None else None
                out.append(self._append_locked(row, g, inp, False, d).node)
            if head is not None:
                target = g.get(rules.resolve(row.root_id, head) or head)
                rules.check_head_target(g, target)
                row.head = target.id
            self._finish(row, g)
        return out

    def append_group(self, units: Sequence[AppendRequest]) -> list[list[AppendOutcome] | BaseException]:
        """Group commit (SPEC §4.2): every unit in ONE transaction (one sync), each unit
        all or nothing, failures isolated per unit, in the order given.

        Each unit meets the rules exactly as a lone ``append`` would, after the units before
        it: seq and HEAD are per session, as if the units had been appended one by one. A
        unit the rules refuse before it wrote anything just answers its error; a unit that
        fails after writing (a later node of a batch, a row the database refuses) rolls the
        group back, and the group runs again without it. A fault of the database itself
        (full, read-only, gone, a failing COMMIT) fails every unit of the group: none was
        written. Returns, per unit, its outcomes or the exception it answers.
        """
        results: list[list[AppendOutcome] | BaseException] = [RuntimeError("not run")] * len(units)
        todo = list(range(len(units)))
        while todo:
            sids = sorted({units[i].session_id for i in todo})
            done: dict[int, list[AppendOutcome] | BaseException] = {}
            try:
                with self._write_many(sids, group=True):
                    state: dict[str, tuple[SessionRow, SessionGraph, int] | BaseException] = {}
                    # every session of the group locked in one round trip, in id order
                    locked = self.backend.lock_sessions(sids)
                    for sid in sids:
                        row = locked.get(sid)
                        if row is None:
                            self._graphs.pop(sid, None)
                            state[sid] = DagctxError(
                                "SessionNotFound",
                                f"session {sid!r} does not exist; list sessions with session/list "
                                "or create one with session/create",
                                session_id=sid,
                            )
                        else:
                            state[sid] = (row, self._refresh(row), row.rev)
                    for i in todo:
                        done[i] = self._apply_unit(i, units[i], state[units[i].session_id])
                    for st in state.values():
                        if isinstance(st, tuple) and st[0].rev != st[2]:
                            self._finish(st[0], st[1])
            except _Redo as redo:
                results[redo.index] = redo.error
                todo.remove(redo.index)
                continue
            except BaseException as exc:
                if len(todo) > 1 and isinstance(exc, Exception) and not isinstance(exc, DagctxError) \
                        and self.backend.fault_kind(exc) is None:
                    # Not a fault of the database but of some row, found only at COMMIT (a
                    # deferred constraint): each unit alone, so only the culprit fails.
                    for i in todo:
                        results[i] = self.append_group([units[i]])[0]
                    return results
                for i in todo:
                    results[i] = exc
                return results
            for i in todo:
                results[i] = done[i]
            return results
        return results

    def _apply_unit(self, index: int, unit: AppendRequest,
                    st: tuple[SessionRow, SessionGraph, int] | BaseException) -> list[AppendOutcome] | BaseException:
        if isinstance(st, BaseException):
            return st
        row, g, _ = st
        rev0 = row.rev
        derived = unit.derived or [None] * len(unit.nodes)
        out: list[AppendOutcome] = []
        try:
            for k, (inp, d) in enumerate(zip(unit.nodes, derived)):
                # In a batch, moveHead is about its conversation nodes; a nested call never moves HEAD.
                mh = None if unit.batch and unit.move_head and inp.predecessor is None else unit.move_head
                try:
                    out.append(self._append_locked(row, g, inp, mh, d))
                except DagctxError as err:
                    if unit.batch:
                        rest = err.path[len("node"):] if err.path and err.path.startswith("node") else (
                            f".{err.path}" if err.path else "")
                        err.path = f"nodes[{k}]{rest}"
                        err.message = f"nodes[{k}]: {err.message}; nothing of the batch was written"
                    raise
        except DagctxError as err:
            if row.rev == rev0:
                return err  # refused before it wrote: its group-mates go on
            raise _Redo(index, err) from err
        except Exception as exc:
            if self.backend.fault_kind(exc) is not None:
                raise  # the database's fault: every unit of the group fails
            raise _Redo(index, exc) from exc
        return out

    def _append_locked(
        self,
        row: SessionRow,
        g: SessionGraph,
        inp: NodeInput,
        move_head: bool | None,
        derived: NodeDerived | None,
        *,
        spawn_ok: bool = False,
        created_at: float | None = None,
    ) -> AppendOutcome:
        node_id = inp.id if inp.id is not None else uuid.uuid4().hex
        rules.check_new_id(g, node_id)
        predecessor = rules.resolve(row.root_id, inp.predecessor)
        caller = rules.resolve(row.root_id, inp.caller)
        # Errors name the client's id, never one made up for a node that was not written.
        rules.check_edges(g, row.head, inp.id, inp, predecessor, caller, spawn_ok=spawn_ok)
        rules.check_reasoning(inp.role, inp.metadata)

        output, spilled = spill_output(inp.output, self.spill, role=inp.role, name=inp.name)
        metadata = dict(inp.metadata)
        if spilled is not None:
            metadata["spill"] = {k: v for k, v in spilled.items() if k != "data"}
        call = Call(
            id=node_id,
            seq=row.next_seq,
            created_at=time.time() if created_at is None else created_at,
            role=inp.role,
            name=inp.name,
            input=inp.input,
            output=output,
            status=inp.status,
            caller=caller,
            predecessor=predecessor,
            reads=list(inp.reads),
            metadata=metadata,
        )
        # Decide HEAD before anything is written: a refused moveHead writes nothing.
        new_head, moved = rules.head_after_append(g, row.head, call, move_head)
        row.rev += 1
        row.next_seq += 1
        row.node_count += 1
        full = node_text(call) if spilled is None else node_text(msgspec.structs.replace(call, output=spilled["data"]))
        node_row = self._node_row(row.id, call, rev=row.rev, derived=derived, search_text=full)
        self.backend.insert_node(node_row)
        if spilled is not None:
            self.backend.put_blob(self._blob(row.id, node_id, spilled))
        g.add(call)
        g.nbytes += len(node_row.body)  # what a refresh would have decoded (the cache bound's weight)
        if moved:
            if call.predecessor == row.head:
                rules.move_branch_name(row.metadata.get("_branches"), row.head, call.id)
            row.head = new_head
        return AppendOutcome(call, row.head, moved)

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

    # ------------------------------------------------------------ the one mutation

    def update(
        self,
        session_id: str,
        node_id: str,
        *,
        status: str,
        output: Any = None,
        metadata: dict[str, Any] | None = None,
        derived: NodeDerived | None = None,
    ) -> AppendOutcome:
        """Fill a running node (SPEC §4). ``derived`` replaces the parts of the stored
        derived data it holds; a part it lacks is kept (an update without a new output)."""
        with self._write(session_id):
            row, g = self._locked(session_id)
            old = g.get(node_id)
            rules.check_update(session_id, old, status)
            rules.check_reasoning(old.role, metadata or {}, "metadata.reasoning")
            new_output, spilled = spill_output(output if output is not None else old.output, self.spill,
                                               role=old.role, name=old.name)
            meta = {**old.metadata, **(metadata or {})}
            if spilled is not None:
                meta["spill"] = {k: v for k, v in spilled.items() if k != "data"}
            row.rev += 1
            call = msgspec.structs.replace(old, output=new_output, status=status, metadata=meta)
            full = node_text(call) if spilled is None else node_text(
                msgspec.structs.replace(call, output=spilled["data"])
            )
            node_row = self._node_row(session_id, call, rev=row.rev, derived=derived, search_text=full)
            self.backend.fill_node(node_row)
            if spilled is not None:
                self.backend.put_blob(self._blob(session_id, node_id, spilled))
            g.add(call)
            g.nbytes += len(node_row.body)
            self._finish(row, g)
        return AppendOutcome(call, row.head, False)

    # ------------------------------------------------------------ HEAD moves

    def checkout(self, session_id: str, node_id: str) -> tuple[str, str]:
        with self._write(session_id):
            row, g = self._locked(session_id)
            target = g.get(rules.resolve(row.root_id, node_id) or node_id)
            rules.check_head_target(g, target)
            previous = row.head
            row.head = target.id
            self._finish(row, g)
        return row.head, previous

    def rewind(self, session_id: str, node_id: str | None = None, steps: int | None = None) -> tuple[str, str]:
        if (node_id is None) == (steps is None):
            raise DagctxError("InvalidParams", "give exactly one of nodeId or steps", path="nodeId")
        with self._write(session_id):
            row, g = self._locked(session_id)
            target = rules.rewind_target(g, row.head, node_id, steps)
            previous = row.head
            row.head = target
            self._finish(row, g)
        return row.head, previous

    def spawn(
        self,
        session_id: str,
        caller_id: str,
        *,
        source: str = "spawn",
        name: str | None = None,
        output: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> AppendOutcome:
        """Create a spawn-branch root (SPEC §4): the only way to make one."""
        with self._write(session_id):
            row, g = self._locked(session_id)
            caller = g.get(rules.resolve(row.root_id, caller_id) or caller_id)
            row.rev += 1
            meta = dict(metadata or {})
            meta.update({"spawn_branch_root": True, "source": source})
            call = Call(
                id=uuid.uuid4().hex,
                seq=row.next_seq,
                created_at=time.time(),
                role="user",
                name=name or source,
                output=output,
                caller=caller.id,
                predecessor=None,
                metadata=meta,
            )
            row.next_seq += 1
            row.node_count += 1
            self.backend.insert_node(self._node_row(row.id, call, rev=row.rev, search_text=node_text(call)))
            g.add(call)
            if name:
                row.metadata.setdefault("_branches", {})[call.id] = name
            self._finish(row, g)
        return AppendOutcome(call, row.head, False)

    def name_branch(self, session_id: str, tip: str, name: str | None) -> None:
        with self._write(session_id):
            row, g = self._locked(session_id)
            node = g.get(tip)
            rules.check_head_target(g, node)
            names = row.metadata.setdefault("_branches", {})
            if name:
                names[tip] = name
            else:
                names.pop(tip, None)
            self._finish(row, g)

    # ------------------------------------------------------------ reads

    def history(self, session_id: str, head: str | None = None) -> tuple[list[Call], str]:
        with self.lock:
            row = self._session_row(session_id)
            g = self._refresh(row)
        h = row.head if head is None else (rules.resolve(row.root_id, head) or head)
        return g.chain(h), h

    def branches(self, session_id: str) -> tuple[list[BranchInfo], str]:
        with self.lock:
            row = self._session_row(session_id)
            g = self._refresh(row)
        names: dict[str, str] = row.metadata.get("_branches", {})
        main = g.main_tip()
        spans = g.chain_spans()  # lengths in one pass, not one walk per tip
        out = []
        for tip in g.tips():
            if tip in spans:
                length, first_id = spans[tip]
                first: Call | None = g.nodes[first_id]
            else:  # ROOT, or a broken chain: the walk says which (BrokenPredecessorChain)
                chain = g.chain(tip)
                length, first = len(chain), (chain[0] if chain else None)
            out.append(
                BranchInfo(
                    head=tip,
                    length=length,
                    main=tip == main,
                    current=tip == row.head,
                    spawn=bool(first is not None and is_spawn_root(first)),
                    name=names.get(tip) or (names.get(first.id) if first is not None else None),
                    root=first.id if first is not None else None,
                )
            )
        return out, row.head

    def get_nodes(
        self, session_id: str, ids: Sequence[str], *, offset: int = 0, length: int | None = None, ranged: bool = False
    ) -> list[Call]:
        with self.lock:
            row = self._session_row(session_id)
            g = self._refresh(row)
        out = []
        for node in rules.known(g, ids):
            if ranged:
                full = self.full_output(session_id, node)
                if isinstance(full, str):
                    rules.check_range(offset, length)
                    end = None if length is None else offset + length
                    node = msgspec.structs.replace(node, output=full[offset:end])
            out.append(node)
        return out

    def full_output(self, session_id: str, node: Call) -> Any:
        """The whole output of a node, reading the spilled blob when there is one."""
        if "spill" not in node.metadata:
            return node.output
        with self.lock:
            got = self.backend.blob(session_id, node.id, "output")
        return node.output if got is None else got

    # ------------------------------------------------------------ search

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        limit: int = 20,
        roles: Sequence[str] | None = None,
    ) -> list[SearchHit]:
        """Full-text search (SPEC §5.6): the same query syntax and hits on every backend."""
        rules.check_search(query, limit)
        if session_id is not None:
            self._session_row(session_id)
        else:
            self.ensure_file()
        with self.lock:
            rows = self.backend.search(query, session_id=session_id, roles=roles, limit=limit)
        terms = fts.query_terms(query)
        return [
            SearchHit(
                session_id=r[0],
                node_id=r[1],
                role=r[2],
                name=r[5],
                seq=r[6],
                snippet=fts.snippet(r[4], terms),
                score=r[3],
            )
            for r in rows
        ]

    # ------------------------------------------------------------ derived caches

    def token_counts(self, session_id: str, tokenizer: str) -> dict[str, tuple[int, int]]:
        """Stored (input, output) token counts of every node for one tokenizer."""
        out: dict[str, tuple[int, int]] = {}
        with self.lock:
            rows = list(self.backend.token_rows(session_id))
        for nid, blob in rows:
            got = decode_meta(blob).get(tokenizer)
            if got is not None:
                out[nid] = (got[0], got[1])
        return out

    def reference_lists(self, session_id: str, *, after_seq: int = -1,
                        ids: Sequence[str] | None = None) -> dict[str, list[str]]:
        """Stored ranked references (code nodes, SPEC §8) of the nodes that have them:
        every one, those with ``seq > after_seq``, or those of ``ids``."""
        if ids is not None and not ids:
            return {}
        with self.lock:
            rows = list(self.backend.ref_rows(session_id, after_seq=after_seq, ids=ids))
        return {nid: decode_refs(blob) for nid, blob in rows}

    def fill_references(self, session_id: str, refs: dict[str, Sequence[str]]) -> None:
        """Keep references mined for nodes that had none stored (rows written before schema
        version 2): one derived transaction; a node's body, revision and session row stay
        as they are, and a list already stored is never replaced."""
        if not refs:
            return
        with self._write_many((_DERIVED,)):
            self.backend.fill_refs(session_id, [(nid, encode_refs(r)) for nid, r in refs.items()])

    def put_usage(self, session_id: str, usage: UsageRow) -> None:
        with self._write(session_id):
            self._session_row(session_id, lock=True)
            self.backend.put_usage(session_id, usage)

    # Summaries made for one request by reduction within a turn (SPEC §8): derived data,
    # keyed by a hash of the summarized content and the model configuration, never part
    # of a session (the backend keeps them in a table of their own).

    def reduction_summaries(self, keys: Sequence[str]) -> dict[str, tuple[str, int, int]]:
        """Cached request summaries by key: ``key → (text, input tokens, output tokens)``."""
        if not keys:
            return {}
        with self.lock:
            return self.backend.reduction_summaries(list(dict.fromkeys(keys)))

    def put_reduction_summaries(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        """Keep request summaries ``(key, kind, text, input tokens, output tokens)``, one
        transaction (idempotent: the same key always holds the same meaning)."""
        if not rows:
            return
        with self._write_many((_DERIVED,)):
            self.backend.put_reduction_summaries(rows, time.time())

    def usage(self, session_id: str) -> list[UsageRow]:
        with self.lock:
            return self.backend.usage_rows(session_id)


def spill_output(output: Any, policy: SpillPolicy, *, role: str = "code",
                 name: str = "") -> tuple[Any, dict[str, Any] | None]:
    """What the node keeps of ``output``, and the spill record (``data`` = the whole text).

    Pure and deterministic, so the engine can count the tokens of exactly what the
    store will keep before it appends. Size alone decides (SPEC §4: a 50 MB output on
    one line spills like a 50 MB log). Only function and tool results (``role`` code)
    spill: a user's message and a model's reply are what the conversation is, and a
    ``context/system_prompt`` node (``name``) is sent whole, so it is stored and counted
    whole, however long.
    """
    p = policy
    if (role != "code" or name == SYSTEM_PROMPT_NAME or not isinstance(output, str)
            or len(output) < p.min_chars):
        return output, None
    lines = output.count("\n") + 1
    chars = len(output)
    head = output[: p.head_chars]
    tail = output[chars - p.tail_chars :]
    omitted = chars - len(head) - len(tail)
    marker = (
        f"\n[… {omitted:,} of {chars:,} characters ({lines:,} lines) omitted here; the whole "
        f"output is stored: read it with node/get and range {{offset: {len(head)}, length: {omitted}}} …]\n"
    )
    info = {
        "chars": chars,
        "lines": lines,
        "headChars": len(head),
        "tailChars": len(tail),
        "omitted": omitted,
        "data": output,
    }
    return head + marker + tail, info
