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


def _random_session(rng: Any) -> GraphBuilder:
    """A session of turns with retries, forks, a spawned branch and summaries of every
    kind: contiguous runs on one branch or another, with and without a recorded head,
    rolled ones, unfinished ones, ids that are gone, runs that are not contiguous."""
    b = GraphBuilder()
    conv: list[str] = []
    tips = ["root"]
    for i in range(rng.randint(5, 60)):
        r = rng.random()
        if r < 0.15 and conv:  # a fork from an older node
            pred = rng.choice(conv)
        elif r < 0.25 and tips:
            pred = rng.choice(tips)
        else:
            pred = tips[-1]
        nid = b.add(f"n{i}", "user" if i % 2 == 0 else "llm", name=None if i % 2 == 0 else "m",
                    output=f"turn {i}", predecessor=pred)
        conv.append(nid)
        if pred in tips:
            tips.remove(pred)
        tips.append(nid)
        if i % 2 and rng.random() < 0.5:
            b.add(f"t{i}", "code", name="bash", output="ok", caller=nid)
            if rng.random() < 0.2:
                sp = b.add(f"sp{i}", "user", output="task", caller=f"t{i}", metadata={"spawn_branch_root": True})
                b.add(f"sl{i}", "llm", name="m", output="done", predecessor=sp)
                conv += [sp, f"sl{i}"]
                tips.append(f"sl{i}")
        if rng.random() < 0.2:  # a summary of a run of some branch, made now
            chain = [n.id for n in b.g.chain(rng.choice(b.g.tips()))]
            if chain:
                lo = rng.randrange(len(chain))
                hi = rng.randrange(lo, len(chain))
                covers = chain[lo: hi + 1]
                meta: dict[str, Any] = {"covers_ids": covers}
                kind = rng.random()
                if kind < 0.4:
                    meta["head"] = rng.choice(chain[hi:])
                elif kind < 0.5:
                    meta["head"] = rng.choice(conv)
                elif kind < 0.6 and len(covers) > 2:
                    meta["covers_ids"] = covers[:1] + covers[2:]  # not contiguous
                elif kind < 0.7:
                    meta["covers_ids"] = covers + ["gone"]
                b.add(f"S{i}", "llm", name=SUMMARY_NAME, output="summary", predecessor="root", metadata=meta,
                      status="running" if kind > 0.95 else "completed")
    return b


def test_one_walk_states_what_select_summary_states_for_every_head() -> None:
    # the graph answers every head in one walk (choices_by_head); it must say exactly what
    # the render's rule says head by head, on every shape of session
    import random

    from dagctx.context.graph_view import choices_by_head
    from dagctx.context.summary_choice import select_summary

    rng = random.Random(22)
    checked = applied = 0
    for _ in range(300):
        b = _random_session(rng)
        heads = b.g.tips() + [rng.choice(b.g.by_seq).id for _ in range(3)]
        heads = [h for h in heads if b.g.is_conversation(b.g.nodes[h])]
        got = choices_by_head(b.g, heads)
        for h in heads:
            want = select_summary(b.g, b.g.chain(h))
            assert (got[h].active and got[h].active.id, got[h].first, got[h].last, sorted(got[h].superseded)) == (
                want.active and want.active.id, want.first, want.last, sorted(want.superseded)), h
            checked += 1
            applied += want.active is not None
    assert checked > 1000 and applied > 100  # the shapes do reach summaries that apply


def test_choices_carried_to_a_later_state_are_what_a_fresh_walk_states() -> None:
    # ChoiceMemo keeps each head's choice from one state to the next; after every write of
    # a growing session (turns, forks, tool calls, summaries appended running and then
    # finished, a node arriving under the id a summary recorded as its head) it must state
    # exactly what select_summary states head by head
    import random

    from dagctx.context.graph_view import ChoiceMemo
    from dagctx.context.summary_choice import select_summary
    from dagctx.protocol.nodes import Call

    rng = random.Random(2222)
    checked = reused = 0
    for _ in range(60):
        b = GraphBuilder()
        memo = ChoiceMemo()
        conv = ["root"]
        running: list[Call] = []
        for i in range(rng.randint(10, 50)):
            r = rng.random()
            if r < 0.55:
                pred = b.g.tips()[-1] if rng.random() < 0.8 else rng.choice(conv)
                conv.append(b.add(f"n{i}", "user", output="turn", predecessor=pred))
            elif r < 0.7 and len(conv) > 1:
                b.add(f"t{i}", "code", name="bash", output="ok", caller=rng.choice(conv[1:]))
            elif r < 0.85:
                chain = [n.id for n in b.g.chain(rng.choice(b.g.tips()))]
                if chain:
                    lo = rng.randrange(len(chain))
                    meta: dict[str, Any] = {"covers_ids": chain[lo: rng.randrange(lo, len(chain)) + 1]}
                    if rng.random() < 0.5:
                        meta["head"] = rng.choice([*chain, f"n{i + rng.randint(1, 4)}"])  # maybe one to come
                    status = "running" if rng.random() < 0.3 else "completed"
                    b.add(f"S{i}", "llm", name=SUMMARY_NAME, output="summary", predecessor="root",
                          metadata=meta, status=status)
                    if status == "running":
                        running.append(b.g.nodes[f"S{i}"])
            elif running:  # a running summary finishes (the graph's one kind of replacement)
                old = running.pop(0)
                b.g.add(Call(id=old.id, seq=old.seq, created_at=old.created_at, role="llm", name=old.name,
                             output="done", predecessor=old.predecessor, metadata=old.metadata))
            if not b.g.summaries:
                continue
            heads = b.g.tips()
            before = memo.state
            got = memo.choices_for(b.g, heads)
            if before is not None and memo._still_valid(b.g, before):
                reused += 1
            for h in heads:
                want = select_summary(b.g, b.g.chain(h))
                assert (got[h].active and got[h].active.id, got[h].first, got[h].last, got[h].superseded) == (
                    want.active and want.active.id, want.first, want.last, want.superseded), h
                checked += 1
    assert checked > 500 and reused > 100  # states were carried over, and checked


def test_carried_choices_do_not_keep_a_graph_alive() -> None:
    # the store's cache bounds the daemon's memory by evicting graphs: what session/graph
    # keeps between states must not hold an evicted graph
    import gc

    from dagctx.context.graph_view import ChoiceMemo

    b = _session()
    _summary(b, "S1", ["u1", "l1", "u2", "l2"])
    memo = ChoiceMemo()
    assert memo.choices_for(b.g, b.g.tips())["l3"].active.id == "S1"
    assert memo.state is not None and memo.state[0]() is b.g
    del b
    gc.collect()
    assert memo.state[0]() is None
    fresh = _session()
    _summary(fresh, "S1", ["u1", "l1", "u2", "l2"])
    assert not memo._still_valid(fresh.g, memo.state)  # another graph: everything asked again
