"""The memory index's API over a ``Store`` (SPEC §5.1): reads under the store's lock, one
derived write transaction per index run. What goes in (files, chunks) is decided above."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .memory_rows import MemoryChunkRow, MemoryFileRow, MemoryRows
from .store import Store
from .store_base import DERIVED_KEY

__all__ = ["FileUpdate", "MemoryChunkRow", "MemoryFileRow", "MemoryIndex"]

#: vectors read per hold of the store's lock (``MemoryIndex.vectors``)
VECTOR_PAGE = 4_096


@dataclass(frozen=True, slots=True)
class FileUpdate:
    """One file of an index run: its row, and its chunks (None: content unchanged, keep them)."""

    row: MemoryFileRow
    chunks: Sequence[MemoryChunkRow] | None


class MemoryIndex:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _rows(self) -> MemoryRows:
        return self.store.backend.memory_rows()

    def files(self, workspace: str) -> list[MemoryFileRow]:
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().files(workspace)

    def run(self, workspace: str) -> tuple[float, bytes] | None:
        with self.store.lock:
            return self._rows().run(workspace)

    def chunk_count(self, workspace: str) -> int:
        with self.store.lock:
            return self._rows().chunk_count(workspace)

    def chunk(self, workspace: str, chunk_id: str) -> MemoryChunkRow | None:
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().chunk(workspace, chunk_id)

    def chunks(self, workspace: str, chunk_ids: Sequence[str]) -> dict[str, MemoryChunkRow]:
        """The chunks of these ids that exist, by id (one query)."""
        if not chunk_ids:
            return {}
        self.store.ensure_file()
        with self.store.lock:
            return {r.id: r for r in self._rows().chunks(workspace, list(chunk_ids))}

    def search(self, workspace: str, expression: str, limit: int, under: str | None = None,
               words: Sequence[str] = ()) -> list[tuple[MemoryChunkRow, float]]:
        """Keyword hits, best first; ``under``: only chunks whose path is below ``under/``;
        ``words``: the keywords of a conversational query whose ``OR`` ``expression`` is (a
        backend may then bound the matches it ranks, SPEC §5.1)."""
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().search(workspace, expression, limit, under, words)

    def warm(self, workspace: str) -> None:
        """Read ahead what a keyword search of the workspace keeps between searches (SQLite: its
        rowid range, ``SqliteMemory._rowids``; nothing on PostgreSQL), so the first search of an
        index generation does not pay for it — called by the daemon's background reads."""
        self.store.ensure_file()
        with self.store.lock:
            rows = self._rows()
            warm = getattr(rows, "warm", None)
            if warm is not None:
                warm(workspace)

    def sessions_marker(self) -> tuple[int, float]:
        """(how many sessions, the newest ``updated_at``): one aggregate row."""
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().sessions_marker()

    def sessions_since(self, since: float) -> list[tuple[str, float, int]]:
        """(id, updated_at, node_count) of the sessions written at or after ``since``."""
        with self.store.lock:
            return self._rows().sessions_since(since)

    def sessions_all(self) -> list[tuple[str, float, int]]:
        with self.store.lock:
            return self._rows().sessions_all()

    def sessions_after(self, since: float) -> int:
        with self.store.lock:
            return self._rows().sessions_after(since)

    def files_named(self, workspace: str, paths: Sequence[str]) -> list[MemoryFileRow]:
        if not paths:
            return []
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().files_named(workspace, list(paths))

    def file_count(self, workspace: str) -> int:
        with self.store.lock:
            return self._rows().file_count(workspace)

    def vectors(self, workspace: str, model: str) -> list[tuple[str, bytes]]:
        """Every chunk's vector of ``model`` (``provider:model``), in chunk id order — read
        ``VECTOR_PAGE`` rows per hold of the store's lock, so a read of 100,000 vectors (seconds)
        never holds every other request on the database back for all of it."""
        self.store.ensure_file()
        out: list[tuple[str, bytes]] = []
        while True:
            with self.store.lock:
                page = self._rows().vectors(workspace, model, out[-1][0] if out else "", VECTOR_PAGE)
            out += page
            if len(page) < VECTOR_PAGE:
                return out

    def vector_sets(self) -> list[tuple[str, str, float]]:
        """(workspace, model, index generation) of every set of vectors, newest index first
        (from the kept counts: no vector row read)."""
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().vector_sets()

    def vector_count(self, workspace: str, model: str) -> int:
        with self.store.lock:
            return self._rows().vector_count(workspace, model)

    def missing_vectors(self, workspace: str, model: str, limit: int, after: str = "") -> list[tuple[str, str]]:
        """(chunk id, text) of chunks without a vector of ``model``, at most ``limit``, in id
        order after ``after`` (the last id of the batch before: no batch rescans the ones done)."""
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().missing_vectors(workspace, model, limit, after)

    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None:
        """Store vectors (float32 bytes) of chunks, in one transaction."""
        with self.store._write_many((DERIVED_KEY,)):
            self._rows().put_vectors(workspace, model, dim, rows)

    def apply_sessions(self, workspace: str, *, gone: Sequence[str], rows: Sequence[MemoryFileRow],
                       chunks: Sequence[tuple[str, Sequence[MemoryChunkRow]]], indexed_at: float,
                       marker: bytes = b"") -> None:
        """A sync of session chunks, in one transaction: the sessions ``gone`` lose everything,
        each path of ``chunks`` gets exactly its chunks, ``rows`` are the sessions' marks,
        ``marker`` the sessions' state the index is now up to date with (the run row's
        ``skipped`` field, which a workspace of files uses for its skips)."""
        with self.store._write_many((DERIVED_KEY,)):
            r = self._rows()
            for sid in gone:
                r.drop_under(workspace, sid)
            for path, cs in chunks:
                r.replace_chunks(workspace, path, cs)
            for row in rows:
                r.put_file(workspace, row, None)
            r.put_run(workspace, indexed_at, marker)

    def apply(self, workspace: str, *, drop: Sequence[str], put: Sequence[FileUpdate],
              indexed_at: float, skipped: bytes) -> None:
        """One index run, in one transaction: files gone (or skipped now) lose their rows and
        chunks, changed files get their new chunks, unchanged ones their new times."""
        with self.store._write_many((DERIVED_KEY,)):
            rows = self._rows()
            rows.drop_files(workspace, list(drop))
            for u in put:
                rows.put_file(workspace, u.row, u.chunks)
            rows.put_run(workspace, indexed_at, skipped)
            rows.drop_stale_vectors(workspace)  # a chunk id is its content: unchanged chunks keep theirs
