"""The node and search rows of a group commit written by a few multi-row INSERTs
(``sqlite_backend._insert_rows``, SPEC §4.2): every row once, in order, whatever the
group's size, and the statements are few (the writer thread takes the interpreter lock
back once a statement)."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from dagctx.ledger.sqlite_backend import ROWS_PER_INSERT, _insert_rows


class _Counting:
    """A real SQLite connection that counts the statements run through it."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, a TEXT, b BLOB)")
        self.statements = 0

    def execute(self, sql: str, params: Any) -> Any:
        self.statements += 1
        return self.db.execute(sql, params)

    def executemany(self, sql: str, seq: Any) -> Any:
        seq = list(seq)
        self.statements += len(seq)
        return self.db.executemany(sql, seq)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 63, 64, 65, 127, 128, 129, 200, 1024])
def test_every_row_once_in_order_in_few_statements(n: int) -> None:
    c = _Counting()
    rows = [(k, f"text {k}", bytes([k % 256])) for k in range(n)]
    _insert_rows(c, "INSERT INTO t(k, a, b) VALUES", "(?,?,?)", rows)
    assert c.db.execute("SELECT k, a, b FROM t ORDER BY rowid").fetchall() == rows
    full, rest = divmod(n, ROWS_PER_INSERT)
    assert c.statements == full + bin(rest).count("1")
