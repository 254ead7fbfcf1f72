"""The PostgreSQL schema and its forward migrations (the twin of ``schema.py``).

Everything lives in the ``dagctx`` schema of the database the URL names, so dagctx can
share a database with other applications. The tables mirror SQLite's; the search index
is a ``tsvector`` column on ``nodes`` (GIN-indexed) with the searchable text beside it
for snippets. Free text that a client chooses (titles, names, outputs, model names) is
stored as UTF-8 ``BYTEA``: PostgreSQL's ``TEXT`` cannot hold a NUL character, which JSON
strings and SQLite may, and a value must come back exactly as it was given. Migrations run under a transaction-scoped advisory lock, so many daemons
starting at once migrate exactly once.
"""

from __future__ import annotations

from typing import Any

from .schema import refuse_newer

SCHEMA_VERSION = 5

#: advisory lock key that serialises migrations ("dagctx" as an int)
MIGRATION_LOCK = 0x646167637478

_V1 = """
CREATE TABLE dagctx.sessions(
  id TEXT PRIMARY KEY,
  title BYTEA NOT NULL,
  root_id TEXT NOT NULL,
  head TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL,
  next_seq BIGINT NOT NULL,
  rev BIGINT NOT NULL,
  node_count BIGINT NOT NULL,
  source_key BYTEA UNIQUE,
  metadata BYTEA NOT NULL
);
CREATE TABLE dagctx.nodes(
  session_id TEXT NOT NULL,
  id TEXT NOT NULL,
  seq BIGINT NOT NULL,
  rev BIGINT NOT NULL,
  role TEXT NOT NULL,
  name BYTEA NOT NULL,
  status TEXT NOT NULL,
  caller TEXT,
  predecessor TEXT,
  created_at DOUBLE PRECISION NOT NULL,
  body BYTEA NOT NULL,
  tokens BYTEA,
  search_text BYTEA,
  search_vec TSVECTOR,
  -- false: too big for the vector to keep every position; matches are checked in Python
  search_full BOOLEAN,
  PRIMARY KEY(session_id, id),
  UNIQUE(session_id, seq)
);
CREATE INDEX nodes_rev ON dagctx.nodes(session_id, rev);
CREATE INDEX nodes_search ON dagctx.nodes USING gin(search_vec);
CREATE TABLE dagctx.usage(
  session_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  model BYTEA,
  input BIGINT NOT NULL,
  output BIGINT NOT NULL,
  cache_read BIGINT NOT NULL,
  cache_write BIGINT NOT NULL,
  estimated BIGINT,
  reported_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY(session_id, node_id)
);
CREATE TABLE dagctx.blobs(
  session_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  field TEXT NOT NULL,
  chars BIGINT NOT NULL,
  lines BIGINT NOT NULL,
  data BYTEA NOT NULL,
  PRIMARY KEY(session_id, node_id, field)
);
CREATE TABLE dagctx.reduction_summaries(
  key TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  text BYTEA NOT NULL,
  input_tokens BIGINT NOT NULL,
  output_tokens BIGINT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL
)
"""

#: Version 2 (SPEC §8): a code node's ranked references beside its token counts.
_V2 = """
ALTER TABLE dagctx.nodes ADD COLUMN refs BYTEA
"""

#: Version 3 (SPEC §5.1): memory files, their chunks with a weighted ``tsvector`` (as ``nodes``), and
#: what each workspace's last index run skipped.
_V3 = """
CREATE TABLE IF NOT EXISTS dagctx.memory_files(
  workspace TEXT NOT NULL,
  path TEXT NOT NULL,
  source TEXT NOT NULL,
  hash TEXT NOT NULL,
  mtime DOUBLE PRECISION NOT NULL,
  size BIGINT NOT NULL,
  lines BIGINT NOT NULL,
  chunks BIGINT NOT NULL,
  PRIMARY KEY(workspace, path)
);
CREATE TABLE IF NOT EXISTS dagctx.memory_chunks(
  workspace TEXT NOT NULL,
  id TEXT NOT NULL,
  path TEXT NOT NULL,
  source TEXT NOT NULL,
  start_line BIGINT NOT NULL,
  end_line BIGINT NOT NULL,
  hash TEXT NOT NULL,
  mtime DOUBLE PRECISION NOT NULL,
  text TEXT NOT NULL,
  search_vec TSVECTOR,
  search_full BOOLEAN,
  PRIMARY KEY(workspace, id)
);
CREATE INDEX IF NOT EXISTS memory_chunks_path ON dagctx.memory_chunks(workspace, path);
CREATE INDEX IF NOT EXISTS memory_chunks_search ON dagctx.memory_chunks USING gin(search_vec);
CREATE TABLE IF NOT EXISTS dagctx.memory_runs(
  workspace TEXT PRIMARY KEY,
  indexed_at DOUBLE PRECISION NOT NULL,
  skipped BYTEA NOT NULL
)
"""

#: Version 4 (SPEC §5.1): a vector per memory chunk and embedding model, float32 bytes (no pgvector:
#: the search is an exact matrix product in the daemon).
_V4 = """
CREATE TABLE IF NOT EXISTS dagctx.memory_vectors(
  workspace TEXT NOT NULL,
  chunk_id TEXT NOT NULL,
  model TEXT NOT NULL,
  dim INTEGER NOT NULL,
  vec BYTEA NOT NULL,
  PRIMARY KEY(workspace, chunk_id, model)
)
"""

#: advisory lock key every write of the memory index takes first (in its counting triggers), so
#: the shared count rows below are updated by one transaction at a time: no two writers lock
#: them in different orders ("dagmem" as an int)
MEMORY_LOCK = 0x6461676D656D

#: Version 5 (SPEC §5.1): what ``schema.py``'s version 5 counts (chunks, files and a model's
#: vectors per workspace, for ``memory/status``) and the chunks' tokens (``:tokens``: their
#: positions, for BM25's mean length), and ``memory_terms``: how many chunks (of every
#: workspace) hold each lexeme — the twin of SQLite's FTS5 vocabulary, which the keyword search
#: weighs a query's words by. Statement triggers with transition tables keep both in the
#: writing transaction (one upsert per lexeme per statement, in lexeme order). Filled from the
#: rows already there (``ts_stat`` counts the documents holding each lexeme).
_V5 = f"""
CREATE TABLE IF NOT EXISTS dagctx.memory_counts(
  workspace TEXT NOT NULL,
  what TEXT NOT NULL,
  n BIGINT NOT NULL,
  PRIMARY KEY(workspace, what)
);
CREATE TABLE IF NOT EXISTS dagctx.memory_terms(
  term TEXT PRIMARY KEY,
  chunks BIGINT NOT NULL
);
INSERT INTO dagctx.memory_counts(workspace, what, n) SELECT workspace, ':chunks', count(*) FROM dagctx.memory_chunks GROUP BY workspace ON CONFLICT DO NOTHING;
INSERT INTO dagctx.memory_counts(workspace, what, n) SELECT workspace, ':files', count(*) FROM dagctx.memory_files GROUP BY workspace ON CONFLICT DO NOTHING;
INSERT INTO dagctx.memory_counts(workspace, what, n) SELECT workspace, model, count(*) FROM dagctx.memory_vectors GROUP BY workspace, model ON CONFLICT DO NOTHING;
INSERT INTO dagctx.memory_terms(term, chunks) SELECT word, ndoc FROM ts_stat('SELECT search_vec FROM dagctx.memory_chunks') ON CONFLICT DO NOTHING;
INSERT INTO dagctx.memory_counts(workspace, what, n) SELECT workspace, ':tokens', sum((SELECT coalesce(sum(cardinality(t.positions)), 0) FROM unnest(c.search_vec) t)) FROM dagctx.memory_chunks c GROUP BY workspace ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION dagctx.memory_chunks_added() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock({MEMORY_LOCK}); INSERT INTO dagctx.memory_counts AS m(workspace, what, n) SELECT workspace, ':chunks', count(*) FROM added GROUP BY workspace ORDER BY workspace ON CONFLICT(workspace, what) DO UPDATE SET n = m.n + excluded.n; INSERT INTO dagctx.memory_counts AS m(workspace, what, n) SELECT workspace, ':tokens', sum((SELECT coalesce(sum(cardinality(t.positions)), 0) FROM unnest(added.search_vec) t)) FROM added GROUP BY workspace ORDER BY workspace ON CONFLICT(workspace, what) DO UPDATE SET n = m.n + excluded.n; INSERT INTO dagctx.memory_terms AS m(term, chunks) SELECT t.lexeme, count(*) FROM added, unnest(added.search_vec) t GROUP BY t.lexeme ORDER BY t.lexeme ON CONFLICT(term) DO UPDATE SET chunks = m.chunks + excluded.chunks; RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION dagctx.memory_chunks_removed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock({MEMORY_LOCK}); UPDATE dagctx.memory_counts m SET n = m.n - g.n FROM (SELECT workspace, count(*) AS n FROM removed GROUP BY workspace) g WHERE m.workspace = g.workspace AND m.what = ':chunks'; UPDATE dagctx.memory_counts m SET n = m.n - g.n FROM (SELECT workspace, sum((SELECT coalesce(sum(cardinality(t.positions)), 0) FROM unnest(removed.search_vec) t)) AS n FROM removed GROUP BY workspace) g WHERE m.workspace = g.workspace AND m.what = ':tokens'; UPDATE dagctx.memory_terms m SET chunks = m.chunks - g.n FROM (SELECT t.lexeme, count(*) AS n FROM removed, unnest(removed.search_vec) t GROUP BY t.lexeme) g WHERE m.term = g.lexeme; RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION dagctx.memory_files_added() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock({MEMORY_LOCK}); INSERT INTO dagctx.memory_counts AS m(workspace, what, n) SELECT workspace, ':files', count(*) FROM added GROUP BY workspace ORDER BY workspace ON CONFLICT(workspace, what) DO UPDATE SET n = m.n + excluded.n; RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION dagctx.memory_files_removed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock({MEMORY_LOCK}); UPDATE dagctx.memory_counts m SET n = m.n - g.n FROM (SELECT workspace, count(*) AS n FROM removed GROUP BY workspace) g WHERE m.workspace = g.workspace AND m.what = ':files'; RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION dagctx.memory_vectors_added() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock({MEMORY_LOCK}); INSERT INTO dagctx.memory_counts AS m(workspace, what, n) SELECT workspace, model, count(*) FROM added GROUP BY workspace, model ORDER BY workspace, model ON CONFLICT(workspace, what) DO UPDATE SET n = m.n + excluded.n; RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION dagctx.memory_vectors_removed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock({MEMORY_LOCK}); UPDATE dagctx.memory_counts m SET n = m.n - g.n FROM (SELECT workspace, model, count(*) AS n FROM removed GROUP BY workspace, model) g WHERE m.workspace = g.workspace AND m.what = g.model; RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER memory_chunks_added AFTER INSERT ON dagctx.memory_chunks REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION dagctx.memory_chunks_added();
CREATE OR REPLACE TRIGGER memory_chunks_removed AFTER DELETE ON dagctx.memory_chunks REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION dagctx.memory_chunks_removed();
CREATE OR REPLACE TRIGGER memory_files_added AFTER INSERT ON dagctx.memory_files REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION dagctx.memory_files_added();
CREATE OR REPLACE TRIGGER memory_files_removed AFTER DELETE ON dagctx.memory_files REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION dagctx.memory_files_removed();
CREATE OR REPLACE TRIGGER memory_vectors_added AFTER INSERT ON dagctx.memory_vectors REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION dagctx.memory_vectors_added();
CREATE OR REPLACE TRIGGER memory_vectors_removed AFTER DELETE ON dagctx.memory_vectors REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION dagctx.memory_vectors_removed()
"""

MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5}

#: Indexes every open makes sure of, whatever the version (they change no row, so an older
#: dagctx reads the schema as before): session and node ids by prefix in byte order
#: (SPEC §4.3), which the primary keys, in the database's collation, may not give; sessions
#: by the time of their last write (memory search's session index catches up on the ones
#: written since its mark, SPEC §5.1).
INDEXES = (
    ("dagctx.sessions_id_c", 'CREATE INDEX IF NOT EXISTS sessions_id_c ON dagctx.sessions (id COLLATE "C")'),
    ("dagctx.nodes_id_c", 'CREATE INDEX IF NOT EXISTS nodes_id_c ON dagctx.nodes (id COLLATE "C")'),
    ("dagctx.sessions_by_update",
     "CREATE INDEX IF NOT EXISTS sessions_by_update ON dagctx.sessions (updated_at)"),
    # a model's vectors counted without reading them (memory/index, memory/status)
    ("dagctx.memory_vectors_by_model",
     "CREATE INDEX IF NOT EXISTS memory_vectors_by_model ON dagctx.memory_vectors (workspace, model)"),
)


def migrate(conn: Any) -> int:
    """Bring the ``dagctx`` schema forward to ``SCHEMA_VERSION`` in one transaction.

    Returns the version found. A schema newer than this daemon is refused; a ``dagctx``
    schema without our version table is refused rather than written into.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        has_schema = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name='dagctx'"
        ).fetchone() is not None
        has_meta = conn.execute("SELECT to_regclass('dagctx.meta') IS NOT NULL").fetchone()[0]
        if has_schema and not has_meta:
            raise RuntimeError(
                "the database has a schema named dagctx that dagctx did not create (no dagctx.meta "
                "table); use another database, or drop that schema"
            )
        found = 0
        if has_meta:
            got = conn.execute("SELECT value FROM dagctx.meta WHERE key='schema_version'").fetchone()
            found = int(got[0]) if got else 0
        if found > SCHEMA_VERSION:
            refuse_newer(found, SCHEMA_VERSION)
        if not has_schema:
            conn.execute("CREATE SCHEMA dagctx")
            conn.execute("CREATE TABLE dagctx.meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version].split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO dagctx.meta(key, value) VALUES('schema_version', %s) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(version),),
            )
        for name, statement in INDEXES:
            # looked up first: CREATE INDEX locks the table against writes even when it exists
            if conn.execute("SELECT to_regclass(%s) IS NULL", (name,)).fetchone()[0]:
                conn.execute(statement)
    return found
