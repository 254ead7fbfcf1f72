"""The memory index's API over a ``Store`` (SPEC §5.1): reads under the store's lock, one
derived write transaction per index run. What goes in (files, chunks) is decided above."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .memory_rows import MemoryChunkRow, MemoryFileRow, MemoryRows
from .store import Store
from .store_base import DERIVED_KEY

__all__ = ["FileUpdate", "MemoryChunkRow", "MemoryFileRow", "MemoryIndex"]


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

    def search(self, workspace: str, expression: str, limit: int) -> list[tuple[MemoryChunkRow, float]]:
        self.store.ensure_file()
        with self.store.lock:
            return self._rows().search(workspace, expression, limit)

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
