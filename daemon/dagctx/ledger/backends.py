"""The registry of storage backends (SPEC §2.1): which database names each takes and how
it opens one. Its modules are imported only when a database of theirs opens, so a
daemon on SQLite never loads psycopg. A new backend is its module plus one entry in
``BACKENDS``; a test keeps the names equal to the wire ``StorageKind``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .backend import Backend


@dataclass(frozen=True)
class BackendKind:
    """One storage backend as the registry knows it: which database names it takes
    (SPEC §2.1) and how it opens one; its module is imported only when it opens."""

    #: ``capabilities.storage`` of ``initialize`` (the wire ``StorageKind``), and the backend's ``kind``
    name: str
    #: whether a database name means this backend
    accepts: Callable[[str], bool]
    #: ``open(name, synchronous, create_parent, timeout)``; ``timeout``: how long a request
    #: may wait for its database (another process's lock; a server slow or silent)
    open: Callable[[str, str | None, bool, float | None], Backend]
    #: whether a name it accepts is a file path (the client's: ``~`` and relative paths resolve there)
    is_file: Callable[[str], bool] = lambda name: False


def _postgres_url(name: str) -> bool:
    low = name.strip().lower()
    return low.startswith("postgresql://") or low.startswith("postgres://")


def _open_postgres(name: str, synchronous: str | None, create_parent: bool, timeout: float | None) -> Backend:
    from .postgres_backend import PostgresBackend

    return PostgresBackend(name, timeout=timeout)


def _open_sqlite(name: str, synchronous: str | None, create_parent: bool, timeout: float | None) -> Backend:
    from .sqlite_backend import SqliteBackend

    return SqliteBackend(name, synchronous=synchronous, create_parent=create_parent, lock_timeout=timeout)


#: every storage backend, asked in order; the last takes any name (SPEC §2.1: a
#: ``postgresql://`` or ``postgres://`` URL names a server, anything else a SQLite file)
BACKENDS: tuple[BackendKind, ...] = (
    BackendKind("postgresql", _postgres_url, _open_postgres),
    BackendKind("sqlite", lambda name: True, _open_sqlite, is_file=lambda name: name != ":memory:"),
)


def backend_for(name: str) -> BackendKind:
    """The backend a database name means."""
    return next(kind for kind in BACKENDS if kind.accepts(name))


def names_a_file(name: str) -> bool:
    """Whether a database name is a file path (made absolute, compared by real path)."""
    return backend_for(name).is_file(name)


def open_backend(
    name: str, *, synchronous: str | None = None, create_parent: bool = True, timeout: float | None = None
) -> Backend:
    """The backend a database name means (SPEC §2.1). ``timeout``: how long a request may wait
    for its database (another process's lock; a PostgreSQL server slow or silent)."""
    return backend_for(name).open(name, synchronous, create_parent, timeout)
