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

``Store`` stands in three rooms: ``store_base.py`` (the backend, the locks, write
transactions, the graph cache), ``appends.py`` (every write that creates or fills a
node, group commit included) and this module (sessions, HEAD moves, reads, search, the
derived caches); ``spill.py`` decides what a node keeps of a long result.

API Boundary: ``Store`` is the only way anything above reads or writes the record.
Architecture Invariant: nothing above the ledger knows SQL; nothing here knows
JSON-RPC, tokens or rendering.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.messages import BranchInfo, IdMatch, SearchHit, SessionInfo
from dagctx.protocol.nodes import Call, NodeInput

from . import rules
from . import search as fts
from .appends import Appends
from .backend import CHARS_KEY, NodeDerived, SessionRow, UsageRow, decode_meta, decode_refs, encode_refs
from .graph import SessionGraph, is_spawn_root
from .store_base import DERIVED_KEY

__all__ = ["Store"]


#: what a skeleton graph (``Store.skeleton``) leaves out of a node's metadata: texts that
#: ride beside its output
SKELETON_DROPS = ("thinking", "reasoning")


def skeletal(node: Call) -> Call:
    """``node`` without its texts (``Store.skeleton``)."""
    md = node.metadata
    if any(k in md for k in SKELETON_DROPS):
        md = {k: v for k, v in md.items() if k not in SKELETON_DROPS}
    return msgspec.structs.replace(node, input=None, output=None, metadata=md)


def pages_of(sizes: Sequence[tuple[str, int]], budget: int, most: int = 500) -> Iterator[list[str]]:
    """The ids of ``(id, size)`` in runs of at most ``budget`` bytes (or one id) and ``most`` ids."""
    page: list[str] = []
    used = 0
    for nid, size in sizes:
        if page and (used + size > budget or len(page) >= most):
            yield page
            page, used = [], 0
        page.append(nid)
        used += size
    if page:
        yield page


class NodePages:
    """Nodes read whole in a given order (an export's, SPEC §9), a page of at most ``budget``
    stored bytes (or one node) at a time (``Store.nodes_of``; ``sizes`` from
    ``Store.skeleton``): ``take`` hands out the nodes asked for, and a page is read only
    when they are not yet in."""

    def __init__(self, store: Store, session_id: str, order: Sequence[str], sizes: dict[str, int],
                 budget: int = 256 << 10) -> None:
        self.store, self.session_id = store, session_id
        self.pages = pages_of([(i, sizes.get(i, 0)) for i in order], budget)
        self.buf: dict[str, Call] = {}

    def take(self, ids: Sequence[str]) -> dict[str, Call]:
        missing = [i for i in ids if i not in self.buf]
        while missing:
            page = next(self.pages, None)
            if page is None:  # not in the order (it cannot be): read what is left directly
                self.buf.update(self.store.nodes_of(self.session_id, missing))
                break
            self.buf.update(self.store.nodes_of(self.session_id, page))
            missing = [i for i in missing if i not in self.buf]
        return {i: self.buf.pop(i) for i in ids if i in self.buf}


class Store(Appends):
    """The record of every session in one database (a SQLite file or a PostgreSQL URL).

    Many stores — in this process or in other daemons, on other hosts for PostgreSQL —
    may open the same database; each sees the others' committed writes before it answers.
    """

    # ------------------------------------------------------------ sessions

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
        nodes: Iterable[NodeInput],
        head: str | None,
        metadata: dict[str, Any] | None = None,
        derived: dict[str, NodeDerived] | None = None,
        usage: Sequence[UsageRow] = (),
        written: list[int] | None = None,
    ) -> tuple[SessionInfo, bool]:
        """Create a session from an imported transcript in ONE transaction.

        Idempotent: a session with the same ``source_key`` is returned as it is
        (``created=False``). Spawn-branch roots are allowed here (an import replays
        spawns that already happened); every other rule of ``append`` applies.

        ``nodes`` may be a generator that reads each node's body as it is written: the
        rules are checked against a skeleton of the session (edges, roles, names and
        metadata, no inputs or outputs) that is not cached, so memory is bounded by the
        largest node, not the session (SPEC §9 ``session/import``); the next read loads
        the graph from the database. ``written``, when given, is filled with the stored
        body size of each node written, in revision order (revisions 2, 3, …), for
        ``written_nodes``.
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
            for inp in nodes:
                d = derived.get(inp.id) if derived and inp.id is not None else None
                # An import replays history: a node keeps the time it happened at the source.
                when = inp.metadata.get("timestamp")
                before = g.nbytes
                self._append_locked(row, g, inp, False, d, spawn_ok=True, skeleton=True,
                                    created_at=float(when) if isinstance(when, (int, float)) else None)
                if written is not None:
                    written.append(g.nbytes - before)
            if head is not None:
                target = g.get(rules.resolve(row.root_id, head) or head)
                rules.check_head_target(g, target)
                row.head = target.id
            for u in usage:
                if u.node_id in g.nodes:
                    self.backend.put_usage(sid, u)
            self._finish(row, g)
        return self.get_session(sid), True

    def written_nodes(self, session_id: str, sizes: Sequence[int],
                      budget: int = 256 << 10) -> Iterator[list[Call]]:
        """The nodes ``import_session`` wrote (``sizes`` as it filled ``written``), read
        back in pages of at most ``budget`` stored bytes (or one node), oldest first: what
        is announced after an import costs a page, never the session."""
        k = 0  # nodes read so far; node k has revision k + 2 (the root has 1)
        while k < len(sizes):
            j, used = k, 0
            while j < len(sizes) and (j == k or used + sizes[j] <= budget):
                used += sizes[j]
                j += 1
            with self.lock:
                page = [self._dec.decode(b) for b in self.backend.bodies_between(session_id, k + 1, j + 1)]
            yield page
            k = j

    def skeleton(self, session_id: str, budget: int = 256 << 10,
                 tick: Callable[[], None] | None = None) -> tuple[SessionGraph, dict[str, int]]:
        """The session's graph without its texts — no inputs or outputs, no
        ``metadata.thinking``/``reasoning`` (``SKELETON_DROPS``) — read in pages of at most
        ``budget`` stored bytes (or one node), in seq order, and never cached; and each
        node's stored body size, for ``nodes_of`` pages. What streams a session out
        (``session/export``) walks it and reads each node whole only for its own lines, so
        its memory is bounded by the largest node, not the session (SPEC §9). The nodes are
        the ones committed when it started, each as read (a node finished meanwhile is read
        finished). ``tick`` runs between pages (a cancellation check)."""
        with self.lock:
            row = self._session_row(session_id)
            sizes = self.backend.body_sizes(session_id)
        g = SessionGraph(session_id, row.root_id)
        for ids in pages_of(sizes, budget):
            with self.lock:
                bodies = self.backend.bodies_of(session_id, ids)
            for node in sorted(map(self._dec.decode, bodies), key=lambda n: n.seq):
                g.add(skeletal(node))
            if tick is not None:
                tick()
        g.rev = row.rev
        return g, dict(sizes)

    def nodes_of(self, session_id: str, ids: Sequence[str]) -> dict[str, Call]:
        """The nodes ``ids`` whole, as stored (one read; a page of ``skeleton``'s sizes)."""
        with self.lock:
            bodies = self.backend.bodies_of(session_id, ids)
        return {n.id: n for n in map(self._dec.decode, bodies)}

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

    #: the longest window a read that never waits lists (a longer one, or one far down the
    #: list, costs milliseconds: it goes the usual way)
    NOWAIT_LIST_LIMIT = 200

    # Reads that never wait (SPEC §1.4: the quick reads answered on the event loop). None
    # whenever the answer is not at hand at once — the file vanished or was changed (the
    # usual read reopens it), another process holds a lock, the backend cannot read
    # without a lock (PostgreSQL: every read is a network round trip), the session does
    # not exist, the params are out of range — and the caller asks the usual way, which
    # gives the same answer or words the error.

    #: the most answers of never-waiting reads kept beside the rows they were built from
    NOWAIT_ANSWERS_KEPT = 256

    def list_sessions_nowait(self, limit: int = 100, offset: int = 0, *, same_batch: bool = False,
                             shape: Callable[[list[SessionInfo], int], Any] | None = None) -> Any:
        """``(sessions, total)``, or ``shape(sessions, total)`` — built once while the rows
        it reads are kept, the same object for every read until then. ``same_batch``: a
        read that arrived with this one just looked for a vanished file and for commits;
        this one may share that look (they are concurrent with any write)."""
        nowait = getattr(self.backend, "sessions_nowait", None)
        if nowait is None or not (0 <= limit <= self.NOWAIT_LIST_LIMIT and 0 <= offset <= self.NOWAIT_LIST_LIMIT):
            return None
        if not same_batch and self.backend.vanished():
            return None
        got = nowait(limit, offset, same_batch)
        if got is None:
            return None

        def build() -> Any:
            infos, total = [self._info(r) for r in got[0]], got[1]
            return (infos, total) if shape is None else shape(infos, total)

        return self._nowait_answer(("sessions", limit, offset, shape), got, build)

    def get_session_nowait(self, session_id: str, *, same_batch: bool = False) -> SessionInfo | None:
        nowait = getattr(self.backend, "session_nowait", None)
        if nowait is None or (not same_batch and self.backend.vanished()):
            return None
        row = nowait(session_id, same_batch)
        return None if row is None else self._nowait_answer(("session", session_id), row, lambda: self._info(row))

    def nowait_marker(self) -> Callable[[], Any] | None:
        """What reads a mark of the file's state without a wait: equal marks mean the same
        file with nothing committed between (SPEC §1.4), so an answer built after the first
        still holds at the second; a mark of None tells nothing (a file being replaced, the
        index not open yet). None where the backend has no marks (PostgreSQL)."""
        return getattr(self.backend, "nowait_mark", None)

    def nowait_watch(self) -> Any:
        """What a client's reader thread may poll beside its input so that the marks of
        ``nowait_marker`` need not ask the kernel again (``SqliteFile.nowait_mark``'s
        ``quiet``, SPEC §1.4): an object with ``fileno``, or None."""
        watch = getattr(self.backend, "nowait_watch", None)
        return None if watch is None else watch()

    def _nowait_answer(self, key: Any, rows: Any, build: Callable[[], Any]) -> Any:
        """The answer built from ``rows`` (the backend's kept rows: the same object until
        the file changes), built once for them. A quick read answered again with nothing
        committed between then costs no new objects, and the server can reuse its encoding
        (SPEC §1.4). Answers are only read, never changed in place."""
        hit = self._nowait_answers.get(key)
        if hit is not None and hit[0] is rows:
            return hit[1]
        answer = build()
        if len(self._nowait_answers) >= self.NOWAIT_ANSWERS_KEPT:
            self._nowait_answers.clear()
        self._nowait_answers[key] = (rows, answer)
        return answer

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

    def token_counts(self, session_id: str, tokenizer: str, *,
                     tick: Callable[[], None] | None = None,
                     chars: dict[str, bytes] | None = None) -> dict[str, tuple[int, int]]:
        """Stored (input, output) token counts of every node for one tokenizer; ``tick()``
        is called every few hundred rows (the engine's cancellation check, SPEC §1.4).
        ``chars``: filled with each node's stored ``NodeDerived.chars`` (the rows that have
        them), from the same reading of the same rows."""
        out: dict[str, tuple[int, int]] = {}
        with self.lock:
            rows = list(self.backend.token_rows(session_id))
        for k, (nid, blob) in enumerate(rows):
            if tick is not None and not k & 511:
                tick()
            meta = decode_meta(blob)
            got = meta.get(tokenizer)
            if got is not None:
                out[nid] = (got[0], got[1])
            if chars is not None:
                kept = meta.get(CHARS_KEY)
                if kept is not None:
                    chars[nid] = kept
        return out

    def reference_lists(self, session_id: str, *, after_seq: int = -1, ids: Sequence[str] | None = None,
                        tick: Callable[[], None] | None = None) -> dict[str, list[str]]:
        """Stored ranked references (code nodes, SPEC §8) of the nodes that have them:
        every one, those with ``seq > after_seq``, or those of ``ids``; ``tick()`` as in
        ``token_counts``."""
        if ids is not None and not ids:
            return {}
        with self.lock:
            rows = list(self.backend.ref_rows(session_id, after_seq=after_seq, ids=ids))
        out: dict[str, list[str]] = {}
        for k, (nid, blob) in enumerate(rows):
            if tick is not None and not k & 511:
                tick()
            out[nid] = decode_refs(blob)
        return out

    def fill_references(self, session_id: str, refs: dict[str, Sequence[str]]) -> None:
        """Keep references mined for nodes that had none stored (rows written before schema
        version 2): one derived transaction; a node's body, revision and session row stay
        as they are, and a list already stored is never replaced."""
        if not refs:
            return
        with self._write_many((DERIVED_KEY,)):
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
        with self._write_many((DERIVED_KEY,)):
            self.backend.put_reduction_summaries(rows, time.time())

    def warnings(self) -> list[str]:
        """What ``daemon/status`` should warn about this database (the backend knows)."""
        return self.backend.warnings()

    def usage(self, session_id: str) -> list[UsageRow]:
        with self.lock:
            return self.backend.usage_rows(session_id)
