"""``session/graph`` on a real daemon (SPEC §4.1): a real compaction, a fork, paging, errors."""

from __future__ import annotations

from pathlib import Path

import re

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import context_messages as pc

from sampling_stub import ScriptedSampler, request_text

MODELS = {"small-32k": {"contextWindow": 32000, "maxOutput": 4000}}


async def _long_session(c: DagctxClient, turns: int = 8) -> tuple[str, list[str], dict[str, str]]:
    s = await c.session_create("graph")
    tip = s.head
    chain: list[str] = []
    tools: dict[str, str] = {}
    for i in range(turns):
        u = await c.append(s.session_id, "user", output=f"turn {i}: please look at src/mod_{i}.py " + "word " * 300,
                           predecessor=tip)
        llm = await c.append(s.session_id, "llm", name="small-32k", output=f"looked at mod_{i} " + "text " * 300,
                             predecessor=u.head)
        t = await c.append(s.session_id, "code", name="bash", input={"cmd": f"cat src/mod_{i}.py"},
                           output="line\n" * 50, caller=llm.node.id, metadata={"toolCallId": f"call_{i}"})
        tools[llm.node.id] = t.node.id
        chain += [u.node.id, llm.node.id]
        tip = llm.head
    return s.session_id, chain, tools


async def test_graph_restates_a_real_compaction_and_a_fork(tmp_path: Path) -> None:
    # a summary that keeps every identifier of what it covers (the retention check passes)
    sampler = ScriptedSampler(lambda p: "## Summary\nFiles: " + " ".join(
        sorted(set(re.findall(r"src/mod_\d+\.py|mod_\d+|call_\d+", request_text(p))))))
    c = await DagctxClient.spawn(tmp_path / "g.db", capabilities={"sampling": {}},
                                 initialization_options={"models": MODELS})
    c.on_request("sampling/createMessage", sampler)
    try:
        sid, chain, tools = await _long_session(c)
        res = await c.compact(sid, model="small-32k", keep_recent_tokens=800)
        assert res.ok, res
        # a fork from inside the covered segment: it does not hold the segment, renders raw
        fork = await c.append(sid, "llm", name="small-32k", output="another answer", predecessor=chain[0])

        g = await c.graph(sid)
        rows = {r.id: r for r in g.nodes}
        summary = rows[res.summary_id]
        expected = [x for cid in res.covers_ids for x in ([cid, tools[cid]] if cid in tools else [cid])]
        assert summary.summary and summary.covers_ids == expected
        by_head = {h.head: h.summary_id for h in g.heads}
        main_tip = chain[-1]
        assert by_head[main_tip] == res.summary_id and by_head[fork.node.id] is None
        assert summary.active_for == [main_tip]
        # the graph and the render agree on every head
        for head, sid_used in by_head.items():
            r = await c.render(sid, head=head)
            assert r.manifest["summaryId"] == sid_used
        assert {b.head for b in g.branches} == {main_tip, fork.node.id}
        assert g.head == main_tip and g.total == len(rows) and g.next_after_seq is None

        # compacting again rolls the summary: the old one is superseded, without coverage
        more = await c.append(sid, "user", output="one more " + "word " * 400, predecessor=main_tip)
        await c.append(sid, "llm", name="small-32k", output="ok " + "text " * 400, predecessor=more.head)
        again = await c.compact(sid, model="small-32k", keep_recent_tokens=400)
        assert again.ok and again.superseded_summary == res.summary_id
        rows = {r.id: r for r in (await c.graph(sid)).nodes}
        assert rows[res.summary_id].superseded_summary and rows[res.summary_id].covers_ids is None
        assert rows[again.summary_id].covers_ids[: len(expected)] == expected

        # writes after the graph was asked (a turn, a tool call, a retry of the last reply):
        # what the daemon kept of the last state is carried over; every head still says
        # what its render uses
        tip = (await c.session_get(sid)).head
        more2 = await c.append(sid, "user", output="and one more " + "word " * 50, predecessor=tip)
        last = await c.append(sid, "llm", name="small-32k", output="fine", predecessor=more2.head)
        await c.append(sid, "code", name="bash", output="ok", caller=last.node.id, metadata={"toolCallId": "c9"})
        retry = await c.append(sid, "llm", name="small-32k", output="fine, again", predecessor=more2.node.id)
        g3 = await c.graph(sid)
        by_head = {h.head: h.summary_id for h in g3.heads}
        assert by_head[last.node.id] == again.summary_id and by_head[retry.node.id] == again.summary_id
        assert by_head[fork.node.id] is None
        for head, sid_used in by_head.items():
            r = await c.render(sid, head=head)
            assert r.manifest["summaryId"] == sid_used
        rows = {r.id: r for r in g3.nodes}

        # pages by seq: every node once, in seq order
        seen, after = [], -1
        while True:
            page = await c.graph(sid, after_seq=after, limit=7)
            seen += [(r.seq, r.id) for r in page.nodes]
            if page.next_after_seq is None:
                break
            after = page.next_after_seq
        assert [i for _, i in seen] == list(rows) and [s for s, _ in seen] == sorted(s for s, _ in seen)
        conv = await c.graph(sid, conversation_only=True, limit=20_000)
        assert not any(r.id in tools.values() for r in conv.nodes) and conv.nodes[2].callees == 1
    finally:
        await c.close()


async def test_graph_refuses_bad_heads_and_sessions(daemon: DagctxClient) -> None:
    c = daemon
    s = await c.session_create("bad")
    u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
    llm = await c.append(s.session_id, "llm", name="m", output="hello", predecessor=u.head)
    t = await c.append(s.session_id, "code", name="bash", output="x", caller=llm.node.id,
                       metadata={"toolCallId": "c1"})
    with pytest.raises(RpcError) as err:
        await c.graph(s.session_id, heads=[t.node.id])
    assert err.value.kind == "InvalidParams" and llm.node.id in err.value.message
    with pytest.raises(RpcError) as err:
        await c.graph(s.session_id, heads=["nope"])
    assert err.value.kind == "NodeNotFound"
    with pytest.raises(RpcError) as err:
        await c.graph("no-such-session")
    assert err.value.kind == "SessionNotFound"
    with pytest.raises(RpcError) as err:
        await c.request("session/graph", {"sessionId": s.session_id, "limit": 0})
    assert err.value.code == -32602
    g = await c.graph(s.session_id, heads=[u.node.id])
    assert [h.head for h in g.heads] == [u.node.id] and g.nodes[0].id == s.root_id
    _ = pc  # the context types are part of this module's vocabulary (compact results)
