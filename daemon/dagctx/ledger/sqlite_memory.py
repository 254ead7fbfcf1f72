"""The memory index's rows in a SQLite file (SPEC §5.1): tables with an FTS5 index of the
chunks, the same query syntax as ``search/query``. ``SqliteBackend.memory_rows()`` gives it."""

from __future__ import annotations

import functools
import sqlite3
import time
import unicodedata
import weakref
from collections.abc import Sequence
from typing import Any

from dagctx.protocol.errors import DagctxError

from . import search as fts
from .backend import storage_error
from .memory_rows import (CHUNK_COLS, KEYWORD_BUDGET, MemoryChunkRow, MemoryFileRow, by_share, chunk_row,
                          keyword_draws, under_range)


#: a search's keyword expressions as FTS5 expressions (``search.fts_query``, a pure function
#: of the text): a conversational query's draws are the same few strings again and again
_fts_query = functools.lru_cache(maxsize=1024)(fts.fts_query)
#: the words' chunk counts a backend's connection read, while nothing was written since
#: (``SqliteMemory._doc_counts``): backend → (connection, its data version, its changes), counts
_DOC_COUNTS: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int, int], dict[str, int]]] = weakref.WeakKeyDictionary()
#: words whose counts are kept per backend (the oldest half dropped beyond it)
DOC_COUNTS_KEPT = 4_096
#: each workspace's rowid range (``SqliteMemory._rowids``) per backend: workspace → (run stamp, range)
_ROWIDS: weakref.WeakKeyDictionary[Any, dict[str, tuple[float | None, tuple[int, int, bool] | None]]] = \
    weakref.WeakKeyDictionary()


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

    def _count(self, workspace: str, what: str) -> int:
        """A count the schema's triggers keep (``memory_counts``, version 5): one row read."""
        with self.b._faults("read the memory index"):
            r = self._c().execute("SELECT n FROM memory_counts WHERE workspace=? AND what=?",
                                  (workspace, what)).fetchone()
        return int(r[0]) if r else 0

    def chunk_count(self, workspace: str) -> int:
        return self._count(workspace, ":chunks")

    def chunk(self, workspace: str, chunk_id: str) -> MemoryChunkRow | None:
        with self.b._faults("read the memory index"):
            r = self._c().execute(f"SELECT {CHUNK_COLS} FROM memory_chunks c WHERE c.workspace=? AND c.id=?",
                                  (workspace, chunk_id)).fetchone()
        return None if r is None else chunk_row(r)

    def chunks(self, workspace: str, chunk_ids: Sequence[str]) -> list[MemoryChunkRow]:
        out: list[MemoryChunkRow] = []
        with self.b._faults("read the memory index"):
            for i in range(0, len(chunk_ids), 500):  # under SQLite's bound-parameter limit
                part = chunk_ids[i:i + 500]
                out += [chunk_row(r) for r in self._c().execute(
                    f"SELECT {CHUNK_COLS} FROM memory_chunks c WHERE c.workspace=? AND c.id IN "
                    f"({','.join('?' * len(part))})", (workspace, *part)).fetchall()]
        return out

    def search(self, workspace: str, expression: str, limit: int, under: str | None = None,
               words: Sequence[str] = ()) -> list[tuple[MemoryChunkRow, float]]:
        """``words``: the keywords of a conversational query (``expression`` is their ``OR``),
        searched rarest first with a bound on the rows ranked (``_keywords``); else ranked
        as ``_ranked_raw`` says."""
        if len(words) > 1:
            try:
                return self._keywords(workspace, list(words), limit, under, expression)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError):
                    raise DagctxError("InvalidQuery", f"the search query {expression!r} is not valid full-text "
                                      f"syntax ({exc})", path="query") from exc
                raise storage_error("StorageCorrupt", f"cannot search memory: {exc}", self.b.location) from exc
        return self._ranked(workspace, expression, limit, under)

    def _ranked(self, workspace: str, expression: str, limit: int,
                under: str | None = None) -> list[tuple[MemoryChunkRow, float]]:
        # bm25 is lower-is-better; keep higher-is-better like search/query
        return [(chunk_row(r[1:]), -float(s)) for r, s in self._ranked_raw(workspace, expression, limit, under)]

    def _ranked_raw(self, workspace: str, expression: str, limit: int, under: str | None) -> list[tuple[Any, float]]:
        """(rowid and chunk columns, bm25) best first. Ranked inside the full-text index first (rowid and BM25 only, FTS5's own sort), then
        the best rows' chunks read and kept when of this workspace (and below ``under``): the
        chunks' text is never carried through the sort of every match — half the time of a
        join sorted whole at 100,000 chunks (ARCHITECTURE.md). The index holds every
        workspace's chunks; while the best ``page`` hold fewer than ``limit`` of this one, a
        larger page is ranked (sized by the share found). The rows are read by rowid (``+``:
        ``_rows_of``)."""
        below = "AND c.path >= ? AND c.path < ? " if under is not None else ""
        span = under_range(under) if under is not None else ()
        q = _fts_query(expression)
        c = self._c()
        page = max(64, 2 * limit)
        try:
            while True:
                top = c.execute("SELECT rowid, bm25(memory_search, 1.0, 1.0) AS s FROM memory_search "
                                "WHERE memory_search MATCH ? ORDER BY s LIMIT ?", (q, page)).fetchall()
                score = dict(top)
                ids = list(score)
                rows: list[Any] = []
                for i in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
                    part = ids[i:i + 500]
                    rows += c.execute(
                        f"SELECT c.rowid, {CHUNK_COLS} FROM memory_chunks c WHERE c.rowid IN "
                        f"({','.join('?' * len(part))}) AND +c.workspace = ? {below}", (*part, workspace, *span)).fetchall()
                if len(rows) >= limit or len(top) < page:
                    break
                page = max(page * 8, 2 * page * limit // max(1, len(rows)))
        except sqlite3.OperationalError as exc:
            raise DagctxError(
                "InvalidQuery",
                f"the search query {expression!r} is not valid full-text syntax ({exc}); quote phrases "
                'with "…", balance parentheses, and put AND/OR/NOT between terms',
                path="query",
            ) from exc
        except sqlite3.DatabaseError as exc:
            raise storage_error("StorageCorrupt", f"cannot search memory: {exc}", self.b.location) from exc
        rows.sort(key=lambda r: (score[r[0]], r[2], r[4]))
        return [(r, score[r[0]]) for r in rows[:limit]]

    def _doc_counts(self, words: Sequence[str]) -> list[int]:
        """How many chunks (of every workspace) hold each word, from the full-text index's own
        vocabulary (an ``fts5vocab`` table of this connection's temporary schema: nothing is
        stored; a lookup walks the term's whole list of chunks, ~0.1 ms per 2,000). The word is
        folded as the index's tokenizer folds it (lower case, diacritics removed); 0 when absent.
        Kept while the database is unchanged — the connection's ``data_version`` (moved by every
        other connection's commit, the daemon's writer's too) and its own count of changes are
        the same — so the common words of a conversation's queries are counted once per write,
        not once per query."""
        c = self._c()
        version = (id(c), int(c.execute("PRAGMA data_version").fetchone()[0]), c.total_changes)
        kept = _DOC_COUNTS.get(self.b)
        if kept is None or kept[0] != version:
            kept = (version, {})
            _DOC_COUNTS[self.b] = kept
        counts = kept[1]
        out = []
        for w in words:
            folded = "".join(ch for ch in unicodedata.normalize("NFD", w.lower()) if not unicodedata.combining(ch))
            n = counts.get(folded)
            if n is None:
                try:
                    r = c.execute("SELECT doc FROM temp.memory_vocab WHERE term = ?", (folded,)).fetchone()
                except sqlite3.OperationalError:  # the connection's first: make its vocabulary table
                    c.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.memory_vocab USING fts5vocab(main, memory_search, row)")
                    r = c.execute("SELECT doc FROM temp.memory_vocab WHERE term = ?", (folded,)).fetchone()
                n = int(r[0]) if r else 0
                if len(counts) >= DOC_COUNTS_KEPT:
                    for old in list(counts)[: DOC_COUNTS_KEPT // 2]:
                        del counts[old]
                counts[folded] = n
            out.append(n)
        return out

    def _keywords(self, workspace: str, words: list[str], limit: int, under: str | None,
                  expression: str) -> list[tuple[MemoryChunkRow, float]]:
        """The ``OR`` of a conversational query's keywords without ranking every chunk that holds
        one common word (SPEC §5.1, keyword candidates; ARCHITECTURE.md has the numbers): the
        draws ``keyword_draws`` plans, each ranked by BM25 over at most ``budget`` matches of
        this workspace (in index order; all of them when fewer), stopping as soon as ``limit``
        are found."""
        budget = max(KEYWORD_BUDGET, 4 * limit)
        draws = keyword_draws(words, self._doc_counts(words), budget)
        if draws is None:
            return self._ranked(workspace, expression, limit, under)
        c = self._c()
        rank = "SELECT r, s FROM (SELECT m.rowid AS r, bm25(memory_search, 1.0, 1.0) AS s FROM memory_search m "
        rowids = self._rowids(workspace) if under is None and not workspace.startswith(":") else None
        if rowids is not None and rowids[2]:  # every row in the range is this workspace's: no join
            sql = rank + "WHERE memory_search MATCH ? AND m.rowid BETWEEN ? AND ? LIMIT ?) ORDER BY s LIMIT ?"
            args: tuple[Any, ...] = (rowids[0], rowids[1])
        else:
            sql = (rank + "CROSS JOIN memory_chunks c ON c.rowid = m.rowid WHERE memory_search MATCH ? "
                   + ("AND m.rowid BETWEEN ? AND ? " if rowids is not None else "") + "AND c.workspace = ? "
                   + ("AND c.path >= ? AND c.path < ? " if under is not None else "") + "LIMIT ?) ORDER BY s LIMIT ?")
            args = (*(rowids[:2] if rowids is not None else ()), workspace,
                    *(under_range(under) if under is not None else ()))
        found: dict[int, tuple[Any, float]] = {}

        def draw(expr: str) -> None:
            rows = c.execute(sql, (_fts_query(expr), *args, budget, limit)).fetchall()
            for r, sc in self._rows_of(workspace, [r for r in rows if r[0] not in found]):
                found[r[0]] = (r, sc)

        for expr in draws:  # by the share of the words held, so the first ``limit`` found suffice
            draw(expr)
            if len(found) >= limit:
                break
        best = by_share(list(found.values()), words, lambda f: f[0][8], lambda f: (f[1], f[0][2], f[0][4]))[:limit]
        return [(chunk_row(r[1:]), -float(s)) for r, s in best]

    def _rows_of(self, workspace: str, scored: Sequence[tuple[int, float]]) -> list[tuple[Any, float]]:
        """((rowid, chunk columns…), score) of these scored rowids that are the workspace's (all of
        them but in a race with a write: the draws and this read are separate statements). The
        ``+`` keeps the workspace a check of each row read by rowid: without it SQLite's planner
        (no statistics) walks the workspace's entries of an index instead — 100,000 of them."""
        c = self._c()
        score = dict(scored)
        ids = list(score)
        out: list[Any] = []
        for i in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
            part = ids[i:i + 500]
            out += [(r, score[r[0]]) for r in c.execute(
                f"SELECT c.rowid, {CHUNK_COLS} FROM memory_chunks c WHERE c.rowid IN ({','.join('?' * len(part))}) "
                "AND +c.workspace = ?", (*part, workspace)).fetchall()]
        return out

    def warm(self, workspace: str) -> None:
        """What a keyword search of the workspace keeps, read ahead (``MemoryIndex.warm``)."""
        if not workspace.startswith(":"):
            with self.b._faults("read the memory index"):
                self._rowids(workspace)

    def _rowids(self, workspace: str) -> tuple[int, int, bool] | None:
        """The smallest and largest rowid of the workspace's chunks, and whether it holds every
        rowid between (None: no chunks). The full-text index holds every workspace's chunks
        under their chunks' rowids; a draw ranks only this range, so FTS5 skips the other
        workspaces' matches outside it instead of joining each to its chunk to drop it, and joins
        none when the range is the workspace's alone (an index run inserts a workspace's chunks
        together). Same rows, same BM25 (its word counts are the whole index's either way);
        ~25 % of the draws' time at 100k chunks in two workspaces (ARCHITECTURE.md). Read once per
        index generation (the run row's stamp, which every write of the workspace's chunks
        moves): an index walk of the workspace's chunks, ~40 ms at 100,000."""
        c = self._c()
        run = c.execute("SELECT indexed_at FROM memory_runs WHERE workspace=?", (workspace,)).fetchone()
        stamp = None if run is None else float(run[0])
        kept = _ROWIDS.setdefault(self.b, {})
        got = kept.get(workspace)
        if got is not None and got[0] == stamp:
            return got[1]
        lo, hi, n = c.execute("SELECT min(rowid), max(rowid), count(*) FROM memory_chunks WHERE workspace=?",
                              (workspace,)).fetchone()
        span = None if lo is None else (int(lo), int(hi), int(hi) - int(lo) + 1 == int(n))
        if len(kept) >= 64:
            kept.clear()
        kept[workspace] = (stamp, span)
        return span

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
            self._insert(workspace, chunks)
        else:  # unchanged content: only the file's times move, and its chunks' with it
            c.execute("UPDATE memory_chunks SET mtime=? WHERE workspace=? AND path=?", (row.mtime, workspace, row.path))
        c.execute(
            "INSERT INTO memory_files(workspace, path, source, hash, mtime, size, lines, chunks) "
            "VALUES(?,?,?,?,?,?,?,?) ON CONFLICT(workspace, path) DO UPDATE SET source=excluded.source, "
            "hash=excluded.hash, mtime=excluded.mtime, size=excluded.size, lines=excluded.lines, "
            "chunks=excluded.chunks",
            (workspace, row.path, row.source, row.hash, row.mtime, row.size, row.lines, row.chunks))

    def _insert(self, workspace: str, chunks: Sequence[MemoryChunkRow]) -> None:
        c = self._c()
        for ch in chunks:
            cur = c.execute(
                "INSERT INTO memory_chunks(workspace, id, path, source, start_line, end_line, hash, mtime, text) "
                "VALUES(?,?,?,?,?,?,?,?,?)",
                (workspace, ch.id, ch.path, ch.source, ch.start_line, ch.end_line, ch.hash, ch.mtime, ch.text))
            c.execute("INSERT INTO memory_search(rowid, text, grams) VALUES(?,?,?)",
                      (cur.lastrowid, ch.text, fts.cjk_grams(ch.text)))

    def _drop_chunks(self, workspace: str, where: str, args: tuple[str, ...]) -> None:
        c = self._c()
        c.execute(f"DELETE FROM memory_vectors WHERE workspace=? AND chunk_id IN "
                  f"(SELECT id FROM memory_chunks WHERE workspace=? AND {where})", (workspace, workspace, *args))
        c.execute(f"DELETE FROM memory_search WHERE rowid IN "
                  f"(SELECT rowid FROM memory_chunks WHERE workspace=? AND {where})", (workspace, *args))
        c.execute(f"DELETE FROM memory_chunks WHERE workspace=? AND {where}", (workspace, *args))

    def replace_chunks(self, workspace: str, path: str, chunks: Sequence[MemoryChunkRow]) -> None:
        self._drop_chunks(workspace, "path=?", (path,))
        self._insert(workspace, chunks)

    def drop_under(self, workspace: str, prefix: str) -> None:
        self._drop_chunks(workspace, "path >= ? AND path < ?", under_range(prefix))
        self._c().execute("DELETE FROM memory_files WHERE workspace=? AND path=?", (workspace, prefix))

    def sessions_marker(self) -> tuple[int, float]:
        with self.b._faults("read the sessions"):
            r = self._c().execute("SELECT count(*), coalesce(max(updated_at), 0) FROM sessions").fetchone()
        return int(r[0]), float(r[1])

    def sessions_since(self, since: float) -> list[tuple[str, float, int]]:
        with self.b._faults("read the sessions"):
            rows = self._c().execute("SELECT id, updated_at, node_count FROM sessions WHERE updated_at >= ? "
                                     "ORDER BY updated_at, id", (since,)).fetchall()
        return [(r[0], float(r[1]), int(r[2])) for r in rows]

    def sessions_all(self) -> list[tuple[str, float, int]]:
        with self.b._faults("read the sessions"):
            rows = self._c().execute("SELECT id, updated_at, node_count FROM sessions ORDER BY id").fetchall()
        return [(r[0], float(r[1]), int(r[2])) for r in rows]

    def sessions_after(self, since: float) -> int:
        with self.b._faults("read the sessions"):
            return int(self._c().execute("SELECT count(*) FROM sessions WHERE updated_at > ?",
                                         (since,)).fetchone()[0])

    def files_named(self, workspace: str, paths: Sequence[str]) -> list[MemoryFileRow]:
        out: list[MemoryFileRow] = []
        with self.b._faults("read the memory index"):
            for i in range(0, len(paths), 500):  # under SQLite's bound-parameter limit
                part = paths[i:i + 500]
                out += [MemoryFileRow(*r) for r in self._c().execute(
                    "SELECT path, source, hash, mtime, size, lines, chunks FROM memory_files WHERE workspace=? "
                    f"AND path IN ({','.join('?' * len(part))})", (workspace, *part)).fetchall()]
        return out

    def file_count(self, workspace: str) -> int:
        return self._count(workspace, ":files")

    def put_run(self, workspace: str, indexed_at: float, skipped: bytes) -> None:
        self._c().execute(
            "INSERT INTO memory_runs(workspace, indexed_at, skipped) VALUES(?,?,?) ON CONFLICT(workspace) "
            "DO UPDATE SET indexed_at=excluded.indexed_at, skipped=excluded.skipped",
            (workspace, indexed_at, skipped))

    # ------------------------------------------------------------ vectors (schema version 4)

    def vectors(self, workspace: str, model: str, after: str = "", limit: int = -1) -> list[tuple[str, bytes]]:
        with self.b._faults("read the memory index"):
            # in the primary key's order from a cursor: no join, no sort (a vector's chunk is
            # there: both leave in the same transaction)
            rows = self._c().execute(
                "SELECT chunk_id, vec FROM memory_vectors WHERE workspace=? AND model=? AND chunk_id > ? "
                "ORDER BY chunk_id LIMIT ?", (workspace, model, after, limit)).fetchall()
        return [(r[0], bytes(r[1])) for r in rows]

    def vector_count(self, workspace: str, model: str) -> int:
        return self._count(workspace, model)

    def vector_sets(self) -> list[tuple[str, str, float]]:
        with self.b._faults("read the memory index"):
            rows = self._c().execute(
                "SELECT k.workspace, k.what, r.indexed_at FROM memory_counts k JOIN memory_runs r "
                "ON r.workspace = k.workspace WHERE k.what NOT LIKE ':%' AND k.n > 0 "
                "ORDER BY r.indexed_at DESC").fetchall()
        return [(r[0], r[1], float(r[2])) for r in rows]

    def missing_vectors(self, workspace: str, model: str, limit: int, after: str = "") -> list[tuple[str, str]]:
        # by the (workspace, id) index from the cursor: no sort of the workspace's chunks per batch
        with self.b._faults("read the memory index"):
            rows = self._c().execute(
                "SELECT c.id, c.text FROM memory_chunks c INDEXED BY memory_chunks_id WHERE c.workspace=? AND c.id > ? "
                "AND NOT EXISTS (SELECT 1 FROM memory_vectors v WHERE v.workspace=c.workspace AND v.chunk_id=c.id "
                "AND v.model=?) ORDER BY c.id LIMIT ?", (workspace, after, model, limit)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def put_vectors(self, workspace: str, model: str, dim: int, rows: Sequence[tuple[str, bytes]]) -> None:
        self._c().executemany(
            "INSERT INTO memory_vectors(workspace, chunk_id, model, dim, vec) VALUES(?,?,?,?,?) "
            "ON CONFLICT(workspace, chunk_id, model) DO UPDATE SET dim=excluded.dim, vec=excluded.vec",
            [(workspace, cid, model, dim, vec) for cid, vec in rows])
        # the run's time is the index's generation stamp (searches keep vectors while it holds)
        self._c().execute("UPDATE memory_runs SET indexed_at = max(?, indexed_at + 0.000001) WHERE workspace=?",
                          (time.time(), workspace))

    def drop_stale_vectors(self, workspace: str) -> None:
        self._c().execute(
            "DELETE FROM memory_vectors WHERE workspace=? AND chunk_id NOT IN "
            "(SELECT id FROM memory_chunks WHERE workspace=?)", (workspace, workspace))
