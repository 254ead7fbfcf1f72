"""The PostgreSQL backend: one server shared by many daemons on many hosts.

psycopg 3 with its connection pool; every connection is in autocommit mode and a write
is an explicit ``BEGIN`` … ``COMMIT`` on one pooled connection. A write first reads its
session row ``FOR UPDATE``: that row lock serialises seq assignment and HEAD moves per
session across every daemon (writes to different sessions run in parallel), and the
row it returns is the latest committed one. A new session's id is claimed by its
primary key (``INSERT … ON CONFLICT DO NOTHING``). Any failure — a rule, a lost connection, a failing ``COMMIT`` —
rolls back; the connection goes back to the pool clean or is discarded.

Search: ``pg_search`` turns the shared token preparation (``search.py``) into
``tsvector`` / ``tsquery`` literals with FTS5's semantics; a GIN index serves it.

How it reaches the server — libpq settings, bounded waits, fault kinds — is
``pg_connection.py``; this module keeps the rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from dagctx.protocol.context_messages import Usage
from dagctx.protocol.errors import DagctxError

from . import pg_pieces, pg_search
from . import search as fts
from .backend import (
    BlobRow,
    NodeRow,
    SearchRow,
    SessionRow,
    UsageRow,
    WouldWait,
    decode_meta,
    encode_meta,
    storage_error,
)
from .memory_rows import MemoryRows
from .pg_connection import DEFAULT_TIMEOUT, SCHEMA_GONE, connection_settings, fault_kind, redact, timed_connection
from .pg_schema import migrate
from .text import utf8

try:  # an optional dependency: `pip install dagctx[postgres]`
    import psycopg
    import psycopg_pool
    from psycopg import pq
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

_SESSION_COLS = (
    "id, title, root_id, head, created_at, updated_at, next_seq, rev, node_count, source_key, metadata"
)


def prefix_sql(table: str, upper: bool, in_session: bool) -> str:
    """The query of ``id/resolve`` (SPEC §4.3): ids in [lo, hi) in byte order — ``upper``:
    with hi — of sessions (id, title) or nodes (session_id, id, role; ``in_session``: of one)."""
    where = 'id COLLATE "C" >= %s' + (' AND id COLLATE "C" < %s' if upper else "")
    if table == "sessions":
        return f'SELECT id, title FROM dagctx.sessions WHERE {where} ORDER BY id COLLATE "C" LIMIT %s'
    if in_session:
        where += " AND session_id = %s"
    return f'SELECT session_id, id, role FROM dagctx.nodes WHERE {where} ORDER BY id COLLATE "C", session_id LIMIT %s'


def _b(text: str | None) -> bytes | None:
    """Client text as stored (UTF-8 BYTEA: TEXT cannot hold NUL; see pg_schema), a large
    text encoded a piece at a time (``text.utf8``: the same bytes; SPEC §1.4)."""
    return None if text is None else utf8(text, "surrogatepass")


def _u(blob: bytes | None) -> str | None:
    return None if blob is None else bytes(blob).decode("utf-8", "surrogatepass")


_INSERT_NODES = ("INSERT INTO dagctx.nodes(session_id, id, seq, rev, role, name, status, caller, predecessor, "
                 "created_at, body, tokens, refs, search_text, search_vec, search_full) VALUES")
_NODE_VALUES = "(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,CAST(%s AS tsvector),%s)"
#: the most rows one INSERT of ``insert_nodes`` writes (16 parameters each; at most 65,535)
NODES_A_STATEMENT = 1000
#: ``_NODE_VALUES`` of the k-th row of a statement with ``$n`` marks, made as needed (by
#: any writer thread: grown under the lock)
_NODE_MARKS: list[str] = []
_NODE_MARKS_LOCK = threading.Lock()


def _node_marks(n: int) -> list[str]:
    """The ``$n``-marked values of the first ``n`` rows of an ``insert_nodes`` statement."""
    if len(_NODE_MARKS) < n:
        with _NODE_MARKS_LOCK:
            while len(_NODE_MARKS) < n:
                marks = [f"${16 * len(_NODE_MARKS) + j}" for j in range(1, 17)]
                marks[14] = f"CAST({marks[14]} AS tsvector)"
                _NODE_MARKS.append(f"({','.join(marks)})")
    return _NODE_MARKS[:n]

#: psycopg's cursor for ``$n``-marked statements (psycopg 3.2+; None before)
_RAW_CURSOR = getattr(psycopg, "RawCursor", None) if psycopg is not None else None

#: libpq's pipeline mode (libpq 14+; the binary wheels have it)
_PIPELINE = psycopg is not None and psycopg.Pipeline.is_supported()


class PostgresBackend:
    kind = "postgresql"

    def __init__(self, url: str, *, pool_size: int | None = None, timeout: float | None = None) -> None:
        if psycopg is None:
            raise DagctxError(
                "InvalidParams",
                "a postgresql:// database needs psycopg 3: pip install 'dagctx[postgres]' "
                "(psycopg[binary] and psycopg-pool)",
                path="initializationOptions.database",
            )
        self.location = redact(url)
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        try:
            self.url, pool_timeout, size = connection_settings(url, self.timeout)
        except (psycopg.ProgrammingError, ValueError) as exc:
            raise DagctxError(
                "InvalidParams",
                f"{self.location!r} is not a valid PostgreSQL URL ({exc}); write "
                "postgresql://USER:PASSWORD@HOST:PORT/DATABASE or postgresql:///DATABASE?host=/socket/dir",
                path="initializationOptions.database",
            ) from exc
        self._conn_class = timed_connection(self.timeout)
        url = self.url
        try:
            # One direct connection first: its error says why (server down, wrong password,
            # no such database), which a pool timeout would not.
            with self._conn_class.connect(url, autocommit=True) as conn:
                migrate(conn)
        except psycopg.Error as exc:
            raise DagctxError(
                "StorageUnavailable",
                f"cannot open the PostgreSQL database {self.location}: {str(exc).strip()}; check that the "
                "server is up and the host, port, user, password and database name in the URL",
                details={"database": self.location},
            ) from exc
        except RuntimeError as exc:
            raise DagctxError("InvalidParams", f"{self.location}: {exc}",
                              path="initializationOptions.database") from exc
        self.pool = psycopg_pool.ConnectionPool(
            url, connection_class=self._conn_class, min_size=1, max_size=pool_size or size,
            # no server-side prepared statements: a pipelined group that fails would leave
            # psycopg believing in statements the server never prepared
            kwargs={"autocommit": True, "prepare_threshold": None}, open=False, timeout=pool_timeout,
            name="dagctx",
            reconnect_timeout=max(30.0, self.timeout * 3),
        )
        try:
            self.pool.open(wait=True, timeout=self.timeout)
        except psycopg_pool.PoolTimeout as exc:
            self.pool.close()
            raise DagctxError(
                "StorageUnavailable",
                f"cannot open the PostgreSQL database {self.location}: no connection within {self.timeout:g} s",
                details={"database": self.location},
            ) from exc
        self._local = threading.local()
        self._migrate_lock = threading.Lock()

    # ------------------------------------------------------------ faults and transactions

    @contextmanager
    def _faults(self, what: str) -> Iterator[None]:
        try:
            yield
        except DagctxError:
            raise
        except Exception as exc:
            err = self._error_of(exc, what)
            if err is None:
                raise
            raise err from exc

    def _error_of(self, exc: BaseException, what: str) -> DagctxError | None:
        """A PostgreSQL fault's documented error, or None (a bug): a schema dropped under
        us is created again (``_schema_gone``)."""
        if getattr(exc, "sqlstate", None) in SCHEMA_GONE:
            return self._schema_gone(exc)
        kind = fault_kind(exc)
        return None if kind is None else storage_error(kind, f"cannot {what}: {str(exc).strip()}", self.location)

    def _schema_gone(self, exc: BaseException) -> DagctxError:
        """The ``dagctx`` schema (or a table of it) vanished under the running daemon: create
        it again now, on a connection of its own, so the next request finds an empty ledger
        instead of failing forever. The request that met it was not written."""
        try:
            with self._migrate_lock, self._conn_class.connect(self.url, autocommit=True) as conn:
                migrate(conn)
            again = "it was created again (empty): retry"
        except Exception as err:  # the next request tries again
            again = f"creating it again failed too ({str(err).strip()})"
        return DagctxError(
            "StorageUnavailable",
            f"the dagctx schema of {self.location} was dropped while this daemon ran ({str(exc).strip()}); "
            f"nothing of this request was written; {again}",
            details={"database": self.location, "reopen": True},
        )

    @contextmanager
    def _conn(self, what: str) -> Iterator[Any]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        with self._faults(what), self.pool.connection() as conn:
            yield conn

    #: a server's database is never replaced under us the way a file is
    generation = 0

    def vanished(self) -> bool:
        return False

    def nowait_likely(self) -> bool:
        """Never: every statement waits for the server (``transaction(nowait=True)``)."""
        return False

    def reopen(self) -> None:
        return None

    def fault_kind(self, exc: BaseException) -> str | None:
        """The storage-fault kind of an exception raised inside a transaction, or None."""
        return fault_kind(exc)

    def storage_error_of(self, exc: BaseException) -> DagctxError | None:
        """The documented error of a PostgreSQL fault that reached a request unmapped, or
        None (a bug): the mapping of ``_faults``."""
        return self._error_of(exc, "read or write")

    @contextmanager
    def transaction(self, session_id: str, guard: AbstractContextManager[Any] | None = None, *,
                    group: bool = False, nowait: bool = False) -> Iterator[None]:
        """``BEGIN`` … ``COMMIT``; the session is locked by the first ``session(lock=True)``;
        ``guard`` is held from ``BEGIN`` until the transaction ends; any failure, COMMIT's
        own included, rolls back.

        ``group``: a group commit, whose writes need no answer: they go in pipeline mode, so
        the group costs a few round trips instead of several per append. A row the server
        refuses then surfaces at ``COMMIT`` as a failure of the whole group (the store runs
        its units one by one to find it). ``nowait``: every statement waits for the server,
        so it never starts (``WouldWait``; the writer thread runs it)."""
        if nowait:
            raise WouldWait("a PostgreSQL write waits for the server")
        if getattr(self._local, "conn", None) is not None:
            raise RuntimeError("write transactions do not nest")
        with self._faults("write"), self.pool.connection() as conn:
            conn.execute("BEGIN")
            self._local.conn = conn
            try:
                with guard if guard is not None else nullcontext():
                    try:
                        if group and _PIPELINE:
                            with conn.pipeline():
                                yield
                                conn.execute("COMMIT")
                        else:
                            yield
                            conn.execute("COMMIT")
                    except BaseException:
                        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                            try:
                                conn.execute("ROLLBACK")
                            except psycopg.Error:
                                pass  # a broken connection: the pool discards it; never mask the cause
                        raise
            finally:
                self._local.conn = None

    # ------------------------------------------------------------ sessions

    @staticmethod
    def _row(r: Sequence[Any]) -> SessionRow:
        return SessionRow(r[0], _u(r[1]) or "", *r[2:9], _u(r[9]), metadata=decode_meta(r[10]))

    def session(self, session_id: str, *, lock: bool = False) -> SessionRow | None:
        # FOR UPDATE waits for another writer of this session and then returns the row as
        # that writer committed it: the lock and the latest revision in one round trip.
        sql = f"SELECT {_SESSION_COLS} FROM dagctx.sessions WHERE id=%s" + (" FOR UPDATE" if lock else "")
        with self._conn("read a session") as c:
            r = c.execute(sql, (session_id,)).fetchone()
        return None if r is None else self._row(r)

    def lock_sessions(self, session_ids: Sequence[str]) -> dict[str, SessionRow]:
        """Inside a transaction: the rows of ``session_ids``, locked ``FOR UPDATE`` in id order
        (every writer locks in that order, so two groups never deadlock) in one round trip."""
        with self._conn("lock sessions") as c:
            rows = c.execute(
                f"SELECT {_SESSION_COLS} FROM dagctx.sessions WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                (list(session_ids),),
            ).fetchall()
        return {r[0]: self._row(r) for r in rows}

    def session_by_source(self, source_key: str) -> SessionRow | None:
        with self._conn("read a session") as c:
            r = c.execute(
                f"SELECT {_SESSION_COLS} FROM dagctx.sessions WHERE source_key=%s", (_b(source_key),)
            ).fetchone()
        return None if r is None else self._row(r)

    def sessions(self, limit: int, offset: int) -> tuple[list[SessionRow], int]:
        with self._conn("list sessions") as c:
            rows = c.execute(
                f"SELECT {_SESSION_COLS} FROM dagctx.sessions ORDER BY updated_at DESC, id LIMIT %s OFFSET %s",
                (limit, offset),
            ).fetchall()
            total = c.execute("SELECT count(*) FROM dagctx.sessions").fetchone()[0]
        return [self._row(r) for r in rows], total

    def sessions_unlocked(self, limit: int, offset: int) -> tuple[list[SessionRow], int] | None:
        """``sessions`` on a pooled connection of its own, needing none of the store's locks
        (SPEC §1.4): a write of this daemon waiting for a session row another daemon holds
        ``FOR UPDATE``, or writing a 50 MB node, holds it up not at all. It reads the last
        commit (each statement its own snapshot, as in autocommit). None inside this
        thread's own transaction, whose connection it must use."""
        if getattr(self._local, "conn", None) is not None:
            return None
        return self.sessions(limit, offset)

    # Ids by prefix (SPEC §4.3): a range [lo, hi) on the id in byte order (COLLATE "C"),
    # answered by the indexes on (id COLLATE "C") (pg_schema.INDEXES): the database's own
    # collation may order text otherwise, and then no range would be a prefix.

    def sessions_in_range(self, lo: str, hi: str | None, limit: int) -> list[tuple[str, str]]:
        with self._conn("look up session ids") as c:
            rows = c.execute(prefix_sql("sessions", hi is not None, False),
                             (lo, *((hi,) if hi is not None else ()), limit)).fetchall()
        return [(r[0], _u(r[1]) or "") for r in rows]

    def nodes_in_range(self, lo: str, hi: str | None, limit: int,
                       session_id: str | None = None) -> list[tuple[str, str, str]]:
        args = (lo, *((hi,) if hi is not None else ()), *((session_id,) if session_id is not None else ()), limit)
        with self._conn("look up node ids") as c:
            rows = c.execute(prefix_sql("nodes", hi is not None, session_id is not None), args).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def insert_session(self, row: SessionRow) -> bool:
        with self._conn("create a session") as c:
            cur = c.execute(
                f"INSERT INTO dagctx.sessions({_SESSION_COLS}) VALUES(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT DO NOTHING",
                (row.id, _b(row.title), row.root_id, row.head, row.created_at, row.updated_at, row.next_seq,
                 row.rev, row.node_count, _b(row.source_key), encode_meta(row.metadata)),
            )
            return cur.rowcount == 1

    def save_session(self, row: SessionRow) -> None:
        with self._conn("write a session") as c:
            c.execute(
                "UPDATE dagctx.sessions SET title=%s, head=%s, next_seq=%s, rev=%s, node_count=%s, updated_at=%s, "
                "metadata=%s WHERE id=%s",
                (_b(row.title), row.head, row.next_seq, row.rev, row.node_count, row.updated_at,
                 encode_meta(row.metadata), row.id),
            )

    def delete_session(self, session_id: str) -> int:
        with self._conn("delete a session") as c:
            n = c.execute("DELETE FROM dagctx.nodes WHERE session_id=%s", (session_id,)).rowcount
            for table in ("usage", "blobs", "sessions"):
                col = "id" if table == "sessions" else "session_id"
                c.execute(f"DELETE FROM dagctx.{table} WHERE {col}=%s", (session_id,))
        return n

    # ------------------------------------------------------------ nodes

    @staticmethod
    def _vector(text: str | None) -> tuple[str | None, bool | None]:
        return (None, None) if text is None else pg_search.document_vector(text, fts.cjk_grams(text))

    def _node_values(self, r: NodeRow) -> tuple[Any, ...]:
        return (r.session_id, r.id, r.seq, r.rev, r.role, _b(r.name), r.status, r.caller, r.predecessor,
                r.created_at, r.body, r.tokens, r.refs, _b(r.search_text), *self._vector(r.search_text))

    def insert_node(self, r: NodeRow) -> None:
        with self._conn("write a node") as c:
            pg_pieces.execute(c, _INSERT_NODES + _NODE_VALUES, self._node_values(r))

    def insert_nodes(self, rows: Sequence[NodeRow]) -> None:
        """``insert_node`` of each row in one statement (a group commit, SPEC §4.2): the
        server parses, plans and answers once for many rows. Its parameters are marked
        ``$1``, ``$2``… (a raw cursor): psycopg caches the scan of a ``%s`` statement only
        when it is short, and scanned this one anew for each group (40 us a row). A row
        with a value sent in pieces (``pg_pieces``) has a statement of its own."""
        with self._conn("write nodes") as c:
            values = [self._node_values(r) for r in rows]
            large = [any(pg_pieces.is_large(x, pg_pieces.PIECE) for x in v) for v in values]
            small = [v for v, big in zip(values, large) if not big]
            # $n marks: a statement psycopg does not scan for %s (psycopg 3.1 has no raw cursor)
            cur = _RAW_CURSOR(c) if _RAW_CURSOR is not None else c
            for k in range(0, len(small), NODES_A_STATEMENT):
                part = small[k:k + NODES_A_STATEMENT]
                marks = _node_marks(len(part)) if _RAW_CURSOR is not None else [_NODE_VALUES] * len(part)
                cur.execute(_INSERT_NODES + ",".join(marks), [x for v in part for x in v])
            for v, big in zip(values, large):
                if big:
                    pg_pieces.execute(c, _INSERT_NODES + _NODE_VALUES, v)

    def fill_node(self, r: NodeRow) -> None:
        with self._conn("write a node") as c:
            pg_pieces.execute(
                c,
                "UPDATE dagctx.nodes SET status=%s, rev=%s, body=%s, tokens=COALESCE(%s, tokens), "
                "refs=COALESCE(%s, refs), search_text=%s, search_vec=CAST(%s AS tsvector), search_full=%s "
                "WHERE session_id=%s AND id=%s",
                (r.status, r.rev, r.body, r.tokens, r.refs, _b(r.search_text), *self._vector(r.search_text),
                 r.session_id, r.id),
            )

    def bodies_between(self, session_id: str, lo: int, hi: int) -> Iterable[bytes]:
        with self._conn("read nodes") as c:
            rows = c.execute(
                "SELECT body FROM dagctx.nodes WHERE session_id=%s AND rev>%s AND rev<=%s ORDER BY seq",
                (session_id, lo, hi),
            ).fetchall()
        return [r[0] for r in rows]

    def body_sizes(self, session_id: str) -> list[tuple[str, int]]:
        with self._conn("read nodes") as c:
            rows = c.execute(
                "SELECT id, octet_length(body) FROM dagctx.nodes WHERE session_id=%s ORDER BY seq", (session_id,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def bodies_of(self, session_id: str, ids: Sequence[str]) -> list[bytes]:
        with self._conn("read nodes") as c:
            rows = c.execute(
                "SELECT body FROM dagctx.nodes WHERE session_id=%s AND id = ANY(%s)", (session_id, list(ids)),
            ).fetchall()
        return [r[0] for r in rows]

    def node_rows(self, session_id: str) -> list[NodeRow]:
        with self._conn("read nodes") as c:
            rows = c.execute(
                "SELECT session_id, id, seq, rev, role, name, status, caller, predecessor, created_at, body, "
                "tokens, refs, search_text FROM dagctx.nodes WHERE session_id=%s ORDER BY seq",
                (session_id,),
            ).fetchall()
        return [NodeRow(*r[:5], _u(r[5]) or "", *r[6:10], bytes(r[10]), None if r[11] is None else bytes(r[11]),
                        None if r[12] is None else bytes(r[12]), _u(r[13])) for r in rows]

    def put_blob(self, b: BlobRow) -> None:
        with self._conn("write a spilled output") as c:
            pg_pieces.execute(
                c,
                "INSERT INTO dagctx.blobs(session_id, node_id, field, chars, lines, data) VALUES(%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT(session_id, node_id, field) DO UPDATE SET chars=excluded.chars, lines=excluded.lines, "
                "data=excluded.data",
                (b.session_id, b.node_id, b.field, b.chars, b.lines, _b(b.data)),
            )

    def blob(self, session_id: str, node_id: str, field: str) -> str | None:
        with self._conn("read a spilled output") as c:
            got = c.execute(
                "SELECT data FROM dagctx.blobs WHERE session_id=%s AND node_id=%s AND field=%s",
                (session_id, node_id, field),
            ).fetchone()
        return None if got is None else _u(got[0])

    def blob_rows(self, session_id: str) -> list[BlobRow]:
        with self._conn("read spilled outputs") as c:
            rows = c.execute(
                "SELECT session_id, node_id, field, chars, lines, data FROM dagctx.blobs WHERE session_id=%s",
                (session_id,),
            ).fetchall()
        return [BlobRow(*r[:5], _u(r[5]) or "") for r in rows]

    def token_rows(self, session_id: str) -> Iterable[tuple[str, bytes]]:
        with self._conn("read token counts") as c:
            return c.execute(
                "SELECT id, tokens FROM dagctx.nodes WHERE session_id=%s AND tokens IS NOT NULL", (session_id,)
            ).fetchall()

    def fill_refs(self, session_id: str, rows: Sequence[tuple[str, bytes]]) -> None:
        with self._conn("write node references") as c:
            c.cursor().executemany(
                "UPDATE dagctx.nodes SET refs=%s WHERE session_id=%s AND id=%s AND refs IS NULL",
                [(blob, session_id, nid) for nid, blob in rows],
            )

    def ref_rows(self, session_id: str, *, after_seq: int = -1,
                 ids: Sequence[str] | None = None) -> Iterable[tuple[str, bytes]]:
        sql = "SELECT id, refs FROM dagctx.nodes WHERE session_id=%s AND seq>%s AND refs IS NOT NULL"
        args: tuple[Any, ...] = (session_id, after_seq)
        if ids is not None:
            sql += " AND id = ANY(%s)"
            args += (list(ids),)
        with self._conn("read node references") as c:
            rows = c.execute(sql, args).fetchall()
        return [(r[0], bytes(r[1])) for r in rows]

    # ------------------------------------------------------------ usage

    def put_usage(self, session_id: str, u: UsageRow) -> None:
        with self._conn("write usage") as c:
            c.execute(
                "INSERT INTO dagctx.usage(session_id, node_id, model, input, output, cache_read, cache_write, "
                "estimated, reported_at) VALUES(%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT(session_id, node_id) DO "
                "UPDATE SET model=excluded.model, input=excluded.input, output=excluded.output, "
                "cache_read=excluded.cache_read, cache_write=excluded.cache_write, estimated=excluded.estimated, "
                "reported_at=excluded.reported_at",
                (session_id, u.node_id, _b(u.model), u.usage.input, u.usage.output, u.usage.cache_read,
                 u.usage.cache_write, u.estimated,
                 u.reported_at),
            )

    def usage_rows(self, session_id: str) -> list[UsageRow]:
        with self._conn("read usage") as c:
            rows = c.execute(
                "SELECT node_id, model, input, output, cache_read, cache_write, estimated, reported_at "
                "FROM dagctx.usage WHERE session_id=%s ORDER BY reported_at",
                (session_id,),
            ).fetchall()
        return [UsageRow(r[0], _u(r[1]), Usage(input=r[2], output=r[3], cache_read=r[4], cache_write=r[5]), r[6],
                         r[7]) for r in rows]

    # ------------------------------------------------------------ search

    def search(
        self, query: str, *, session_id: str | None, roles: Sequence[str] | None, limit: int
    ) -> list[SearchRow]:
        q = pg_search.parse(fts.fts_query(query))
        if q.exact is None or q.relaxed is None:
            return []
        # Documents with every position: the exact query. Huge ones: the position-free
        # superset, then an exact check of their whole text here (pg_search.verify).
        sql = (
            "SELECT n.session_id, n.id, n.role, ts_rank(n.search_vec, r, 1) AS score, n.search_text, n.name, n.seq, "
            "n.search_full FROM dagctx.nodes n, CAST(%s AS tsquery) q, CAST(%s AS tsquery) r "
            "WHERE ((n.search_full AND n.search_vec @@ q) OR (NOT n.search_full AND n.search_vec @@ r))"
        )
        args: list[Any] = [q.exact, q.relaxed]
        if session_id is not None:
            sql += " AND n.session_id = %s"
            args.append(session_id)
        if roles:
            sql += " AND n.role = ANY(%s)"
            args.append(list(roles))
        sql += " ORDER BY score DESC, n.session_id, n.seq LIMIT %s OFFSET %s"
        out: list[SearchRow] = []
        offset = 0
        page = max(limit, 50)
        with self._conn("search") as c:
            while len(out) < limit:
                rows = c.execute(sql, [*args, page, offset]).fetchall()
                for r in rows:
                    text = _u(r[4]) or ""
                    if not r[7] and not pg_search.verify(q, text, fts.cjk_grams(text)):
                        continue
                    out.append((r[0], r[1], r[2], float(r[3]), text, _u(r[5]) or "", r[6]))
                    if len(out) == limit:
                        break
                if len(rows) < page:
                    break
                offset += page
        return out

    # ------------------------------------------------------------ derived caches

    def reduction_summaries(self, keys: Sequence[str]) -> dict[str, tuple[str, int, int]]:
        with self._conn("read request summaries") as c:
            rows = c.execute(
                "SELECT key, text, input_tokens, output_tokens FROM dagctx.reduction_summaries WHERE key = ANY(%s)",
                (list(keys),),
            ).fetchall()
        return {r[0]: (_u(r[1]) or "", r[2], r[3]) for r in rows}

    def put_reduction_summaries(self, rows: Sequence[tuple[str, str, str, int, int]], now: float) -> None:
        with self._conn("write request summaries") as c, c.cursor() as cur:
            cur.executemany(
                "INSERT INTO dagctx.reduction_summaries(key, kind, text, input_tokens, output_tokens, created_at) "
                "VALUES(%s,%s,%s,%s,%s,%s) ON CONFLICT(key) DO UPDATE SET kind=excluded.kind, text=excluded.text, "
                "input_tokens=excluded.input_tokens, output_tokens=excluded.output_tokens, "
                "created_at=excluded.created_at",
                [(k, kind, _b(text), tin, tout, now) for k, kind, text, tin, tout in rows],
            )

    def memory_rows(self) -> MemoryRows:
        """The memory index's rows on this server (SPEC §5.1)."""
        from .pg_memory import PostgresMemory

        return PostgresMemory(self)

    def warnings(self) -> list[str]:
        """Nothing to warn about: who may read the server's data is the server's to decide."""
        return []

    def close(self) -> None:
        self.pool.close()
