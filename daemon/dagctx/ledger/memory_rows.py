"""The memory index's rows (SPEC §5.1; tables of schema version 3), as every backend keeps them.

Kept apart from the session primitives of ``backend.py``: a memory file's chunks are
derived data of a workspace, never part of a session. A backend gives its own
implementation of ``MemoryRows`` (``Backend.memory_rows()``: ``sqlite_memory.py``,
``pg_memory.py``); each keeps rows only (the decisions — what a file's chunks are, when a
file changed — are made above, in ``memory.py`` and the engine). Writes run inside the
store's derived transaction (``Store._write_many``), so one index run commits whole or
not at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: a conversational query's rarest keywords are ranked whole while their chunks add up to at
#: most this many rows; the chunks holding only common keywords are drawn at most this many
#: at a time (``keyword_draws``; ARCHITECTURE.md has the numbers)
KEYWORD_BUDGET = 1_000
#: up to this many keywords, the chunks holding all of them, all but one and all but two are drawn first
MAX_SUBSET_WORDS = 8


@dataclass(frozen=True, slots=True)
class MemoryFileRow:
    path: str
    source: str
    hash: str
    mtime: float
    size: int
    lines: int
    chunks: int


@dataclass(frozen=True, slots=True)
class MemoryChunkRow:
    id: str
    path: str
    source: str
    start_line: int
    end_line: int
    hash: str
    mtime: float
    text: str


class MemoryRows(Protocol):
    def files(self, workspace: str) -> list[MemoryFileRow]: ...
    def run(self, workspace: str) -> tuple[float, bytes] | None: ...
    def chunk_count(self, workspace: str) -> int: ...
    def chunk(self, workspace: str, chunk_id: str) -> MemoryChunkRow | None: ...
    def chunks(self, workspace: str, chunk_ids: Sequence[str]) -> list[MemoryChunkRow]: ...
    def search(self, workspace: str, expression: str, limit: int, under: str | None = None,
               words: Sequence[str] = ()) -> list[tuple[MemoryChunkRow, float]]: ...
    # inside a write transaction
    def drop_files(self, workspace: str, paths: Sequence[str]) -> None: ...
    def put_file(self, workspace: str, row: MemoryFileRow, chunks: Sequence[MemoryChunkRow] | None) -> None: ...
    def put_run(self, workspace: str, indexed_at: float, skipped: bytes) -> None: ...
    # vectors (schema version 4): one per chunk and embedding model (``provider:model``), float32 bytes
    #: in chunk id order after ``after``, at most ``limit`` (-1: all)
    def vectors(self, workspace: str, model: str, after: str = "", limit: int = -1) -> list[tuple[str, bytes]]: ...
    def vector_count(self, workspace: str, model: str) -> int: ...
    #: (workspace, model, run stamp) of the kept vector counts above 0, newest run first
    def vector_sets(self) -> list[tuple[str, str, float]]: ...
    #: in chunk id order, after ``after`` (a cursor: each batch starts where the last ended, an index range)
    def missing_vectors(self, workspace: str, model: str, limit: int, after: str = "") -> list[tuple[str, str]]: ...
    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None: ...
    def drop_stale_vectors(self, workspace: str) -> None: ...
    # session chunks (``engine/memory_sessions.py``): a node's chunks replaced whole, with their
    # full-text rows and vectors; everything of a session (paths ``S/…`` and the row ``S``) dropped
    def replace_chunks(self, workspace: str, path: str, chunks: Sequence[MemoryChunkRow]) -> None: ...
    def drop_under(self, workspace: str, prefix: str) -> None: ...
    # what the session index catches up on (reads of the sessions table, no listing of rows
    # unless asked): (session count, newest ``updated_at``); (id, updated_at, node_count) of
    # the sessions written at or after a time (an index range), or of every session
    def sessions_marker(self) -> tuple[int, float]: ...
    def sessions_since(self, since: float) -> list[tuple[str, float, int]]: ...
    def sessions_all(self) -> list[tuple[str, float, int]]: ...
    def sessions_after(self, since: float) -> int: ...
    # the rows of some files (by path), and how many a workspace has
    def files_named(self, workspace: str, paths: Sequence[str]) -> list[MemoryFileRow]: ...
    def file_count(self, workspace: str) -> int: ...


def under_range(prefix: str) -> tuple[str, str]:
    """Paths below ``prefix/`` as a range of strings: ``[prefix/, prefix0)`` ('0' follows '/')."""
    return prefix + "/", prefix + "0"


CHUNK_COLS = "c.id, c.path, c.source, c.start_line, c.end_line, c.hash, c.mtime, c.text"


def chunk_row(r: Sequence[Any]) -> MemoryChunkRow:
    return MemoryChunkRow(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5], float(r[6]), r[7])


def keyword_draws(words: Sequence[str], dfs: Sequence[int], budget: int) -> list[str] | None:
    """The draws of a conversational query's candidates (SPEC §5.1; both backends run them, each
    draw ranked by BM25 over at most ``budget`` of its matches), given each keyword's chunk
    count ``dfs`` (the backend's vocabulary: SQLite's FTS5 ``fts5vocab``, PostgreSQL's
    ``memory_terms``). None: the keywords' chunks add up to at most ``budget`` (or none is
    held), so their ``OR`` is ranked whole.

    A keyword hit's score is dominated by the share of the query's words it holds, so the
    draws go by that share: the chunks holding every word, then those holding all but one,
    then all but two (of at least two); then every chunk holding one of the rarest words
    (while their chunks add up to at most ``budget``: those that tell chunks apart); then
    chunks holding one of the common words, rarest first. The caller stops as soon as it
    has its candidates: a later draw's chunks hold a smaller share of the words, so they
    would score lower; a word held by many chunks is never ranked whole."""
    order = sorted(range(len(words)), key=lambda i: dfs[i])
    live = [words[i] for i in order if dfs[i] > 0]
    if sum(dfs) <= budget or not live:
        return None
    rare: list[str] = []
    total = 0
    for i in order:  # words no chunk holds (0) first: they cost nothing
        if total + dfs[i] > budget:
            break
        rare.append(words[i])
        total += dfs[i]
    n = len(live)
    draws = []
    if 1 < n <= MAX_SUBSET_WORDS:
        draws.append(" AND ".join(live))
        draws += [" OR ".join("(" + " AND ".join(g) + ")" for g in itertools.combinations(live, k))
                  for k in (n - 1, n - 2) if k >= 2]
    if rare:
        draws.append(" OR ".join(rare))
    draws += [w for w in live if w not in rare]
    return draws


def by_share(found: Sequence[T], words: Sequence[str], text: Callable[[T], str],
             key: Callable[[T], Any]) -> list[T]:
    """The drawn candidates ordered by how many of the query's words each holds (its
    coverage, what dominates its score), then by ``key`` (the backend's rank, path, line)."""
    low = [w.lower() for w in words]

    def held(f: T) -> int:
        t = text(f).lower()
        return sum(1 for w in low if w in t)

    return sorted(found, key=lambda f: (-held(f), key(f)))
