"""A database of ledger schema version 1 is brought forward by the daemon that opens it.

SPEC §2.1: version 2 adds each tool result's ranked references (§8) — rows written before
it are mined when first needed, and aging decides exactly as before — and, on SQLite,
re-indexes Latin words glued to CJK text (§5) that version 1 rows left out. A version-1
database is made from a fresh one the way version 1 left it: no ``refs`` column, the
version row at 1, and (SQLite) a ``grams`` column of CJK grams only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.context.aging import stored_references
from dagctx.ledger.schema import SCHEMA_VERSION
from dagctx.ledger.search import CJK_RUN

from rawdb import RawDb
from test_stored_references import AGING, MODEL, build, result, stored

pytestmark = pytest.mark.asyncio


def as_version_1(database: str) -> None:
    with RawDb(database) as raw:
        raw.execute("ALTER TABLE nodes DROP COLUMN refs")
        raw.execute("UPDATE meta SET value='1' WHERE key='schema_version'")


async def test_a_version_1_database_is_migrated_and_ages_the_same(database: str) -> None:
    c = await DagctxClient.spawn(database, initialization_options={"aging": AGING})
    try:
        sid, tools = await build(c, 7, cite=2)
        before = await c.render(sid, model=MODEL)
        prepared = await c.prepare(sid, model=MODEL)
    finally:
        await c.close()
    assert tools[2] not in before.manifest["agingKinds"] and tools[0] in before.manifest["agingKinds"]
    as_version_1(database)
    c = await DagctxClient.spawn(database, initialization_options={"aging": AGING})
    try:
        with RawDb(database) as raw:
            rev = raw.execute("SELECT rev, updated_at FROM sessions WHERE id=?", (sid,))
        after = await c.render(sid, model=MODEL)
        assert after.manifest["agingKinds"] == before.manifest["agingKinds"]
        assert after.messages == before.messages
        again = await c.prepare(sid, model=MODEL)
        assert again.references_protected == prepared.references_protected == 1
        with RawDb(database) as raw:
            assert raw.execute("SELECT value FROM meta WHERE key='schema_version'") == [(str(SCHEMA_VERSION),)]
        # what the first plan mined is kept for the next daemon; the session did not change
        assert all(stored(database, sid, t) == stored_references(result(i)) for i, t in enumerate(tools))
        with RawDb(database) as raw:
            assert raw.execute("SELECT rev, updated_at FROM sessions WHERE id=?", (sid,)) == rev
        head = (await c.session_get(sid)).head
        t = await c.append(sid, "code", name="read_file", output=result(9), caller=head)
        assert stored(database, sid, t.node.id) == stored_references(result(9))
    finally:
        await c.close()


async def test_version_2_reindexes_latin_words_glued_to_cjk(tmp_path: Path) -> None:
    db = str(tmp_path / "v1.db")
    c = await DagctxClient.spawn(db)
    try:
        s = await c.session_create("glued")
        await c.append(s.session_id, "user", output="我用Python编程，然后跑pytest测试", predecessor=s.head)
        assert len((await c.search("python", session_id=s.session_id)).hits) == 1
    finally:
        await c.close()
    as_version_1(db)
    with RawDb(db) as raw:  # version 1's grams: the CJK runs' unigrams and bigrams, nothing else
        for rowid, text in raw.execute("SELECT rowid, text FROM search"):
            grams = []
            for run in CJK_RUN.findall(text):
                grams += list(run) + [run[i:i + 2] for i in range(len(run) - 1)]
            raw.execute("UPDATE search SET grams=? WHERE rowid=?", (" ".join(grams), rowid))
        assert raw.execute("SELECT count(*) FROM search WHERE search MATCH 'python OR pytest'") == [(0,)]
    c = await DagctxClient.spawn(db)
    try:
        for word in ("python", "pytest", "编程"):
            assert len((await c.search(word, session_id=s.session_id)).hits) == 1, word
    finally:
        await c.close()
    with RawDb(db) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'") == [(str(SCHEMA_VERSION),)]


async def test_a_database_from_a_newer_dagctx_is_refused_and_left_alone(database: str) -> None:
    c = await DagctxClient.spawn(database)
    await c.close()
    with RawDb(database) as raw:
        raw.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    c = await DagctxClient.spawn(database, initialize=False)
    try:
        with pytest.raises(RpcError) as err:
            await c.initialize(initialization_options={"database": database})
        assert err.value.kind == "InvalidParams"
        assert "schema version 99 is newer" in err.value.message and "Upgrade dagctx" in err.value.message
    finally:
        c.notify("exit")  # the daemon refuses shutdown before a successful initialize
        await c.wait(5)
    with RawDb(database) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'") == [("99",)]
