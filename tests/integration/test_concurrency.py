"""Several daemons on one database, and a daemon killed with SIGKILL mid-stream (both backends).

SPEC §4: seq assignment and HEAD moves are transactional across processes, a daemon
notices another process's writes before it answers, and an acknowledged write
survives ``kill -9``.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from rawdb import RawDb
from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

TURNS = 60  # per daemon; each turn is a user node, an llm node and sometimes a tool call


@pytest.fixture
def db_path(database: str) -> str:
    """Every test here runs on both backends: a SQLite file, then a PostgreSQL database."""
    return database


def file_state(db: Path | str, sid: str) -> dict:
    con = RawDb(db)
    try:
        seqs = [r[0] for r in con.execute("SELECT seq FROM nodes WHERE session_id=? ORDER BY seq", (sid,))]
        ids = [r[0] for r in con.execute("SELECT id FROM nodes WHERE session_id=?", (sid,))]
        ((node_count, next_seq, head),) = con.execute(
            "SELECT node_count, next_seq, head FROM sessions WHERE id=?", (sid,)
        )
        fts = con.execute("SELECT count(*) FROM nodes WHERE session_id=? AND search_vec IS NOT NULL" if con.pg
                          else "SELECT count(*) FROM search WHERE session_id=?", (sid,))[0][0]
        return {"seqs": seqs, "ids": ids, "node_count": node_count, "next_seq": next_seq, "head": head, "fts": fts}
    finally:
        con.close()


async def test_two_daemons_append_to_one_session(db_path: Path) -> None:
    a = await DagctxClient.spawn(db_path)
    b = await DagctxClient.spawn(db_path)
    try:
        s = await a.session_create("shared")
        sid, root = s.session_id, s.root_id
        # b has never seen this session: it must find it in the file.
        assert (await b.session_get(sid)).head == root

        acked: dict[str, list[str]] = {"a": [], "b": []}
        turns: dict[str, list[str]] = {"a": [], "b": []}  # the conversation nodes only
        latest: dict[str, str | None] = {"a": None, "b": None}
        cross: list[tuple[str, str, str]] = []  # (writer, node id, the other daemon's node it points at)

        rounds = asyncio.Barrier(2)

        async def writer(name: str, c: DagctxClient, other: str) -> str:
            tip = root
            for i in range(TURNS):
                u = await c.append(sid, "user", input=f"{name} question {i}", predecessor=tip, move_head=False)
                acked[name].append(u.node.id)
                turns[name].append(u.node.id)
                latest[name] = u.node.id
                r = await c.append(sid, "llm", output=f"{name} answer {i}", predecessor=u.node.id, move_head=False)
                acked[name].append(r.node.id)
                turns[name].append(r.node.id)
                latest[name] = r.node.id
                tip = r.node.id
                seen = latest[other]
                if i % 7 == 3 and seen is not None:
                    # A node the other daemon acknowledged a moment ago must already be visible
                    # here: name it as this tool call's reads.
                    t = await c.append(sid, "code", name="peek", caller=r.node.id, reads=[seen],
                                       output=f"saw {seen}", move_head=False)
                    acked[name].append(t.node.id)
                    cross.append((name, t.node.id, seen))
                # The writers go in rounds: each round's appends race between the two daemons,
                # and no writer runs ahead by more than a round. Left to the scheduler, SQLite's
                # busy-wait backoff let one writer hold the lock for long runs, and on a loaded
                # machine one daemon could write nearly all its turns before the other began.
                await rounds.wait()
            return tip

        tip_a, tip_b = await asyncio.wait_for(
            asyncio.gather(writer("a", a, "b"), writer("b", b, "a")), 60
        )
        everything = acked["a"] + acked["b"]
        assert len(everything) == len(set(everything))
        assert cross, "the writers never overlapped"

        # The file: no duplicate seq, contiguous seqs, counts add up, HEAD never moved.
        st = file_state(db_path, sid)
        assert len(st["seqs"]) == len(set(st["seqs"])) == 1 + len(everything)
        assert st["seqs"] == list(range(len(st["seqs"])))
        assert st["node_count"] == st["next_seq"] == len(st["seqs"])
        assert set(st["ids"]) == set(everything) | {root}
        assert st["fts"] == len(everything)
        assert st["head"] == root
        # The two writers really interleaved in the file: every round holds both writers'
        # nodes, so the seq order switches writer at least once a round.
        owner = {nid: "a" for nid in acked["a"]} | {nid: "b" for nid in acked["b"]}
        with RawDb(db_path) as con:
            order = [owner[r[0]] for r in con.execute(
                "SELECT id FROM nodes WHERE session_id=? AND seq>0 ORDER BY seq", (sid,))]
        assert sum(x != y for x, y in zip(order, order[1:])) >= TURNS - 1

        # Each daemon sees every node, its own and the other's, before answering.
        for c in (a, b):
            got = await c.get_nodes(sid, everything)
            assert [n.id for n in got.nodes] == everything
            assert len({n.seq for n in got.nodes}) == len(everything)
            info = await c.session_get(sid)
            assert info.node_count == len(st["seqs"]) and info.head == root
            for tip, name in ((tip_a, "a"), (tip_b, "b")):
                h = await c.history(sid, tip)
                assert [n.id for n in h.nodes] == turns[name]
                assert all(n.input is None or n.input.startswith(name) for n in h.nodes)
            br = await c.branches(sid)
            assert {x.head for x in br.branches} == {tip_a, tip_b}
            assert all(x.length == 2 * TURNS for x in br.branches)
        for name, tid, seen in cross:
            (node,) = (await (b if name == "a" else a).get_nodes(sid, [tid])).nodes
            assert node.reads == [seen]

        # A HEAD move by one daemon is what the other reports next.
        await a.checkout(sid, tip_b)
        assert (await b.session_get(sid)).head == tip_b
        nxt = await b.append(sid, "user", input="b continues a's checkout", predecessor=tip_b)
        assert nxt.head == nxt.node.id
        assert (await a.history(sid)).nodes[-1].id == nxt.node.id
        # Two daemons racing to extend the same HEAD: both acknowledged, distinct seqs, one HEAD.
        r1, r2 = await asyncio.gather(
            a.append(sid, "llm", output="from a", predecessor=nxt.node.id),
            b.append(sid, "llm", output="from b", predecessor=nxt.node.id),
        )
        assert r1.node.seq != r2.node.seq
        final = (await a.session_get(sid)).head
        assert final in (r1.node.id, r2.node.id) and (await b.session_get(sid)).head == final
        assert {x.head for x in (await b.branches(sid)).branches} >= {r1.node.id, r2.node.id}
    finally:
        assert await a.close() == 0
        assert await b.close() == 0


async def test_two_daemons_creating_sessions(db_path: Path) -> None:
    a = await DagctxClient.spawn(db_path)
    b = await DagctxClient.spawn(db_path)
    try:
        made = await asyncio.gather(*[(a if i % 2 else b).session_create(f"s{i}") for i in range(40)])
        ids = {x.session_id for x in made}
        assert len(ids) == 40
        for c in (a, b):
            listed = await c.session_list(limit=100)
            assert listed.total == 40 and {x.session_id for x in listed.sessions} == ids
        # A session deleted by one daemon is gone for the other.
        victim = made[0].session_id
        await a.session_delete(victim)
        try:
            await b.history(victim)
        except RpcError as e:
            assert e.kind == "SessionNotFound"
        else:
            raise AssertionError("b still served a deleted session")
    finally:
        await a.close()
        await b.close()


async def test_kill_9_keeps_every_acknowledged_append(db_path: Path) -> None:
    c = await DagctxClient.spawn(db_path)
    s = await c.session_create("killed")
    sid = s.session_id
    total, window, kill_after = 400, 16, 150
    acked: list[str] = []
    sent: list[str] = []
    in_flight: set[asyncio.Future] = set()
    killed = False
    prev = s.head
    for i in range(total):
        nid = f"k{i:04d}"
        role = "user" if i % 2 == 0 else "llm"
        node = NodeInput(role=role, id=nid, predecessor=prev,
                         **({"input": f"message {i}"} if role == "user" else {"output": f"reply {i}"}))
        try:
            _, fut = c.send_request("node/append", m.NodeAppendParams(session_id=sid, node=node))
        except (ConnectionError, RuntimeError):
            break
        sent.append(nid)
        prev = nid
        fut.add_done_callback(lambda f, n=nid: acked.append(n) if not f.cancelled() and f.exception() is None else None)
        in_flight.add(fut)
        if len(in_flight) >= window:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        if not killed and len(acked) >= kill_after:
            assert c.process is not None
            c.process.send_signal(signal.SIGKILL)
            killed = True
        if killed and c.closed.done():
            break
    assert killed
    if in_flight:  # every request still in flight fails: the connection is gone
        await asyncio.wait(in_flight, timeout=10)
    assert await c.wait(10) == -signal.SIGKILL
    assert len(acked) >= kill_after
    assert len(sent) > len(acked), "requests were still in flight when the daemon died"
    acked_now = list(acked)

    # The order of acknowledgements is the order of the chain.
    assert acked_now == sent[: len(acked_now)]

    c2 = await DagctxClient.spawn(db_path)
    try:
        got = await c2.get_nodes(sid, acked_now)
        assert [n.id for n in got.nodes] == acked_now
        info = await c2.session_get(sid)
        hist = await c2.history(sid)
        # Whatever was committed is a whole prefix of what was sent, and HEAD is its end.
        chain = [n.id for n in hist.nodes]
        assert chain == sent[: len(chain)] and len(chain) >= len(acked_now)
        assert info.head == chain[-1] and info.node_count == len(chain) + 1
        st = file_state(db_path, sid)
        assert st["seqs"] == list(range(len(chain) + 1)) and st["fts"] == len(chain)
        # The ledger goes on from there.
        more = await c2.append(sid, "user", input="after the crash", predecessor=info.head)
        assert more.node.seq == len(chain) + 1
    finally:
        assert await c2.close() == 0
