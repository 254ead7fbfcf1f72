"""The memory index's rows on both backends (SPEC §5.1; tables of schema versions 3 and 4).

Kept apart from the session primitives of ``backend.py``: a memory file's chunks are
derived data of a workspace, never part of a session. ``for_backend`` gives the
implementation of a backend's kind; each keeps rows only (the decisions — what a file's
chunks are, when a file changed — are made above, in ``memory.py`` and the engine). Writes
run inside the store's derived transaction (``Store._write_many``), so one index run
commits whole or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dagctx.protocol.errors import DagctxError

from . import pg_search
from . import search as fts
from .backend import Backend, storage_error


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
    def search(self, workspace: str, expression: str, limit: int) -> list[tuple[MemoryChunkRow, float]]: ...
    # inside a write transaction
    def drop_files(self, workspace: str, paths: Sequence[str]) -> None: ...
    def put_file(self, workspace: str, row: MemoryFileRow, chunks: Sequence[MemoryChunkRow] | None) -> None: ...
    def put_run(self, workspace: str, indexed_at: float, skipped: bytes) -> None: ...
    # vectors: one per chunk and embedding model (``provider:model``), float32 bytes
    def vectors(self, workspace: str, model: str) -> list[tuple[str, bytes]]: ...
    def vector_count(self, workspace: str, model: str) -> int: ...
    def missing_vectors(self, workspace: str, model: str, limit: int) -> list[tuple[str, str]]: ...
    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None: ...
    def drop_stale_vectors(self, workspace: str) -> None: ...


_CHUNK_COLS = "c.id, c.path, c.source, c.start_line, c.end_line, c.hash, c.mtime, c.text"


def _chunk(r: Sequence[Any]) -> MemoryChunkRow:
    return MemoryChunkRow(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5], float(r[6]), r[7])


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
            r = self._c().execute(f"SELECT {_CHUNK_COLS} FROM memory_chunks c WHERE c.workspace=? AND c.id=?",
                                  (workspace, chunk_id)).fetchone()
        return None if r is None else _chunk(r)

    def search(self, workspace: str, expression: str, limit: int) -> list[tuple[MemoryChunkRow, float]]:
        sql = (f"SELECT {_CHUNK_COLS}, bm25(memory_search, 1.0, 1.0) AS score FROM memory_search s "
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
        return [(_chunk(r), -float(r[8])) for r in rows]

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

    # ------------------------------------------------------------ vectors (schema version 4)

    def vectors(self, workspace: str, model: str) -> list[tuple[str, bytes]]:
        with self.b._faults("read the memory index"):
            rows = self._c().execute(
                "SELECT v.chunk_id, v.vec FROM memory_vectors v JOIN memory_chunks c "
                "ON c.workspace = v.workspace AND c.id = v.chunk_id WHERE v.workspace=? AND v.model=? "
                "ORDER BY c.rowid", (workspace, model)).fetchall()
        return [(r[0], bytes(r[1])) for r in rows]

    def vector_count(self, workspace: str, model: str) -> int:
        with self.b._faults("read the memory index"):
            return int(self._c().execute("SELECT count(*) FROM memory_vectors WHERE workspace=? AND model=?",
                                         (workspace, model)).fetchone()[0])

    def missing_vectors(self, workspace: str, model: str, limit: int) -> list[tuple[str, str]]:
        with self.b._faults("read the memory index"):
            rows = self._c().execute(
                "SELECT c.id, c.text FROM memory_chunks c WHERE c.workspace=? AND NOT EXISTS (SELECT 1 FROM "
                "memory_vectors v WHERE v.workspace=c.workspace AND v.chunk_id=c.id AND v.model=?) "
                "ORDER BY c.rowid LIMIT ?", (workspace, model, limit)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None:
        self._c().executemany(
            "INSERT INTO memory_vectors(workspace, chunk_id, model, dim, vec) VALUES(?,?,?,?,?) "
            "ON CONFLICT(workspace, chunk_id, model) DO UPDATE SET dim=excluded.dim, vec=excluded.vec",
            [(workspace, cid, model, dim, vec) for cid, vec in rows])

    def drop_stale_vectors(self, workspace: str) -> None:
        self._c().execute(
            "DELETE FROM memory_vectors WHERE workspace=? AND chunk_id NOT IN "
            "(SELECT id FROM memory_chunks WHERE workspace=?)", (workspace, workspace))


class PostgresMemory:
    def __init__(self, backend: Any) -> None:
        self.b = backend

    def files(self, workspace: str) -> list[MemoryFileRow]:
        with self.b._conn("read the memory index") as c:
            rows = c.execute(
                "SELECT path, source, hash, mtime, size, lines, chunks FROM dagctx.memory_files WHERE workspace=%s "
                "ORDER BY path", (workspace,)).fetchall()
        return [MemoryFileRow(r[0], r[1], r[2], float(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in rows]

    def run(self, workspace: str) -> tuple[float, bytes] | None:
        with self.b._conn("read the memory index") as c:
            r = c.execute("SELECT indexed_at, skipped FROM dagctx.memory_runs WHERE workspace=%s",
                          (workspace,)).fetchone()
        return None if r is None else (float(r[0]), bytes(r[1]))

    def chunk_count(self, workspace: str) -> int:
        with self.b._conn("read the memory index") as c:
            return int(c.execute("SELECT count(*) FROM dagctx.memory_chunks WHERE workspace=%s",
                                 (workspace,)).fetchone()[0])

    def chunk(self, workspace: str, chunk_id: str) -> MemoryChunkRow | None:
        with self.b._conn("read the memory index") as c:
            r = c.execute(f"SELECT {_CHUNK_COLS} FROM dagctx.memory_chunks c WHERE c.workspace=%s AND c.id=%s",
                          (workspace, chunk_id)).fetchone()
        return None if r is None else _chunk(r)

    def search(self, workspace: str, expression: str, limit: int) -> list[tuple[MemoryChunkRow, float]]:
        q = pg_search.parse(fts.fts_query(expression))
        if q.exact is None or q.relaxed is None:
            return []
        sql = (f"SELECT {_CHUNK_COLS}, ts_rank(c.search_vec, r, 1) AS score, c.search_full "
               "FROM dagctx.memory_chunks c, CAST(%s AS tsquery) q, CAST(%s AS tsquery) r "
               "WHERE c.workspace = %s AND ((c.search_full AND c.search_vec @@ q) "
               "OR (NOT c.search_full AND c.search_vec @@ r)) "
               "ORDER BY score DESC, c.path, c.start_line LIMIT %s OFFSET %s")
        out: list[tuple[MemoryChunkRow, float]] = []
        offset, page = 0, max(limit, 50)
        with self.b._conn("search memory") as c:
            while len(out) < limit:
                rows = c.execute(sql, (q.exact, q.relaxed, workspace, page, offset)).fetchall()
                for r in rows:
                    if not r[9] and not pg_search.verify(q, r[7], fts.cjk_grams(r[7])):
                        continue
                    out.append((_chunk(r), float(r[8])))
                    if len(out) == limit:
                        break
                if len(rows) < page:
                    break
                offset += page
        return out

    def drop_files(self, workspace: str, paths: Sequence[str]) -> None:
        if not paths:
            return
        with self.b._conn("write the memory index") as c:
            c.execute("DELETE FROM dagctx.memory_chunks WHERE workspace=%s AND path = ANY(%s)", (workspace, list(paths)))
            c.execute("DELETE FROM dagctx.memory_files WHERE workspace=%s AND path = ANY(%s)", (workspace, list(paths)))

    def put_file(self, workspace: str, row: MemoryFileRow, chunks: Sequence[MemoryChunkRow] | None) -> None:
        with self.b._conn("write the memory index") as c:
            if chunks is not None:
                c.execute("DELETE FROM dagctx.memory_chunks WHERE workspace=%s AND path=%s", (workspace, row.path))
                with c.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO dagctx.memory_chunks(workspace, id, path, source, start_line, end_line, hash, "
                        "mtime, text, search_vec, search_full) VALUES(%s,%s,%s,%s,%s,%s,%s,%s,%s,CAST(%s AS tsvector),%s)",
                        [(workspace, ch.id, ch.path, ch.source, ch.start_line, ch.end_line, ch.hash, ch.mtime, ch.text,
                          *pg_search.document_vector(ch.text, fts.cjk_grams(ch.text))) for ch in chunks])
            else:
                c.execute("UPDATE dagctx.memory_chunks SET mtime=%s WHERE workspace=%s AND path=%s",
                          (row.mtime, workspace, row.path))
            c.execute(
                "INSERT INTO dagctx.memory_files(workspace, path, source, hash, mtime, size, lines, chunks) "
                "VALUES(%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT(workspace, path) DO UPDATE SET source=excluded.source, "
                "hash=excluded.hash, mtime=excluded.mtime, size=excluded.size, lines=excluded.lines, "
                "chunks=excluded.chunks",
                (workspace, row.path, row.source, row.hash, row.mtime, row.size, row.lines, row.chunks))

    def put_run(self, workspace: str, indexed_at: float, skipped: bytes) -> None:
        with self.b._conn("write the memory index") as c:
            c.execute(
                "INSERT INTO dagctx.memory_runs(workspace, indexed_at, skipped) VALUES(%s,%s,%s) "
                "ON CONFLICT(workspace) DO UPDATE SET indexed_at=excluded.indexed_at, skipped=excluded.skipped",
                (workspace, indexed_at, skipped))

    # ------------------------------------------------------------ vectors (schema version 4)

    def vectors(self, workspace: str, model: str) -> list[tuple[str, bytes]]:
        with self.b._conn("read the memory index") as c:
            rows = c.execute(
                "SELECT v.chunk_id, v.vec FROM dagctx.memory_vectors v JOIN dagctx.memory_chunks c "
                "ON c.workspace = v.workspace AND c.id = v.chunk_id WHERE v.workspace=%s AND v.model=%s "
                "ORDER BY c.path, c.start_line, c.id", (workspace, model)).fetchall()
        return [(r[0], bytes(r[1])) for r in rows]

    def vector_count(self, workspace: str, model: str) -> int:
        with self.b._conn("read the memory index") as c:
            return int(c.execute("SELECT count(*) FROM dagctx.memory_vectors WHERE workspace=%s AND model=%s",
                                 (workspace, model)).fetchone()[0])

    def missing_vectors(self, workspace: str, model: str, limit: int) -> list[tuple[str, str]]:
        with self.b._conn("read the memory index") as c:
            rows = c.execute(
                "SELECT c.id, c.text FROM dagctx.memory_chunks c WHERE c.workspace=%s AND NOT EXISTS (SELECT 1 FROM "
                "dagctx.memory_vectors v WHERE v.workspace=c.workspace AND v.chunk_id=c.id AND v.model=%s) "
                "ORDER BY c.path, c.start_line, c.id LIMIT %s", (workspace, model, limit)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None:
        with self.b._conn("write the memory index") as c, c.cursor() as cur:
            cur.executemany(
                "INSERT INTO dagctx.memory_vectors(workspace, chunk_id, model, dim, vec) VALUES(%s,%s,%s,%s,%s) "
                "ON CONFLICT(workspace, chunk_id, model) DO UPDATE SET dim=excluded.dim, vec=excluded.vec",
                [(workspace, cid, model, dim, vec) for cid, vec in rows])

    def drop_stale_vectors(self, workspace: str) -> None:
        with self.b._conn("write the memory index") as c:
            c.execute("DELETE FROM dagctx.memory_vectors v WHERE v.workspace=%s AND NOT EXISTS (SELECT 1 FROM "
                      "dagctx.memory_chunks c WHERE c.workspace=v.workspace AND c.id=v.chunk_id)", (workspace,))


def for_backend(backend: Backend) -> MemoryRows:
    """The memory rows of a backend's kind."""
    if backend.kind == "postgresql":
        return PostgresMemory(backend)
    return SqliteMemory(backend)
