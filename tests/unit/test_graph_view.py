"""``session/graph`` as a pure view (SPEC §4.1): coverage restates stored data."""

from __future__ import annotations

from typing import Any

from graph_builder import GraphBuilder

from dagctx.context.graph_view import coverage, folded_ids, graph_page
from dagctx.context.render import render_view
from dagctx.protocol.nodes import SUMMARY_NAME


def _session() -> GraphBuilder:
    """u1 l1(t1) u2 l2(t2) u3 l3; a retry l1b of l1 (fork at u1); a summary S1 of [u1 l1 u2 l2]."""
    b = GraphBuilder()
    b.add("u1", "user", output="first question", predecessor="root")
    b.add("l1", "llm", name="m", output="answer one", predecessor="u1")
    b.add("t1", "code", name="bash", input={"cmd": "ls"}, output="a.py", caller="l1",
          metadata={"toolCallId": "c1"})
    b.add("u2", "user", output="second", predecessor="l1")
    b.add("l2", "llm", name="m", output="answer two", predecessor="u2")
    b.add("t2", "code", name="grep", input={"q": "x"}, output="big " * 10, caller="l2",
          metadata={"toolCallId": "c2", "spill": {"chars": 90000, "lines": 4000}})
    b.add("u3", "user", output="third", predecessor="l2")
    b.add("l3", "llm", name="m", output="answer three", predecessor="u3",
          metadata={"renderManifest": {"head": "u3", "aged": ["t1"]}})
    b.add("l1b", "llm", name="m", output="retry of one", predecessor="u1")
    return b


def _summary(b: GraphBuilder, sid: str, covers: list[str], predecessor: str = "root") -> None:
    b.add(sid, "llm", name=SUMMARY_NAME, output="[Previous conversation summary]\n…", predecessor=predecessor,
          metadata={"covers_ids": covers, "compaction": True})


def _rows(b: GraphBuilder, **kw: Any) -> dict[str, Any]:
    heads = b.g.tips()
    rows, _, cov = graph_page(b.g, heads, **kw)
    return {"rows": {r.id: r for r in rows}, "cov": cov}


def test_active_summary_row_covers_its_ids_and_their_tool_calls() -> None:
    b = _session()
    _summary(b, "S1", ["u1", "l1", "u2", "l2"])
    out = _rows(b)
    s1 = out["rows"]["S1"]
    assert s1.summary and s1.covers_ids == ["u1", "l1", "t1", "u2", "l2", "t2"]
    assert s1.active_for == ["l3"] and not s1.superseded_summary
    # the fork at u1 does not hold the segment: it renders raw, the graph says so
    assert out["cov"].by_head == {"l3": "S1", "l1b": None}
    # no other row carries coverage
    assert [r.id for r in out["rows"].values() if r.covers_ids is not None] == ["S1"]


def test_the_graph_states_exactly_what_each_render_uses() -> None:
    b = _session()
    _summary(b, "S1", ["u1", "l1"])
    _summary(b, "S2", ["u1", "l1", "u2", "l2"])
    cov = coverage(b.g, b.g.tips())
    for head in b.g.tips():
        assert cov.by_head[head] == render_view(b.g, head).summary_id


def test_a_rolled_summary_is_superseded_without_coverage() -> None:
    b = _session()
    _summary(b, "S1", ["u1", "l1"])
    _summary(b, "S2", ["u1", "l1", "u2", "l2"])
    rows = _rows(b)["rows"]
    assert rows["S1"].superseded_summary and rows["S1"].covers_ids is None and rows["S1"].active_for is None
    assert rows["S2"].covers_ids == ["u1", "l1", "t1", "u2", "l2", "t2"]


def test_a_summary_active_on_one_branch_is_not_superseded_by_another_branch() -> None:
    b = _session()
    _summary(b, "S1", ["u1", "l1b"])  # covers the fork's segment only
    _summary(b, "S2", ["u1", "l1"])   # newer, main lane
    rows = _rows(b)["rows"]
    assert rows["S1"].active_for == ["l1b"] and not rows["S1"].superseded_summary
    assert rows["S2"].active_for == ["l3"]


def test_marks_spill_aging_and_replay_from_stored_data() -> None:
    b = _session()
    rows = _rows(b)["rows"]
    assert rows["t2"].spilled_chars == 90000 and rows["t1"].spilled_chars is None
    assert rows["t1"].aged_by == "l3" and rows["t2"].aged_by is None
    assert rows["l3"].replayable and not rows["l1"].replayable
    assert (rows["l1"].aged_calls, rows["l1"].spilled_calls) == (1, 0)
    assert (rows["l2"].aged_calls, rows["l2"].spilled_calls) == (0, 1) and rows["root"].spilled_calls == 0
    assert rows["t1"].tool_call_id == "c1" and rows["l1"].callees == 1
    assert rows["t1"].preview.startswith('bash({"cmd":"ls"}) → a.py')
    b.add("sp", "user", output="subagent task", caller="t1", metadata={"spawn_branch_root": True})
    sp = _rows(b)["rows"]["sp"]
    assert sp.spawn_root and sp.spawned_from == "l1" and sp.conversation


def test_pages_by_seq_cover_every_node_once() -> None:
    b = _session()
    _summary(b, "S1", ["u1", "l1"])
    seen: list[str] = []
    after = -1
    while True:
        rows, nxt, _ = graph_page(b.g, b.g.tips(), after_seq=after, limit=3)
        seen += [r.id for r in rows]
        if nxt is None:
            break
        after = nxt
    assert seen == [n.id for n in b.g.by_seq]
    conv, _, _ = graph_page(b.g, b.g.tips(), conversation_only=True)
    assert [r.id for r in conv] == ["root", "u1", "l1", "u2", "l2", "u3", "l3", "l1b", "S1"]


def test_folded_ids_leave_out_ids_that_no_longer_exist() -> None:
    b = _session()
    assert folded_ids(b.g, ["u1", "gone", "l1", "u1"]) == ["u1", "l1", "t1"]
