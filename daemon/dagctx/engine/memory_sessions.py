"""Sessions as a source of memory search (SPEC §5.1, ``sources: ["sessions"]``).

Every session's nodes are chunked as memory files are (the default chunk and overlap sizes;
a spilled output read whole, up to ``MAX_NODE_CHARS``) and kept in the memory index under
the reserved workspace key ``SESSIONS_KEY`` (a workspace is an absolute real path: none is it): the
chunks of node N of session S under the path ``S/N``, with their full-text rows and, once
embedded, their vectors — so a session is searched like a memory file, hybrid included.

Incremental by a high-water mark per session: a ``memory_files`` row whose path is the
session id keeps the session's ``updatedAt`` (``mtime``), node count (``lines``), highest
``seq`` indexed (``size``) and the ids of its running nodes (``hash``, space-separated).
A search with ``sessions`` among its sources first brings the index up to date, without
listing the sessions: the ledger's marker — how many sessions there are and the newest
``updatedAt``, one aggregate row (every write to a session moves its ``updatedAt``) — is
compared with the one the index was last brought up to date at (kept in the run row of
``SESSIONS_KEY``). Equal: nothing is read. Else only the sessions written since that
marker's time, less ``MARGIN`` (an index range), are compared with their marks; when the
count then does not add up — a session deleted, or copied in with an old time — every
session's (id, time, node count) is compared (a listing). A session whose time and node
count are unchanged is not read; else its nodes above the mark, and the ones that were
running, are (re-)chunked — a running node's output still grows (``node/update``). A
session deleted loses its chunks. One write transaction per search that found a change; then
up to ``EMBED_PER_SEARCH`` chunks without a vector of the search's model are embedded (the
rest by the next searches; a note says so). ``Counters`` count, per database and daemon
process, what the catch-ups did (``memory/status`` shows them).
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

import msgspec

from dagctx.context import memory_text as mt
from dagctx.ledger.memory import MemoryChunkRow, MemoryFileRow, MemoryIndex
from dagctx.ledger.store import Store
from dagctx.ledger.text import node_text
from dagctx.protocol import memory_messages as mem
from dagctx.protocol.errors import DagctxError

#: the memory index's workspace key of session chunks
SESSIONS_KEY = ":sessions"
#: a node's text beyond this many characters is not indexed (a note would be noise: the
#: full-text search of SPEC §5.6 still has it)
MAX_NODE_CHARS = 1 << 20
#: chunks embedded by one search at most (each batch of 256 its own transaction)
EMBED_PER_SEARCH = 2_048
#: the sessions written this long before the index's marker are compared again: a write
#: committed after a later-stamped one (two processes), or a clock step back, is not lost
MARGIN = 120.0

_marker_enc = msgspec.msgpack.Encoder()
_marker_dec = msgspec.msgpack.Decoder(tuple[int, float])


@dataclass
class Counters:
    """What this process's catch-ups of one database's session index did (``memory/status``)."""

    #: catch-ups asked (one per search over sessions)
    checks: int = 0
    #: of them, found the ledger's marker unchanged: nothing else read
    unchanged: int = 0
    #: of them, compared every session (the index was new, or a session was deleted)
    listings: int = 0
    #: sessions whose nodes were read and (re-)chunked
    sessions_read: int = 0


#: per database key, for the daemon's life (a database closed while idle keeps its counts)
_COUNTERS: dict[str, Counters] = {}
_LOCK = threading.Lock()


def counters(database_key: str) -> Counters:
    with _LOCK:
        return _COUNTERS.setdefault(database_key, Counters())


def marker_of(run: tuple[float, bytes] | None) -> tuple[int, float] | None:
    """The sessions' marker the index was last brought up to date at (None: never)."""
    if run is None or not run[1]:
        return None
    try:
        return _marker_dec.decode(run[1])
    except msgspec.DecodeError:
        return None


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    row: MemoryFileRow
    nodes: list[tuple[str, list[MemoryChunkRow]]]  # (path ``S/N``, its chunks)


@dataclass(frozen=True, slots=True)
class SyncPlan:
    gone: list[str]
    updates: list[SessionUpdate]
    #: the ledger's marker read before the sessions (None: unchanged, nothing to write)
    marker: tuple[int, float] | None = None

    def __bool__(self) -> bool:
        return self.marker is not None


def split_path(path: str) -> tuple[str, str]:
    """(session id, node id) of a session chunk's path."""
    sid, _, nid = path.partition("/")
    return sid, nid


def _text(store: Store, session_id: str, node: msgspec.Struct) -> str:
    if "spill" in getattr(node, "metadata", {}):
        full = store.full_output(session_id, node)  # type: ignore[arg-type]
        node = msgspec.structs.replace(node, output=full)
    # NUL is no character PostgreSQL's text keeps (both backends index the same text)
    return node_text(node)[:MAX_NODE_CHARS].replace("\x00", "")  # type: ignore[arg-type]


def _chunks(session_id: str, node: msgspec.Struct, text: str) -> list[MemoryChunkRow]:
    opts = mem.MemoryIndexOptions()
    path = f"{session_id}/{node.id}"  # type: ignore[attr-defined]
    out = []
    for c in mt.chunk_text(text, opts.chunk_tokens, opts.overlap_tokens):
        digest = hashlib.sha256(f"{path}\x00{c.start_line}\x00{c.end_line}\x00{c.text}".encode()).hexdigest()
        # the id starts with the session's: a search narrowed to one session picks its vectors by it
        out.append(MemoryChunkRow(f"{session_id}/{digest[:24]}", path, "sessions", c.start_line, c.end_line,
                                  c.hash, float(node.created_at), c.text))  # type: ignore[attr-defined]
    return out


def plan(store: Store, index: MemoryIndex, count: Counters | None = None) -> SyncPlan:
    """What the session index lacks (reads only; runs off the event loop)."""
    count = count or Counters()
    count.checks += 1
    marker = index.sessions_marker()
    last = marker_of(index.run(SESSIONS_KEY))
    if last == marker:
        count.unchanged += 1
        return SyncPlan([], [])
    live: list[tuple[str, float, int]] | None = None
    gone: list[str] = []
    if last is not None:
        live = index.sessions_since(last[1] - MARGIN)
        stored = {f.path: f for f in index.files_named(SESSIONS_KEY, [sid for sid, _, _ in live])}
        if index.file_count(SESSIONS_KEY) + sum(1 for sid, _, _ in live if sid not in stored) != marker[0]:
            live = None  # a session deleted, or written with an old time: compare them all
    if live is None:
        count.listings += 1
        live = index.sessions_all()
        stored = {f.path: f for f in index.files(SESSIONS_KEY)}
        ids = {sid for sid, _, _ in live}
        gone = [sid for sid in stored if sid not in ids]
    updates: list[SessionUpdate] = []
    for sid, updated_at, node_count in live:
        old = stored.get(sid)
        if old is not None and old.mtime == updated_at and old.lines == node_count:
            continue
        mark = old.size if old is not None else -1
        was_running = set(old.hash.split()) if old is not None else set()
        try:
            g = store.graph(sid)
        except DagctxError:  # deleted meanwhile: the next search drops it
            continue
        count.sessions_read += 1
        nodes = sorted((n for n in g.nodes.values() if n.seq > mark or n.id in was_running), key=lambda n: n.seq)
        changed = [(f"{sid}/{n.id}", _chunks(sid, n, _text(store, sid, n))) for n in nodes]
        running = sorted(n.id for n in g.nodes.values() if n.status == "running")
        top = max((n.seq for n in g.nodes.values()), default=mark)
        row = MemoryFileRow(sid, "sessions", " ".join(running), updated_at, max(top, mark), node_count,
                            (old.chunks if old is not None else 0) + sum(len(c) for _, c in changed))
        updates.append(SessionUpdate(row, changed))
    return SyncPlan(gone, updates, marker)


def apply(index: MemoryIndex, p: SyncPlan) -> None:
    """The plan, in one write transaction (the database's writer)."""
    index.apply_sessions(SESSIONS_KEY, gone=p.gone, rows=[u.row for u in p.updates],
                         chunks=[c for u in p.updates for c in u.nodes], indexed_at=time.time(),
                         marker=_marker_enc.encode(p.marker) if p.marker is not None else b"")
