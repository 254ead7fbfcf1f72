"""Copy sessions exactly from one store to another (``database/migrate``, SPEC §2.1).

Rows are copied as they are — ids, seq, revisions, edges, HEAD, names, token counts,
usage, summaries and spilled outputs — one session per target transaction, so a copy
interrupted half-way leaves whole sessions only. It is idempotent: a session the target
already holds at the same revision is left alone; one that grew at the source since the
last copy (every node the target has is still in the source at its seq) is copied again;
one that was written to on the target since is a conflict and is never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .backend import SessionRow
from .store import Store


@dataclass
class CopyStats:
    sessions: int = 0
    copied: int = 0
    unchanged: int = 0
    nodes: int = 0
    conflicts: list[str] = field(default_factory=list)


def _all_sessions(store: Store, page: int = 500) -> Iterator[SessionRow]:
    offset = 0
    while True:
        rows, total = store.backend.sessions(page, offset)
        yield from rows
        offset += len(rows)
        if not rows or offset >= total:
            return


def session_ids(store: Store) -> list[str]:
    """Every session id, oldest-updated last (the order ``session/list`` uses)."""
    return [r.id for r in _all_sessions(store)]


def copy_session(src: Store, dst: Store, sid: str, stats: CopyStats) -> None:
    row = src.backend.session(sid)
    if row is None:
        return  # deleted at the source meanwhile
    stats.sessions += 1
    nodes = src.backend.node_rows(sid)
    with dst._write(sid):
        have = dst.backend.session(sid, lock=True)
        if have is not None:
            if have.rev == row.rev and have.head == row.head and have.node_count == row.node_count:
                stats.unchanged += 1
                return
            theirs = {(n.id, n.seq) for n in dst.backend.node_rows(sid)}
            if have.rev > row.rev or not theirs <= {(n.id, n.seq) for n in nodes}:
                stats.conflicts.append(sid)
                return
            dst.backend.delete_session(sid)
        if not dst.backend.insert_session(row):
            stats.conflicts.append(sid)  # the source key belongs to another session there
            return
        for n in nodes:
            dst.backend.insert_node(n)
        for b in src.backend.blob_rows(sid):
            dst.backend.put_blob(b)
        for u in src.backend.usage_rows(sid):
            dst.backend.put_usage(sid, u)
    dst.forget(sid)
    stats.copied += 1
    stats.nodes += len(nodes)


def copy_all(src: Store, dst: Store, progress: Callable[[int, int, str], None] | None = None) -> CopyStats:
    stats = CopyStats()
    ids = session_ids(src)
    for i, sid in enumerate(ids):
        copy_session(src, dst, sid, stats)
        if progress is not None:
            progress(i + 1, len(ids), sid)
    return stats
