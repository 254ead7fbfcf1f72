"""The memory index's rows on a PostgreSQL server (SPEC §5.1): tables with a weighted
``tsvector`` per chunk, searched with ``pg_search``'s translation of the FTS5 syntax.
``PostgresBackend.memory_rows()`` gives it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import pg_search
from . import search as fts
from .memory_rows import CHUNK_COLS, MemoryChunkRow, MemoryFileRow, chunk_row


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

    def search(self, workspace: str, expression: str, limit: int) -> list[tuple[MemoryChunkRow, float]]:
        q = pg_search.parse(fts.fts_query(expression))
        if q.exact is None or q.relaxed is None:
            return []
        sql = (f"SELECT {CHUNK_COLS}, ts_rank(c.search_vec, r, 1) AS score, c.search_full "
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
