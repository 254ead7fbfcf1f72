"""Read and write a dagctx database behind the daemon's back, on either backend.

Tests use it to check what is really stored and to damage data the way a broken writer
would. SQL is written once, SQLite-style (``?`` parameters, bare table names); for
PostgreSQL the parameters become ``%s`` and the tables are looked up in the ``dagctx``
schema.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

_TABLE = re.compile(r"\b(FROM|UPDATE|INTO|JOIN|TABLE)\s+(sessions|nodes|usage|blobs|meta)\b")


def is_pg(database: str | Path) -> bool:
    return str(database).startswith(("postgresql://", "postgres://"))


class RawDb:
    def __init__(self, database: str | Path) -> None:
        self.pg = is_pg(database)
        if self.pg:
            import psycopg

            self.conn: Any = psycopg.connect(str(database), autocommit=True)
        else:
            self.conn = sqlite3.connect(database, isolation_level=None)

    def sql(self, text: str) -> str:
        return _TABLE.sub(r"\1 dagctx.\2", text.replace("?", "%s")) if self.pg else text

    def execute(self, text: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(self.sql(text), args)
        try:
            return [tuple(r) for r in cur.fetchall()]
        except Exception:  # a statement without rows
            return []

    def begin(self) -> None:
        self.conn.execute("BEGIN" if self.pg else "BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RawDb:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
