"""The SQLite backend: every session in one file, WAL journal, FTS5 search.

One write transaction is ``BEGIN IMMEDIATE``: SQLite's single writer lock serialises
seq assignment and HEAD moves across every process sharing the file. WAL +
``synchronous=NORMAL`` means a committed transaction survives ``kill -9`` (FULL also
survives power loss). Before each write the file at the path must still be the file
this daemon opened (same device and inode): a database deleted or replaced underneath
a running daemon answers ``StorageUnavailable`` instead of acknowledging writes into an
unlinked file, and a new daemon refuses to start an empty database where the old one's
write-ahead log is still lying (SPEC §2.1).

The file itself — opening, connections, the write transaction, faults, reopening — is
``sqlite_file.SqliteFile``; this module keeps the rows (sessions, nodes, blobs, tokens,
references, usage, search, request summaries, the memory index's rows).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dagctx.protocol.context_messages import Usage
from dagctx.protocol.errors import DagctxError

from . import search as fts
from .backend import (
    BlobRow,
    NodeRow,
    SearchRow,
    SessionRow,
    UsageRow,
    decode_meta,
    encode_meta,
    storage_error,
)
from .memory_rows import MemoryRows
from .sqlite_file import SqliteFile, fault_kind
from .text import PIECE, utf8

#: The most answers a never-waiting reader keeps between two changes of the file (SPEC
#: §1.4); past it they are dropped and read again. The rows kept are only read (``Store``
#: copies them into its answers), never changed in place.
NOWAIT_ROWS_KEPT = 256

_SESSION_COLS = (
    "id, title, root_id, head, created_at, updated_at, next_seq, rev, node_count, source_key, metadata"
)

# A large text is bound as its UTF-8 bytes, encoded a piece at a time (``text.utf8``), and
# turned back into TEXT by SQLite (``CAST``: the bytes read as UTF-8, the database's
# encoding), outside the interpreter lock: binding a ``str`` encodes it whole holding the
# lock (0.5 s for 50 MB of non-ASCII text measured; SPEC §1.4). The stored value is the
# same TEXT and reads back as the same ``str``.
_INSERT_SEARCH = (
    "INSERT INTO search(rowid, text, grams, session_id, node_id, role) "
    "VALUES(?,CAST(? AS TEXT),CAST(? AS TEXT),?,?,?)"
)


_INSERT_NODES_HEAD = ("INSERT INTO nodes(rowid, session_id, id, seq, rev, role, name, status, caller, predecessor, "
                      "created_at, body, tokens, refs) VALUES")
_NODE_VALUES = "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_SEARCH_HEAD = "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES"
_SEARCH_VALUES = "(?,CAST(? AS TEXT),CAST(? AS TEXT),?,?,?)"

#: the most rows one multi-row INSERT carries (14 columns: 896 parameters, under SQLite's
#: oldest default limit of 999)
ROWS_PER_INSERT = 64


def _insert_rows(c: Any, head: str, values: str, rows: list[tuple[Any, ...]]) -> None:
    """``rows`` inserted by multi-row INSERTs of 64, 32, ... 1 rows: a handful of statements
    a group (and as many distinct texts, so the statement cache keeps them). Each statement
    releases and takes back the interpreter lock once, where ``executemany`` does it twice a
    row; the writer thread then waits for the event loop's thread far less often (SPEC §4.2)."""
    pos, n = 0, len(rows)
    size = ROWS_PER_INSERT
    while pos < n:
        while size > n - pos:
            size //= 2
        k = (n - pos) // size * size if size == ROWS_PER_INSERT else size
        sql = head + ",".join([values] * size)
        if k == size:
            c.execute(sql, [v for row in rows[pos:pos + size] for v in row])
        else:
            c.executemany(sql, [[v for row in rows[j:j + size] for v in row] for j in range(pos, pos + k, size)])
        pos += k


def _bound(text: str) -> str | bytes:
    """``text`` as bound into ``CAST(? AS TEXT)``: itself when short, else its UTF-8 bytes."""
    return text if len(text) <= PIECE or text.isascii() else utf8(text)


def _search_values(r: NodeRow) -> tuple[Any, ...]:
    assert r.search_text is not None
    return (_bound(r.search_text), _bound(fts.cjk_grams(r.search_text)), r.session_id, r.id, r.role)


def prefix_sql(table: str, upper: bool, in_session: bool) -> str:
    """The query of ``id/resolve`` (SPEC §4.3): ids in [lo, hi) — ``upper``: with hi — of
    sessions (id, title) or nodes (session_id, id, role; ``in_session``: of one session)."""
    where = "id >= ?" + (" AND id < ?" if upper else "")
    if table == "sessions":
        return f"SELECT id, title FROM sessions WHERE {where} ORDER BY id LIMIT ?"
    if in_session:
        where += " AND session_id = ?"
    return f"SELECT session_id, id, role FROM nodes WHERE {where} ORDER BY id, session_id LIMIT ?"


class SqliteBackend(SqliteFile):
    kind = "sqlite"

    def _row(self, row: Sequence[Any]) -> SessionRow:
        return SessionRow(*row[:10], metadata=decode_meta(row[10]))

    def session(self, session_id: str, *, lock: bool = False) -> SessionRow | None:
        with self._faults("read a session"):
            row = self._c().execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else self._row(row)

    def lock_sessions(self, session_ids: Sequence[str]) -> dict[str, SessionRow]:
        """Inside a transaction: the rows of ``session_ids`` (the write lock is the file's)."""
        out: dict[str, SessionRow] = {}
        with self._faults("read sessions"):
            for k in range(0, len(session_ids), 500):
                part = list(session_ids[k:k + 500])
                marks = ",".join("?" * len(part))
                for r in self._c().execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id IN ({marks})", part):
                    out[r[0]] = self._row(r)
        return out

    def session_by_source(self, source_key: str) -> SessionRow | None:
        with self._faults("read a session"):
            row = self._c().execute(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE source_key=?", (source_key,)
            ).fetchone()
        return None if row is None else self._row(row)

    def sessions(self, limit: int, offset: int) -> tuple[list[SessionRow], int]:
        with self._faults("list sessions"):
            rows = self._c().execute(
                f"SELECT {_SESSION_COLS} FROM sessions ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            total = self._c().execute("SELECT count(*) FROM sessions").fetchone()[0]
        return [self._row(r) for r in rows], total

    # Ids by prefix (SPEC §4.3): a range [lo, hi) on the id, which SQLite answers with a
    # search of an index (sessions: the primary key's; nodes: nodes_by_id, schema.py).

    def sessions_in_range(self, lo: str, hi: str | None, limit: int) -> list[tuple[str, str]]:
        with self._faults("look up session ids"):
            return [(r[0], r[1]) for r in self._c().execute(
                prefix_sql("sessions", hi is not None, False), (lo, *((hi,) if hi is not None else ()), limit))]

    def nodes_in_range(self, lo: str, hi: str | None, limit: int,
                       session_id: str | None = None) -> list[tuple[str, str, str]]:
        args = (lo, *((hi,) if hi is not None else ()), *((session_id,) if session_id is not None else ()), limit)
        with self._faults("look up node ids"):
            return [(r[0], r[1], r[2]) for r in self._c().execute(
                prefix_sql("nodes", hi is not None, session_id is not None), args)]

    def sessions_unlocked(self, limit: int, offset: int) -> tuple[list[SessionRow], int] | None:
        """``sessions`` on this thread's own connection, so it needs none of the store's
        locks: a long write transaction of this daemon (a 50 MB node being indexed) holds
        it up not at all (SPEC §1.4). In WAL mode it reads the last commit. None when this
        file cannot have one (in memory, read-only storage, inside a transaction)."""
        if self._memory or self.read_only or getattr(self._tx, "conn", None) is not None:
            return None
        conn = getattr(self._own, "conn", None)
        if conn is None or getattr(self._own, "generation", -1) != self.generation:
            conn = self._connect(self.location)
            with self._readers_lock:
                self._readers.append(conn)
            self._own.conn, self._own.generation = conn, self.generation
        try:
            with self._faults("list sessions"):
                rows = conn.execute(
                    f"SELECT {_SESSION_COLS} FROM sessions ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
                    (limit, offset),
                ).fetchall()
                total = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        except sqlite3.ProgrammingError:  # closed by a reopen meanwhile: the locked way waits for it
            self._own.conn = None
            return None
        return [self._row(r) for r in rows], total

    # Reads for a caller that must never wait (a connection's reader thread, the event
    # loop: SPEC §1.4): on one connection kept for them, with no busy timeout, taken only
    # when free — so a file locked by another process, a reopen in progress, another
    # quick read under way or any fault answers None at once, and the caller asks again
    # the usual way (in the pool), which waits, retries and words the error. One for the
    # whole file, not one per thread: a reader thread lives as long as its client, and a
    # connection per client would outlive it (a descriptor and a page cache each). The rows
    # read are kept until the file changes: ``PRAGMA data_version`` moves when any other
    # connection commits — this daemon's writer or another process — and this one never
    # writes, so an unchanged version means unchanged rows.

    def _nowait_rows(self, same_batch: bool) -> tuple[sqlite3.Connection, dict[Any, Any]] | None:
        """The never-waiting connection and the rows still valid, or None; called with
        ``_nowait_lock`` held. ``same_batch``: the version was read for a read that arrived
        with this one (any look since is only fresher)."""
        if self._memory or self.read_only or getattr(self._tx, "conn", None) is not None:
            return None
        conn = self._nowait_conn
        if conn is None or self._nowait_generation != self.generation:
            try:
                conn = self._connect(self.location, timeout=0.0)
            except Exception:  # noqa: BLE001 - locked or faulty: the usual way says which
                return None
            with self._readers_lock:
                self._readers.append(conn)
            self._nowait_conn, self._nowait_generation = conn, self.generation
            self._nowait_version, self._nowait_kept = None, {}
            self._close_wal_index()
        elif same_batch and self._nowait_version is not None:
            return conn, self._nowait_kept
        header = self._wal_index_header()
        if header is not None and header == self._nowait_header and self._nowait_version is not None:
            return conn, self._nowait_kept  # no commit since the version below was read
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
        except (sqlite3.Error, ValueError):  # busy, closed by a reopen, a fault: the usual way
            self._drop_nowait(conn)
            return None
        if version != self._nowait_version or len(self._nowait_kept) > NOWAIT_ROWS_KEPT:
            self._nowait_version, self._nowait_kept = version, {}
        # read before the version, so a commit between the two only makes the next look slower
        self._nowait_header = header
        if self._nowait_shm < 0:
            self._open_wal_index()
        return conn, self._nowait_kept

    def _drop_nowait(self, conn: sqlite3.Connection) -> None:
        """A fault met on the never-waiting connection: closed; the next read opens another."""
        self._nowait_conn = None
        self._close_wal_index()
        with self._readers_lock:
            if conn in self._readers:
                self._readers.remove(conn)
        try:
            conn.close()
        except sqlite3.Error:
            pass

    def _nowait_read(self, key: tuple[Any, ...], same_batch: bool,
                     read: Callable[[sqlite3.Connection], Any]) -> Any:
        """``read`` on the never-waiting connection, or the rows kept under ``key``; None
        when it would wait (taken, locked, a fault) or ``read`` found nothing."""
        if not self._nowait_lock.acquire(blocking=False):
            return None
        try:
            got = self._nowait_rows(same_batch)
            if got is None:
                return None
            conn, kept = got
            hit = kept.get(key)
            if hit is not None:
                return hit
            try:
                hit = read(conn)
            except (sqlite3.Error, ValueError):
                self._drop_nowait(conn)
                return None
            if hit is not None:
                kept[key] = hit
            return hit
        finally:
            self._nowait_lock.release()

    def sessions_nowait(self, limit: int, offset: int,
                        same_batch: bool = False) -> tuple[list[SessionRow], int] | None:
        def read(conn: sqlite3.Connection) -> tuple[list[SessionRow], int]:
            rows = conn.execute(
                f"SELECT {_SESSION_COLS} FROM sessions ORDER BY updated_at DESC, id LIMIT ? OFFSET ?", (limit, offset),
            ).fetchall()
            return [self._row(r) for r in rows], conn.execute("SELECT count(*) FROM sessions").fetchone()[0]

        return self._nowait_read(("sessions", limit, offset), same_batch, read)

    def session_nowait(self, session_id: str, same_batch: bool = False) -> SessionRow | None:
        """The session's row; None when it would need a wait, or when there is no such
        session (the usual way answers SessionNotFound)."""
        def read(conn: sqlite3.Connection) -> SessionRow | None:
            row = conn.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id=?", (session_id,)).fetchone()
            return None if row is None else self._row(row)

        return self._nowait_read(("session", session_id), same_batch, read)

    def insert_session(self, row: SessionRow) -> bool:
        try:
            self._c().execute(
                f"INSERT INTO sessions({_SESSION_COLS}) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                (row.id, row.title, row.root_id, row.head, row.created_at, row.updated_at, row.next_seq,
                 row.rev, row.node_count, row.source_key, encode_meta(row.metadata)),
            )
        except sqlite3.IntegrityError:
            return False
        return True

    def save_session(self, row: SessionRow) -> None:
        self._c().execute(
            "UPDATE sessions SET title=?, head=?, next_seq=?, rev=?, node_count=?, updated_at=?, metadata=? "
            "WHERE id=?",
            (row.title, row.head, row.next_seq, row.rev, row.node_count, row.updated_at,
             encode_meta(row.metadata), row.id),
        )

    def delete_session(self, session_id: str) -> int:
        self._c().execute(
            "DELETE FROM search WHERE rowid IN (SELECT rowid FROM nodes WHERE session_id=?)", (session_id,)
        )
        n = self._c().execute("DELETE FROM nodes WHERE session_id=?", (session_id,)).rowcount
        for table in ("usage", "blobs"):
            self._c().execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))
        self._c().execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return n

    # ------------------------------------------------------------ nodes

    def insert_node(self, r: NodeRow) -> None:
        cur = self._c().execute(
            "INSERT INTO nodes(session_id, id, seq, rev, role, name, status, caller, predecessor, created_at, body, "
            "tokens, refs) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (r.session_id, r.id, r.seq, r.rev, r.role, r.name, r.status, r.caller, r.predecessor, r.created_at,
             r.body, r.tokens, r.refs),
        )
        if r.search_text is not None:
            self._c().execute(_INSERT_SEARCH, (cur.lastrowid, *_search_values(r)))

    def insert_nodes(self, rows: Sequence[NodeRow]) -> None:
        """``insert_node`` of each row, one statement a table (a group commit, SPEC §4.2).
        Each row gets the rowid SQLite would give it, one past the largest, so its search
        row, written after all of them, carries it too."""
        c = self._c()
        top = c.execute("SELECT max(rowid) FROM nodes").fetchone()[0] or 0
        _insert_rows(c, _INSERT_NODES_HEAD, _NODE_VALUES, [
            (top + k, r.session_id, r.id, r.seq, r.rev, r.role, r.name, r.status, r.caller, r.predecessor,
             r.created_at, r.body, r.tokens, r.refs) for k, r in enumerate(rows, 1)])
        _insert_rows(c, _INSERT_SEARCH_HEAD, _SEARCH_VALUES,
                     [(top + k, *_search_values(r)) for k, r in enumerate(rows, 1) if r.search_text is not None])

    def fill_node(self, r: NodeRow) -> None:
        rowid = self._c().execute(
            "SELECT rowid FROM nodes WHERE session_id=? AND id=?", (r.session_id, r.id)
        ).fetchone()[0]
        self._c().execute(
            "UPDATE nodes SET status=?, rev=?, body=?, tokens=COALESCE(?, tokens), refs=COALESCE(?, refs) "
            "WHERE rowid=?",
            (r.status, r.rev, r.body, r.tokens, r.refs, rowid),
        )
        self._c().execute("DELETE FROM search WHERE rowid=?", (rowid,))
        if r.search_text is not None:
            self._c().execute(_INSERT_SEARCH, (rowid, *_search_values(r)))

    def bodies_between(self, session_id: str, lo: int, hi: int) -> Iterable[bytes]:
        with self._faults("read nodes"):
            rows = self._c().execute(
                "SELECT body FROM nodes WHERE session_id=? AND rev>? AND rev<=? ORDER BY seq", (session_id, lo, hi)
            ).fetchall()
        return [r[0] for r in rows]

    def body_sizes(self, session_id: str) -> list[tuple[str, int]]:
        with self._faults("read nodes"):
            rows = self._c().execute(
                "SELECT id, length(body) FROM nodes WHERE session_id=? ORDER BY seq", (session_id,)
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def bodies_of(self, session_id: str, ids: Sequence[str]) -> list[bytes]:
        out: list[bytes] = []
        with self._faults("read nodes"):
            for k in range(0, len(ids), 500):  # within SQLite's limit on bound variables
                part = list(ids[k:k + 500])
                out.extend(r[0] for r in self._c().execute(
                    f"SELECT body FROM nodes WHERE session_id=? AND id IN ({','.join('?' * len(part))})",
                    (session_id, *part)))
        return out

    def node_rows(self, session_id: str) -> list[NodeRow]:
        with self._faults("read nodes"):
            rows = self._c().execute(
                "SELECT n.session_id, n.id, n.seq, n.rev, n.role, n.name, n.status, n.caller, n.predecessor, "
                "n.created_at, n.body, n.tokens, n.refs, s.text FROM nodes n LEFT JOIN search s ON s.rowid = n.rowid "
                "WHERE n.session_id=? ORDER BY n.seq",
                (session_id,),
            ).fetchall()
        return [NodeRow(*r) for r in rows]

    def blob_rows(self, session_id: str) -> list[BlobRow]:
        with self._faults("read spilled outputs"):
            rows = self._c().execute(
                "SELECT session_id, node_id, field, chars, lines, data FROM blobs WHERE session_id=?", (session_id,)
            ).fetchall()
        return [BlobRow(*r) for r in rows]

    def put_blob(self, b: BlobRow) -> None:
        self._c().execute(
            "INSERT OR REPLACE INTO blobs(session_id, node_id, field, chars, lines, data) "
            "VALUES(?,?,?,?,?,CAST(? AS TEXT))",
            (b.session_id, b.node_id, b.field, b.chars, b.lines, _bound(b.data)),
        )

    def blob(self, session_id: str, node_id: str, field: str) -> str | None:
        with self._faults("read a spilled output"):
            got = self._c().execute(
                "SELECT data FROM blobs WHERE session_id=? AND node_id=? AND field=?", (session_id, node_id, field)
            ).fetchone()
        return None if got is None else got[0]

    def token_rows(self, session_id: str) -> Iterable[tuple[str, bytes]]:
        with self._faults("read token counts"):
            return self._c().execute(
                "SELECT id, tokens FROM nodes WHERE session_id=? AND tokens IS NOT NULL", (session_id,)
            ).fetchall()

    def fill_refs(self, session_id: str, rows: Sequence[tuple[str, bytes]]) -> None:
        self._c().executemany(
            "UPDATE nodes SET refs=? WHERE session_id=? AND id=? AND refs IS NULL",
            [(blob, session_id, nid) for nid, blob in rows],
        )

    def ref_rows(self, session_id: str, *, after_seq: int = -1,
                 ids: Sequence[str] | None = None) -> Iterable[tuple[str, bytes]]:
        sql = "SELECT id, refs FROM nodes WHERE session_id=? AND seq>? AND refs IS NOT NULL"
        with self._faults("read node references"):
            if ids is None:
                return self._c().execute(sql, (session_id, after_seq)).fetchall()
            out: list[tuple[str, bytes]] = []
            for k in range(0, len(ids), 500):
                chunk = list(ids[k:k + 500])
                marks = ",".join("?" * len(chunk))
                out += self._c().execute(f"{sql} AND id IN ({marks})", (session_id, after_seq, *chunk)).fetchall()
            return out

    # ------------------------------------------------------------ usage

    def put_usage(self, session_id: str, u: UsageRow) -> None:
        self._c().execute(
            "INSERT OR REPLACE INTO usage(session_id, node_id, model, input, output, cache_read, cache_write, "
            "estimated, reported_at) VALUES(?,?,?,?,?,?,?,?,?)",
            (session_id, u.node_id, u.model, u.usage.input, u.usage.output, u.usage.cache_read, u.usage.cache_write,
             u.estimated,
             u.reported_at),
        )

    def usage_rows(self, session_id: str) -> list[UsageRow]:
        with self._faults("read usage"):
            rows = self._c().execute(
                "SELECT node_id, model, input, output, cache_read, cache_write, estimated, reported_at "
                "FROM usage WHERE session_id=? ORDER BY reported_at",
                (session_id,),
            ).fetchall()
        return [UsageRow(r[0], r[1], Usage(input=r[2], output=r[3], cache_read=r[4], cache_write=r[5]), r[6], r[7])
                for r in rows]

    # ------------------------------------------------------------ search

    def search(
        self, query: str, *, session_id: str | None, roles: Sequence[str] | None, limit: int
    ) -> list[SearchRow]:
        sql = (
            "SELECT s.session_id, s.node_id, s.role, bm25(search, 1.0, 1.0) AS score, s.text, n.name, n.seq "
            "FROM search s JOIN nodes n ON n.rowid = s.rowid WHERE search MATCH ?"
        )
        args: list[Any] = [fts.fts_query(query)]
        if session_id is not None:
            sql += " AND s.session_id = ?"
            args.append(session_id)
        if roles:
            sql += f" AND s.role IN ({','.join('?' * len(roles))})"
            args.extend(roles)
        sql += " ORDER BY score LIMIT ?"
        args.append(limit)
        try:
            rows = self._c().execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            # A damaged file answers its storage kind (a damaged search index included),
            # never a query error or an internal one.
            if fault_kind(exc) is not None or not isinstance(exc, sqlite3.OperationalError):
                kind = fault_kind(exc) or "StorageCorrupt"
                raise storage_error(kind, f"cannot search: {exc}", self.location) from exc
            raise DagctxError(
                "InvalidQuery",
                f"the search query {query!r} is not valid full-text syntax ({exc}); quote phrases "
                'with "…", balance parentheses, and put AND/OR/NOT between terms',
                path="query",
            ) from exc
        # bm25 is lower-is-better; the protocol's score is higher-is-better.
        return [(r[0], r[1], r[2], -float(r[3]), r[4], r[5], r[6]) for r in rows]

    # ------------------------------------------------------------ derived caches

    #: created on first use, so older files need no migration
    _REDUCTION_DDL = (
        "CREATE TABLE IF NOT EXISTS reduction_summaries(key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
        "text TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
        "created_at REAL NOT NULL) WITHOUT ROWID"
    )

    def _reduction_table(self) -> bool:
        """Whether the table exists (a read-only database without it has no summaries)."""
        if getattr(self, "_reduction_ready", False):
            return True
        if self.read_only:
            with self._faults("read request summaries"):
                found = self._c().execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='reduction_summaries'"
                ).fetchone()
            self._reduction_ready = found is not None
            return self._reduction_ready
        with self._faults("create the request summary table"):
            self._c().execute(self._REDUCTION_DDL)
        self._reduction_ready = True
        return True

    def reduction_summaries(self, keys: Sequence[str]) -> dict[str, tuple[str, int, int]]:
        if not self._reduction_table():
            return {}
        out: dict[str, tuple[str, int, int]] = {}
        with self._faults("read request summaries"):
            for i in range(0, len(keys), 500):
                part = list(keys[i : i + 500])
                marks = ",".join("?" * len(part))
                for key, text, tin, tout in self._c().execute(
                    f"SELECT key, text, input_tokens, output_tokens FROM reduction_summaries WHERE key IN ({marks})",
                    part,
                ):
                    out[key] = (text, tin, tout)
        return out

    def put_reduction_summaries(self, rows: Sequence[tuple[str, str, str, int, int]], now: float) -> None:
        self._reduction_table()
        self._c().executemany(
            "INSERT OR REPLACE INTO reduction_summaries(key, kind, text, input_tokens, output_tokens, created_at) "
            "VALUES(?,?,?,?,?,?)",
            [(*r, now) for r in rows],
        )

    def memory_rows(self) -> MemoryRows:
        """The memory index's rows in this file (SPEC §5.1)."""
        from .sqlite_memory import SqliteMemory

        return SqliteMemory(self)

    def warnings(self) -> list[str]:
        """What ``daemon/status`` warns about this database: a file (or its WAL/shared-memory
        file) other users may read or write (SPEC §2.1: what dagctx creates is 0600; an older
        or copied file may not be)."""
        if self._memory:
            return []
        out = []
        for path in (self.location, self.location + "-wal", self.location + "-shm"):
            try:
                mode = os.stat(path).st_mode & 0o777
            except OSError:
                continue
            if mode & 0o077:
                out.append(f"{path} is readable or writable by other users (mode {mode:04o}): run chmod 600 {path}")
        return out

    def close(self) -> None:
        with self._nowait_lock:
            self._close_wal_index()
        self._close_commit_index()
        if self._wdb is not None and self._wdb is not self.db:
            self._wdb.close()
        self.db.close()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
