"""The SQLite backend: every session in one file, WAL journal, FTS5 search.

One write transaction is ``BEGIN IMMEDIATE``: SQLite's single writer lock serialises
seq assignment and HEAD moves across every process sharing the file. WAL +
``synchronous=NORMAL`` means a committed transaction survives ``kill -9`` (FULL also
survives power loss). Before each write the file at the path must still be the file
this daemon opened (same device and inode): a database deleted or replaced underneath
a running daemon answers ``StorageUnavailable`` instead of acknowledging writes into an
unlinked file, and a new daemon refuses to start an empty database where the old one's
write-ahead log is still lying (SPEC §2.1).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dagctx.protocol.context_messages import Usage
from dagctx.protocol.errors import DagctxError

from . import search as fts
from .backend import BlobRow, NodeRow, SearchRow, SessionRow, UsageRow, decode_meta, encode_meta, storage_error
from .schema import SCHEMA_VERSION, current_version, migrate, refuse_newer

_SESSION_COLS = (
    "id, title, root_id, head, created_at, updated_at, next_seq, rev, node_count, source_key, metadata"
)


def fault_kind(exc: sqlite3.Error) -> str | None:
    """The stable kind of a SQLite storage fault, or None for anything else (a bug)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    if name.startswith("SQLITE_FULL") or "database or disk is full" in text:
        return "StorageFull"
    if name.startswith("SQLITE_READONLY") or "readonly database" in text:
        return "StorageReadOnly"
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text or "not a database" in text:
        return "StorageCorrupt"
    if name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return "StorageUnavailable"
    return None


class SqliteBackend:
    kind = "sqlite"

    def __init__(self, path: str, *, synchronous: str | None = None, create_parent: bool = True) -> None:
        self.location = path
        self._memory = path == ":memory:"
        if not self._memory:
            parent = os.path.dirname(os.path.abspath(path))
            if create_parent:
                os.makedirs(parent, exist_ok=True)
            elif not os.path.isdir(parent):
                raise FileNotFoundError(f"the folder {parent!r} does not exist")
            self._refuse_orphaned_log(path)
        sync = (synchronous or os.environ.get("DAGCTX_SYNC") or "NORMAL").upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {sync!r}")
        self.read_only = not self._memory and self._on_read_only_storage(path)
        if self.read_only:
            self.db = self._open_read_only(path)
        else:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
            try:
                with self._faults("open the database"):
                    self.db.execute("PRAGMA journal_mode=WAL")
                    self.db.execute(f"PRAGMA synchronous={sync}")
                    self.db.execute("PRAGMA busy_timeout=30000")
                    # Our tables declare no foreign keys; checks stay on so a deferred constraint
                    # (tests install one) fails at COMMIT like a full disk does.
                    self.db.execute("PRAGMA foreign_keys=ON")
                    migrate(self.db)
            except BaseException:
                self.db.close()
                raise
        self._ident = None if self._memory else self._file_ident()

    # ------------------------------------------------------------ the file under us

    @staticmethod
    def _on_read_only_storage(path: str) -> bool:
        """An existing database we may not write: a read-only mount, or no write permission."""
        if not os.path.exists(path):
            return False
        try:
            ro_mount = bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
        except OSError:
            ro_mount = False
        return ro_mount or not os.access(path, os.W_OK)

    def _open_read_only(self, path: str) -> sqlite3.Connection:
        """Serve reads from a database that cannot be written; every write answers
        ``StorageReadOnly``. On a read-only mount nobody can change the file, so it is
        opened ``immutable`` (WAL's shared-memory file cannot be created there)."""
        ro_mount = bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro" + ("&immutable=1" if ro_mount else "")
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30.0)
        try:
            with self._faults("open the database"):
                found = current_version(db)
        except BaseException:
            db.close()
            raise
        if found > SCHEMA_VERSION:
            db.close()
            refuse_newer(found)
        if found != SCHEMA_VERSION:
            db.close()
            raise storage_error(
                "StorageReadOnly",
                f"cannot open the database: schema version {found} needs migrating to {SCHEMA_VERSION}, "
                "which needs write access",
                path,
            )
        return db

    @staticmethod
    def _refuse_orphaned_log(path: str) -> None:
        if os.path.exists(path):
            return
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                raise DagctxError(
                    "StorageUnavailable",
                    f"the database file {path!r} is missing but its write-ahead log {path + suffix!r} "
                    "is still there: the database was deleted or moved while a daemon had it open. "
                    f"Restore the file, or delete {path}-wal and {path}-shm to start an empty database",
                    details={"database": path},
                )

    def _file_ident(self) -> tuple[int, int]:
        st = os.stat(self.location)
        return st.st_dev, st.st_ino

    def _check_file(self) -> None:
        """The path still names the file we opened; else no write may be acknowledged."""
        if self._ident is None:
            return
        try:
            same = self._file_ident() == self._ident
        except OSError:
            same = False
        if not same:
            raise DagctxError(
                "StorageUnavailable",
                f"the database file {self.location!r} was deleted or replaced while this daemon had "
                "it open; nothing was written. Restore the file (or move the new one away) and "
                "restart the daemon",
                details={"database": self.location},
            )

    # ------------------------------------------------------------ faults and transactions

    @contextmanager
    def _faults(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            kind = fault_kind(exc)
            if kind is None:
                raise
            raise storage_error(kind, f"cannot {what}: {exc}", self.location) from exc

    @contextmanager
    def transaction(self, session_id: str) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; any failure, COMMIT's own included, rolls back."""
        if self.read_only:
            raise storage_error("StorageReadOnly", "cannot write", self.location)
        with self._faults("start a write"):
            self.db.execute("BEGIN IMMEDIATE")
        try:
            self._check_file()
            with self._faults("write"):
                yield
            self._check_file()  # again just before COMMIT: the file may have gone meanwhile
            with self._faults("write"):
                self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the connection rolls back itself when it cannot; never mask the cause
            raise

    # ------------------------------------------------------------ sessions

    def _row(self, row: Sequence[Any]) -> SessionRow:
        return SessionRow(*row[:10], metadata=decode_meta(row[10]))

    def session(self, session_id: str, *, lock: bool = False) -> SessionRow | None:
        with self._faults("read a session"):
            row = self.db.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else self._row(row)

    def session_by_source(self, source_key: str) -> SessionRow | None:
        with self._faults("read a session"):
            row = self.db.execute(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE source_key=?", (source_key,)
            ).fetchone()
        return None if row is None else self._row(row)

    def sessions(self, limit: int, offset: int) -> tuple[list[SessionRow], int]:
        with self._faults("list sessions"):
            rows = self.db.execute(
                f"SELECT {_SESSION_COLS} FROM sessions ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            total = self.db.execute("SELECT count(*) FROM sessions").fetchone()[0]
        return [self._row(r) for r in rows], total

    def insert_session(self, row: SessionRow) -> bool:
        try:
            self.db.execute(
                f"INSERT INTO sessions({_SESSION_COLS}) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                (row.id, row.title, row.root_id, row.head, row.created_at, row.updated_at, row.next_seq,
                 row.rev, row.node_count, row.source_key, encode_meta(row.metadata)),
            )
        except sqlite3.IntegrityError:
            return False
        return True

    def save_session(self, row: SessionRow) -> None:
        self.db.execute(
            "UPDATE sessions SET title=?, head=?, next_seq=?, rev=?, node_count=?, updated_at=?, metadata=? "
            "WHERE id=?",
            (row.title, row.head, row.next_seq, row.rev, row.node_count, row.updated_at,
             encode_meta(row.metadata), row.id),
        )

    def delete_session(self, session_id: str) -> int:
        self.db.execute(
            "DELETE FROM search WHERE rowid IN (SELECT rowid FROM nodes WHERE session_id=?)", (session_id,)
        )
        n = self.db.execute("DELETE FROM nodes WHERE session_id=?", (session_id,)).rowcount
        for table in ("usage", "blobs"):
            self.db.execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))
        self.db.execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return n

    # ------------------------------------------------------------ nodes

    def insert_node(self, r: NodeRow) -> None:
        cur = self.db.execute(
            "INSERT INTO nodes(session_id, id, seq, rev, role, name, status, caller, predecessor, created_at, body, "
            "tokens, refs) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (r.session_id, r.id, r.seq, r.rev, r.role, r.name, r.status, r.caller, r.predecessor, r.created_at,
             r.body, r.tokens, r.refs),
        )
        if r.search_text is not None:
            self.db.execute(
                "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
                (cur.lastrowid, r.search_text, fts.cjk_grams(r.search_text), r.session_id, r.id, r.role),
            )

    def fill_node(self, r: NodeRow) -> None:
        rowid = self.db.execute(
            "SELECT rowid FROM nodes WHERE session_id=? AND id=?", (r.session_id, r.id)
        ).fetchone()[0]
        self.db.execute(
            "UPDATE nodes SET status=?, rev=?, body=?, tokens=COALESCE(?, tokens), refs=COALESCE(?, refs) "
            "WHERE rowid=?",
            (r.status, r.rev, r.body, r.tokens, r.refs, rowid),
        )
        self.db.execute("DELETE FROM search WHERE rowid=?", (rowid,))
        if r.search_text is not None:
            self.db.execute(
                "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
                (rowid, r.search_text, fts.cjk_grams(r.search_text), r.session_id, r.id, r.role),
            )

    def bodies_between(self, session_id: str, lo: int, hi: int) -> Iterable[bytes]:
        with self._faults("read nodes"):
            rows = self.db.execute(
                "SELECT body FROM nodes WHERE session_id=? AND rev>? AND rev<=? ORDER BY seq", (session_id, lo, hi)
            ).fetchall()
        return [r[0] for r in rows]

    def node_rows(self, session_id: str) -> list[NodeRow]:
        with self._faults("read nodes"):
            rows = self.db.execute(
                "SELECT n.session_id, n.id, n.seq, n.rev, n.role, n.name, n.status, n.caller, n.predecessor, "
                "n.created_at, n.body, n.tokens, n.refs, s.text FROM nodes n LEFT JOIN search s ON s.rowid = n.rowid "
                "WHERE n.session_id=? ORDER BY n.seq",
                (session_id,),
            ).fetchall()
        return [NodeRow(*r) for r in rows]

    def blob_rows(self, session_id: str) -> list[BlobRow]:
        with self._faults("read spilled outputs"):
            rows = self.db.execute(
                "SELECT session_id, node_id, field, chars, lines, data FROM blobs WHERE session_id=?", (session_id,)
            ).fetchall()
        return [BlobRow(*r) for r in rows]

    def put_blob(self, b: BlobRow) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO blobs(session_id, node_id, field, chars, lines, data) VALUES(?,?,?,?,?,?)",
            (b.session_id, b.node_id, b.field, b.chars, b.lines, b.data),
        )

    def blob(self, session_id: str, node_id: str, field: str) -> str | None:
        with self._faults("read a spilled output"):
            got = self.db.execute(
                "SELECT data FROM blobs WHERE session_id=? AND node_id=? AND field=?", (session_id, node_id, field)
            ).fetchone()
        return None if got is None else got[0]

    def token_rows(self, session_id: str) -> Iterable[tuple[str, bytes]]:
        with self._faults("read token counts"):
            return self.db.execute(
                "SELECT id, tokens FROM nodes WHERE session_id=? AND tokens IS NOT NULL", (session_id,)
            ).fetchall()

    def fill_refs(self, session_id: str, rows: Sequence[tuple[str, bytes]]) -> None:
        self.db.executemany(
            "UPDATE nodes SET refs=? WHERE session_id=? AND id=? AND refs IS NULL",
            [(blob, session_id, nid) for nid, blob in rows],
        )

    def ref_rows(self, session_id: str, *, after_seq: int = -1,
                 ids: Sequence[str] | None = None) -> Iterable[tuple[str, bytes]]:
        sql = "SELECT id, refs FROM nodes WHERE session_id=? AND seq>? AND refs IS NOT NULL"
        with self._faults("read node references"):
            if ids is None:
                return self.db.execute(sql, (session_id, after_seq)).fetchall()
            out: list[tuple[str, bytes]] = []
            for k in range(0, len(ids), 500):
                chunk = list(ids[k:k + 500])
                marks = ",".join("?" * len(chunk))
                out += self.db.execute(f"{sql} AND id IN ({marks})", (session_id, after_seq, *chunk)).fetchall()
            return out

    # ------------------------------------------------------------ usage

    def put_usage(self, session_id: str, u: UsageRow) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO usage(session_id, node_id, model, input, output, cache_read, cache_write, "
            "estimated, reported_at) VALUES(?,?,?,?,?,?,?,?,?)",
            (session_id, u.node_id, u.model, u.usage.input, u.usage.output, u.usage.cache_read, u.usage.cache_write,
             u.estimated,
             u.reported_at),
        )

    def usage_rows(self, session_id: str) -> list[UsageRow]:
        with self._faults("read usage"):
            rows = self.db.execute(
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
            rows = self.db.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if fault_kind(exc) is not None:
                with self._faults("search"):
                    raise
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
                found = self.db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='reduction_summaries'"
                ).fetchone()
            self._reduction_ready = found is not None
            return self._reduction_ready
        with self._faults("create the request summary table"):
            self.db.execute(self._REDUCTION_DDL)
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
                for key, text, tin, tout in self.db.execute(
                    f"SELECT key, text, input_tokens, output_tokens FROM reduction_summaries WHERE key IN ({marks})",
                    part,
                ):
                    out[key] = (text, tin, tout)
        return out

    def put_reduction_summaries(self, rows: Sequence[tuple[str, str, str, int, int]], now: float) -> None:
        self._reduction_table()
        self.db.executemany(
            "INSERT OR REPLACE INTO reduction_summaries(key, kind, text, input_tokens, output_tokens, created_at) "
            "VALUES(?,?,?,?,?,?)",
            [(*r, now) for r in rows],
        )

    def close(self) -> None:
        self.db.close()
