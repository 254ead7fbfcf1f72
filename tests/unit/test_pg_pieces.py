"""Large values reach PostgreSQL a piece at a time (``ledger/pg_pieces.py``, SPEC §1.4):
no statement carries a parameter over the piece size, and what is stored is the same."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import msgspec
import pytest

psycopg = pytest.importorskip("psycopg")

from dagctx.ledger import pg_pieces  # noqa: E402

from test_search_text import append_spilled  # noqa: E402


class Recorder:
    """A connection that remembers every statement's parameters (the rest passes through)."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.sent = conn, []

    def execute(self, sql: str, params: Any = None) -> Any:
        self.sent.append((sql, list(params or ())))
        return self.conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _largest_sent(rec: Recorder) -> int:
    return max((len(v) for _, ps in rec.sent for v in ps if isinstance(v, (bytes, bytearray, memoryview))), default=0)


def test_large_parameters_are_sent_in_pieces_and_stored_whole(pg_url: str) -> None:
    """Every size around the piece (0, 1, piece - 1, piece, piece + 1, several pieces and a
    rest), random bytes with NULs, two large values in one statement, an INSERT and an
    UPDATE, inside a transaction, in pipeline mode and in autocommit: the rows hold exactly
    the bytes given, no statement sent a parameter over the piece, and no piece is left."""
    piece = 64
    rnd = random.Random(7)
    sizes = [0, 1, piece - 1, piece, piece + 1, 2 * piece, 5 * piece + 3]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t(id int PRIMARY KEY, a bytea, b bytea, note text)")
        rec = Recorder(conn)
        want: dict[int, tuple[bytes, bytes]] = {}
        for i, n in enumerate(sizes):
            a = bytes(rnd.randrange(256) for _ in range(n))
            b = b"\x00" * (n // 2) + b"%s" * (n // 4)
            mode = i % 3
            sql = "INSERT INTO t(id, a, b, note) VALUES(%s, %s, %s, %s)"
            if mode == 0:
                with conn.transaction():
                    pg_pieces.execute(rec, sql, (i, a, b, "n"), piece=piece)
            elif mode == 1:
                with conn.transaction(), conn.pipeline():
                    pg_pieces.execute(rec, sql, (i, a, b, "n"), piece=piece)
            else:
                pg_pieces.execute(rec, sql, (i, a, b, "n"), piece=piece)  # autocommit: a transaction of its own
            want[i] = (a, b)
        big = bytes(rnd.randrange(256) for _ in range(7 * piece + 5))
        with conn.transaction():  # two writes of large values in one transaction do not mix
            pg_pieces.execute(rec, "UPDATE t SET a=%s WHERE id=%s", (big, 0), piece=piece)
            pg_pieces.execute(rec, "UPDATE t SET b=%s WHERE id=%s", (big[::-1], 1), piece=piece)
        want[0] = (big, want[0][1])
        want[1] = (want[1][0], big[::-1])
        got = {r[0]: (bytes(r[1]), bytes(r[2])) for r in conn.execute("SELECT id, a, b FROM t")}
        assert got == want
        assert _largest_sent(rec) <= piece
        assert any("dagctx_pieces" in sql for sql, _ in rec.sent)  # the large ones did go in pieces
        assert conn.execute("SELECT count(*) FROM pg_temp.dagctx_pieces").fetchone()[0] == 0
        with pytest.raises(ValueError):
            pg_pieces.execute(rec, "INSERT INTO t(id, a) VALUES(%s, %s)", (99, big, 1), piece=piece)
        rec.sent.clear()
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():  # a refused row: nothing kept
            pg_pieces.execute(rec, "INSERT INTO t(id, a) VALUES(%s, %s)", (0, big), piece=piece)
        assert conn.execute("SELECT count(*) FROM pg_temp.dagctx_pieces").fetchone()[0] == 0


def test_a_large_output_is_stored_in_postgresql_as_the_same_rows(pg_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spilled non-ASCII output appended through the store with 64-byte pieces is stored
    as the very rows (body, search text and vector, spilled copy) of a store that sends it
    whole, reads back as the same text and is found by search."""
    from dagctx.ledger import Store

    output = "".join(f"ligne {k} : déjà vérifié — “build” 第{k}行编译成功 😀\x00\n" for k in range(2_000))
    rows = []
    urls = [pg_server.new_database(), pg_server.new_database()]
    try:
        for url, piece in zip(urls, (64, 1 << 40)):
            monkeypatch.setattr(pg_pieces, "PIECE", piece)
            sent: list[int] = []
            real = pg_pieces.execute

            def counting(conn: Any, sql: str, params: Any, piece: int | None = None) -> None:
                rec = Recorder(conn)
                real(rec, sql, params, piece)
                sent.append(_largest_sent(rec))

            monkeypatch.setattr(pg_pieces, "execute", counting)
            store = Store(url)
            try:
                sid, node = append_spilled(store, output)
                caller = store.graph(sid).nodes[node.id].caller
                assert (max(sent) <= 64) == (piece == 64), sent
            finally:
                store.close()
            with psycopg.connect(url) as conn:
                body, text, vec, full = conn.execute(
                    "SELECT body, search_text, search_vec::text, search_full FROM dagctx.nodes WHERE id=%s",
                    (node.id,)).fetchone()
                data = conn.execute("SELECT data FROM dagctx.blobs WHERE node_id=%s", (node.id,)).fetchone()[0]
            stored = msgspec.msgpack.decode(bytes(body))  # the node as stored, but for its ids and time
            assert stored.pop("id") == node.id and stored.pop("caller") == caller and stored.pop("createdAt")
            rows.append((stored, hashlib.sha256(bytes(text)).hexdigest(), hashlib.sha256(vec.encode()).hexdigest(),
                         full, hashlib.sha256(bytes(data)).hexdigest()))
            monkeypatch.setattr(pg_pieces, "execute", real)
    finally:
        for url in urls:
            pg_server.drop_database(url)
    assert rows[0] == rows[1]
    assert rows[0][0]["output"].startswith("ligne 0")


def test_a_role_without_the_temporary_privilege_gets_storage_read_only(pg_server, pg_url: str) -> None:
    """SPEC §2.1: the pieced send needs the database's TEMPORARY privilege (everyone's by
    default). A role without it is told so as ``StorageReadOnly`` (the server's own words
    in the message), never an internal error; a value under the piece needs no privilege."""
    from dagctx.ledger.pg_connection import fault_kind

    name = pg_url.split("///", 1)[1].split("?", 1)[0]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE t(id int, a bytea)")
        admin.execute(f'REVOKE TEMPORARY ON DATABASE "{name}" FROM PUBLIC')
        admin.execute("DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'dagctx_no_temp') "
                      "THEN CREATE ROLE dagctx_no_temp LOGIN; END IF; END$$")
        admin.execute("GRANT ALL ON TABLE t TO dagctx_no_temp")
    url = pg_url.rsplit("&user=", 1)[0] + "&user=dagctx_no_temp"
    with psycopg.connect(url, autocommit=True) as conn:
        pg_pieces.execute(conn, "INSERT INTO t VALUES(%s, %s)", (1, b"x" * 64), piece=64)  # no piece needed
        with pytest.raises(psycopg.Error) as exc:
            pg_pieces.execute(conn, "INSERT INTO t VALUES(%s, %s)", (2, b"x" * 65), piece=64)
        assert fault_kind(exc.value) == "StorageReadOnly" and "temporary" in str(exc.value).lower()
        assert [r[0] for r in conn.execute("SELECT id FROM t")] == [1]
