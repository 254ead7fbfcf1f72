"""The ledger: sessions of append-only ``Call`` DAGs in one SQLite file.

This is the only module that runs SQL. Every write is one ``BEGIN IMMEDIATE``
transaction, so seq assignment and HEAD moves are serialised across processes
sharing the file; every read first compares the session's revision counter with
the cached ``SessionGraph`` and loads only the rows that changed, so a daemon sees
another process's writes before it answers and never re-reads what it has.

Invariants enforced here (SPEC §4), each with a test:
append-only (the one mutation fills a running node), duplicate ids refused,
``PredecessorMissing``, edges must point at existing nodes of the right kind,
HEAD has one writer and moves only on user-facing moves.

Architecture Invariant: nothing above the ledger knows SQL; nothing here knows
JSON-RPC, tokens or rendering.
"""

from __future__ import annotations

import gc
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.context_messages import Usage
from dagctx.protocol.messages import BranchInfo, SearchHit, SessionInfo
from dagctx.protocol.nodes import (
    ROOT_SENTINEL,
    SUMMARY_NAME,
    TERMINAL_STATUSES,
    Call,
    NodeInput,
)

from . import search as fts
from .graph import SessionGraph, is_spawn_root, is_summary
from .schema import migrate
from .text import node_text

_ID_RE = re.compile(r"^[^\x00-\x1f]{1,200}$")


@dataclass(frozen=True)
class SpillPolicy:
    """Outputs longer than both limits are stored whole in ``blobs`` and the node keeps
    head + tail with a marker (write path, once, deterministic)."""

    min_chars: int = 32_000
    min_lines: int = 100
    head_chars: int = 6_000
    tail_chars: int = 3_000


@dataclass
class AppendOutcome:
    node: Call
    head: str
    moved: bool


@dataclass
class TokenRow:
    input_tokens: int
    output_tokens: int


@dataclass
class UsageRow:
    """Provider usage of one llm node as stored: the wire ``Usage`` and what the ledger adds
    (the resolved model, the estimate it was sent with, when it was reported)."""

    node_id: str
    model: str | None
    usage: Usage
    estimated: int | None
    reported_at: float

    @property
    def prompt(self) -> int:
        return self.usage.prompt


@dataclass
class _SessionRow:
    id: str
    title: str
    root_id: str
    head: str
    created_at: float
    updated_at: float
    next_seq: int
    rev: int
    node_count: int
    source_key: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


_SESSION_COLS = (
    "id, title, root_id, head, created_at, updated_at, next_seq, rev, node_count, source_key, metadata"
)


class Store:
    """One SQLite database file, opened by one daemon (others may open it too)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str | None = None,
        spill: SpillPolicy | None = None,
        create_parent: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        if self.path != ":memory:":
            parent = os.path.dirname(os.path.abspath(self.path))
            if create_parent:
                os.makedirs(parent, exist_ok=True)
            elif not os.path.isdir(parent):
                raise FileNotFoundError(f"the folder {parent!r} does not exist")
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        sync = (synchronous or os.environ.get("DAGCTX_SYNC") or "NORMAL").upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {sync!r}")
        # WAL + NORMAL: a committed transaction survives kill -9 of this process
        # (it is in the WAL file); FULL also survives power loss.
        self.db.execute(f"PRAGMA synchronous={sync}")
        self.db.execute("PRAGMA busy_timeout=30000")
        self.db.execute("PRAGMA foreign_keys=OFF")
        migrate(self.db)
        self.spill = spill or SpillPolicy()
        self._graphs: dict[str, SessionGraph] = {}
        #: session id → created_at of the session each cached graph was built from, so a
        #: session deleted and re-created under the same id by another process is rebuilt.
        self._graph_born: dict[str, float] = {}
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(Call)
        self._meta_enc = msgspec.msgpack.Encoder()
        self._meta_dec = msgspec.msgpack.Decoder(dict)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ transactions

    @contextmanager
    def _write(self, session_id: str | None = None) -> Iterator[None]:
        """One immediate write transaction; a failure rolls back and drops the cache."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            if session_id is not None:
                self._graphs.pop(session_id, None)
            raise
        else:
            self.db.execute("COMMIT")

    # ------------------------------------------------------------ sessions

    def _session_row(self, session_id: str) -> _SessionRow:
        row = self.db.execute(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE id=?", (session_id,)
        ).fetchone()
        if row is None:
            self._graphs.pop(session_id, None)
            raise DagctxError(
                "SessionNotFound",
                f"session {session_id!r} does not exist; list sessions with session/list "
                "or create one with session/create",
                session_id=session_id,
            )
        return self._row(row)

    def _row(self, row: Sequence[Any]) -> _SessionRow:
        return _SessionRow(*row[:10], metadata=self._meta_dec.decode(row[10]))

    @staticmethod
    def _info(r: _SessionRow) -> SessionInfo:
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
    ) -> _SessionRow:
        root_id = f"root-{sid}"
        now = time.time()
        root = Call(id=root_id, seq=0, created_at=now, role="user", name="ROOT", metadata={"display": "root"})
        meta = dict(metadata or {})
        try:
            self.db.execute(
                f"INSERT INTO sessions({_SESSION_COLS}) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                (sid, title or "untitled", root_id, root_id, now, now, 1, 1, 1, source_key, self._meta_enc.encode(meta)),
            )
        except sqlite3.IntegrityError as exc:
            raise DagctxError(
                "Conflict",
                f"a session with id {sid!r} or source {source_key!r} already exists",
                session_id=sid,
            ) from exc
        self._insert_row(sid, root, rev=1)
        return _SessionRow(sid, title or "untitled", root_id, root_id, now, now, 1, 1, 1, source_key, meta)

    def import_session(
        self,
        *,
        source_key: str,
        title: str,
        nodes: Sequence[NodeInput],
        head: str | None,
        metadata: dict[str, Any] | None = None,
        token_counts: dict[str, dict[str, tuple[int, int]]] | None = None,
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
            row = self._create_locked(sid, title, metadata, source_key)
            g = SessionGraph(sid, row.root_id)
            self._graphs[sid] = g
            g.add(self._dec.decode(self.db.execute(
                "SELECT body FROM nodes WHERE session_id=? AND id=?", (sid, row.root_id)).fetchone()[0]))
            g.rev = row.rev
            for inp in nodes:
                counts = token_counts.get(inp.id) if token_counts and inp.id is not None else None
                # An import replays history: a node keeps the time it happened at the source.
                when = inp.metadata.get("timestamp")
                self._append_locked(row, g, inp, False, counts, spawn_ok=True,
                                    created_at=float(when) if isinstance(when, (int, float)) else None)
            if head is not None:
                target = g.get(row.root_id if head == ROOT_SENTINEL else head)
                self._check_head_target(g, target)
                row.head = target.id
            for u in usage:
                if u.node_id in g.nodes:
                    self.db.execute(
                        "INSERT OR REPLACE INTO usage(session_id, node_id, model, input, output, cache_read, "
                        "cache_write, estimated, reported_at) VALUES(?,?,?,?,?,?,?,?,?)",
                        (sid, u.node_id, u.model, u.usage.input, u.usage.output, u.usage.cache_read,
                         u.usage.cache_write, u.estimated, u.reported_at),
                    )
            self._finish(row, g)
        return self.get_session(sid), True

    def find_by_source(self, source_key: str) -> SessionInfo | None:
        row = self.db.execute(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE source_key=?", (source_key,)
        ).fetchone()
        return None if row is None else self._info(self._row(row))

    def get_session(self, session_id: str) -> SessionInfo:
        return self._info(self._session_row(session_id))

    def list_sessions(self, limit: int = 100, offset: int = 0) -> tuple[list[SessionInfo], int]:
        if limit < 0 or offset < 0:
            raise DagctxError("InvalidParams", "limit and offset must be zero or positive")
        rows = self.db.execute(
            f"SELECT {_SESSION_COLS} FROM sessions ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
            (limit, offset),
        ).fetchall()
        total = self.db.execute("SELECT count(*) FROM sessions").fetchone()[0]
        return [self._info(self._row(r)) for r in rows], total

    def rename_session(self, session_id: str, title: str) -> SessionInfo:
        if not title.strip():
            raise DagctxError("InvalidParams", "title must not be empty")
        with self._write(session_id):
            self._session_row(session_id)
            self.db.execute(
                "UPDATE sessions SET title=?, updated_at=? WHERE id=?", (title, time.time(), session_id)
            )
        return self.get_session(session_id)

    def delete_session(self, session_id: str) -> int:
        with self._write(session_id):
            row = self._session_row(session_id)
            self.db.execute(
                "DELETE FROM search WHERE rowid IN (SELECT rowid FROM nodes WHERE session_id=?)",
                (session_id,),
            )
            n = self.db.execute("DELETE FROM nodes WHERE session_id=?", (session_id,)).rowcount
            for table in ("usage", "blobs"):
                self.db.execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))
            self.db.execute("DELETE FROM sessions WHERE id=?", (row.id,))
        self._graphs.pop(session_id, None)
        return n

    # ------------------------------------------------------------ graph cache

    def graph(self, session_id: str) -> SessionGraph:
        """The session's graph, brought up to date with every committed write."""
        return self._refresh(self._session_row(session_id))

    def _refresh(self, row: _SessionRow) -> SessionGraph:
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
            cur = self.db.execute(
                "SELECT body FROM nodes WHERE session_id=? AND rev>? ORDER BY seq", (row.id, g.rev)
            )
            dec = self._dec.decode
            loaded = 0
            for (body,) in cur:
                g.add(dec(body))
                loaded += 1
            g.rev = row.rev
            if loaded >= 1000:
                # A big load is long-lived data: keep the cyclic GC from re-scanning it on
                # every render (it was a third of a warm render's time on 10k nodes).
                gc.freeze()
        return g

    def head(self, session_id: str) -> str:
        return self._session_row(session_id).head

    # ------------------------------------------------------------ appends

    def append(
        self,
        session_id: str,
        node: NodeInput,
        *,
        move_head: bool | None = None,
        token_counts: dict[str, tuple[int, int]] | None = None,
    ) -> AppendOutcome:
        with self._write(session_id):
            row = self._session_row(session_id)
            g = self._refresh(row)
            outcome = self._append_locked(row, g, node, move_head, token_counts)
            self._finish(row, g)
        return outcome

    def append_many(
        self,
        session_id: str,
        nodes: Iterable[NodeInput],
        *,
        head: str | None = None,
        token_counts: dict[str, dict[str, tuple[int, int]]] | None = None,
    ) -> list[Call]:
        """Append a batch in one transaction (imports); HEAD moves to ``head`` if given.

        All or nothing: one invalid node rolls the whole batch back.
        """
        out: list[Call] = []
        with self._write(session_id):
            row = self._session_row(session_id)
            g = self._refresh(row)
            for inp in nodes:
                counts = None
                if token_counts and inp.id is not None:
                    counts = token_counts.get(inp.id)
                out.append(self._append_locked(row, g, inp, False, counts).node)
            if head is not None:
                target = g.get(head if head != ROOT_SENTINEL else row.root_id)
                self._check_head_target(g, target)
                row.head = target.id
            self._finish(row, g)
        return out

    def _append_locked(
        self,
        row: _SessionRow,
        g: SessionGraph,
        inp: NodeInput,
        move_head: bool | None,
        token_counts: dict[str, tuple[int, int]] | None,
        *,
        spawn_ok: bool = False,
        created_at: float | None = None,
    ) -> AppendOutcome:
        node_id = inp.id if inp.id is not None else uuid.uuid4().hex
        if not _ID_RE.match(node_id):
            raise DagctxError(
                "InvalidParams",
                "node.id must be 1–200 characters without control characters",
                path="node.id",
            )
        if node_id in g.nodes or node_id == ROOT_SENTINEL:
            raise DagctxError(
                "DuplicateNode",
                f"node {node_id!r} already exists in session {row.id!r}; ids are unique and "
                "nodes are never replaced — omit node.id to get a fresh one",
                node_id=node_id,
                session_id=row.id,
            )
        predecessor = row.root_id if inp.predecessor == ROOT_SENTINEL else inp.predecessor
        caller = row.root_id if inp.caller == ROOT_SENTINEL else inp.caller
        # Errors name the client's id, never one made up for a node that was not written.
        self._validate_edges(row, g, inp.id, inp, predecessor, caller, spawn_ok=spawn_ok)

        output, spilled = self._spill(inp.output)
        metadata = dict(inp.metadata)
        if spilled is not None:
            metadata["spill"] = {k: v for k, v in spilled.items() if k != "data"}
        row.rev += 1
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
        row.next_seq += 1
        row.node_count += 1
        self._insert_row(
            row.id, call, rev=row.rev, full_output=None if spilled is None else spilled["data"], tokens=token_counts
        )
        if spilled is not None:
            self.db.execute(
                "INSERT INTO blobs(session_id, node_id, field, chars, lines, data) VALUES(?,?,?,?,?,?)",
                (row.id, node_id, "output", spilled["chars"], spilled["lines"], spilled["data"]),
            )
        g.add(call)

        moved = False
        if g.is_conversation(call) and not is_summary(call):
            extends = predecessor == row.head
            if move_head is True or (move_head is None and extends):
                if extends:
                    self._move_branch_name(row, row.head, call.id)
                row.head = call.id
                moved = True
        elif move_head is True:
            raise DagctxError(
                "InvalidEdge",
                "moveHead is only for conversation nodes (user/llm turns or top-level calls "
                "with a predecessor); a nested call never becomes HEAD",
                node_id=node_id,
                session_id=row.id,
            )
        return AppendOutcome(call, row.head, moved)

    def _validate_edges(
        self,
        row: _SessionRow,
        g: SessionGraph,
        node_id: str | None,
        inp: NodeInput,
        predecessor: str | None,
        caller: str | None,
        *,
        spawn_ok: bool = False,
    ) -> None:
        sid = row.id
        if inp.metadata.get("spawn_branch_root") and not (spawn_ok and predecessor is None and caller is not None):
            raise DagctxError(
                "InvalidEdge",
                "spawn-branch roots are created only by session/spawn, never by node/append",
                node_id=node_id,
                session_id=sid,
                path="node.metadata.spawn_branch_root",
            )
        if caller is not None and caller not in g.nodes:
            raise DagctxError(
                "NodeNotFound",
                f"node.caller {caller!r} does not exist in session {sid!r}",
                node_id=caller,
                session_id=sid,
                path="node.caller",
            )
        if predecessor is not None:
            pred = g.nodes.get(predecessor)
            if pred is None:
                raise DagctxError(
                    "NodeNotFound",
                    f"node.predecessor {predecessor!r} does not exist in session {sid!r}; "
                    f"the current head is {row.head!r}",
                    node_id=predecessor,
                    session_id=sid,
                    path="node.predecessor",
                )
            if not g.is_conversation(pred):
                raise DagctxError(
                    "InvalidEdge",
                    f"node.predecessor {predecessor!r} is a nested call, not a conversation node; "
                    "a predecessor must be a user/llm turn, a top-level call, or ROOT",
                    node_id=predecessor,
                    session_id=sid,
                    path="node.predecessor",
                )
        nested = caller is not None and caller != row.root_id and g.nodes[caller].role in ("code", "llm")
        if nested and predecessor is not None:
            raise DagctxError(
                "InvalidEdge",
                "a nested call (its caller is a function or an LLM call) has no predecessor: "
                "drop node.predecessor, or drop node.caller for a top-level turn",
                node_id=node_id,
                session_id=sid,
                path="node.predecessor",
            )
        ask_user_answer = inp.role == "user" and inp.input is not None and caller is not None
        if inp.role in ("user", "llm") and not nested and predecessor is None and not ask_user_answer:
            raise DagctxError(
                "PredecessorMissing",
                f"a top-level {inp.role} node needs node.predecessor: pass the current head "
                f"{row.head!r} to continue the branch, an earlier turn's id to fork, or \"ROOT\"",
                node_id=node_id,
                session_id=sid,
                path="node.predecessor",
                details={"head": row.head},
            )
        for rid in inp.reads:
            if rid not in g.nodes:
                raise DagctxError(
                    "NodeNotFound",
                    f"node.reads names {rid!r}, which does not exist in session {sid!r}",
                    node_id=rid,
                    session_id=sid,
                    path="node.reads",
                )
        if inp.name == SUMMARY_NAME and inp.role == "llm":
            covers = inp.metadata.get("covers_ids")
            if not isinstance(covers, list) or not covers:
                raise DagctxError(
                    "InvalidEdge",
                    "a context/summary node needs metadata.covers_ids: the ordered ids it replaces",
                    node_id=node_id,
                    session_id=sid,
                    path="node.metadata.covers_ids",
                )
            for cid in covers:
                c = g.nodes.get(cid) if isinstance(cid, str) else None
                if c is None or not g.is_conversation(c) or is_summary(c) or cid == row.root_id:
                    raise DagctxError(
                        "InvalidEdge",
                        f"metadata.covers_ids names {cid!r}, which is not a real conversation "
                        "node of this session (summaries never cover summaries)",
                        node_id=node_id,
                        session_id=sid,
                        path="node.metadata.covers_ids",
                    )

    def _spill(self, output: Any) -> tuple[Any, dict[str, Any] | None]:
        return spill_output(output, self.spill)

    def _insert_row(
        self,
        sid: str,
        call: Call,
        *,
        rev: int,
        full_output: str | None = None,
        tokens: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        cur = self.db.execute(
            "INSERT INTO nodes(session_id, id, seq, rev, role, name, status, caller, predecessor, created_at, body, "
            "tokens) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                sid,
                call.id,
                call.seq,
                rev,
                call.role,
                call.name,
                call.status,
                call.caller,
                call.predecessor,
                call.created_at,
                self._enc.encode(call),
                self._meta_enc.encode(tokens) if tokens else None,
            ),
        )
        if call.metadata.get("display") == "root":
            return
        text = node_text(call) if full_output is None else node_text(msgspec.structs.replace(call, output=full_output))
        self.db.execute(
            "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
            (cur.lastrowid, text, fts.cjk_grams(text), sid, call.id, call.role),
        )

    def _finish(self, row: _SessionRow, g: SessionGraph) -> None:
        row.updated_at = time.time()
        self.db.execute(
            "UPDATE sessions SET head=?, next_seq=?, rev=?, node_count=?, updated_at=?, metadata=? WHERE id=?",
            (
                row.head,
                row.next_seq,
                row.rev,
                row.node_count,
                row.updated_at,
                self._meta_enc.encode(row.metadata),
                row.id,
            ),
        )
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
        token_counts: dict[str, tuple[int, int]] | None = None,
    ) -> AppendOutcome:
        if status not in TERMINAL_STATUSES:
            raise DagctxError(
                "InvalidParams",
                f"status must be one of completed, error, cancelled (not {status!r})",
                path="status",
            )
        with self._write(session_id):
            row = self._session_row(session_id)
            g = self._refresh(row)
            old = g.get(node_id)
            if old.status != "running":
                raise DagctxError(
                    "NotRunning",
                    f"node {node_id!r} is {old.status}, and only a running node may be updated "
                    "(the ledger is append-only); append a new node instead",
                    node_id=node_id,
                    session_id=session_id,
                )
            new_output, spilled = self._spill(output if output is not None else old.output)
            meta = {**old.metadata, **(metadata or {})}
            if spilled is not None:
                meta["spill"] = {k: v for k, v in spilled.items() if k != "data"}
            row.rev += 1
            call = msgspec.structs.replace(old, output=new_output, status=status, metadata=meta)
            rowid = self.db.execute(
                "SELECT rowid FROM nodes WHERE session_id=? AND id=?", (session_id, node_id)
            ).fetchone()[0]
            self.db.execute(
                "UPDATE nodes SET status=?, rev=?, body=?, tokens=COALESCE(?, tokens) WHERE rowid=?",
                (status, row.rev, self._enc.encode(call),
                 self._meta_enc.encode(token_counts) if token_counts else None, rowid),
            )
            full = node_text(call) if spilled is None else node_text(
                msgspec.structs.replace(call, output=spilled["data"])
            )
            self.db.execute("DELETE FROM search WHERE rowid=?", (rowid,))
            self.db.execute(
                "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
                (rowid, full, fts.cjk_grams(full), session_id, node_id, call.role),
            )
            if spilled is not None:
                self.db.execute(
                    "INSERT OR REPLACE INTO blobs(session_id, node_id, field, chars, lines, data) VALUES(?,?,?,?,?,?)",
                    (session_id, node_id, "output", spilled["chars"], spilled["lines"], spilled["data"]),
                )
            g.add(call)
            self._finish(row, g)
        return AppendOutcome(call, row.head, False)

    # ------------------------------------------------------------ HEAD moves

    def _check_head_target(self, g: SessionGraph, node: Call) -> None:
        if not g.is_conversation(node) or is_summary(node):
            raise DagctxError(
                "InvalidEdge",
                f"node {node.id!r} is not a conversation node; HEAD can only be a user/llm turn, "
                "a top-level call, a spawn root, or ROOT",
                node_id=node.id,
                session_id=g.session_id,
            )
        g.chain(node.id)  # refuses a head whose branch is broken

    def checkout(self, session_id: str, node_id: str) -> tuple[str, str]:
        with self._write(session_id):
            row = self._session_row(session_id)
            g = self._refresh(row)
            target = g.get(row.root_id if node_id == ROOT_SENTINEL else node_id)
            self._check_head_target(g, target)
            previous = row.head
            row.head = target.id
            self._finish(row, g)
        return row.head, previous

    def rewind(self, session_id: str, node_id: str | None = None, steps: int | None = None) -> tuple[str, str]:
        if (node_id is None) == (steps is None):
            raise DagctxError("InvalidParams", "give exactly one of nodeId or steps", path="nodeId")
        with self._write(session_id):
            row = self._session_row(session_id)
            g = self._refresh(row)
            chain = [g.root_id] + [n.id for n in g.chain(row.head)]
            if steps is not None:
                if steps < 1 or steps >= len(chain):
                    raise DagctxError(
                        "InvalidParams",
                        f"steps must be between 1 and {len(chain) - 1} on this branch (got {steps})",
                        path="steps",
                    )
                target = chain[-1 - steps]
            else:
                target = row.root_id if node_id == ROOT_SENTINEL else node_id
                g.get(target)
                if target not in chain:
                    raise DagctxError(
                        "InvalidEdge",
                        f"node {target!r} is not on the current branch; rewind moves back along "
                        "HEAD's branch — use session/checkout to jump to another branch",
                        node_id=target,
                        session_id=session_id,
                    )
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
            row = self._session_row(session_id)
            g = self._refresh(row)
            caller = g.get(row.root_id if caller_id == ROOT_SENTINEL else caller_id)
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
            self._insert_row(row.id, call, rev=row.rev)
            g.add(call)
            if name:
                row.metadata.setdefault("_branches", {})[call.id] = name
            self._finish(row, g)
        return AppendOutcome(call, row.head, False)

    def _move_branch_name(self, row: _SessionRow, old_tip: str, new_tip: str) -> None:
        names = row.metadata.get("_branches")
        if names and old_tip in names:
            names[new_tip] = names.pop(old_tip)

    def name_branch(self, session_id: str, tip: str, name: str | None) -> None:
        with self._write(session_id):
            row = self._session_row(session_id)
            g = self._refresh(row)
            node = g.get(tip)
            self._check_head_target(g, node)
            names = row.metadata.setdefault("_branches", {})
            if name:
                names[tip] = name
            else:
                names.pop(tip, None)
            self._finish(row, g)

    # ------------------------------------------------------------ reads

    def history(self, session_id: str, head: str | None = None) -> tuple[list[Call], str]:
        row = self._session_row(session_id)
        g = self._refresh(row)
        h = row.head if head is None else (row.root_id if head == ROOT_SENTINEL else head)
        return g.chain(h), h

    def branches(self, session_id: str) -> tuple[list[BranchInfo], str]:
        row = self._session_row(session_id)
        g = self._refresh(row)
        names: dict[str, str] = row.metadata.get("_branches", {})
        main = g.main_tip()
        out = []
        for tip in g.tips():
            chain = g.chain(tip)
            first = chain[0] if chain else None
            out.append(
                BranchInfo(
                    head=tip,
                    length=len(chain),
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
        row = self._session_row(session_id)
        g = self._refresh(row)
        out = []
        for nid in ids:
            node = g.get(row.root_id if nid == ROOT_SENTINEL else nid)
            if ranged:
                full = self.full_output(session_id, node)
                if isinstance(full, str):
                    if offset < 0 or (length is not None and length < 0):
                        raise DagctxError("InvalidParams", "range offset and length must be ≥ 0", path="range")
                    end = None if length is None else offset + length
                    node = msgspec.structs.replace(node, output=full[offset:end])
            out.append(node)
        return out

    def full_output(self, session_id: str, node: Call) -> Any:
        """The whole output of a node, reading the spilled blob when there is one."""
        if "spill" not in node.metadata:
            return node.output
        got = self.db.execute(
            "SELECT data FROM blobs WHERE session_id=? AND node_id=? AND field='output'",
            (session_id, node.id),
        ).fetchone()
        return node.output if got is None else got[0]

    # ------------------------------------------------------------ search

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        limit: int = 20,
        roles: Sequence[str] | None = None,
    ) -> list[SearchHit]:
        if not query.strip():
            raise DagctxError("InvalidQuery", "query is empty: give at least one word", path="query")
        if not 1 <= limit <= 1000:
            raise DagctxError("InvalidParams", "limit must be between 1 and 1000", path="limit")
        if session_id is not None:
            self._session_row(session_id)
        expr = fts.fts_query(query)
        sql = (
            "SELECT s.session_id, s.node_id, s.role, bm25(search, 1.0, 1.0) AS score, s.text, n.name, n.seq "
            "FROM search s JOIN nodes n ON n.rowid = s.rowid WHERE search MATCH ?"
        )
        args: list[Any] = [expr]
        if session_id is not None:
            sql += " AND s.session_id = ?"
            args.append(session_id)
        if roles:
            sql += f" AND s.role IN ({','.join('?' * len(roles))})"
            args.extend(roles)
        sql += " ORDER BY score LIMIT ?"
        args.append(limit)
        try:
            rows = self.db.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            raise DagctxError(
                "InvalidQuery",
                f"the search query {query!r} is not valid full-text syntax ({exc}); quote phrases "
                'with "…", balance parentheses, and put AND/OR/NOT between terms',
                path="query",
            ) from exc
        terms = fts.query_terms(query)
        return [
            SearchHit(
                session_id=r[0],
                node_id=r[1],
                role=r[2],
                name=r[5],
                seq=r[6],
                snippet=fts.snippet(r[4], terms),
                score=-float(r[3]),
            )
            for r in rows
        ]

    # ------------------------------------------------------------ derived caches

    def token_counts(self, session_id: str, tokenizer: str) -> dict[str, tuple[int, int]]:
        """Stored (input, output) token counts of every node for one tokenizer."""
        out: dict[str, tuple[int, int]] = {}
        dec = self._meta_dec.decode
        for nid, blob in self.db.execute(
            "SELECT id, tokens FROM nodes WHERE session_id=? AND tokens IS NOT NULL", (session_id,)
        ):
            got = dec(blob).get(tokenizer)
            if got is not None:
                out[nid] = (got[0], got[1])
        return out

    def put_usage(self, session_id: str, usage: UsageRow) -> None:
        with self._write(session_id):
            self._session_row(session_id)
            self.db.execute(
                "INSERT OR REPLACE INTO usage(session_id, node_id, model, input, output, cache_read, cache_write, "
                "estimated, reported_at) VALUES(?,?,?,?,?,?,?,?,?)",
                (
                    session_id,
                    usage.node_id,
                    usage.model,
                    usage.usage.input,
                    usage.usage.output,
                    usage.usage.cache_read,
                    usage.usage.cache_write,
                    usage.estimated,
                    usage.reported_at,
                ),
            )

    # Summaries made for one request by reduction within a turn (SPEC §8): derived data,
    # keyed by a hash of the summarized content and the model configuration, never part
    # of a session. The table is created on first use so older files need no migration.
    _REDUCTION_DDL = (
        "CREATE TABLE IF NOT EXISTS reduction_summaries(key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
        "text TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
        "created_at REAL NOT NULL) WITHOUT ROWID"
    )

    def _reduction_table(self) -> None:
        if not getattr(self, "_reduction_ready", False):
            self.db.execute(self._REDUCTION_DDL)
            self._reduction_ready = True

    def reduction_summaries(self, keys: Sequence[str]) -> dict[str, tuple[str, int, int]]:
        """Cached request summaries by key: ``key → (text, input tokens, output tokens)``."""
        if not keys:
            return {}
        self._reduction_table()
        out: dict[str, tuple[str, int, int]] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), 500):
            part = unique[i : i + 500]
            marks = ",".join("?" * len(part))
            for key, text, tin, tout in self.db.execute(
                f"SELECT key, text, input_tokens, output_tokens FROM reduction_summaries WHERE key IN ({marks})",
                part,
            ):
                out[key] = (text, tin, tout)
        return out

    def put_reduction_summaries(self, rows: Sequence[tuple[str, str, str, int, int]]) -> None:
        """Keep request summaries ``(key, kind, text, input tokens, output tokens)``, one
        transaction (idempotent: the same key always holds the same meaning)."""
        if not rows:
            return
        self._reduction_table()
        now = time.time()
        with self._write():
            self.db.executemany(
                "INSERT OR REPLACE INTO reduction_summaries(key, kind, text, input_tokens, output_tokens, created_at) "
                "VALUES(?,?,?,?,?,?)",
                [(*r, now) for r in rows],
            )

    def usage(self, session_id: str) -> list[UsageRow]:
        rows = self.db.execute(
            "SELECT node_id, model, input, output, cache_read, cache_write, estimated, reported_at "
            "FROM usage WHERE session_id=? ORDER BY reported_at",
            (session_id,),
        ).fetchall()
        return [UsageRow(r[0], r[1], Usage(input=r[2], output=r[3], cache_read=r[4], cache_write=r[5]), r[6], r[7])
                for r in rows]


def spill_output(output: Any, policy: SpillPolicy) -> tuple[Any, dict[str, Any] | None]:
    """What the node keeps of ``output``, and the spill record (``data`` = the whole text).

    Pure and deterministic, so the engine can count the tokens of exactly what the
    store will keep before it appends.
    """
    p = policy
    if not isinstance(output, str) or len(output) < p.min_chars:
        return output, None
    lines = output.count("\n") + 1
    if lines <= p.min_lines:
        return output, None
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
