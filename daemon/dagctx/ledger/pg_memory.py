"""The memory index's rows on a PostgreSQL server (SPEC §5.1): tables with a weighted
``tsvector`` per chunk, searched with ``pg_search``'s translation of the FTS5 syntax.
``PostgresBackend.memory_rows()`` gives it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from . import pg_search
from . import search as fts
from .memory_rows import CHUNK_COLS, MemoryChunkRow, MemoryFileRow, chunk_row, under_range


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
            r = c.execute(f"SELECT {CHUNK_COLS} FROM dagctx.memory_chunks c WHERE c.workspace=%s AND c.id=%s",
                          (workspace, chunk_id)).fetchone()
        return None if r is None else chunk_row(r)

    def chunks(self, workspace: str, chunk_ids: Sequence[str]) -> list[MemoryChunkRow]:
        with self.b._conn("read the memory index") as c:
            rows = c.execute(f"SELECT {CHUNK_COLS} FROM dagctx.memory_chunks c WHERE c.workspace=%s AND c.id = ANY(%s)",
                             (workspace, list(chunk_ids))).fetchall()
        return [chunk_row(r) for r in rows]

    def search(self, workspace: str, expression: str, limit: int, under: str | None = None,
               words: Sequence[str] = ()) -> list[tuple[MemoryChunkRow, float]]:
        # ``words`` unused: PostgreSQL ranks every match of the keywords' OR (ARCHITECTURE.md)
        q = pg_search.parse(fts.fts_query(expression))
        if q.exact is None or q.relaxed is None:
            return []
        # below one session: a range of paths compared as bytes (the database's collation may not)
        below = 'AND c.path COLLATE "C" >= %s AND c.path COLLATE "C" < %s ' if under is not None else ""
        span = under_range(under) if under is not None else ()
        sql = (f"SELECT {CHUNK_COLS}, ts_rank(c.search_vec, r, 1) AS score, c.search_full "
               "FROM dagctx.memory_chunks c, CAST(%s AS tsquery) q, CAST(%s AS tsquery) r "
               f"WHERE c.workspace = %s {below}AND ((c.search_full AND c.search_vec @@ q) "
               "OR (NOT c.search_full AND c.search_vec @@ r)) "
               "ORDER BY score DESC, c.path, c.start_line LIMIT %s OFFSET %s")
        out: list[tuple[MemoryChunkRow, float]] = []
        offset, page = 0, max(limit, 50)
        with self.b._conn("search memory") as c:
            while len(out) < limit:
                rows = c.execute(sql, (q.exact, q.relaxed, workspace, *span, page, offset)).fetchall()
                for r in rows:
                    if not r[9] and not pg_search.verify(q, r[7], fts.cjk_grams(r[7])):
                        continue
                    out.append((chunk_row(r), float(r[8])))
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
                self._insert(c, workspace, chunks)
            else:
                c.execute("UPDATE dagctx.memory_chunks SET mtime=%s WHERE workspace=%s AND path=%s",
                          (row.mtime, workspace, row.path))
            c.execute(
                "INSERT INTO dagctx.memory_files(workspace, path, source, hash, mtime, size, lines, chunks) "
                "VALUES(%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT(workspace, path) DO UPDATE SET source=excluded.source, "
                "hash=excluded.hash, mtime=excluded.mtime, size=excluded.size, lines=excluded.lines, "
                "chunks=excluded.chunks",
                (workspace, row.path, row.source, row.hash, row.mtime, row.size, row.lines, row.chunks))

    @staticmethod
    def _insert(c: Any, workspace: str, chunks: Sequence[MemoryChunkRow]) -> None:
        if not chunks:
            return
        with c.cursor() as cur:
            cur.executemany(
                "INSERT INTO dagctx.memory_chunks(workspace, id, path, source, start_line, end_line, hash, "
                "mtime, text, search_vec, search_full) VALUES(%s,%s,%s,%s,%s,%s,%s,%s,%s,CAST(%s AS tsvector),%s)",
                [(workspace, ch.id, ch.path, ch.source, ch.start_line, ch.end_line, ch.hash, ch.mtime, ch.text,
                  *pg_search.document_vector(ch.text, fts.cjk_grams(ch.text))) for ch in chunks])

    def replace_chunks(self, workspace: str, path: str, chunks: Sequence[MemoryChunkRow]) -> None:
        with self.b._conn("write the memory index") as c:
            c.execute("DELETE FROM dagctx.memory_vectors WHERE workspace=%s AND chunk_id IN "
                      "(SELECT id FROM dagctx.memory_chunks WHERE workspace=%s AND path=%s)", (workspace, workspace, path))
            c.execute("DELETE FROM dagctx.memory_chunks WHERE workspace=%s AND path=%s", (workspace, path))
            self._insert(c, workspace, chunks)

    def drop_under(self, workspace: str, prefix: str) -> None:
        lo, hi = under_range(prefix)
        with self.b._conn("write the memory index") as c:
            below = 'path COLLATE "C" >= %s AND path COLLATE "C" < %s'
            c.execute("DELETE FROM dagctx.memory_vectors WHERE workspace=%s AND chunk_id IN (SELECT id FROM "
                      f"dagctx.memory_chunks WHERE workspace=%s AND {below})", (workspace, workspace, lo, hi))
            c.execute(f"DELETE FROM dagctx.memory_chunks WHERE workspace=%s AND {below}", (workspace, lo, hi))
            c.execute("DELETE FROM dagctx.memory_files WHERE workspace=%s AND path=%s", (workspace, prefix))

    def sessions_marker(self) -> tuple[int, float]:
        with self.b._conn("read the sessions") as c:
            r = c.execute("SELECT count(*), coalesce(max(updated_at), 0) FROM dagctx.sessions").fetchone()
        return int(r[0]), float(r[1])

    def sessions_since(self, since: float) -> list[tuple[str, float, int]]:
        with self.b._conn("read the sessions") as c:
            rows = c.execute("SELECT id, updated_at, node_count FROM dagctx.sessions WHERE updated_at >= %s "
                             "ORDER BY updated_at, id", (since,)).fetchall()
        return [(r[0], float(r[1]), int(r[2])) for r in rows]

    def sessions_all(self) -> list[tuple[str, float, int]]:
        with self.b._conn("read the sessions") as c:
            rows = c.execute("SELECT id, updated_at, node_count FROM dagctx.sessions ORDER BY id").fetchall()
        return [(r[0], float(r[1]), int(r[2])) for r in rows]

    def sessions_after(self, since: float) -> int:
        with self.b._conn("read the sessions") as c:
            return int(c.execute("SELECT count(*) FROM dagctx.sessions WHERE updated_at > %s",
                                 (since,)).fetchone()[0])

    def files_named(self, workspace: str, paths: Sequence[str]) -> list[MemoryFileRow]:
        with self.b._conn("read the memory index") as c:
            rows = c.execute(
                "SELECT path, source, hash, mtime, size, lines, chunks FROM dagctx.memory_files WHERE workspace=%s "
                "AND path = ANY(%s)", (workspace, list(paths))).fetchall()
        return [MemoryFileRow(r[0], r[1], r[2], float(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in rows]

    def file_count(self, workspace: str) -> int:
        with self.b._conn("read the memory index") as c:
            return int(c.execute("SELECT count(*) FROM dagctx.memory_files WHERE workspace=%s",
                                 (workspace,)).fetchone()[0])

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

    def missing_vectors(self, workspace: str, model: str, limit: int, after: str = "") -> list[tuple[str, str]]:
        # by the primary key (workspace, id) from the cursor: no sort of the workspace's chunks per batch
        with self.b._conn("read the memory index") as c:
            rows = c.execute(
                "SELECT c.id, c.text FROM dagctx.memory_chunks c WHERE c.workspace=%s AND c.id > %s AND NOT EXISTS "
                "(SELECT 1 FROM dagctx.memory_vectors v WHERE v.workspace=c.workspace AND v.chunk_id=c.id AND "
                "v.model=%s) ORDER BY c.id LIMIT %s", (workspace, after, model, limit)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None:
        with self.b._conn("write the memory index") as c, c.cursor() as cur:
            cur.executemany(
                "INSERT INTO dagctx.memory_vectors(workspace, chunk_id, model, dim, vec) VALUES(%s,%s,%s,%s,%s) "
                "ON CONFLICT(workspace, chunk_id, model) DO UPDATE SET dim=excluded.dim, vec=excluded.vec",
                [(workspace, cid, model, dim, vec) for cid, vec in rows])
            # the run's time is the index's generation stamp (searches keep vectors while it holds)
            cur.execute("UPDATE dagctx.memory_runs SET indexed_at = GREATEST(%s, indexed_at + 0.000001) "
                        "WHERE workspace=%s", (time.time(), workspace))

    def drop_stale_vectors(self, workspace: str) -> None:
        with self.b._conn("write the memory index") as c:
            c.execute("DELETE FROM dagctx.memory_vectors v WHERE v.workspace=%s AND NOT EXISTS (SELECT 1 FROM "
                      "dagctx.memory_chunks c WHERE c.workspace=v.workspace AND c.id=v.chunk_id)", (workspace,))
