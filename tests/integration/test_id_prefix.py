"""Ids by prefix (SPEC §4.3) on both backends: ``id/resolve`` through a real daemon, the
``dagctx show PREFIX`` / ``dagctx history PREFIX`` command lines a person types, and the
query plans of the lookups (an index range scan on the id, never a scan of the table).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.ledger import postgres_backend, sqlite_backend

SESSIONS = 17  # 16 hex digits: two sessions share a first character, whatever the uuids


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """The clients and command lines of this module share one daemon, as a user's do."""


async def fill(database: str) -> dict[str, object]:
    """17 sessions; in the first, nodes whose ids share prefixes (explicit ids)."""
    c = await DagctxClient.spawn(database)
    try:
        made = [await c.session_create(f"session {i}") for i in range(SESSIONS)]
        first = made[0]
        u = await c.append(first.session_id, "user", id="pfx-abc123-one", output="first question", predecessor=first.head)
        a = await c.append(first.session_id, "llm", id="pfx-abc123-two", name="gpt-4o", output="first answer",
                           predecessor=u.node.id)
        await c.append(first.session_id, "code", id="pfx-abd999", name="bash", input={"cmd": "ls"}, output="a.py",
                       caller=a.node.id, metadata={"toolCallId": "call_1"})
        # the same id in another session: a node id is unique within its session only
        second = made[1]
        await c.append(second.session_id, "user", id="pfx-shared", output="second question", predecessor=second.head)
        await c.append(first.session_id, "user", id="pfx-shared", output="third question", predecessor=a.node.id)
        return {"sessions": [s.session_id for s in made], "first": first.session_id, "second": second.session_id}
    finally:
        await c.close()


async def test_id_resolve_answers_from_the_index(database: str) -> None:
    ids = await fill(database)
    c = await DagctxClient.spawn(database)
    try:
        both = await c.id_resolve("pfx-abc123")
        assert [(x.kind, x.node_id, x.role) for x in both.matches] == [
            ("node", "pfx-abc123-one", "user"), ("node", "pfx-abc123-two", "llm")]
        assert not both.truncated and {x.session_id for x in both.matches} == {ids["first"]}
        one = await c.id_resolve("pfx-abd")
        assert [(x.node_id, x.role) for x in one.matches] == [("pfx-abd999", "code")]  # a tool call too
        assert (await c.id_resolve("pfx-zzz")).matches == []
        # limit and truncated
        cut = await c.id_resolve("pfx-", kinds="node", limit=2)
        assert len(cut.matches) == 2 and cut.truncated
        # the same node id in two sessions, and narrowed to one session
        shared = await c.id_resolve("pfx-shared")
        assert sorted(x.session_id for x in shared.matches) == sorted([ids["first"], ids["second"]])
        scoped = await c.id_resolve("pfx-shared", session_id=ids["second"])
        assert [(x.session_id, x.node_id) for x in scoped.matches] == [(ids["second"], "pfx-shared")]
        # sessions by prefix, with their titles; sessions come before nodes
        sid = ids["first"]
        got = await c.id_resolve(sid[:13], kinds="session")
        assert [(x.kind, x.session_id, x.title) for x in got.matches] == [("session", sid, "session 0")]
        firsts = Counter(s[0] for s in ids["sessions"])  # type: ignore[union-attr]
        ch, n = firsts.most_common(1)[0]
        assert n >= 2
        many = await c.id_resolve(ch, kinds="session", limit=1000)
        assert sorted(x.session_id for x in many.matches) == sorted(s for s in ids["sessions"] if s[0] == ch)  # type: ignore[union-attr]
        # bad input: a clear error, nothing changed
        before = (await c.session_list(limit=100)).total
        for bad, kind, words in (({"prefix": ""}, "InvalidParams", "prefix is empty"),
                                 ({"prefix": "x" * 257}, "InvalidParams", "ids are shorter"),
                                 ({"prefix": "pfx", "limit": 0}, "InvalidParams", "limit must be"),
                                 ({"prefix": "pfx", "sessionId": "no-such-session"}, "SessionNotFound", "does not exist")):
            with pytest.raises(RpcError) as err:
                await c.request("id/resolve", bad)
            assert err.value.kind == kind and words in err.value.message, (bad, err.value)
        assert (await c.session_list(limit=100)).total == before
    finally:
        await c.close()


def dagctx(database: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    env.pop("DAGCTX_DB", None)
    return subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "--db", database, *args], capture_output=True,
                          text=True, encoding="utf-8", timeout=120, env=env)


async def test_show_and_history_by_prefix_on_the_command_line(database: str) -> None:
    ids = await fill(database)
    # a unique prefix: the node, exit 0
    shown = dagctx(database, "show", "pfx-abd")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "node pfx-abd999" in shown.stdout and "a.py" in shown.stdout
    as_json = dagctx(database, "show", "pfx-abc123-o", "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["output"] == "first question"
    # an exact id that is also the prefix of nothing else: that node
    assert dagctx(database, "show", "pfx-abc123-two").returncode == 0
    # ambiguous: every candidate named, how to fix it, exit 1
    amb = dagctx(database, "show", "pfx-abc123")
    assert amb.returncode == 1, amb.stdout
    assert "ambiguous" in amb.stdout and "pfx-abc123-one" in amb.stdout and "pfx-abc123-two" in amb.stdout
    assert "give more characters" in amb.stdout and "(InvalidParams)" in amb.stdout
    # the same id in two sessions: ambiguous until --session says which
    twice = dagctx(database, "show", "pfx-shared")
    assert twice.returncode == 1 and ids["first"] in twice.stdout and ids["second"] in twice.stdout
    one = dagctx(database, "show", "pfx-shared", "--session", str(ids["second"])[:13], "--json")
    assert one.returncode == 0 and json.loads(one.stdout)["output"] == "second question"
    # unknown: a clear error, exit 1
    missing = dagctx(database, "show", "pfx-nothing")
    assert missing.returncode == 1 and "no node id starts with it" in missing.stdout and "(NodeNotFound)" in missing.stdout
    # sessions by prefix: unique → the history; ambiguous → the candidates with their titles
    hist = dagctx(database, "history", str(ids["first"])[:13], "--json")
    assert hist.returncode == 0 and json.loads(hist.stdout)["nodes"][0]["id"] == "pfx-abc123-one"
    firsts = Counter(s[0] for s in ids["sessions"])  # type: ignore[union-attr]
    ch = firsts.most_common(1)[0][0]
    amb_s = dagctx(database, "history", ch)
    assert amb_s.returncode == 1 and "ambiguous" in amb_s.stdout and "session " in amb_s.stdout
    assert all(s in amb_s.stdout for s in ids["sessions"] if s[0] == ch)  # type: ignore[union-attr]
    nosuch = dagctx(database, "history", "zzzz")
    assert nosuch.returncode == 1 and "no session id starts with it" in nosuch.stdout


async def test_prefix_lookups_use_an_index(database: str) -> None:
    """The plans of the exact queries the backends run: a range search of an index on the id."""
    await fill(database)
    if "://" not in database:
        db = sqlite3.connect(database)
        try:
            for table in ("sessions", "nodes"):
                plan = " ".join(r[-1] for r in db.execute("EXPLAIN QUERY PLAN " + sqlite_backend.prefix_sql(table, True, False),
                                                          ("pfx-a", "pfx-b", 10)))
                index = "sqlite_autoindex_sessions_1" if table == "sessions" else "nodes_by_id"
                assert f"SEARCH {table} USING INDEX {index} (id>? AND id<?)" in plan, plan
            plan = " ".join(r[-1] for r in db.execute("EXPLAIN QUERY PLAN " + sqlite_backend.prefix_sql("nodes", True, True),
                                                      ("pfx-a", "pfx-b", "s", 10)))
            assert "USING INDEX" in plan and "SCAN nodes" not in plan, plan
        finally:
            db.close()
        return
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        # the planner may prefer a sequential scan of a small table: forbid it, so the plan
        # shows whether an index can answer the range at all (without one, it scans anyway)
        conn.execute("SET enable_seqscan = off")
        for table, index in (("sessions", "sessions_id_c"), ("nodes", "nodes_id_c")):
            rows = conn.execute("EXPLAIN " + postgres_backend.prefix_sql(table, True, False), ("pfx-a", "pfx-b", 10)).fetchall()
            plan = "\n".join(r[0] for r in rows)
            assert f"Index Scan using {index}" in plan or f"Bitmap Index Scan on {index}" in plan, plan
            assert "Seq Scan" not in plan, plan
