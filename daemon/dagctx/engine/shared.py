"""What every connection of one daemon shares: one open store per database and its caches.

A per-user daemon serves many clients (SPEC §1.4); each has its own ``EngineCore``
(options, capabilities, models, the peer it may ask to sample), but two connections
naming the same database file use one ``Store`` — one graph cache, one token-count
cache, one registry of renders — so the second client pays nothing the first already
paid. ``open_store`` is the one place a store is constructed, so a different backend
slots in here.

Architecture Invariant: no SQL and no JSON-RPC here.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from dagctx.ledger import Store, is_postgres_url

from . import compaction_pipeline


def open_store(path: str, *, create_parent: bool) -> Store:
    """The store of a database path or ``postgresql://`` URL (SPEC §2.1; the ledger picks
    the backend)."""
    return Store(path, create_parent=create_parent)


@dataclass
class ViewCaches:
    """The rebuildable caches of ``ContextService`` for one database (see views.py)."""

    renders: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    by_session: dict[str, Any] = field(default_factory=dict)
    tokens: dict[tuple[str, str], dict[str, tuple[int, int]]] = field(default_factory=dict)
    prefixes: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    updates_seen: dict[tuple[str, str], int] = field(default_factory=dict)
    #: session id → code node id → its ranked references (SPEC §8); and per session the
    #: newest seq and the number of graph updates they were read up to
    refs: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    refs_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    aging: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    texts: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)


@dataclass
class OpenDatabase:
    """One open database and what hangs off it; ``users`` counts the connections on it."""

    key: str
    store: Store
    caches: ViewCaches = field(default_factory=ViewCaches)
    compaction: compaction_pipeline.CompactionState = field(default_factory=compaction_pipeline.CompactionState)
    users: int = 0


def _key(path: str) -> str:
    return path if path == ":memory:" or is_postgres_url(path) else os.path.realpath(path)


class EngineShared:
    """The daemon-wide state: open databases by real path, reference-counted."""

    def __init__(self) -> None:
        self._open: dict[str, OpenDatabase] = {}
        self._lock = threading.Lock()

    def acquire(self, path: str, *, create_parent: bool) -> OpenDatabase:
        """The open database of ``path`` (opened on first use), counted as one more user."""
        key = _key(path)
        with self._lock:
            db = self._open.get(key)
            if db is None or key == ":memory:":
                db = OpenDatabase(key, open_store(path, create_parent=create_parent))
                if key != ":memory:":
                    self._open[key] = db
            db.users += 1
            return db

    def release(self, db: OpenDatabase) -> None:
        """One user less. The store stays open (its caches stay warm for the next client)
        until ``close_all``: a view of a closed connection may still be running on it."""
        with self._lock:
            db.users = max(0, db.users - 1)
            if db.key == ":memory:" and db.users == 0:
                db.store.close()

    def close_unused(self, db: OpenDatabase) -> bool:
        """Close ``db`` when no connection uses it (its caches go with it); the next
        ``acquire`` opens it afresh. False when someone acquired it meanwhile."""
        with self._lock:
            if db.users > 0 or self._open.get(db.key) is not db:
                return False
            del self._open[db.key]
        with db.store.lock:
            db.store.close()
        db.caches = ViewCaches()
        return True

    def databases(self) -> list[OpenDatabase]:
        with self._lock:
            return list(self._open.values())

    def close_all(self) -> None:
        """Close every store (the daemon is ending)."""
        with self._lock:
            dbs = list(self._open.values())
            self._open.clear()
        for db in dbs:
            with db.store.lock:
                db.store.close()
