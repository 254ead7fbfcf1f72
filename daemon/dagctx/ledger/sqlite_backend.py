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
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
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
    busy_error,
    decode_meta,
    encode_meta,
    storage_error,
)
from .memory_rows import MemoryRows
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


#: how long a write waits for another process's write lock before ``StorageBusy`` (seconds)
DEFAULT_LOCK_TIMEOUT = 10.0


def private_folder(path: str) -> None:
    """Create the folders of ``path`` that are missing, each 0700 whatever the umask
    (SPEC §2.1: what dagctx creates is private); existing folders are left alone."""
    missing = []
    folder = os.path.abspath(path)
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)


def create_private_file(path: str) -> bool:
    """Create an empty database file 0600 whatever the umask, if none exists; SQLite gives
    its -wal and -shm files the database file's mode. Whether it was created here."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return True


def prefix_sql(table: str, upper: bool, in_session: bool) -> str:
    """The query of ``id/resolve`` (SPEC §4.3): ids in [lo, hi) — ``upper``: with hi — of
    sessions (id, title) or nodes (session_id, id, role; ``in_session``: of one session)."""
    where = "id >= ?" + (" AND id < ?" if upper else "")
    if table == "sessions":
        return f"SELECT id, title FROM sessions WHERE {where} ORDER BY id LIMIT ?"
    if in_session:
        where += " AND session_id = ?"
    return f"SELECT session_id, id, role FROM nodes WHERE {where} ORDER BY id, session_id LIMIT ?"


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class SqliteBackend:
    kind = "sqlite"

    def __init__(self, path: str, *, synchronous: str | None = None, create_parent: bool = True,
                 lock_timeout: float | None = None) -> None:
        self.location = path
        self._memory = path == ":memory:"
        self.lock_timeout = DEFAULT_LOCK_TIMEOUT if lock_timeout is None else float(lock_timeout)
        sync = (synchronous or os.environ.get("DAGCTX_SYNC") or "NORMAL").upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {sync!r}")
        self._sync = sync
        self._create_parent = create_parent
        #: the connection in use by a thread inside ``transaction`` (the writer's)
        self._tx = threading.local()
        #: per thread, a reading connection of its own for reads that need no lock of the
        #: store (``sessions_unlocked``); all of them, to close them with the backend
        self._own = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        #: how many times the file was reopened (the store drops its caches when it changes)
        self.generation = 0
        self._open()

    def _open(self) -> None:
        path = self.location
        if not self._memory:
            parent = os.path.dirname(os.path.abspath(path))
            if self._create_parent:
                private_folder(parent)
            elif not os.path.isdir(parent):
                raise FileNotFoundError(f"the folder {parent!r} does not exist")
            self._refuse_orphaned_log(path)
        self.read_only = not self._memory and self._on_read_only_storage(path)
        #: ``db`` serves reads (under the store's lock); ``_wdb`` is the writer's own
        #: connection, so a write waiting for another process's lock holds up no reader
        self._wdb: sqlite3.Connection | None = None
        if self.read_only:
            self.db = self._open_read_only(path)
        else:
            if not self._memory:
                create_private_file(path)
            self.db = self._connect(path)
            try:
                with self._faults("open the database"):
                    migrate(self.db)
                self._wdb = self.db if self._memory else self._connect(path)
            except BaseException:
                self.db.close()
                raise
        self._ident = None if self._memory else self._file_ident()
        #: the write-ahead log and shared-memory files that belong to the file we opened
        self._logs = {} if self._memory else {sfx: _ident(path + sfx) for sfx in ("-wal", "-shm")}

    def _connect(self, path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=self.lock_timeout)
        try:
            with self._faults("open the database"):
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(f"PRAGMA synchronous={self._sync}")
                db.execute(f"PRAGMA busy_timeout={int(self.lock_timeout * 1000)}")
                # Our tables declare no foreign keys; checks stay on so a deferred constraint
                # (tests install one) fails at COMMIT like a full disk does.
                db.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            db.close()
            raise
        return db

    def _c(self) -> sqlite3.Connection:
        """This thread's connection: the writer's inside a transaction, else the reader."""
        return getattr(self._tx, "conn", None) or self.db

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
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                             timeout=self.lock_timeout)
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

    def vanished(self) -> bool:
        """Whether the path no longer names the file this backend opened (deleted, or
        replaced by another file): the store then reopens it (SPEC §2.1)."""
        if self._ident is None:
            return False
        try:
            return self._file_ident() != self._ident
        except OSError:
            return True

    def reopen(self) -> None:
        """Close the file we had and open (or create) the one the path names now. Called by
        the store with no transaction open and every user of the connections locked out.
        Closing first lets SQLite fold its write-ahead log into the old file and remove
        it, so the new file never meets the old one's log."""
        with self._readers_lock:  # a reader left open on the old file would, closing later,
            readers, self._readers = self._readers, []  # fold or remove the log at this path
        old = (self._wdb, self.db, *readers)
        for conn in old:
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
        # SQLite leaves the log of an unlinked file where it was: it is ours, and the new
        # file must never meet it (it would be replayed into it), so it goes now.
        for sfx, ident in self._logs.items():
            if ident is not None and _ident(self.location + sfx) == ident:
                try:
                    os.unlink(self.location + sfx)
                except FileNotFoundError:
                    pass
        self._open()
        self.generation += 1

    def _check_file(self) -> None:
        """The path still names the file we opened; else no write may be acknowledged."""
        if self.vanished():
            raise DagctxError(
                "StorageUnavailable",
                f"the database file {self.location!r} was deleted or replaced while this daemon had "
                "it open; nothing was written to it. The daemon opens the file the path names now "
                "for the next request: retry",
                details={"database": self.location, "reopen": True},
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

    def fault_kind(self, exc: BaseException) -> str | None:
        """The storage-fault kind of an exception raised inside a transaction, or None."""
        return fault_kind(exc) if isinstance(exc, sqlite3.Error) else None

    @contextmanager
    def transaction(self, session_id: str, guard: AbstractContextManager[Any] | None = None, *,
                    group: bool = False) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on the writer's connection; ``guard`` is held from
        the moment the write lock is ours until the transaction ends (the wait for another
        process's lock holds nothing of ours). Any failure, COMMIT's own included, rolls back."""
        if self.read_only or self._wdb is None:
            raise storage_error("StorageReadOnly", "cannot write", self.location)
        if getattr(self._tx, "conn", None) is not None:
            raise RuntimeError("write transactions do not nest")
        w = self._wdb
        try:
            w.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if fault_kind(exc) == "StorageUnavailable" and "locked" in str(exc).lower():
                raise busy_error(self.location, self.lock_timeout) from exc
            with self._faults("start a write"):
                raise
        self._tx.conn = w
        try:
            with guard if guard is not None else nullcontext():
                try:
                    self._check_file()
                    with self._faults("write"):
                        yield
                    self._check_file()  # again just before COMMIT: the file may have gone meanwhile
                    with self._faults("write"):
                        w.execute("COMMIT")
                except BaseException:
                    if w.in_transaction:
                        try:
                            w.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass  # the connection rolls back itself when it cannot; never mask the cause
                    raise
        finally:
            self._tx.conn = None

    # ------------------------------------------------------------ sessions

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
            self._c().execute(
                "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
                (cur.lastrowid, r.search_text, fts.cjk_grams(r.search_text), r.session_id, r.id, r.role),
            )

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
            self._c().execute(
                "INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
                (rowid, r.search_text, fts.cjk_grams(r.search_text), r.session_id, r.id, r.role),
            )

    def bodies_between(self, session_id: str, lo: int, hi: int) -> Iterable[bytes]:
        with self._faults("read nodes"):
            rows = self._c().execute(
                "SELECT body FROM nodes WHERE session_id=? AND rev>? AND rev<=? ORDER BY seq", (session_id, lo, hi)
            ).fetchall()
        return [r[0] for r in rows]

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
            "INSERT OR REPLACE INTO blobs(session_id, node_id, field, chars, lines, data) VALUES(?,?,?,?,?,?)",
            (b.session_id, b.node_id, b.field, b.chars, b.lines, b.data),
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
        if self._wdb is not None and self._wdb is not self.db:
            self._wdb.close()
        self.db.close()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
