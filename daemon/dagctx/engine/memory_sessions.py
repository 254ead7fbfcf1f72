"""Sessions as a source of memory search (SPEC §5.1, ``sources: ["sessions"]``).

Every session's nodes are chunked as memory files are (the default chunk and overlap sizes;
a spilled output read whole, up to ``MAX_NODE_CHARS``) and kept in the memory index under
the reserved workspace key ``SESSIONS_KEY`` (a workspace is an absolute real path: none is it): the
chunks of node N of session S under the path ``S/N``, with their full-text rows and, once
embedded, their vectors — so a session is searched like a memory file, hybrid included.

Incremental by a high-water mark per session: a ``memory_files`` row whose path is the
session id keeps the session's ``updatedAt`` (``mtime``), node count (``lines``), highest
``seq`` indexed (``size``) and the ids of its running nodes (``hash``, space-separated).
A search with ``sessions`` among its sources first brings the index up to date: a session
whose time and node count are unchanged and that has no running node is not read; else its
nodes above the mark, and the ones that were running, are (re-)chunked — a running node's
output still grows (``node/update``). A session deleted loses its chunks. One write
transaction per search that found a change; then up to ``EMBED_PER_SEARCH`` chunks without
a vector of the search's model are embedded (the rest by the next searches; a note says so).
"""

from __future__ import annotations

import hashlib
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
#: sessions listed per page while looking for changes
PAGE = 500


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    row: MemoryFileRow
    nodes: list[tuple[str, list[MemoryChunkRow]]]  # (path ``S/N``, its chunks)


@dataclass(frozen=True, slots=True)
class SyncPlan:
    gone: list[str]
    updates: list[SessionUpdate]

    def __bool__(self) -> bool:
        return bool(self.gone or self.updates)


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


def plan(store: Store, index: MemoryIndex) -> SyncPlan:
    """What the session index lacks (reads only; runs off the event loop)."""
    stored = {f.path: f for f in index.files(SESSIONS_KEY)}
    live = {}
    offset = 0
    while True:
        infos, total = store.list_sessions(PAGE, offset)
        for info in infos:
            live[info.session_id] = info
        offset += len(infos)
        if not infos or offset >= total:
            break
    gone = [sid for sid in stored if sid not in live]
    updates: list[SessionUpdate] = []
    for sid, info in live.items():
        old = stored.get(sid)
        if old is not None and not old.hash and old.mtime == info.updated_at and old.lines == info.node_count:
            continue
        mark = old.size if old is not None else -1
        was_running = set(old.hash.split()) if old is not None else set()
        try:
            g = store.graph(sid)
        except DagctxError:  # deleted meanwhile: the next search drops it
            continue
        nodes = sorted((n for n in g.nodes.values() if n.seq > mark or n.id in was_running), key=lambda n: n.seq)
        changed = [(f"{sid}/{n.id}", _chunks(sid, n, _text(store, sid, n))) for n in nodes]
        running = sorted(n.id for n in g.nodes.values() if n.status == "running")
        top = max((n.seq for n in g.nodes.values()), default=mark)
        row = MemoryFileRow(sid, "sessions", " ".join(running), info.updated_at, max(top, mark), info.node_count,
                            (old.chunks if old is not None else 0) + sum(len(c) for _, c in changed))
        updates.append(SessionUpdate(row, changed))
    return SyncPlan(gone, updates)


def apply(index: MemoryIndex, p: SyncPlan) -> None:
    """The plan, in one write transaction (the database's writer)."""
    index.apply_sessions(SESSIONS_KEY, gone=p.gone, rows=[u.row for u in p.updates],
                         chunks=[c for u in p.updates for c in u.nodes], indexed_at=time.time())
