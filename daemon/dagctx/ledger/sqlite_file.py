"""A SQLite database file as the backend holds it: opening (private folders and a 0600
file, WAL, a read-only fallback on read-only storage, migrations), connections (the
writer's own, one per reading thread), the write transaction (``BEGIN IMMEDIATE``, with a
lock timeout that ends in ``StorageBusy``), storage faults by kind, and noticing a file
deleted or replaced underneath (device + inode) to reopen it (SPEC §2.1).
``SqliteBackend`` (``sqlite_backend.py``) keeps its rows on top of this.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

from dagctx.protocol.errors import DagctxError

from .backend import WouldWait, busy_error, storage_error
from .path_watch import PathWatch
from .schema import SCHEMA_VERSION, current_version, migrate, refuse_newer

#: the WAL index header: two copies of 48 bytes, written by every commit
WAL_INDEX_HEADER_BYTES = 96
#: the log's length (pages) at which a COMMIT checkpoints: SQLite's default
#: ``wal_autocheckpoint``, which this package leaves as it is
CHECKPOINT_PAGES = 1000
#: how far short of it a write that must not wait stays: more than such a write adds — a
#: lone append (at most 16,000 characters) writes 12 pages when short, 29 for 16,000 Latin
#: characters, ~170 for 16,000 distinct CJK ones (their search grams). One refused here pays
#: the writer thread's hand-offs, as every append did before the lone path
NOWAIT_LOG_MARGIN = 200


def _open_index(location: str) -> int:
    """A read-only descriptor of the database's WAL index (``-shm``), -1 when there is none."""
    try:
        return os.open(location + "-shm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -1


def _index_header(fd: int) -> bytes | None:
    """The WAL index header (``pread``: a file cut short gives a short read, never a
    signal); None when ``fd`` is not open or the header is not all there."""
    if fd < 0:
        return None
    try:
        header = os.pread(fd, WAL_INDEX_HEADER_BYTES, 0)
    except OSError:
        return None
    return header if len(header) == WAL_INDEX_HEADER_BYTES else None


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


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class SqliteFile:
    """One SQLite file opened for the store: connections, transactions, faults, reopening."""

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
        #: the one connection for reads that must never wait (``sessions_nowait``), taken
        #: only when free; its generation, the data version its kept rows were read at
        self._nowait_lock = threading.Lock()
        self._nowait_conn: sqlite3.Connection | None = None
        self._nowait_generation = -1
        self._nowait_version: int | None = None
        self._nowait_kept: dict[Any, Any] = {}
        #: the WAL index (``-shm``) opened for reading its header, -1 when not open; the
        #: header's bytes read just before ``_nowait_version`` (``sqlite_backend``)
        self._nowait_shm = -1
        self._nowait_header: bytes | None = None
        #: while the index is open: the kernel's word that the path still names this file
        #: (``path_watch``), so a never-waiting read's mark needs no ``stat``
        self._path_watch: PathWatch | None = None
        #: the WAL index opened for the writer's look at the log's length before a write that
        #: must not wait (``transaction(nowait=True)``), -1 when not open
        self._commit_index = -1
        #: the watch told of a change and the path named another file then: look with
        #: ``stat`` at every mark until it names this one again (or the file is reopened) —
        #: the events are consumed by the first look, and any later one must not take the
        #: watch's silence since for "nothing moved"
        self._look_at_path = False
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
        #: a query met a table or column missing from the schema this daemon migrated: the
        #: file's tables were changed under us (``storage_error_of``); reopened next request
        self._schema_changed = False
        #: the write-ahead log and shared-memory files that belong to the file we opened
        self._logs = {} if self._memory else {sfx: _ident(path + sfx) for sfx in ("-wal", "-shm")}

    def _connect(self, path: str, timeout: float | None = None) -> sqlite3.Connection:
        """A connection to ``path``; ``timeout``: how long it waits for a lock (the
        file's ``lock_timeout`` unless given; 0 for a reader that must never wait)."""
        wait = self.lock_timeout if timeout is None else timeout
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=wait)
        try:
            with self._faults("open the database"):
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(f"PRAGMA synchronous={self._sync}")
                db.execute(f"PRAGMA busy_timeout={int(wait * 1000)}")
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

    # The look for commits without a statement. Every commit to a database in WAL mode —
    # by any connection, in any process — rewrites the header of its WAL index (the
    # ``-shm`` file: a change counter, the last frame, checksums; SQLite's documented
    # "walformat"). Header bytes equal to those read just before ``PRAGMA data_version``
    # mean no commit since, so that version and the rows read at it still hold; any
    # difference, a torn read in the middle of a commit included, only sends the read to
    # ``PRAGMA data_version`` again. No commit can bypass the header while the never-waiting
    # connection is open: leaving WAL mode needs every other connection closed, and so does
    # a write in exclusive locking mode, whose index lives in private memory (both refused,
    # tests/unit/test_nowait_reads.py). A replaced
    # or deleted file is the store's look (``vanished``, SPEC §2.1). ``pread``, never a
    # mapping: a file cut short gives a short read, not a signal. Measured with
    # bench/bench_roundtrip.py: a statement costs a sequential read several times its
    # in-loop cost, its locks and pages cold after the client ran (SPEC §1.4).

    def _wal_index_header(self) -> bytes | None:
        return _index_header(self._nowait_shm)

    def _open_wal_index(self) -> None:
        self._nowait_shm = _open_index(self.location)
        if self._nowait_shm < 0:
            self._nowait_shm = -2  # not there (yet): looked for again at the next version read
            return
        self._path_watch = PathWatch.open(self.location)

    def _close_wal_index(self) -> None:
        fd, self._nowait_shm, self._nowait_header = self._nowait_shm, -1, None
        watch, self._path_watch = self._path_watch, None
        if watch is not None:
            watch.close()
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def nowait_mark(self, quiet: object = None) -> tuple[int, bytes] | None:
        """``(generation, WAL index header)``: the file this backend has open, and the header
        every commit rewrites (the look above); None when the file was replaced or changed,
        or its index is not open (yet) — the never-waiting reads then look their own way.

        ``quiet``: the watch (``nowait_watch``) a client's reader thread polled beside that
        client's input, when the poll that woke it for the read now answered found nothing
        queued on it (SPEC §1.4). The read's first byte had arrived by then, so it is no
        later than that poll: a move the kernel had not told of then is concurrent with the
        read, and the watch need not be asked again (one system call fewer a read)."""
        if self._nowait_shm < 0 or not self._nowait_lock.acquire(blocking=False):
            return None
        try:  # (the lock: the index's descriptor and the watch are closed and reopened under it)
            watch = self._path_watch
            if watch is None or self._look_at_path or (quiet is not watch and watch.changed()):
                if watch is not None and watch.stale:  # a name moved on the way: look at the path
                    watch.close()
                    self._path_watch = PathWatch.open(self.location)
                if self.vanished():
                    self._look_at_path = True
                    return None
                self._look_at_path = False
            elif self._schema_changed:
                return None
            try:  # (``_wal_index_header``, inline: this runs for every replayed read)
                header = os.pread(self._nowait_shm, WAL_INDEX_HEADER_BYTES, 0)
            except OSError:
                return None
        finally:
            self._nowait_lock.release()
        return (self.generation, header) if len(header) == WAL_INDEX_HEADER_BYTES else None

    def nowait_watch(self) -> PathWatch | None:
        """The watch of the path ``nowait_mark`` asks, for a reader thread to poll beside its
        client's input (it has ``fileno``); None while there is none."""
        return self._path_watch

    def vanished(self) -> bool:
        """Whether the path no longer names the file this backend opened (deleted, or
        replaced by another file): the store then reopens it (SPEC §2.1)."""
        if self._schema_changed:
            return True
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
        same = self._ident is not None and _ident(self.location) == self._ident  # only its tables changed
        with self._readers_lock:  # a reader left open on the old file would, closing later,
            readers, self._readers = self._readers, []  # fold or remove the log at this path
        self._close_commit_index()
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
            if not same and ident is not None and _ident(self.location + sfx) == ident:
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
            err = self._error_of(exc, what)
            if err is None:
                raise
            raise err from exc

    def fault_kind(self, exc: BaseException) -> str | None:
        """The storage-fault kind of an exception raised inside a transaction, or None."""
        return fault_kind(exc) if isinstance(exc, sqlite3.Error) else None

    def storage_error_of(self, exc: BaseException) -> DagctxError | None:
        """The documented error of a SQLite fault that reached a request unmapped, or None
        (a bug): the mapping of ``_faults``."""
        return self._error_of(exc, "read or write")

    def _error_of(self, exc: BaseException, what: str) -> DagctxError | None:
        """A SQLite fault's documented error, or None (a bug). A missing table or column
        means another program changed the file's tables while this daemon had it open
        (dropped them, or set its schema version back): the file is opened again, its
        schema brought up to date, before the next request (SPEC §2.1), instead of every
        request failing until a restart."""
        if not isinstance(exc, sqlite3.Error):
            return None
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and text.startswith(("no such table", "no such column")):
            self._schema_changed = True
            return DagctxError(
                "StorageUnavailable",
                f"the tables of the database file {self.location!r} were changed while this daemon had it open "
                f"({text}); nothing of this request was written. The daemon opens the file again (its schema "
                "brought up to date) for the next request: retry",
                details={"database": self.location, "reopen": True},
            )
        kind = fault_kind(exc)
        return None if kind is None else storage_error(kind, f"cannot {what}: {exc}", self.location)

    def nowait_likely(self) -> bool:
        """Whether a write that must not wait (``transaction(nowait=True)``) would start now,
        at a glance (one read of the WAL index header): not when its COMMIT would sync
        (``synchronous`` FULL or EXTRA) or fold the log (``_log_short``), nor on a file that
        cannot be written. Another process's lock is not looked at: ``transaction`` tries it."""
        return not self.read_only and self._wdb is not None and self._sync not in ("FULL", "EXTRA") \
            and self._log_short()

    def _log_short(self) -> bool:
        """Whether the write-ahead log is well short of the length at which a COMMIT folds it
        into the file (SQLite's automatic checkpoint, at 1000 pages by default: it writes the
        pages back and syncs the file — 8-10 ms on the development machine against 0.03 ms for
        a commit, and unbounded on a slow disk). A write that must not wait (``nowait``: run on
        the event loop) is refused near it; the writer thread then commits, and checkpoints.
        The length is the WAL index header's ``mxFrame`` (SQLite's "walformat", host byte
        order); when it cannot be read, the answer is no."""
        if self._commit_index < 0:
            self._commit_index = _open_index(self.location)
        header = _index_header(self._commit_index)
        return header is not None and int.from_bytes(header[16:20], sys.byteorder) < CHECKPOINT_PAGES - NOWAIT_LOG_MARGIN

    def _close_commit_index(self) -> None:
        fd, self._commit_index = self._commit_index, -1
        if fd >= 0:
            with suppress(OSError):
                os.close(fd)

    @contextmanager
    def transaction(self, session_id: str, guard: AbstractContextManager[Any] | None = None, *,
                    group: bool = False, nowait: bool = False) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on the writer's connection; ``guard`` is held from
        the moment the write lock is ours until the transaction ends (the wait for another
        process's lock holds nothing of ours). Any failure, COMMIT's own included, rolls back.

        ``nowait``: only when nothing makes it wait — ``WouldWait`` (nothing written) when
        another process holds the write lock (``BEGIN`` tried with no busy timeout) or its
        ``COMMIT`` would sync (``synchronous`` FULL or EXTRA, or a checkpoint: ``_log_short``).
        Its caller looked at the file just before (``StoreBase._write_many``): only the look
        before ``COMMIT`` is left."""
        if self.read_only or self._wdb is None:
            raise storage_error("StorageReadOnly", "cannot write", self.location)
        if getattr(self._tx, "conn", None) is not None:
            raise RuntimeError("write transactions do not nest")
        if nowait and self._sync in ("FULL", "EXTRA"):
            raise WouldWait("its COMMIT syncs")
        if nowait and not self._log_short():
            raise WouldWait("its COMMIT may fold the write-ahead log into the file")
        w = self._wdb
        try:
            if nowait:
                w.execute("PRAGMA busy_timeout=0")
            w.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if fault_kind(exc) == "StorageUnavailable" and "locked" in str(exc).lower():
                if nowait:
                    raise WouldWait("another process holds the write lock") from exc
                raise busy_error(self.location, self.lock_timeout) from exc
            with self._faults("start a write"):
                raise
        finally:
            if nowait:
                with suppress(sqlite3.Error):
                    w.execute(f"PRAGMA busy_timeout={int(self.lock_timeout * 1000)}")
        self._tx.conn = w
        try:
            with guard if guard is not None else nullcontext():
                try:
                    if not nowait:
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
