"""The SQLite schema and its forward migrations.

One file holds many sessions and is the backup unit: node payloads, spilled
outputs, token counts and usage all live in it. Node payloads are msgpack-encoded
``Call`` Structs; ordering fields are indexed columns beside them. Edges are
columns too but not indexed: walks run on the in-memory graph, never in SQL.
Per-node token counts (a derived cache, ``{tokenizer: [input, output]}``) and a code
node's ranked references (a msgpack array, since version 2) ride in the node's row so
an append is one row write.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.version import __version__

from .search import cjk_grams

SCHEMA_VERSION = 5

_V1 = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions(
  id TEXT PRIMARY KEY,
  title TEXT NOT NULL,
  root_id TEXT NOT NULL,
  head TEXT NOT NULL,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL,
  next_seq INTEGER NOT NULL,
  rev INTEGER NOT NULL,
  node_count INTEGER NOT NULL,
  source_key TEXT UNIQUE,
  metadata BLOB NOT NULL
);
CREATE TABLE nodes(
  rowid INTEGER PRIMARY KEY,
  session_id TEXT NOT NULL,
  id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  rev INTEGER NOT NULL,
  role TEXT NOT NULL,
  name TEXT NOT NULL,
  status TEXT NOT NULL,
  caller TEXT,
  predecessor TEXT,
  created_at REAL NOT NULL,
  body BLOB NOT NULL,
  tokens BLOB
);
CREATE UNIQUE INDEX nodes_id ON nodes(session_id, id);
CREATE UNIQUE INDEX nodes_seq ON nodes(session_id, seq);
CREATE INDEX nodes_rev ON nodes(session_id, rev);
CREATE VIRTUAL TABLE search USING fts5(
  text, grams, session_id UNINDEXED, node_id UNINDEXED, role UNINDEXED,
  tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TABLE usage(
  session_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  model TEXT,
  input INTEGER NOT NULL,
  output INTEGER NOT NULL,
  cache_read INTEGER NOT NULL,
  cache_write INTEGER NOT NULL,
  estimated INTEGER,
  reported_at REAL NOT NULL,
  PRIMARY KEY(session_id, node_id)
) WITHOUT ROWID;
CREATE TABLE blobs(
  session_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  field TEXT NOT NULL,
  chars INTEGER NOT NULL,
  lines INTEGER NOT NULL,
  data TEXT NOT NULL,
  PRIMARY KEY(session_id, node_id, field)
) WITHOUT ROWID;
"""

#: Version 2 (SPEC §8): a code node's ranked references, mined once when it is written,
#: ride in its row beside the token counts (NULL in older rows: mined and filled when first needed);
#: the search index is brought up to today's CJK rule (``DATA_MIGRATIONS``).
_V2 = """
ALTER TABLE nodes ADD COLUMN refs BLOB
"""

#: Version 3 (SPEC §5.1): a workspace's memory files, their chunks (line ranges, content hashes, the
#: file's modification time) and the chunks' full-text index (same columns as ``search``; the rowid is
#: the chunk's), and what each workspace's last index run skipped. Derived data: ``memory/index`` rebuilds it.
_V3 = """
CREATE TABLE IF NOT EXISTS memory_files(
  workspace TEXT NOT NULL,
  path TEXT NOT NULL,
  source TEXT NOT NULL,
  hash TEXT NOT NULL,
  mtime REAL NOT NULL,
  size INTEGER NOT NULL,
  lines INTEGER NOT NULL,
  chunks INTEGER NOT NULL,
  PRIMARY KEY(workspace, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS memory_chunks(
  rowid INTEGER PRIMARY KEY,
  workspace TEXT NOT NULL,
  id TEXT NOT NULL,
  path TEXT NOT NULL,
  source TEXT NOT NULL,
  start_line INTEGER NOT NULL,
  end_line INTEGER NOT NULL,
  hash TEXT NOT NULL,
  mtime REAL NOT NULL,
  text TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS memory_chunks_id ON memory_chunks(workspace, id);
CREATE INDEX IF NOT EXISTS memory_chunks_path ON memory_chunks(workspace, path);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_search USING fts5(
  text, grams, tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TABLE IF NOT EXISTS memory_runs(
  workspace TEXT PRIMARY KEY,
  indexed_at REAL NOT NULL,
  skipped BLOB NOT NULL
) WITHOUT ROWID
"""

#: Version 4 (SPEC §5.1): a vector per memory chunk and embedding model (``provider:model``): float32
#: bytes of ``dim`` values, unit length. Derived data: ``memory/index`` makes them again.
_V4 = """
CREATE TABLE IF NOT EXISTS memory_vectors(
  workspace TEXT NOT NULL,
  chunk_id TEXT NOT NULL,
  model TEXT NOT NULL,
  dim INTEGER NOT NULL,
  vec BLOB NOT NULL,
  PRIMARY KEY(workspace, chunk_id, model)
) WITHOUT ROWID
"""

#: Version 5 (SPEC §5.1): how many chunks, files and vectors (per model) each workspace's memory
#: index holds, kept by triggers in the transaction of every insert and delete (``memory/status``
#: reads them instead of counting 100,000 rows). What a model's vectors count is ``what`` = the
#: model (``provider:model``); ``:chunks`` and ``:files`` are the other two (no model starts with
#: ``:``). Filled from the rows already there.
_V5 = """
CREATE TABLE IF NOT EXISTS memory_counts(
  workspace TEXT NOT NULL,
  what TEXT NOT NULL,
  n INTEGER NOT NULL,
  PRIMARY KEY(workspace, what)
) WITHOUT ROWID;
INSERT OR IGNORE INTO memory_counts(workspace, what, n) SELECT workspace, ':chunks', count(*) FROM memory_chunks GROUP BY workspace;
INSERT OR IGNORE INTO memory_counts(workspace, what, n) SELECT workspace, ':files', count(*) FROM memory_files GROUP BY workspace;
INSERT OR IGNORE INTO memory_counts(workspace, what, n) SELECT workspace, model, count(*) FROM memory_vectors GROUP BY workspace, model;
CREATE TRIGGER IF NOT EXISTS memory_chunks_added AFTER INSERT ON memory_chunks BEGIN INSERT INTO memory_counts(workspace, what, n) VALUES(new.workspace, ':chunks', 1) ON CONFLICT(workspace, what) DO UPDATE SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS memory_chunks_removed AFTER DELETE ON memory_chunks BEGIN UPDATE memory_counts SET n = n - 1 WHERE workspace = old.workspace AND what = ':chunks'; END;
CREATE TRIGGER IF NOT EXISTS memory_files_added AFTER INSERT ON memory_files BEGIN INSERT INTO memory_counts(workspace, what, n) VALUES(new.workspace, ':files', 1) ON CONFLICT(workspace, what) DO UPDATE SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS memory_files_removed AFTER DELETE ON memory_files BEGIN UPDATE memory_counts SET n = n - 1 WHERE workspace = old.workspace AND what = ':files'; END;
CREATE TRIGGER IF NOT EXISTS memory_vectors_added AFTER INSERT ON memory_vectors BEGIN INSERT INTO memory_counts(workspace, what, n) VALUES(new.workspace, new.model, 1) ON CONFLICT(workspace, what) DO UPDATE SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS memory_vectors_removed AFTER DELETE ON memory_vectors BEGIN UPDATE memory_counts SET n = n - 1 WHERE workspace = old.workspace AND what = old.model; END
"""

#: version → script that brings version-1 to version.
MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5}

#: Indexes a writable open makes sure of, whatever the version (they change no row, so an
#: older dagctx reads the file as before): node ids by prefix (SPEC §4.3; session ids
#: have their primary key's); sessions by the time of their last write (the session index
#: of memory search catches up on the ones written since its mark, SPEC §5.1); memory
#: vectors by workspace and model.
INDEXES = (
    "CREATE INDEX IF NOT EXISTS nodes_by_id ON nodes(id)",
    "CREATE INDEX IF NOT EXISTS sessions_by_update ON sessions(updated_at)",
    # a model's vectors counted without reading them (memory/index, memory/status): the
    # table's rows hold the vectors, 2.4 s to count 100,000 of them, 0.1 s from this index
    "CREATE INDEX IF NOT EXISTS memory_vectors_by_model ON memory_vectors(workspace, model)",
)


def _regram_glued_latin(db: sqlite3.Connection) -> None:
    """Version 2 also brings the search index up to the rule that indexes a Latin run glued
    to CJK text on its own (``search.cjk_grams``, SPEC §5): rows indexed before it hold
    CJK grams only, so ``python`` missed 我用Python编程. Only a row with grams holds CJK
    text, so only those are read, a thousand at a time."""
    last = -1
    while True:
        rows = db.execute(
            "SELECT rowid, text, grams FROM search WHERE rowid > ? AND grams != '' ORDER BY rowid LIMIT 1000",
            (last,),
        ).fetchall()
        if not rows:
            return
        for rowid, text, grams in rows:
            new = cjk_grams(text)
            if new != grams:
                db.execute("UPDATE search SET grams=? WHERE rowid=?", (new, rowid))
        last = rows[-1][0]


#: version → what runs in Python after its script, in the same transaction.
DATA_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {2: _regram_glued_latin}


def refuse_newer(found: int, known: int = SCHEMA_VERSION) -> None:
    """A database a newer dagctx wrote is refused, never guessed at (SPEC §2.1)."""
    raise DagctxError(
        "InvalidParams",
        f"the database's schema version {found} is newer than this dagctx {__version__} knows "
        f"({known}): a newer dagctx wrote it. Upgrade dagctx (every daemon that shares this "
        "database), or name another database",
        path="initializationOptions.database",
    )


def current_version(db: sqlite3.Connection) -> int:
    row = db.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'"
    ).fetchone()
    if row is None:
        return 0
    got = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return int(got[0]) if got else 0


def migrate(db: sqlite3.Connection) -> int:
    """Bring the database forward to ``SCHEMA_VERSION`` in one transaction.

    Returns the version found. A database newer than this daemon is refused rather
    than guessed at.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        found = current_version(db)
        if found > SCHEMA_VERSION:
            refuse_newer(found)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version].split(";\n"):
                if statement.strip():
                    db.execute(statement)
            if version in DATA_MIGRATIONS and found > 0:  # a new database has nothing to redo
                DATA_MIGRATIONS[version](db)
            db.execute(
                "INSERT INTO meta(key, value) VALUES('schema_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(version),),
            )
        for statement in INDEXES:
            db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return found
