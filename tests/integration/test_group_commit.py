"""Group commit (SPEC §4.2): appends from many connections of one shared daemon, committed
together, keep every rule of a lone append — on both backends.

* seq stays contiguous per session and each connection's appends keep their order;
* HEAD ends where the rule puts it when the committed nodes are replayed one by one in
  seq order;
* a failing append (refused by the rules, or by the database after it wrote) fails alone;
* ``node/appendBatch`` is all or nothing, and names the node that was refused;
* ``kill -9`` while groups are in flight loses no acknowledged append.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon_stop import exited, stop_daemon
from rawdb import RawDb
from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

CLIENTS = 8


@pytest.fixture
def db_path(database: str) -> str:
    return database


class SharedDaemon:
    """One shared daemon on a private socket; ``connect`` opens one more connection."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.run = tempfile.mkdtemp(prefix="gc-", dir="/tmp")  # short: socket paths are limited
        self.socket = os.path.join(self.run, "d.sock")
        self.clients: list[DagctxClient] = []
        self.pid: int | None = None

    async def connect(self, **kw: Any) -> DagctxClient:
        c = await DagctxClient.connect(self.database, socket_path=self.socket, **kw)
        self.clients.append(c)
        if self.pid is None:
            self.pid = (await c.daemon_status()).pid
        return c

    async def stop(self) -> None:
        await stop_daemon(self.pid, self.clients)


@pytest.fixture
async def shared(db_path: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SharedDaemon]:
    monkeypatch.delenv("DAGCTX_STANDALONE", raising=False)
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "60")
    d = SharedDaemon(db_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", d.run)
    monkeypatch.setenv("DAGCTX_STATE_DIR", os.path.join(d.run, "state"))
    yield d
    await d.stop()


def replay_head(rows: list[tuple[str, str | None, str | None, bool]], root: str) -> str:
    """HEAD after appending ``rows`` (id, predecessor, caller, conversation?) one by one with
    the default rule: a conversation node that extends HEAD becomes HEAD."""
    head = root
    for nid, pred, _caller, conv in rows:
        if conv and pred == head:
            head = nid
    return head


async def _pipeline(c: DagctxClient, sid: str, nodes: list[NodeInput]) -> list[Any]:
    futs = [c.send_request("node/append", m.NodeAppendParams(session_id=sid, node=n))[1] for n in nodes]
    return await asyncio.gather(*futs, return_exceptions=True)


async def test_pipelined_appends_from_many_connections_keep_seq_order_and_head(shared: SharedDaemon) -> None:
    clients = [await shared.connect() for _ in range(CLIENTS)]
    s = await clients[0].session_create("group")
    sid, root = s.session_id, s.root_id
    # Every client extends its own branch from ROOT (one of them extends HEAD at a time),
    # and also appends to a session of its own.
    own = [await c.session_create(f"own {i}") for i, c in enumerate(clients)]
    per = 40

    async def work(i: int, c: DagctxClient) -> tuple[list[Any], list[Any]]:
        chain, mine = [], []
        prev, prev_own = root, own[i].head
        for k in range(per):
            role = "user" if k % 2 == 0 else "llm"
            chain.append(NodeInput(role=role, id=f"c{i}.{k}", predecessor=prev, output=f"{i}:{k}"))
            mine.append(NodeInput(role=role, id=f"o{i}.{k}", predecessor=prev_own, output=f"own {i}:{k}"))
            prev, prev_own = f"c{i}.{k}", f"o{i}.{k}"
        got = await asyncio.gather(_pipeline(c, sid, chain), _pipeline(c, own[i].session_id, mine))
        return got[0], got[1]

    results = await asyncio.gather(*(work(i, c) for i, c in enumerate(clients)))
    for i, (chain, mine) in enumerate(results):
        assert all(isinstance(r, m.NodeResult) for r in chain + mine), [r for r in chain + mine if not
                                                                        isinstance(r, m.NodeResult)][:3]
        # a connection's appends keep their order
        assert [r.node.seq for r in chain] == sorted(r.node.seq for r in chain)
        assert [r.node.id for r in mine] == [f"o{i}.{k}" for k in range(per)]
        # its own session: seq 1..per, HEAD followed the chain
        assert [r.node.seq for r in mine] == list(range(1, per + 1))
        assert mine[-1].head == f"o{i}.{per - 1}"

    with RawDb(shared.database) as raw:
        rows = raw.execute("SELECT id, predecessor, caller, seq FROM nodes WHERE session_id=? ORDER BY seq", (sid,))
        ((head, next_seq, count),) = raw.execute("SELECT head, next_seq, node_count FROM sessions WHERE id=?",
                                                 (sid,))
    seqs = [r[3] for r in rows]
    assert seqs == list(range(CLIENTS * per + 1)) and next_seq == CLIENTS * per + 1 and count == CLIENTS * per + 1
    assert head == replay_head([(r[0], r[1], r[2], True) for r in rows[1:]], root)
    info = await clients[0].session_get(sid)
    assert info.head == head and info.node_count == CLIENTS * per + 1
    # every connection's chain is intact in the history of its own tip
    for i in range(CLIENTS):
        hist = await clients[i].history(sid, head=f"c{i}.{per - 1}")
        assert [n.id for n in hist.nodes] == [f"c{i}.{k}" for k in range(per)]


def _poison(database: str) -> None:
    """A database rule the ledger does not know: a node named ``poison`` is refused by the
    database itself, after the ledger wrote the rows before it in the same transaction."""
    with RawDb(database) as raw:
        if raw.pg:
            raw.execute("CREATE FUNCTION dagctx.poison() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN IF NEW.name = convert_to('poison', 'UTF8') THEN "
                        "RAISE EXCEPTION 'poisoned node'; END IF; RETURN NEW; END $$")
            raw.execute("CREATE TRIGGER poison BEFORE INSERT ON dagctx.nodes FOR EACH ROW "
                        "EXECUTE FUNCTION dagctx.poison()")
        else:
            raw.execute("CREATE TRIGGER poison BEFORE INSERT ON nodes WHEN NEW.name = 'poison' "
                        "BEGIN SELECT RAISE(ABORT, 'poisoned node'); END")


async def test_a_failing_append_fails_alone(shared: SharedDaemon) -> None:
    clients = [await shared.connect() for _ in range(CLIENTS)]
    s = await clients[0].session_create("isolation")
    sid = s.session_id
    _poison(shared.database)
    rounds = 6

    async def work(i: int, c: DagctxClient) -> list[tuple[str, Any]]:
        out = []
        for k in range(rounds):
            base = f"w{i}.{k}"
            plan = [
                (f"{base}.ok", NodeInput(role="user", id=f"{base}.ok", predecessor=s.root_id, output="fine")),
                # refused by the rules before anything is written
                (f"{base}.missing", NodeInput(role="llm", id=f"{base}.missing", predecessor="nope")),
                # refused by the database after its rows were written
                (f"{base}.poison", NodeInput(role="user", id=f"{base}.poison", name="poison",
                                             predecessor=s.root_id)),
                (f"{base}.dup", NodeInput(role="user", id=f"{base}.ok", predecessor=s.root_id)),
                (f"{base}.ok2", NodeInput(role="llm", id=f"{base}.ok2", predecessor=f"{base}.ok", output="fine")),
            ]
            got = await _pipeline(c, sid, [n for _, n in plan])
            out += [(name, r) for (name, _), r in zip(plan, got)]
        return out

    everything = [x for part in await asyncio.gather(*(work(i, c) for i, c in enumerate(clients))) for x in part]
    ok = [name for name, r in everything if isinstance(r, m.NodeResult)]
    for name, r in everything:
        if name.endswith((".ok", ".ok2")):
            assert isinstance(r, m.NodeResult), (name, r)
        else:
            assert isinstance(r, RpcError), (name, r)
    kinds = {name.rsplit(".", 1)[1]: r.kind for name, r in everything if isinstance(r, RpcError)}
    assert kinds["missing"] == "NodeNotFound" and kinds["dup"] == "DuplicateNode"
    assert "poisoned node" in next(r.message for n, r in everything if n.endswith(".poison"))
    with RawDb(shared.database) as raw:
        stored = {r[0] for r in raw.execute("SELECT id FROM nodes WHERE session_id=?", (sid,))}
        seqs = [r[0] for r in raw.execute("SELECT seq FROM nodes WHERE session_id=? ORDER BY seq", (sid,))]
    assert stored == set(ok) | {s.root_id}
    assert seqs == list(range(len(ok) + 1))


async def test_append_batch_is_all_or_nothing(shared: SharedDaemon) -> None:
    c = await shared.connect()
    s = await c.session_create("batch")
    sid = s.session_id
    turn = [
        {"role": "user", "id": "u1", "output": "run the tests", "predecessor": s.head},
        {"role": "llm", "id": "a1", "name": "gpt-4o", "output": "running", "predecessor": "u1"},
        {"role": "code", "id": "t1", "name": "bash", "input": {"cmd": "pytest"}, "output": "ok", "caller": "a1",
         "metadata": {"toolCallId": "call_1"}},
        {"role": "llm", "id": "a2", "name": "gpt-4o", "output": "all green", "predecessor": "a1"},
    ]
    res = await c.append_batch(sid, turn)
    assert [n.id for n in res.nodes] == ["u1", "a1", "t1", "a2"]
    assert [n.seq for n in res.nodes] == [1, 2, 3, 4]
    assert res.head == "a2" and (await c.session_get(sid)).head == "a2"

    bad = [
        {"role": "user", "id": "u2", "output": "again", "predecessor": "a2"},
        {"role": "llm", "id": "b2", "output": "x", "predecessor": "no-such-node"},
    ]
    with pytest.raises(RpcError) as err:
        await c.append_batch(sid, bad)
    assert err.value.kind == "NodeNotFound" and "nodes[1]" in err.value.message
    info = await c.session_get(sid)
    assert info.node_count == 5 and info.head == "a2"  # nothing of the refused batch
    with pytest.raises(RpcError) as empty:
        await c.append_batch(sid, [])
    assert empty.value.kind == "InvalidParams"
    # a batch the database refuses after writing its first node: nothing stays
    _poison(shared.database)
    with pytest.raises(RpcError):
        await c.append_batch(sid, [{"role": "user", "id": "u3", "predecessor": "a2"},
                                   {"role": "llm", "id": "p3", "name": "poison", "predecessor": "u3"}])
    info = await c.session_get(sid)
    assert info.node_count == 5 and info.head == "a2"
    nxt = await c.append(sid, "user", id="u4", predecessor="a2", output="still fine")
    assert nxt.node.seq == 5 and nxt.head == "u4"


async def test_kill_9_during_groups_loses_no_acknowledged_append(shared: SharedDaemon) -> None:
    clients = [await shared.connect() for _ in range(CLIENTS)]
    s = await clients[0].session_create("killed")
    sid, root = s.session_id, s.root_id
    acked: list[str] = []
    sent: dict[int, list[str]] = {i: [] for i in range(CLIENTS)}
    killed = asyncio.Event()

    async def work(i: int, c: DagctxClient) -> None:
        prev = root
        window: set[asyncio.Future[Any]] = set()
        for k in range(400):
            if c.closed.done():
                break
            nid = f"k{i}.{k}"
            node = NodeInput(role="user" if k % 2 == 0 else "llm", id=nid, predecessor=prev, output=f"{i} {k}")
            _, fut = c.send_request("node/append", m.NodeAppendParams(session_id=sid, node=node))
            sent[i].append(nid)
            prev = nid
            fut.add_done_callback(lambda f, n=nid: acked.append(n)
                                  if not f.cancelled() and f.exception() is None else None)
            window.add(fut)
            if len(window) >= 8:
                _, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
            if killed.is_set():
                break
        if window:
            await asyncio.wait(window, timeout=10)

    async def killer() -> None:
        while len(acked) < 300:
            await asyncio.sleep(0.005)
        assert shared.pid is not None
        os.kill(shared.pid, signal.SIGKILL)
        killed.set()

    await asyncio.gather(killer(), *(work(i, c) for i, c in enumerate(clients)))
    acked_now = set(acked)
    assert len(acked_now) >= 300
    with RawDb(shared.database) as raw:
        rows = raw.execute("SELECT id, seq FROM nodes WHERE session_id=? ORDER BY seq", (sid,))
        ((next_seq, count),) = raw.execute("SELECT next_seq, node_count FROM sessions WHERE id=?", (sid,))
    stored = {r[0] for r in rows}
    assert acked_now <= stored, f"{len(acked_now - stored)} acknowledged appends lost"
    assert [r[1] for r in rows] == list(range(len(rows))) and next_seq == len(rows) and count == len(rows)
    # whatever each connection got committed is a prefix of what it sent
    for i in range(CLIENTS):
        mine = [nid for nid in sent[i] if nid in stored]
        assert mine == sent[i][: len(mine)]
    # a new daemon goes on from there, once the killed one is gone: until its process has
    # exited, its socket still takes a connection (into the backlog) and then drops it
    assert shared.pid is not None
    for _ in range(1500):
        if exited(shared.pid):
            break
        await asyncio.sleep(0.02)
    shared.pid = None
    shared.clients = []
    c2 = await shared.connect()
    more = await c2.append(sid, "user", id="after", predecessor=root, output="after the crash")
    assert more.node.seq == len(rows)


async def test_one_connection_pipelining_appends_keeps_order_and_isolates_failures(shared: SharedDaemon) -> None:
    """SPEC §1.4, §4.2: a connection's appends behind another append are handed to the writer
    before that one is answered (so they can share its group), yet each meets the rules
    after the ones sent before it and the answers come in the order sent: a refused append
    (by the rules, or by the handler before the writer: an unknown renderId) answers alone
    in its place, and an append whose counts are derived in a thread (a large payload)
    still goes to the writer before the appends sent after it (the next one names it as
    its predecessor)."""
    c = await shared.connect()
    s = await c.session_create("one connection")
    sid = s.session_id
    big = "x" * 70_000  # derived in a thread (SPEC §1.4: 64,000 characters or more)
    plan: list[tuple[str, dict[str, Any]]] = []
    prev = s.root_id
    for k in range(60):
        nid = f"p{k}"
        role = "user" if k % 2 == 0 else "llm"
        if k % 10 == 3:
            plan.append(("NodeNotFound", {"node": NodeInput(role=role, id=nid, predecessor="nope")}))
            continue
        if k % 10 == 7:
            plan.append(("InvalidParams", {"node": NodeInput(role=role, id=nid, predecessor=prev, output="r"),
                                           "renderId": "no-such-render"}))
            continue
        text = big if k % 10 == 5 else f"turn {k}"
        plan.append(("ok", {"node": NodeInput(role=role, id=nid, predecessor=prev, output=text)}))
        prev = nid
    order: list[int] = []
    futs = []
    for k, (_, p) in enumerate(plan):
        _, fut = c.send_request("node/append", m.NodeAppendParams(session_id=sid, node=p["node"],
                                                                  render_id=p.get("renderId")))
        fut.add_done_callback(lambda f, k=k: order.append(k))
        futs.append(fut)
    got = await asyncio.gather(*futs, return_exceptions=True)
    assert order == list(range(len(plan)))  # answered in the order sent
    ok_ids = []
    for (want, p), r in zip(plan, got):
        if want == "ok":
            assert isinstance(r, m.NodeResult), (p["node"].id, r)
            ok_ids.append(r.node.id)
            assert r.head == r.node.id  # each extended HEAD, as one by one
        else:
            assert isinstance(r, RpcError) and r.kind == want, (p["node"].id, r)
    assert [r.node.seq for r in got if isinstance(r, m.NodeResult)] == list(range(1, len(ok_ids) + 1))
    hist = await c.history(sid, head=ok_ids[-1])
    assert [n.id for n in hist.nodes] == ok_ids
    info = await c.session_get(sid)  # an ordered read after them sees them all
    assert info.head == ok_ids[-1] and info.node_count == len(ok_ids) + 1


async def test_cancelling_a_pipelined_append_keeps_the_answers_in_order(shared: SharedDaemon) -> None:
    """A pipelined append cancelled while it waits answers RequestCancelled in its place;
    every other append of the run is written and answered in the order sent."""
    c = await shared.connect()
    s = await c.session_create("cancel")
    sid = s.session_id
    order: list[int] = []
    futs, ids = [], []
    for k in range(40):
        node = NodeInput(role="user", id=f"q{k}", predecessor=s.root_id, output=f"fork {k}")
        msg_id, fut = c.send_request("node/append", m.NodeAppendParams(session_id=sid, node=node))
        fut.add_done_callback(lambda f, k=k: order.append(k))
        futs.append(fut)
        ids.append(msg_id)
    c.cancel(ids[30])
    got = await asyncio.gather(*futs, return_exceptions=True)
    for k, r in enumerate(got):
        if k != 30:
            assert isinstance(r, m.NodeResult), (k, r)
        else:
            assert isinstance(r, m.NodeResult) or (isinstance(r, RpcError) and r.kind == "RequestCancelled"), r
    # a cancelled answer may overtake (SPEC §1.4: answered at once); the others keep their order
    assert [k for k in order if k != 30] == [k for k in range(40) if k != 30]
    with RawDb(shared.database) as raw:
        stored = {r[0] for r in raw.execute("SELECT id FROM nodes WHERE session_id=?", (sid,))}
    assert {f"q{k}" for k in range(40) if k != 30} <= stored
    assert ("q30" in stored) == isinstance(got[30], m.NodeResult)  # "nothing was written" is true


@pytest.fixture
async def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SharedDaemon]:
    """A shared daemon on a SQLite file whose write lock a test can hold from another connection."""
    d = SharedDaemon(str(tmp_path / "held.db"))
    monkeypatch.delenv("DAGCTX_STANDALONE", raising=False)
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "60")
    monkeypatch.setenv("XDG_RUNTIME_DIR", d.run)
    monkeypatch.setenv("DAGCTX_STATE_DIR", os.path.join(d.run, "state"))
    yield d
    await d.stop()


async def test_an_append_cancelled_once_the_writer_has_it_answers_what_it_wrote(held: SharedDaemon) -> None:
    """Another connection holds the file's write lock, so the writer thread has taken the
    append and waits for the lock when the cancel comes: the append is committed once the
    lock is free, and its answer says so (SPEC §1.4) — never "cancelled, nothing was
    written". An append still queued behind it is taken out and answers RequestCancelled."""
    import sqlite3

    d, db = held, held.database
    c = await d.connect()
    other = await d.connect()
    s = await c.session_create("held")
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")  # the write lock, held
    try:
        taken_id, taken = c.send_request("node/append", m.NodeAppendParams(
            session_id=s.session_id, node=NodeInput(role="user", id="taken", predecessor=s.root_id, output="a")))
        await asyncio.sleep(0.5)  # the writer took it and waits for the lock
        queued_id, queued = other.send_request("node/append", m.NodeAppendParams(
            session_id=s.session_id, node=NodeInput(role="user", id="queued", predecessor=s.root_id, output="b")))
        await asyncio.sleep(0.2)
        c.cancel(taken_id)
        other.cancel(queued_id)
        await asyncio.sleep(0.2)
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    got = await asyncio.gather(taken, queued, return_exceptions=True)
    assert isinstance(got[0], m.NodeResult) and got[0].node.id == "taken", got[0]
    assert isinstance(got[1], RpcError) and got[1].kind == "RequestCancelled", got[1]
    with RawDb(db) as rawdb:
        stored = {r[0] for r in rawdb.execute("SELECT id FROM nodes WHERE session_id=?", (s.session_id,))}
    assert "taken" in stored and "queued" not in stored


async def test_any_write_cancelled_once_the_writer_has_it_answers_what_it_wrote(held: SharedDaemon) -> None:
    """The same for every write of the writer thread (a rename here): taken, it is
    committed and answered; still queued, it is dropped and answers RequestCancelled."""
    import sqlite3

    d, db = held, held.database
    c = await d.connect()
    other = await d.connect()
    s = await c.session_create("before")
    t = await other.session_create("other")
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    try:
        taken_id, taken = c.send_request("session/rename", m.SessionRenameParams(session_id=s.session_id, title="renamed"))
        await asyncio.sleep(0.5)
        queued_id, queued = other.send_request("session/rename", m.SessionRenameParams(session_id=t.session_id, title="dropped"))
        await asyncio.sleep(0.2)
        c.cancel(taken_id)
        other.cancel(queued_id)
        await asyncio.sleep(0.2)
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    got = await asyncio.gather(taken, queued, return_exceptions=True)
    assert not isinstance(got[0], BaseException), got[0]
    assert isinstance(got[1], RpcError) and got[1].kind == "RequestCancelled", got[1]
    assert (await other.session_get(s.session_id)).title == "renamed"
    assert (await other.session_get(t.session_id)).title == "other"


def _node_id(params: Any) -> str:
    node = params["node"] if isinstance(params, dict) else params.node
    return node["id"] if isinstance(node, dict) else node.id


def _turn_nodes(prefix: str) -> list[NodeInput]:
    """A chain of user/llm turns with a tool call, each text with a word of its own."""
    nodes: list[NodeInput] = []
    prev: str | None = None
    for k in range(12):
        nid = f"t{k}"
        text = f"{prefix}word{k} 第{'一二三四五六七八九十'[k % 10]}段 " * 2
        if k % 2 == 0:
            nodes.append(NodeInput(role="user", id=nid, predecessor=prev, input=text))
        else:
            nodes.append(NodeInput(role="llm", id=nid, predecessor=prev, output=text))
            if k % 4 == 1:
                nodes.append(NodeInput(role="code", id=f"c{k}", name="read_file", caller=nid,
                                       input={"path": f"src/m{k}.py"}, output=f"{prefix}tool{k}"))
        prev = nid
    return nodes


async def test_one_append_at_a_time_stores_what_pipelined_appends_store(shared: SharedDaemon) -> None:
    """One client awaiting each append in turn (on SQLite each is a group of one, committed
    on the daemon's loop when its writer is idle: ``Writer.run_alone``) and the same appends
    pipelined (committed in groups by the writer thread) store the same rows, seq, HEAD and
    search rows (SPEC §4.2, §5); a refused append in between changes nothing."""
    c = await shared.connect(initialization_options={"observeNodes": True})
    one, piped = await c.session_create("one at a time"), await c.session_create("pipelined")
    nodes = _turn_nodes("lone")
    for n in nodes:
        if n.predecessor is None and n.caller is None:
            n = msgspec.structs.replace(n, predecessor=one.root_id)
        await c.request("node/append", m.NodeAppendParams(session_id=one.session_id, node=n))
        # its answer went out after its own notification (written at once when alone)
        told = [params for method, params in c.notifications if method == "node/didAppend"]
        assert told and _node_id(told[-1]) == n.id, told[-1:]
        with pytest.raises(RpcError) as refused:  # a duplicate id: refused, nothing written
            await c.request("node/append", m.NodeAppendParams(session_id=one.session_id, node=n))
        assert refused.value.kind == "DuplicateNode"
    got = await _pipeline(c, piped.session_id, [msgspec.structs.replace(n, predecessor=piped.root_id)
                                                if n.predecessor is None and n.caller is None else n
                                                for n in nodes])
    assert all(isinstance(r, m.NodeResult) for r in got), got

    def stored(sid: str, root: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        with RawDb(shared.database) as raw:
            rows = raw.execute("SELECT id, seq, rev, role, name, status, caller, predecessor, tokens, refs "
                               "FROM nodes WHERE session_id=? AND id<>? ORDER BY seq", (sid, root))
            session = raw.execute("SELECT head, next_seq, rev, node_count FROM sessions WHERE id=?", (sid,))
        return [r[:7] + ("ROOT" if r[7] == root else r[7], bytes(r[8]), r[9] and bytes(r[9])) for r in rows], session

    assert stored(one.session_id, one.root_id) == stored(piped.session_id, piped.root_id)
    assert stored(one.session_id, one.root_id)[1][0][:2] == ("t11", len(nodes) + 1)
    for k in range(12):
        for sid in (one.session_id, piped.session_id):
            hits = (await c.search(f"loneword{k}", session_id=sid)).hits
            assert [h.node_id for h in hits] == [f"t{k}"], (k, hits)
    for k in (1, 5, 9):
        assert {h.session_id for h in (await c.search(f"lonetool{k}")).hits} == {one.session_id, piped.session_id}


async def test_a_lone_append_meeting_another_process_lock_waits_in_the_writer(held: SharedDaemon) -> None:
    """Another process holds the write lock when a lone append comes: it is not committed on
    the daemon's loop (which would wait there), but by the writer thread once the lock is
    free — meanwhile the loop answers other requests — and it is acknowledged as written."""
    import sqlite3

    d, db = held, held.database
    c = await d.connect()
    other = await d.connect()
    s = await c.session_create("held")
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    try:
        _, pending = c.send_request("node/append", m.NodeAppendParams(
            session_id=s.session_id, node=NodeInput(role="user", id="waited", predecessor=s.root_id, output="a")))
        await asyncio.sleep(0.3)
        status = await other.daemon_status()  # answered on the loop while the append waits
        assert status.pid == d.pid
        assert not pending.done()
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    got = await pending
    assert isinstance(got, m.NodeResult) and (got.node.id, got.node.seq, got.head) == ("waited", 1, "waited")
    with RawDb(db) as rawdb:
        assert rawdb.execute("SELECT id, seq FROM nodes WHERE session_id=? AND seq>0", (s.session_id,)) == [
            ("waited", 1)]


def _corked(c: DagctxClient) -> Any:
    """Hold what ``c`` sends until the returned function is called: then one write carries
    it all, so the daemon reads the frames together (SPEC §1.4, §4.2)."""
    sent: list[bytes] = []
    c._writer.write = sent.append  # type: ignore[method-assign]

    def flush() -> None:
        del c._writer.write
        c._writer.write(b"".join(sent))

    return flush


async def test_appends_read_together_keep_their_order_rules_and_errors(shared: SharedDaemon) -> None:
    """A run of appends that reaches the daemon in one read is handed to the writer as the
    frames are dispatched (an append with more frames behind it does not wait for a turn of
    the event loop), yet each meets the rules after those sent before it and is answered in
    its place: a refused one (by the rules, or before the writer: an unknown renderId)
    alone, one counted in a thread (a big payload) before those after it."""
    c = await shared.connect()
    s = await c.session_create("one read")
    sid = s.session_id
    plan: list[tuple[str, m.NodeAppendParams]] = []
    prev = s.root_id
    for k in range(48):
        nid, role = f"r{k}", ("user" if k % 2 == 0 else "llm")
        if k % 12 == 4:
            plan.append(("DuplicateNode", m.NodeAppendParams(session_id=sid, node=NodeInput(
                role=role, id=f"r{k - 1}", predecessor=prev, output="again"))))
            continue
        if k % 12 == 9:
            plan.append(("InvalidParams", m.NodeAppendParams(session_id=sid, render_id="no-such-render", node=NodeInput(
                role=role, id=nid, predecessor=prev, output="r"))))
            continue
        text = "y" * 70_000 if k % 12 == 6 else f"read together {k} 第{k}段"
        plan.append(("ok", m.NodeAppendParams(session_id=sid, node=NodeInput(role=role, id=nid, predecessor=prev,
                                                                             output=text))))
        prev = nid
    flush = _corked(c)
    order: list[int] = []
    futs = []
    for k, (_, p) in enumerate(plan):
        fut = c.send_request("node/append", p)[1]
        fut.add_done_callback(lambda f, k=k: order.append(k))
        futs.append(fut)
    flush()
    got = await asyncio.gather(*futs, return_exceptions=True)
    assert order == list(range(len(plan)))
    ok_ids = []
    for (want, p), r in zip(plan, got):
        if want == "ok":
            assert isinstance(r, m.NodeResult) and r.head == r.node.id == p.node.id, (p.node.id, r)
            ok_ids.append(r.node.id)
        else:
            assert isinstance(r, RpcError) and r.kind == want, (p.node.id, r)
    assert [r.node.seq for r in got if isinstance(r, m.NodeResult)] == list(range(1, len(ok_ids) + 1))
    assert [n.id for n in (await c.history(sid)).nodes] == ok_ids
    with RawDb(shared.database) as raw:
        rows = raw.execute("SELECT id, tokens FROM nodes WHERE session_id=? AND seq>0 ORDER BY seq", (sid,))
    assert [r[0] for r in rows] == ok_ids and all(r[1] is not None for r in rows)  # counted, by the writer
    for k in (0, 13, 25):
        assert [h.node_id for h in (await c.search(f"第{k}段", session_id=sid)).hits] == [f"r{k}"]


async def test_an_append_read_with_others_is_taken_out_when_cancelled_in_the_queue(held: SharedDaemon) -> None:
    """The writer waits for another process's lock with one append; two more arrive in one
    read, the first handed to the writer's queue at once. Cancelled there, it is taken out
    and answers RequestCancelled ("nothing was written" holds); the append that holds the
    lock's wait and the one after it are committed and answered in order (SPEC §1.4)."""
    import sqlite3

    d, db = held, held.database
    c = await d.connect()
    s = await c.session_create("held")
    sid = s.session_id
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    try:
        _, first = c.send_request("node/append", m.NodeAppendParams(
            session_id=sid, node=NodeInput(role="user", id="first", predecessor=s.root_id, output="a")))
        await asyncio.sleep(0.5)  # the writer took it and waits for the lock
        flush = _corked(c)
        dropped_id, dropped = c.send_request("node/append", m.NodeAppendParams(
            session_id=sid, node=NodeInput(role="user", id="dropped", predecessor=s.root_id, output="b")))
        _, last = c.send_request("node/append", m.NodeAppendParams(
            session_id=sid, node=NodeInput(role="llm", id="last", predecessor="first", output="c")))
        flush()
        await asyncio.sleep(0.3)
        c.cancel(dropped_id)
        await asyncio.sleep(0.2)
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    got = await asyncio.gather(first, dropped, last, return_exceptions=True)
    assert isinstance(got[0], m.NodeResult) and got[0].node.seq == 1, got[0]
    assert isinstance(got[1], RpcError) and got[1].kind == "RequestCancelled", got[1]
    assert isinstance(got[2], m.NodeResult) and (got[2].node.seq, got[2].head) == (2, "last"), got[2]
    with RawDb(db) as rawdb:
        assert rawdb.execute("SELECT id, seq FROM nodes WHERE session_id=? AND seq>0 ORDER BY seq", (sid,)) == [
            ("first", 1), ("last", 2)]
