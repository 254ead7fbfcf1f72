"""Large values sent to PostgreSQL a piece at a time (SPEC §1.4).

libpq sends a statement with its parameters as one message, and psycopg calls it holding
the interpreter lock; while the server keeps reading, the whole message goes out in that
one call. For a 50 MB output (its spilled copy and its search text: two such values, the
node's body keeps a head and a tail) that was 0.4–0.75 s of the lock per statement on a
two-core machine, in which no
other connection of the daemon got an answer — while a second process inserting the
same rows stalled nobody (``bench/bench_isolation.py --pg``).

So every bytes parameter over ``PIECE`` is first written to a temporary table of the
connection, one small statement per piece, and the statement itself takes the value from
there: ``string_agg`` of the pieces in order, on the server. The stored bytes are the
same. The pieces live only inside the write's transaction (``ON COMMIT DELETE ROWS``, and
deleted after use so two large values of one transaction never mix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the largest parameter sent in one message; larger ones go in pieces of this size
PIECE = 1 << 20

_CREATE = ("CREATE TEMP TABLE IF NOT EXISTS dagctx_pieces("
           "field int NOT NULL, k int NOT NULL, piece bytea NOT NULL) ON COMMIT DELETE ROWS")
_PUT = "INSERT INTO pg_temp.dagctx_pieces(field, k, piece) VALUES(%s, %s, %b)"
_GATHER = "(SELECT string_agg(piece, ''::bytea ORDER BY k) FROM pg_temp.dagctx_pieces WHERE field = {})"


def is_large(value: Any, piece: int) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview)) and len(value) > piece


def execute(conn: Any, sql: str, params: Sequence[Any], piece: int | None = None) -> None:
    """``conn.execute(sql, params)`` inside the caller's transaction (or one of its own),
    every bytes parameter over ``piece`` (default ``PIECE``) bytes sent ahead in pieces (see
    the module). ``sql`` marks each parameter with ``%s`` and has no other ``%s``."""
    piece = PIECE if piece is None else piece
    large = [k for k, v in enumerate(params) if is_large(v, piece)]
    if not large:
        conn.execute(sql, params)
        return
    parts = sql.split("%s")
    if len(parts) != len(params) + 1:
        raise ValueError(f"{len(parts) - 1} placeholders for {len(params)} parameters")
    from psycopg import pq  # an optional dependency: only a PostgreSQL backend gets here

    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
        with conn.transaction():  # autocommit would drop the pieces after each statement
            _execute(conn, parts, params, large, piece)
    else:
        _execute(conn, parts, params, large, piece)


def _execute(conn: Any, parts: list[str], params: Sequence[Any], large: list[int], piece: int) -> None:
    conn.execute(_CREATE)
    text, kept = [parts[0]], []
    for k, value in enumerate(params):
        if k in large:
            view = memoryview(value).cast("B")
            for n, at in enumerate(range(0, len(view), piece)):
                conn.execute(_PUT, (k, n, bytes(view[at: at + piece])))
            text.append(_GATHER.format(k))
        else:
            text.append("%s")
            kept.append(value)
        text.append(parts[k + 1])
    conn.execute("".join(text), kept)
    conn.execute("DELETE FROM pg_temp.dagctx_pieces")
