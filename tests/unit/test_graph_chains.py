"""SessionGraph walks that share work: a fork reuses the last chain's prefix; chain lengths
for every tip in one pass (what session/branches and session/graph ask of many tips)."""

from __future__ import annotations

import pytest

from graph_builder import GraphBuilder

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call


def _long_with_forks() -> GraphBuilder:
    b = GraphBuilder()
    prev = "root"
    for i in range(200):
        role = "user" if i % 2 == 0 else "llm"
        prev = b.add(f"n{i}", role, output=str(i), predecessor=prev)
        if i % 40 == 39:
            b.add(f"r{i}", "llm", output="retry", predecessor=f"n{i - 1}")
    return b


def _fresh_chain(g: SessionGraph, head: str) -> list[str]:
    """The same walk on a graph that has never walked (no reuse)."""
    h = SessionGraph(g.session_id, g.root_id)
    h.add_all(g.by_seq)
    return [n.id for n in h.chain(head)]


def test_forks_share_the_last_chain_and_walk_the_same() -> None:
    g = _long_with_forks().g
    tips = g.tips()
    assert len(tips) == 6
    for order in (tips, list(reversed(tips)), tips[::2] + tips[1::2]):
        for tip in order:
            assert [n.id for n in g.chain(tip)] == _fresh_chain(g, tip)
    # a head in the middle of the last chain is its prefix
    g.chain("n199")
    assert [n.id for n in g.chain("n100")] == [f"n{i}" for i in range(101)]


def test_chain_spans_give_every_tips_length_and_first_node() -> None:
    b = _long_with_forks()
    b.add("sp", "user", output="task", caller="n3", metadata={"spawn_branch_root": True})
    b.add("sp1", "llm", output="done", predecessor="sp")
    g = b.g
    spans = g.chain_spans()
    for tip in g.tips():
        chain = g.chain(tip)
        assert spans[tip] == (len(chain), chain[0].id)
    assert spans["sp1"] == (2, "sp")


def test_a_broken_chain_still_raises_after_a_reused_walk() -> None:
    g = _long_with_forks().g
    g.chain("n199")
    g.add(Call(id="orphan", seq=10_000, created_at=0.0, role="llm", predecessor="missing"))
    assert "orphan" not in g.chain_spans()
    with pytest.raises(DagctxError) as err:
        g.chain("orphan")
    assert err.value.kind == "BrokenPredecessorChain"
