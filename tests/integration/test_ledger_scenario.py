"""A whole session's life through a real daemon over stdio, checked at every step.

create → turns with tool calls → fork (retry) → checkout back and forth → rewind →
spawn → error turn and its retry → restart the daemon → reopen. After every step
HEAD exists, the history from HEAD walks and ends at HEAD, and session/branches
agrees with both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from rawdb import RawDb
from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import Call

OPTS = {"observeNodes": True}


# ---------------------------------------------------------------- helpers


async def check(c: DagctxClient, sid: str) -> tuple[m.SessionInfo, list[Call], m.SessionBranchesResult]:
    """Assert the session is consistent as seen through the protocol; return what was read."""
    info = await c.session_get(sid)
    head = info.head
    (node,) = (await c.get_nodes(sid, [head])).nodes
    assert node.id == head

    hist = await c.history(sid)
    assert hist.head == head
    nodes = hist.nodes
    if head == info.root_id:
        assert nodes == []
    else:
        assert nodes and nodes[-1].id == head
        first = nodes[0]
        assert first.predecessor == info.root_id or first.metadata.get("spawn_branch_root")
        for prev, cur in zip(nodes, nodes[1:]):
            assert cur.predecessor == prev.id
            assert cur.seq > prev.seq
        assert all(n.role in ("user", "llm", "code") for n in nodes)

    br = await c.branches(sid)
    assert br.head == head
    tips = [b.head for b in br.branches]
    assert len(tips) == len(set(tips))
    assert sum(b.main for b in br.branches) == 1
    current = [b for b in br.branches if b.current]
    if head in tips:
        assert [b.head for b in current] == [head]
    else:
        # HEAD was rewound into the middle of a branch: no tip is current, but HEAD is on one.
        assert current == []
        chains = [[n.id for n in (await c.history(sid, b.head)).nodes] for b in br.branches]
        assert any(head in ch for ch in chains)
    for b in br.branches:
        h = await c.history(sid, b.head)
        assert len(h.nodes) == b.length
        assert (h.nodes[-1].id if h.nodes else info.root_id) == b.head
        assert b.spawn == bool(h.nodes and h.nodes[0].metadata.get("spawn_branch_root"))
    main = next(b for b in br.branches if b.main)
    assert not main.spawn
    return info, nodes, br


@pytest.fixture
def db_path(database: str) -> str:
    """Every test here runs on both backends: a SQLite file, then a PostgreSQL database."""
    return database


def rows(db: Path | str) -> dict[str, Any]:
    """What is in the database, read behind the daemon's back."""
    with RawDb(db) as con:
        return {
            "nodes": con.execute("SELECT count(*) FROM nodes")[0][0],
            "sessions": con.execute("SELECT id, head, node_count, next_seq, rev FROM sessions ORDER BY id"),
            "search": con.execute("SELECT count(*) FROM nodes WHERE search_vec IS NOT NULL" if con.pg
                                  else "SELECT count(*) FROM search")[0][0],
        }


async def expect_error(kind: str, coro) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    err = info.value
    assert err.kind == kind, (err.code, err.message, err.data)
    assert "Traceback" not in err.message
    return err


def notes(c: DagctxClient, method: str) -> list[m.NodeNotification]:
    return [p for name, p in c.notifications if name == method]


# ---------------------------------------------------------------- the scenario


async def test_session_life(db_path: Path) -> None:
    c = await DagctxClient.spawn(db_path, initialization_options=OPTS)
    try:
        created = await c.session_create("scenario")
        sid, root = created.session_id, created.root_id
        assert created.head == root
        info, hist, br = await check(c, sid)
        assert hist == [] and [(b.head, b.length, b.main, b.current) for b in br.branches] == [(root, 0, True, True)]

        # ---- five turns; every llm reply makes one tool call (a nested code node)
        users, llms, tools = [], [], []
        head = root
        for i in range(1, 6):
            u = await c.append(sid, "user", input=f"question {i}", predecessor=head)
            assert u.head == u.node.id and u.node.predecessor == head
            a = await c.append(sid, "llm", output=f"let me look ({i})", predecessor=u.node.id,
                               metadata={"model": "test-model"})
            assert a.head == a.node.id
            t = await c.append(sid, "code", name="read_file", input={"path": f"f{i}.py"},
                               output=f"contents {i}", caller=a.node.id, metadata={"toolCallId": f"call_{i}"})
            assert t.head == a.node.id, "a tool call never moves HEAD"
            assert t.node.caller == a.node.id and t.node.predecessor is None
            assert t.node.metadata["toolCallId"] == f"call_{i}"
            users.append(u.node)
            llms.append(a.node)
            tools.append(t.node)
            head = a.node.id
            info, hist, br = await check(c, sid)
            assert info.head == head and len(hist) == 2 * i
            assert [n.id for n in hist] == [x.id for pair in zip(users, llms) for x in pair]
            assert len(br.branches) == 1 and br.branches[0].length == 2 * i
        seqs = [n.seq for n in (await c.get_nodes(sid, [n.id for n in users + llms + tools])).nodes]
        assert len(set(seqs)) == 15 and info.node_count == 16

        # didAppend was emitted for every append, in order, with the HEAD it left behind
        appended = notes(c, "node/didAppend")
        assert [n.node.id for n in appended] == [x.id for trip in zip(users, llms, tools) for x in trip]
        assert all(n.session_id == sid for n in appended)
        assert appended[-1].head == llms[-1].id

        # ---- fork: retry the last llm reply (same predecessor, moveHead)
        retry = await c.append(sid, "llm", output="a better answer", predecessor=users[4].id, move_head=True)
        assert retry.head == retry.node.id
        info, hist, br = await check(c, sid)
        assert info.head == retry.node.id and llms[4].id not in {n.id for n in hist}
        by_head = {b.head: b for b in br.branches}
        assert set(by_head) == {llms[4].id, retry.node.id}
        assert by_head[llms[4].id].main and by_head[retry.node.id].current
        assert by_head[llms[4].id].length == by_head[retry.node.id].length == 10

        # ---- checkout back and forth
        for target in (llms[4].id, retry.node.id, llms[4].id, retry.node.id):
            before = info.head
            moved = await c.checkout(sid, target)
            assert moved.head == target and moved.previous == before
            info, hist, br = await check(c, sid)
            assert info.head == target
        await expect_error("InvalidEdge", c.checkout(sid, tools[0].id))  # a tool call is never HEAD
        await expect_error("NodeNotFound", c.checkout(sid, "no-such-node"))
        assert (await c.session_get(sid)).head == retry.node.id

        # ---- rewind by steps and by node id
        r = await c.rewind(sid, steps=2)
        assert r.head == llms[3].id and r.previous == retry.node.id
        info, hist, br = await check(c, sid)
        assert hist[-1].id == llms[3].id and len(hist) == 8
        r = await c.rewind(sid, node_id=users[1].id)
        assert r.head == users[1].id
        await check(c, sid)
        # Not on the current branch (it lies ahead of HEAD now): an error, HEAD stays.
        await expect_error("InvalidEdge", c.rewind(sid, node_id=llms[2].id))
        await expect_error("InvalidParams", c.rewind(sid, steps=99))
        assert (await c.session_get(sid)).head == users[1].id
        await c.checkout(sid, retry.node.id)
        # The other branch's tip is not on this branch either.
        await expect_error("InvalidEdge", c.rewind(sid, node_id=llms[4].id))
        info, hist, br = await check(c, sid)
        assert info.head == retry.node.id

        # ---- spawn a branch: HEAD unchanged, its appends never move HEAD
        sp = await c.spawn_branch(sid, retry.node.id, source="subagent", name="research")
        assert sp.head == retry.node.id and sp.node.metadata["spawn_branch_root"]
        assert sp.node.caller == retry.node.id and sp.node.predecessor is None
        su = await c.append(sid, "user", input="find the config loader", predecessor=sp.node.id)
        sa = await c.append(sid, "llm", output="found it in src/app.py", predecessor=su.node.id)
        st = await c.append(sid, "code", name="grep", input={"q": "load"}, output="src/app.py:3",
                            caller=sa.node.id, metadata={"toolCallId": "sub_1"})
        assert su.head == sa.head == st.head == retry.node.id
        info, hist, br = await check(c, sid)
        assert info.head == retry.node.id
        sub = await c.history(sid, sa.node.id)
        assert [n.id for n in sub.nodes] == [sp.node.id, su.node.id, sa.node.id], "stops at the spawn root"
        spawn_branch = next(b for b in br.branches if b.spawn)
        assert spawn_branch.head == sa.node.id and spawn_branch.root == sp.node.id
        assert spawn_branch.length == 3 and spawn_branch.name == "research"
        assert not spawn_branch.main and not spawn_branch.current
        assert {n.id for n in hist}.isdisjoint({sp.node.id, su.node.id, sa.node.id})

        # ---- an error turn and its retry
        u6 = await c.append(sid, "user", input="now run the tests", predecessor=retry.node.id)
        err6 = await c.append(sid, "llm", output="provider error: 529 overloaded", status="error",
                              predecessor=u6.node.id)
        assert err6.node.status == "error" and err6.head == err6.node.id
        await check(c, sid)
        retry6 = await c.append(sid, "llm", output="the tests pass", predecessor=u6.node.id, move_head=True)
        info, hist, br = await check(c, sid)
        assert info.head == retry6.node.id
        assert err6.node.id not in {n.id for n in hist}, "the retry never sees the error it retries"
        assert hist[-2].id == u6.node.id
        (stored_err,) = (await c.get_nodes(sid, [err6.node.id])).nodes
        assert stored_err.status == "error" and stored_err.output == "provider error: 529 overloaded"
        assert err6.node.id in {b.head for b in br.branches}

        # ---- a running node finishes once
        u7 = await c.append(sid, "user", input="summarize", predecessor=retry6.node.id)
        run = await c.append(sid, "llm", output="", status="running", predecessor=u7.node.id)
        tool = await c.append(sid, "code", name="bash", input={"cmd": "ls"}, status="running", caller=run.node.id,
                              metadata={"toolCallId": "call_run"})
        n_updates = len(notes(c, "node/didUpdate"))
        t_done = await c.update(sid, tool.node.id, "completed", output="a.py\nb.py")
        done = await c.update(sid, run.node.id, "completed", output="all done", model="test-model")
        assert done.node.status == "completed" and done.node.output == "all done"
        assert done.node.metadata["model"] == "test-model" and done.node.seq == run.node.seq
        assert done.head == run.node.id and t_done.node.output == "a.py\nb.py"
        updates = notes(c, "node/didUpdate")[n_updates:]
        assert [(u.node.id, u.node.status) for u in updates] == [
            (tool.node.id, "completed"),
            (run.node.id, "completed"),
        ]
        assert updates[-1].node.output == "all done"
        snap = rows(db_path)
        await expect_error("NotRunning", c.update(sid, run.node.id, "error", output="late"))
        await expect_error("NotRunning", c.update(sid, users[0].id, "completed"))
        assert rows(db_path) == snap and len(notes(c, "node/didUpdate")) == n_updates + 2
        info, hist, br = await check(c, sid)

        # ---- refused writes leave the file exactly as it was
        snap = rows(db_path)
        n_appends = len(notes(c, "node/didAppend"))
        dup = await expect_error("DuplicateNode", c.append(sid, "user", id=users[0].id, input="again",
                                                           predecessor=info.head))
        assert dup.data.get("nodeId") == users[0].id
        missing = await expect_error("PredecessorMissing", c.append(sid, "user", input="lost"))
        assert missing.data.get("path") == "node.predecessor"
        await expect_error("PredecessorMissing", c.append(sid, "llm", output="orphan"))
        await expect_error("NodeNotFound", c.append(sid, "user", input="x", predecessor="ghost"))
        await expect_error("InvalidEdge", c.append(sid, "user", input="x", predecessor=tools[0].id))
        await expect_error("SessionNotFound", c.append("no-such-session", "user", input="x", predecessor="ROOT"))
        assert rows(db_path) == snap
        assert (await c.session_get(sid)).head == info.head and (await c.session_get(sid)).node_count == info.node_count
        assert len(notes(c, "node/didAppend")) == n_appends, "a refused append is not announced"
        final_info, final_hist, final_br = await check(c, sid)
    finally:
        assert await c.close() == 0

    # ---- restart: a new daemon on the same file sees the same session, HEAD unmoved
    c2 = await DagctxClient.spawn(db_path, initialization_options=OPTS)
    try:
        info2, hist2, br2 = await check(c2, sid)
        assert info2.head == final_info.head and info2.node_count == final_info.node_count
        assert hist2 == final_hist
        assert br2 == final_br
        listed = await c2.session_list()
        assert [s.session_id for s in listed.sessions] == [sid] and listed.total == 1
        # and the session continues where it was
        nxt = await c2.append(sid, "user", input="after the restart", predecessor=info2.head)
        assert nxt.node.seq == info2.node_count and nxt.head == nxt.node.id
        await check(c2, sid)
    finally:
        assert await c2.close() == 0


# ---------------------------------------------------------------- bad data surfaces


def corrupt(db: Path, sid: str, node_id: str, predecessor: str | None, *, bump_node_rev: bool = True) -> None:
    """Rewrite a node's predecessor (column and msgpack body) behind the daemon's back."""
    con = RawDb(db)
    try:
        con.begin()
        ((body,),) = con.execute("SELECT body FROM nodes WHERE session_id=? AND id=?", (sid, node_id))
        call = msgspec.structs.replace(msgspec.msgpack.decode(body, type=Call), predecessor=predecessor)
        ((rev,),) = con.execute("SELECT rev FROM sessions WHERE id=?", (sid,))
        rev += 1
        con.execute(
            "UPDATE nodes SET predecessor=?, body=?" + (", rev=?" if bump_node_rev else "")
            + " WHERE session_id=? AND id=?",
            (predecessor, msgspec.msgpack.encode(call), *((rev,) if bump_node_rev else ()), sid, node_id),
        )
        con.execute("UPDATE sessions SET rev=? WHERE id=?", (rev, sid))
        con.commit()
    finally:
        con.close()


async def test_broken_predecessor_chain_surfaces(db_path: Path, daemon: DagctxClient) -> None:
    c = daemon
    s = await c.session_create("to be corrupted")
    sid = s.session_id
    u1 = await c.append(sid, "user", input="one", predecessor=s.head)
    a1 = await c.append(sid, "llm", output="two", predecessor=u1.node.id)
    u2 = await c.append(sid, "user", input="three", predecessor=a1.node.id)
    a2 = await c.append(sid, "llm", output="four", predecessor=u2.node.id)
    await check(c, sid)  # the daemon has the graph cached now

    corrupt(db_path, sid, u2.node.id, "vanished-node")
    err = await expect_error("BrokenPredecessorChain", c.history(sid))
    assert err.code == -32001
    assert err.data["nodeId"] == u2.node.id and err.data["sessionId"] == sid
    assert "vanished-node" in err.message
    await expect_error("BrokenPredecessorChain", c.branches(sid))
    await expect_error("BrokenPredecessorChain", c.history(sid, a2.node.id))
    # The part of the branch below the damage still answers; the daemon is alive.
    ok = await c.history(sid, a1.node.id)
    assert [n.id for n in ok.nodes] == [u1.node.id, a1.node.id]
    (raw,) = (await c.get_nodes(sid, [u2.node.id])).nodes
    assert raw.predecessor == "vanished-node", "node/get shows the stored data as it is"

    # A null predecessor on a user turn (column and body): the walk stops there too.
    corrupt(db_path, sid, u2.node.id, None)
    err = await expect_error("BrokenPredecessorChain", c.history(sid))
    assert err.data["nodeId"] in (u2.node.id, a2.node.id) and u2.node.id in err.message

    # A fresh daemon loading the damaged file reports the same thing, never repairs it.
    c2 = await DagctxClient.spawn(db_path)
    try:
        err2 = await expect_error("BrokenPredecessorChain", c2.history(sid))
        assert err2.data["nodeId"] == err.data["nodeId"]
        assert (await c2.history(sid, a1.node.id)).nodes[-1].id == a1.node.id
    finally:
        assert await c2.close() == 0


async def test_corruption_without_node_rev_is_seen_after_restart(db_path: Path) -> None:
    """Only sessions.rev bumped: a running daemon may keep its cached node, a new one must not."""
    c = await DagctxClient.spawn(db_path)
    try:
        s = await c.session_create()
        u = await c.append(s.session_id, "user", input="q", predecessor=s.head)
        await c.append(s.session_id, "llm", output="a", predecessor=u.node.id)
        await check(c, s.session_id)
    finally:
        await c.close()
    corrupt(db_path, s.session_id, u.node.id, "nowhere", bump_node_rev=False)
    c2 = await DagctxClient.spawn(db_path)
    try:
        err = await expect_error("BrokenPredecessorChain", c2.history(s.session_id))
        assert err.data["nodeId"] == u.node.id
    finally:
        await c2.close()


# ---------------------------------------------------------------- spilled output


async def test_spilled_output_through_the_daemon(db_path: Path, daemon: DagctxClient) -> None:
    c = daemon
    s = await c.session_create("spill")
    sid = s.session_id
    u = await c.append(sid, "user", input="cat the log", predecessor=s.head)
    a = await c.append(sid, "llm", output="reading it", predecessor=u.node.id)
    lines = [f"{i:05d} INFO request served in {i % 97} ms path=/api/v1/items/{i}" for i in range(900)]
    text = "\n".join(lines)
    assert len(text) > 32_000 and len(lines) > 100
    t = await c.append(sid, "code", name="cat", input={"path": "server.log"}, output=text, caller=a.node.id,
                       metadata={"toolCallId": "call_cat"})
    spill = t.node.metadata["spill"]
    assert spill["chars"] == len(text) and spill["lines"] == len(lines)
    assert spill["headChars"] + spill["omitted"] + spill["tailChars"] == len(text)

    (shown,) = (await c.get_nodes(sid, [t.node.id])).nodes
    assert shown.output == t.node.output
    assert shown.output.startswith(text[: spill["headChars"]])
    assert shown.output.endswith(text[-spill["tailChars"] :])
    marker = shown.output[spill["headChars"] : len(shown.output) - spill["tailChars"]]
    assert "omitted" in marker and f"{spill['omitted']:,}" in marker
    assert len(shown.output) < len(text)

    off, length = spill["headChars"], spill["omitted"]
    (middle,) = (await c.get_nodes(sid, [t.node.id], range=m.OutputRange(offset=off, length=length))).nodes
    assert middle.output == text[off : off + length]
    (whole,) = (await c.get_nodes(sid, [t.node.id], range=m.OutputRange())).nodes
    assert whole.output == text
    (piece,) = (await c.get_nodes(sid, [t.node.id], range=m.OutputRange(offset=12_345, length=678))).nodes
    assert piece.output == text[12_345 : 12_345 + 678]
    (past,) = (await c.get_nodes(sid, [t.node.id], range=m.OutputRange(offset=len(text) + 10, length=5))).nodes
    assert past.output == ""
    await expect_error("InvalidParams", c.get_nodes(sid, [t.node.id], range=m.OutputRange(offset=-1)))

    # The stored text is in the file once, whole.
    with RawDb(db_path) as con:
        ((data,),) = con.execute("SELECT data FROM blobs WHERE node_id=?", (t.node.id,))
    data = data if isinstance(data, str) else bytes(data).decode()  # PostgreSQL keeps UTF-8 bytes
    assert data == text
    # Reading twice changes nothing (the read path has no side effects).
    again = (await c.get_nodes(sid, [t.node.id])).nodes[0]
    assert again == shown

    # A short output is never spilled and a range reads it too.
    small = await c.append(sid, "code", name="echo", output="short", caller=a.node.id)
    assert "spill" not in small.node.metadata
    (sr,) = (await c.get_nodes(sid, [small.node.id], range=m.OutputRange(offset=1, length=3))).nodes
    assert sr.output == "hor"
