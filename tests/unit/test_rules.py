"""The ledger's rules on a bare SessionGraph: no store, no database."""

from __future__ import annotations

import pytest

from dagctx.ledger import rules
from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call, NodeInput


def graph() -> SessionGraph:
    """ROOT ← u1 ← a1 (which called tool t1) ← u2, plus a fork a1b of u1."""
    g = SessionGraph("s", "r")
    nodes = [
        Call(id="r", seq=0, created_at=0, role="user", name="ROOT", metadata={"display": "root"}),
        Call(id="u1", seq=1, created_at=0, role="user", name="user", predecessor="r"),
        Call(id="a1", seq=2, created_at=0, role="llm", name="llm", predecessor="u1"),
        Call(id="t1", seq=3, created_at=0, role="code", name="read", caller="a1", status="running"),
        Call(id="u2", seq=4, created_at=0, role="user", name="user", predecessor="a1"),
        Call(id="a1b", seq=5, created_at=0, role="llm", name="llm", predecessor="u1"),
    ]
    for n in nodes:
        g.add(n)
    return g


def kind(fn, *args, **kw) -> str:
    with pytest.raises(DagctxError) as info:
        fn(*args, **kw)
    return info.value.kind


def edges(g: SessionGraph, inp: NodeInput, head: str = "u2") -> None:
    rules.check_edges(g, head, inp.id, inp, rules.resolve("r", inp.predecessor), rules.resolve("r", inp.caller))


def test_ids_are_unique_and_well_formed() -> None:
    g = graph()
    assert kind(rules.check_new_id, g, "u1") == "DuplicateNode"
    assert kind(rules.check_new_id, g, "ROOT") == "DuplicateNode"
    assert kind(rules.check_new_id, g, "bad\nid") == "InvalidParams"
    rules.check_new_id(g, "fresh")


def test_edge_rules() -> None:
    g = graph()
    assert kind(edges, g, NodeInput(role="user", input="x")) == "PredecessorMissing"
    assert kind(edges, g, NodeInput(role="user", input="x", predecessor="ghost")) == "NodeNotFound"
    assert kind(edges, g, NodeInput(role="user", input="x", predecessor="t1")) == "InvalidEdge"
    assert kind(edges, g, NodeInput(role="code", name="x", caller="a1", predecessor="u2")) == "InvalidEdge"
    assert kind(edges, g, NodeInput(role="code", name="x", caller="ghost")) == "NodeNotFound"
    assert kind(edges, g, NodeInput(role="user", input="x", predecessor="u2", reads=["nope"])) == "NodeNotFound"
    assert kind(edges, g, NodeInput(role="user", input="x", caller="r",
                                    metadata={"spawn_branch_root": True})) == "InvalidEdge"
    summary = NodeInput(role="llm", name="context/summary", predecessor="u2", metadata={"covers_ids": ["t1"]})
    assert kind(edges, g, summary) == "InvalidEdge"
    edges(g, NodeInput(role="llm", name="context/summary", predecessor="u2", metadata={"covers_ids": ["u1", "a1"]}))
    edges(g, NodeInput(role="user", input="answer", caller="t1"))  # an ask-user answer
    edges(g, NodeInput(role="code", name="x", caller="a1"))
    edges(g, NodeInput(role="user", input="x", predecessor="ROOT"))


def test_head_follows_an_extending_append_only() -> None:
    g = graph()
    ext = Call(id="a2", seq=6, created_at=0, role="llm", name="llm", predecessor="u2")
    fork = Call(id="u3", seq=6, created_at=0, role="user", name="user", predecessor="a1b")
    nested = Call(id="t2", seq=6, created_at=0, role="code", name="x", caller="a1")
    for c in (ext, fork, nested):
        g.add(c)
    assert rules.head_after_append(g, "u2", ext, None) == ("a2", True)
    assert rules.head_after_append(g, "u2", ext, False) == ("u2", False)
    assert rules.head_after_append(g, "u2", fork, None) == ("u2", False)
    assert rules.head_after_append(g, "u2", fork, True) == ("u3", True)
    assert rules.head_after_append(g, "u2", nested, None) == ("u2", False)
    assert kind(rules.head_after_append, g, "u2", nested, True) == "InvalidEdge"


def test_head_targets_and_rewinds() -> None:
    g = graph()
    assert kind(rules.check_head_target, g, g.get("t1")) == "InvalidEdge"
    rules.check_head_target(g, g.get("a1b"))
    assert rules.rewind_target(g, "u2", None, 2) == "u1"
    assert rules.rewind_target(g, "u2", "ROOT", None) == "r"
    assert kind(rules.rewind_target, g, "u2", "a1b", None) == "InvalidEdge"
    assert kind(rules.rewind_target, g, "u2", None, 9) == "InvalidParams"
    assert kind(rules.rewind_target, g, "u2", "u1", 1) == "InvalidParams"


def test_only_a_running_node_is_finished() -> None:
    g = graph()
    rules.check_update("s", g.get("t1"), "completed")
    assert kind(rules.check_update, "s", g.get("t1"), "running") == "InvalidParams"
    assert kind(rules.check_update, "s", g.get("a1"), "completed") == "NotRunning"


def test_branch_names_follow_their_tip() -> None:
    names = {"u2": "feature"}
    rules.move_branch_name(names, "u2", "a2")
    assert names == {"a2": "feature"}
