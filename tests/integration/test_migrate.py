"""``dagctx migrate --from --to``: every session copied exactly, both ways, idempotently.

The source is a real database written by the demo (tool calls, a compaction summary,
a spawn branch, usage) plus a spilled output; the copy goes SQLite → PostgreSQL →
SQLite through the CLI (each run spawns a daemon on the target), and the rows are
compared on both sides behind the daemons' backs.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from dagctx.client import DagctxClient
from dagctx.ledger import Store
from dagctx.protocol.nodes import NodeInput

from test_cli import dagctx, ok


def snapshot(database: str) -> dict[str, object]:
    """Everything a session is, as stored: session rows, node rows, blobs, usage."""
    s = Store(database)
    try:
        out: dict[str, object] = {}
        rows, _ = s.backend.sessions(10_000, 0)
        for r in rows:
            nodes = [(n.id, n.seq, n.rev, n.role, n.name, n.status, n.caller, n.predecessor, n.created_at, n.body,
                      n.tokens, n.refs, n.search_text) for n in s.backend.node_rows(r.id)]
            blobs = sorted((b.node_id, b.field, b.chars, b.lines, b.data) for b in s.backend.blob_rows(r.id))
            usage = [(u.node_id, u.model, u.usage, u.estimated, u.reported_at)
                     for u in s.backend.usage_rows(r.id)]
            out[r.id] = (r.title, r.root_id, r.head, r.created_at, r.updated_at, r.next_seq, r.rev, r.node_count,
                         r.source_key, r.metadata, nodes, blobs, usage)
        return out
    finally:
        s.close()


def test_migrate_copies_everything_both_ways_and_is_idempotent(tmp_path: Path, pg_url: str) -> None:
    src = str(tmp_path / "src.db")
    ok("demo", "--db", src, "--keep", "--turns", "2")
    s = Store(src)
    try:
        sid = s.list_sessions()[0][0].session_id
        big = "\n".join(f"line {i} " + "x" * 200 for i in range(300))
        s.append(sid, NodeInput(role="code", name="dump", output=big, caller=s.head(sid)))
    finally:
        s.close()
    before = snapshot(src)
    assert before and any(v[11] for v in before.values())  # a spilled blob is among them

    out = ok("migrate", "--from", src, "--to", pg_url)
    assert f"copied {len(before)}" in out
    assert snapshot(pg_url) == before
    again = ok("migrate", "--from", src, "--to", pg_url)
    assert "copied 0" in again and f"unchanged {len(before)}" in again
    assert snapshot(pg_url) == before

    back = str(tmp_path / "back.db")
    ok("migrate", "--from", pg_url, "--to", back)
    assert snapshot(back) == before

    # What was copied works: a daemon on the copy serves history and search as the source did.
    hist = ok("history", "--db", back, sid[:8])
    assert ok("history", "--db", src, sid[:8]) == hist
    assert ok("search", "--db", back, "迁移") == ok("search", "--db", src, "迁移")
    # PostgreSQL ranks differently (ts_rank, not bm25) but finds the same nodes.
    hits = lambda db: set(re.findall(r"│ ([0-9a-f]{8}) ", ok("search", "--db", db, "迁移", "--limit", "100")))  # noqa: E731
    assert hits(pg_url) == hits(src) and hits(src)


def test_migrate_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    p = dagctx("migrate", "--from", str(tmp_path / "missing.db"), "--to", str(tmp_path / "t.db"))
    assert p.returncode != 0 and "no database file" in p.stdout.lower()  # error lines are sentences
    assert not (tmp_path / "missing.db").exists()
    p = dagctx("migrate", "--from", str(tmp_path / "t.db"), "--to", str(tmp_path / "t.db"))
    assert p.returncode != 0 and "same database" in p.stdout
    p = dagctx("migrate", "--from", "postgresql://nobody@127.0.0.1:1/none", "--to", str(tmp_path / "t2.db"))
    assert p.returncode != 0 and "StorageUnavailable" in p.stdout and "server is up" in p.stdout


@pytest.mark.asyncio
async def test_subscribers_of_a_migrated_session_hear_its_new_nodes(tmp_path: Path) -> None:
    """A copy that brings a session forward is a write like any other (SPEC §9): the
    target daemon's subscribers get ``node/didAppend`` for the nodes it added."""
    a = await DagctxClient.spawn(tmp_path / "a.db", standalone=True)
    b = await DagctxClient.spawn(tmp_path / "b.db", standalone=True)
    try:
        s = await a.session_create("moving")
        u = await a.append(s.session_id, "user", output="one", predecessor=s.head)
        await b.request("database/migrate", {"source": str(tmp_path / "a.db")})
        assert (await b.subscribe(s.session_id)).head == u.node.id
        reply = await a.append(s.session_id, "llm", name="gpt-4o", output="two", predecessor=u.node.id)
        res = await b.request("database/migrate", {"source": str(tmp_path / "a.db")})
        assert res.copied == 1 and res.nodes == 3
        for _ in range(100):
            got = [p for m, p in b.notifications if m == "node/didAppend" and p.node.id == reply.node.id]
            if got:
                break
            await asyncio.sleep(0.02)
        assert got and got[0].head == reply.node.id and got[0].node.output == "two"
    finally:
        await a.close()
        await b.close()
