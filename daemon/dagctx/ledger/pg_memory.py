"""The memory index's rows on a PostgreSQL server (SPEC §5.1): tables with a weighted
``tsvector`` per chunk, searched with ``pg_search``'s translation of the FTS5 syntax.
``PostgresBackend.memory_rows()`` gives it."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from . import pg_search
from . import search as fts
from .memory_rows import (CHUNK_COLS, KEYWORD_BUDGET, MemoryChunkRow, MemoryFileRow, by_share, chunk_row,
                          keyword_draws, under_range)

#: FTS5's ``bm25()`` constants (SQLite's side ranks with it)
BM25_K1 = 1.2
BM25_B = 0.75


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

    def _count(self, workspace: str, what: str) -> int:
        """A count the schema's triggers keep (``memory_counts``, version 5): one row read."""
        with self.b._conn("read the memory index") as c:
            r = c.execute("SELECT n FROM dagctx.memory_counts WHERE workspace=%s AND what=%s",
                          (workspace, what)).fetchone()
        return int(r[0]) if r else 0

    def chunk_count(self, workspace: str) -> int:
        return self._count(workspace, ":chunks")

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
        if words:
            return self._keywords(workspace, list(words), limit, under, expression)
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

    def _keywords(self, workspace: str, words: list[str], limit: int, under: str | None,
                  expression: str) -> list[tuple[MemoryChunkRow, float]]:
        """A conversational query's keywords as SQLite's side runs them (SPEC §5.1): each word's
        chunk count from ``memory_terms`` (the schema's triggers keep it, the twin of FTS5's
        vocabulary), the same draws (``keyword_draws``), each ranked by FTS5's BM25 formula —
        IDF from those counts and the chunks of every workspace, term frequencies and the
        chunk's length from its ``tsvector``'s positions, the mean length from the ``:tokens``
        count — over at most ``budget`` matches; the same order by the share of the words
        held. So a rare word weighs what it weighs on SQLite, where ``ts_rank`` (no IDF) made a
        chunk holding one common word score like one holding one rare word."""
        budget = max(KEYWORD_BUDGET, 4 * limit)
        folded = [t[0] if len(t) == 1 else "" for t in (pg_search.tokens(w) for w in words)]
        below = 'AND c.path COLLATE "C" >= %s AND c.path COLLATE "C" < %s ' if under is not None else ""
        span = under_range(under) if under is not None else ()
        found: dict[str, tuple[MemoryChunkRow, float]] = {}
        with self.b._conn("search memory") as c:
            held = dict(c.execute("SELECT term, chunks FROM dagctx.memory_terms WHERE term = ANY(%s)",
                                  ([f for f in folded if f],)).fetchall())
            dfs = [max(0, int(held.get(f, 0))) if f else 0 for f in folded]
            n, tokens = c.execute(
                "SELECT coalesce(sum(n) FILTER (WHERE what = ':chunks'), 0), "
                "coalesce(sum(n) FILTER (WHERE what = ':tokens'), 0) FROM dagctx.memory_counts "
                "WHERE what IN (':chunks', ':tokens')").fetchone()
            n, avgdl = max(1, int(n)), (float(tokens) / int(n) if int(n) and tokens else 1.0)
            idf = [max(1e-6, math.log((n - df + 0.5) / (df + 0.5))) for df in dfs]
            # FTS5's bm25: sum of idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / mean length))
            tfs = ", ".join(f"coalesce(sum(cardinality(t.positions)) FILTER (WHERE t.lexeme = CAST(%s AS text)), 0) AS tf{i}"
                            for i in range(len(words)))
            norm = f"{BM25_K1!r} * ({1 - BM25_B!r} + {BM25_B!r} * d.dl / {avgdl!r})"
            score = " + ".join(f"{idf[i]!r} * d.tf{i} * {BM25_K1 + 1!r} / (d.tf{i} + {norm})"
                               for i in range(len(words)))
            sql = (f"SELECT {CHUNK_COLS}, {score} AS score, c.search_full FROM (SELECT * FROM dagctx.memory_chunks c "
                   "WHERE c.workspace = %s " + below + "AND ((c.search_full AND c.search_vec @@ CAST(%s AS tsquery)) "
                   "OR (NOT c.search_full AND c.search_vec @@ CAST(%s AS tsquery))) LIMIT %s) c, LATERAL "
                   f"(SELECT coalesce(sum(cardinality(t.positions)), 0) AS dl, {tfs} FROM unnest(c.search_vec) t) d "
                   "ORDER BY score DESC, c.path, c.start_line LIMIT %s")

            def draw(expr: str) -> None:
                q = pg_search.parse(fts.fts_query(expr))
                if q.exact is None or q.relaxed is None:
                    return
                for r in c.execute(sql, (workspace, *span, q.exact, q.relaxed, budget, *folded, limit)).fetchall():
                    if r[0] in found or (not r[9] and not pg_search.verify(q, r[7], fts.cjk_grams(r[7]))):
                        continue
                    found[r[0]] = (chunk_row(r), float(r[8]))

            for expr in keyword_draws(words, dfs, budget) or [expression]:
                draw(expr)
                if len(found) >= limit:
                    break
        return by_share(list(found.values()), words, lambda f: f[0].text,
                        lambda f: (-f[1], f[0].path, f[0].start_line))[:limit]

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
        # one statement for the file's chunks: the schema's statement triggers count their
        # lexemes (``memory_terms``) and rows once per statement, not once per chunk
        vecs = [pg_search.document_vector(ch.text, fts.cjk_grams(ch.text)) for ch in chunks]
        c.execute(
            "INSERT INTO dagctx.memory_chunks(workspace, id, path, source, start_line, end_line, hash, "
            "mtime, text, search_vec, search_full) SELECT %s, u.* FROM unnest(CAST(%s AS text[]), "
            "CAST(%s AS text[]), CAST(%s AS text[]), CAST(%s AS bigint[]), CAST(%s AS bigint[]), "
            "CAST(%s AS text[]), CAST(%s AS float8[]), CAST(%s AS text[]), CAST(CAST(%s AS text[]) AS tsvector[]), "
            "CAST(%s AS boolean[])) AS u",
            (workspace, [ch.id for ch in chunks], [ch.path for ch in chunks], [ch.source for ch in chunks],
             [ch.start_line for ch in chunks], [ch.end_line for ch in chunks], [ch.hash for ch in chunks],
             [ch.mtime for ch in chunks], [ch.text for ch in chunks], [v for v, _ in vecs], [f for _, f in vecs]))

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
        return self._count(workspace, ":files")

    def put_run(self, workspace: str, indexed_at: float, skipped: bytes) -> None:
        with self.b._conn("write the memory index") as c:
            c.execute(
                "INSERT INTO dagctx.memory_runs(workspace, indexed_at, skipped) VALUES(%s,%s,%s) "
                "ON CONFLICT(workspace) DO UPDATE SET indexed_at=excluded.indexed_at, skipped=excluded.skipped",
                (workspace, indexed_at, skipped))

    # ------------------------------------------------------------ vectors (schema version 4)

    def vectors(self, workspace: str, model: str, after: str = "", limit: int = -1) -> list[tuple[str, bytes]]:
        with self.b._conn("read the memory index") as c:
            # in the primary key's order from a cursor: no join, no sort by path (a vector's
            # chunk is there: both leave in the same transaction)
            rows = c.execute(
                'SELECT chunk_id, vec FROM dagctx.memory_vectors WHERE workspace=%s AND model=%s AND chunk_id > %s '
                'ORDER BY chunk_id LIMIT %s', (workspace, model, after, None if limit < 0 else limit)).fetchall()
        return [(r[0], bytes(r[1])) for r in rows]

    def vector_count(self, workspace: str, model: str) -> int:
        return self._count(workspace, model)

    def vector_sets(self) -> list[tuple[str, str, float]]:
        with self.b._conn("read the memory index") as c:
            rows = c.execute(
                "SELECT k.workspace, k.what, r.indexed_at FROM dagctx.memory_counts k JOIN dagctx.memory_runs r "
                "ON r.workspace = k.workspace WHERE k.what NOT LIKE ':%%' AND k.n > 0 "
                "ORDER BY r.indexed_at DESC").fetchall()
        return [(r[0], r[1], float(r[2])) for r in rows]

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
