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


def test_tips_spans_and_main_tip_kept_between_writes_are_those_of_a_fresh_pass() -> None:
    # tips, chain spans and the main lane's tip are kept and extended by the nodes appended since; after every
    # write (turns, forks, tool calls, spawned branches, summaries beside the chain, a
    # running node finished) they equal one pass over a graph that never kept them
    import random

    from dagctx.protocol.nodes import SUMMARY_NAME

    def fresh(g: SessionGraph) -> tuple[list[str], dict[str, tuple[int, str]], str]:
        h = SessionGraph(g.session_id, g.root_id)
        h.add_all(g.by_seq)
        want_tips = [n.id for n in h.by_seq if n.id != h.root_id and h.is_conversation(n)
                     and not h.conv_children.get(n.id)] or [h.root_id]
        main = h.root_id
        while kids := h.conv_children.get(main):
            main = kids[0]
        return want_tips, h.chain_spans(), main

    rng = random.Random(7)
    extended = 0
    for _ in range(40):
        b = GraphBuilder()
        conv = ["root"]
        for i in range(rng.randint(5, 80)):
            r = rng.random()
            if r < 0.5:
                conv.append(b.add(f"n{i}", "user", output="x", predecessor=rng.choice([conv[-1], *conv[-5:]])))
            elif r < 0.65 and len(conv) > 1:
                b.add(f"t{i}", "code", name="bash", output="ok", caller=rng.choice(conv[1:]))
            elif r < 0.75 and len(conv) > 1:
                conv.append(b.add(f"sp{i}", "user", output="task", caller=rng.choice(conv[1:]),
                                  metadata={"spawn_branch_root": True}))
            elif r < 0.85:
                b.add(f"S{i}", "llm", name=SUMMARY_NAME, output="s", predecessor="root",
                      metadata={"covers_ids": conv[1:3]})
            else:
                running = b.add(f"r{i}", "llm", output=None, predecessor=conv[-1], status="running")
                conv.append(running)
                old = b.g.nodes[running]
                b.g.add(Call(id=old.id, seq=old.seq, created_at=old.created_at, role="llm", output="done",
                             predecessor=old.predecessor))
            before = b.g._shape
            assert (b.g.tips(), b.g.chain_spans(), b.g.main_tip()) == fresh(b.g)
            extended += before is not None and b.g._shape is not None and before[0][1] == b.g._shape[0][1]
    assert extended > 500  # most writes extended what was kept


def test_the_same_head_again_gives_the_same_nodes_and_a_replaced_one_anew() -> None:
    """A head asked again with no node replaced since is the kept list of its nodes (a copy:
    what a caller does to it changes no later answer); a replaced node (the one mutation)
    is the new object in the next answer."""
    import msgspec

    b = _long_with_forks()
    g = b.g
    head = "n199"
    first = g.chain(head)
    again = g.chain(head)
    assert again == first and again is not first
    assert all(x is y for x, y in zip(again, first))
    again.clear()
    assert [n.id for n in g.chain(head)] == _fresh_chain(g, head)
    # a new node (a fork) changes no branch that was walked
    b.add("late", "llm", output="late", predecessor="n150")
    assert [n.id for n in g.chain(head)] == _fresh_chain(g, head)
    old = g.nodes["n101"]
    g.add(msgspec.structs.replace(old, output="replaced"))
    got = g.chain(head)
    assert got[101] is g.nodes["n101"] and got[101].output == "replaced"
    assert [n.id for n in got] == _fresh_chain(g, head)
    # another head, then this one again: walked, the same nodes
    g.chain("late")
    assert [(n.id, n.output) for n in g.chain(head)] == [(n.id, n.output) for n in got]
