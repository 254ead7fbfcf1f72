"""The memory index's rows in a SQLite file (SPEC §5.1): tables with an FTS5 index of the
chunks, the same query syntax as ``search/query``. ``SqliteBackend.memory_rows()`` gives it."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from dagctx.protocol.errors import DagctxError

from . import search as fts
from .backend import storage_error
from .memory_rows import CHUNK_COLS, MemoryChunkRow, MemoryFileRow, chunk_row


class SqliteMemory:
    def __init__(self, backend: Any) -> None:
        self.b = backend

    def _c(self) -> sqlite3.Connection:
        return self.b._c()

    def files(self, workspace: str) -> list[MemoryFileRow]:
        with self.b._faults("read the memory index"):
            rows = self._c().execute(
                "SELECT path, source, hash, mtime, size, lines, chunks FROM memory_files WHERE workspace=? "
                "ORDER BY path", (workspace,)).fetchall()
        return [MemoryFileRow(*r) for r in rows]

    def run(self, workspace: str) -> tuple[float, bytes] | None:
        with self.b._faults("read the memory index"):
            r = self._c().execute("SELECT indexed_at, skipped FROM memory_runs WHERE workspace=?",
                                  (workspace,)).fetchone()
        return None if r is None else (float(r[0]), bytes(r[1]))

    def chunk_count(self, workspace: str) -> int:
        with self.b._faults("read the memory index"):
            return int(self._c().execute("SELECT count(*) FROM memory_chunks WHERE workspace=?",
                                         (workspace,)).fetchone()[0])

    def chunk(self, workspace: str, chunk_id: str) -> MemoryChunkRow | None:
        with self.b._faults("read the memory index"):
            r = self._c().execute(f"SELECT {CHUNK_COLS} FROM memory_chunks c WHERE c.workspace=? AND c.id=?",
                                  (workspace, chunk_id)).fetchone()
        return None if r is None else chunk_row(r)

    def search(self, workspace: str, expression: str, limit: int) -> list[tuple[MemoryChunkRow, float]]:
        sql = (f"SELECT {CHUNK_COLS}, bm25(memory_search, 1.0, 1.0) AS score FROM memory_search s "
               "JOIN memory_chunks c ON c.rowid = s.rowid WHERE memory_search MATCH ? AND c.workspace = ? "
               "ORDER BY score, c.path, c.start_line LIMIT ?")
        try:
            rows = self._c().execute(sql, (fts.fts_query(expression), workspace, limit)).fetchall()
        except sqlite3.OperationalError as exc:
            raise DagctxError(
                "InvalidQuery",
                f"the search query {expression!r} is not valid full-text syntax ({exc}); quote phrases "
                'with "…", balance parentheses, and put AND/OR/NOT between terms',
                path="query",
            ) from exc
        except sqlite3.DatabaseError as exc:
            raise storage_error("StorageCorrupt", f"cannot search memory: {exc}", self.b.location) from exc
        # bm25 is lower-is-better; keep higher-is-better like search/query
        return [(chunk_row(r), -float(r[8])) for r in rows]

    def drop_files(self, workspace: str, paths: Sequence[str]) -> None:
        c = self._c()
        for path in paths:
            c.execute("DELETE FROM memory_search WHERE rowid IN "
                      "(SELECT rowid FROM memory_chunks WHERE workspace=? AND path=?)", (workspace, path))
            c.execute("DELETE FROM memory_chunks WHERE workspace=? AND path=?", (workspace, path))
            c.execute("DELETE FROM memory_files WHERE workspace=? AND path=?", (workspace, path))

    def put_file(self, workspace: str, row: MemoryFileRow, chunks: Sequence[MemoryChunkRow] | None) -> None:
        c = self._c()
        if chunks is not None:
            self.drop_files(workspace, [row.path])
            for ch in chunks:
                cur = c.execute(
                    "INSERT INTO memory_chunks(workspace, id, path, source, start_line, end_line, hash, mtime, text) "
                    "VALUES(?,?,?,?,?,?,?,?,?)",
                    (workspace, ch.id, ch.path, ch.source, ch.start_line, ch.end_line, ch.hash, ch.mtime, ch.text))
                c.execute("INSERT INTO memory_search(rowid, text, grams) VALUES(?,?,?)",
                          (cur.lastrowid, ch.text, fts.cjk_grams(ch.text)))
        else:  # unchanged content: only the file's times move, and its chunks' with it
            c.execute("UPDATE memory_chunks SET mtime=? WHERE workspace=? AND path=?", (row.mtime, workspace, row.path))
        c.execute(
            "INSERT INTO memory_files(workspace, path, source, hash, mtime, size, lines, chunks) "
            "VALUES(?,?,?,?,?,?,?,?) ON CONFLICT(workspace, path) DO UPDATE SET source=excluded.source, "
            "hash=excluded.hash, mtime=excluded.mtime, size=excluded.size, lines=excluded.lines, "
            "chunks=excluded.chunks",
            (workspace, row.path, row.source, row.hash, row.mtime, row.size, row.lines, row.chunks))

    def put_run(self, workspace: str, indexed_at: float, skipped: bytes) -> None:
        self._c().execute(
            "INSERT INTO memory_runs(workspace, indexed_at, skipped) VALUES(?,?,?) ON CONFLICT(workspace) "
            "DO UPDATE SET indexed_at=excluded.indexed_at, skipped=excluded.skipped",
            (workspace, indexed_at, skipped))
