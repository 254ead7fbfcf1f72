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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


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
    def vectors(self, workspace: str, model: str) -> list[tuple[str, bytes]]: ...
    def vector_count(self, workspace: str, model: str) -> int: ...
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
