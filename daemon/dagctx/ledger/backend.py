"""The storage interface under the ledger: the ``Backend`` primitives its implementations keep.

The store (``store.py``) decides what is written — by the rules in ``rules.py`` — and
a ``Backend`` only keeps rows: sessions, nodes (msgpack bodies beside indexed
columns), spilled blobs, usage rows and the search index. Two backends exist:
``sqlite_backend.SqliteBackend`` (one file, the default) and
``postgres_backend.PostgresBackend`` (a server shared by many daemons), chosen by the
database name (SPEC §2.1: ``postgresql://…`` URLs are PostgreSQL, anything else is a
file path) through ``backends.BACKENDS``, where a new backend is one registration.

Contract every backend keeps (tests/unit/test_store.py runs over both):

* ``transaction(session_id)`` is one write transaction, serialised per session against
  every other process on the same database (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL:
  the session row read ``FOR UPDATE`` by ``session(..., lock=True)``; a new session's
  id is claimed by its primary key). It commits at the end and rolls back on ANY failure,
  a failing ``COMMIT`` included, so the connection is never left inside a transaction.
* ``session(..., lock=True)`` inside a transaction returns the latest committed row.
* ``bodies_between(sid, lo, hi)`` returns node bodies with ``lo < rev <= hi`` in seq order.
* ``body_sizes(sid)`` returns ``(id, stored body bytes)`` of every node, in seq order,
  without reading a body; ``bodies_of(sid, ids)`` the bodies of those nodes (in
  no set order): what reads a session a page at a time (``Store.skeleton``,
  ``Store.full_nodes``) is built on them.
* ``transaction(session_id, guard)`` holds ``guard`` (the store's lock) only once the
  database's write lock is ours: waiting for another process never holds up readers.
* ``transaction(..., nowait=True)`` starts only when nothing would make it wait — no other
  process's lock (SQLite), no server round trip (PostgreSQL always waits for one), no sync
  at ``COMMIT`` (SQLite ``synchronous`` FULL or EXTRA, or a log long enough for the COMMIT
  to checkpoint it) — else it raises ``WouldWait``
  having written nothing: a lone append may then run on the caller's thread
  (``Store.append_alone``). ``nowait_likely()`` answers at a glance, writing nothing, whether
  such a write would start now — no promise (``transaction`` looks again), but a False lets
  the caller hand the write over before it prepares it.
* storage faults surface as ``DagctxError`` with a stable kind (``StorageFull``,
  ``StorageReadOnly``, ``StorageCorrupt``, ``StorageUnavailable``, ``StorageBusy``) and a
  message saying what to do; nothing half-written stays behind. ``fault_kind(exc)`` tells a
  fault of the database (every write of a group fails) from a failure of one row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from dagctx.protocol.context_messages import Usage
from dagctx.protocol.errors import DagctxError

from .memory_rows import MemoryRows

_meta_enc = msgspec.msgpack.Encoder()
_meta_dec = msgspec.msgpack.Decoder(dict)


def encode_meta(value: dict[str, Any]) -> bytes:
    """Session metadata and token counts are msgpack maps in every backend."""
    return _meta_enc.encode(value)


def decode_meta(blob: bytes) -> dict[str, Any]:
    return _meta_dec.decode(blob)


_refs_dec = msgspec.msgpack.Decoder(list[str])


def encode_refs(refs: Sequence[str]) -> bytes:
    """A node's kept references are a msgpack array of strings in every backend."""
    return _meta_enc.encode(list(refs))


def decode_refs(blob: bytes) -> list[str]:
    return _refs_dec.decode(blob)


@dataclass(frozen=True, slots=True)
class NodeDerived:
    """What the layers above derive from a node once, when it is written, for the ledger to
    keep in the node's row: token counts per tokenizer, the character counts of its texts
    (``chars``), and a code node's ranked references (SPEC §8). All are caches: a part
    that is missing is computed again by whoever needs it; the ledger never interprets
    them. ``chars`` rides in the token counts' map (under ``CHARS_KEY``), so storing it
    changed no table of any backend, and a row written without it simply lacks the key."""

    tokens: dict[str, tuple[int, int]] | None = None
    refs: Sequence[str] | None = None
    #: opaque bytes (``context.char_classes.stored_classes``); kept only beside ``tokens``
    chars: bytes | None = None


#: The key of the token counts' map under which ``NodeDerived.chars`` is kept: no tokenizer
#: id starts with a colon, so a reader of one tokenizer's counts never meets it.
CHARS_KEY = ":chars"


@dataclass
class SessionRow:
    id: str
    title: str
    root_id: str
    head: str
    created_at: float
    updated_at: float
    next_seq: int
    rev: int
    node_count: int
    source_key: str | None
    #: msgpack-decoded session metadata (keys starting with ``_`` are the ledger's own)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeRow:
    """What a backend stores for one node; the store encodes, the backend only keeps."""

    session_id: str
    id: str
    seq: int
    rev: int
    role: str
    name: str
    status: str
    caller: str | None
    predecessor: str | None
    created_at: float
    body: bytes
    tokens: bytes | None
    #: msgpack array of the node's kept references (``NodeDerived.refs``); None: not mined
    refs: bytes | None
    #: the searchable text (whole output even when spilled); None: not indexed (roots)
    search_text: str | None


@dataclass
class BlobRow:
    session_id: str
    node_id: str
    field: str
    chars: int
    lines: int
    data: str


@dataclass
class UsageRow:
    """Provider usage of one llm node as stored: the wire ``Usage`` and what the ledger adds
    (the resolved model, the estimate it was sent with, when it was reported)."""

    node_id: str
    model: str | None
    usage: Usage
    estimated: int | None
    reported_at: float

    @property
    def prompt(self) -> int:
        return self.usage.prompt


#: (session_id, node_id, role, score — higher is better, text, name, seq)
SearchRow = tuple[str, str, str, float, str, str, int]


class Backend(Protocol):
    """The primitives the store needs; see the module docstring for the contract."""

    #: ``"sqlite"`` or ``"postgresql"``
    kind: str
    #: what ``initialize`` reports as the database: a file path, or the URL without a password
    location: str

    #: bumped when the backend reopened its database (the store then drops its caches)
    generation: int

    def transaction(
        self, session_id: str, guard: AbstractContextManager[Any] | None = None, *, group: bool = False,
        nowait: bool = False,
    ) -> AbstractContextManager[None]: ...
    def fault_kind(self, exc: BaseException) -> str | None: ...
    def storage_error_of(self, exc: BaseException) -> DagctxError | None: ...
    def vanished(self) -> bool: ...
    def nowait_likely(self) -> bool: ...
    def reopen(self) -> None: ...
    def session(self, session_id: str, *, lock: bool = False) -> SessionRow | None: ...
    def lock_sessions(self, session_ids: Sequence[str]) -> dict[str, SessionRow]: ...
    def session_by_source(self, source_key: str) -> SessionRow | None: ...
    def sessions(self, limit: int, offset: int) -> tuple[list[SessionRow], int]: ...
    def sessions_in_range(self, lo: str, hi: str | None, limit: int) -> list[tuple[str, str]]: ...
    def nodes_in_range(self, lo: str, hi: str | None, limit: int,
                       session_id: str | None = None) -> list[tuple[str, str, str]]: ...
    def insert_session(self, row: SessionRow) -> bool: ...
    def save_session(self, row: SessionRow) -> None: ...
    def delete_session(self, session_id: str) -> int: ...
    def insert_node(self, row: NodeRow) -> None: ...
    def insert_nodes(self, rows: Sequence[NodeRow]) -> None: ...
    def fill_node(self, row: NodeRow) -> None: ...
    def bodies_between(self, session_id: str, lo: int, hi: int) -> Iterable[bytes]: ...
    def body_sizes(self, session_id: str) -> list[tuple[str, int]]: ...
    def bodies_of(self, session_id: str, ids: Sequence[str]) -> list[bytes]: ...
    def node_rows(self, session_id: str) -> list[NodeRow]: ...
    def put_blob(self, blob: BlobRow) -> None: ...
    def blob(self, session_id: str, node_id: str, field: str) -> str | None: ...
    def blob_rows(self, session_id: str) -> list[BlobRow]: ...
    def token_rows(self, session_id: str) -> Iterable[tuple[str, bytes]]: ...
    def ref_rows(self, session_id: str, *, after_seq: int = -1,
                 ids: Sequence[str] | None = None) -> Iterable[tuple[str, bytes]]: ...
    def fill_refs(self, session_id: str, rows: Sequence[tuple[str, bytes]]) -> None: ...
    def put_usage(self, session_id: str, usage: UsageRow) -> None: ...
    def usage_rows(self, session_id: str) -> list[UsageRow]: ...
    def search(
        self, query: str, *, session_id: str | None, roles: Sequence[str] | None, limit: int
    ) -> list[SearchRow]: ...
    # derived caches that belong to no session (SPEC §8 request summaries)
    def reduction_summaries(self, keys: Sequence[str]) -> dict[str, tuple[str, int, int]]: ...
    def put_reduction_summaries(self, rows: Sequence[tuple[str, str, str, int, int]], now: float) -> None: ...
    # what else a backend keeps or knows of its database
    def memory_rows(self) -> MemoryRows: ...
    def warnings(self) -> list[str]: ...
    def close(self) -> None: ...


def storage_error(kind: str, what: str, location: str) -> DagctxError:
    """A storage fault with the advice that goes with its kind (SPEC §7)."""
    advice = {
        "StorageFull": "the disk (or the server's storage) is full: free space, then retry; "
        "nothing of this request was written, reads still work",
        "StorageReadOnly": "the database is read-only (file permissions, a read-only mount, or a "
        "standby server): make it writable or point dagctx at another database; reads still work",
        "StorageCorrupt": "the database is damaged: stop every daemon using it and restore it from "
        "a backup (for a SQLite file, `sqlite3 FILE .recover` salvages what is readable)",
        "StorageUnavailable": "the database cannot be reached right now: check that it exists and "
        "the server is up, then retry; nothing of this request was written",
        "StorageBusy": "another process holds the database's write lock (a standalone dagctx run, a "
        "migration, or another program writing the file): nothing of this request was written; retry "
        "when it is done, reads still work",
    }[kind]
    return DagctxError(kind, f"{what} ({location}): {advice}", details={"database": location})


class WouldWait(Exception):
    """``transaction(nowait=True)`` refused to start: it would have had to wait (for another
    process's lock, a server's answer, or a sync at ``COMMIT``). Nothing was written."""


def busy_error(location: str, waited: float) -> DagctxError:
    """A write that waited ``waited`` seconds for another process's lock (SPEC §7)."""
    return storage_error("StorageBusy", f"cannot write: the database stayed locked by another process for "
                         f"{waited:g} s", location)
