"""Summaries are branch-local (SPEC §8, which summary a head uses), through a real daemon.

A summary written while compacting one head never changes the render of a head that
does not descend from it. The issue's case (20 turns, compact, fork at turn 5, compact
the fork with ``keepRecentTokens: 300``, render main) and a seeded randomized run of
forks, retries, new turns and compactions on random heads, checking after every
compaction that every branch tip outside the compacted head's descendants renders
byte-identically, and that the compacted head rolls over its own previous summary.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient

from test_compaction_daemon import BIG, Sampler, chat, spawn

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


async def test_compacting_a_fork_never_changes_main(db_path: Path) -> None:
    sampler = Sampler()
    c = await spawn(db_path, sampler)
    try:
        s = await c.session_create("issue-18-case")
        sid = s.session_id
        main_tip, turns = await c_chat(c, sid, s.head, 20)
        first = await c.compact(sid, head=main_tip, model=BIG, keep_recent_tokens=4000)
        assert first.ok and first.summary_id, first
        main_before = await c.render(sid, head=main_tip, model=BIG, format="openai")
        assert main_before.manifest["summaryId"] == first.summary_id
        # fork at turn 5 and compact the fork hard
        fork_tip, _ = await chat(c, sid, turns[5]["reply"], 1, start=40, tag="fork", move_head=False)
        fork = await c.compact(sid, head=fork_tip, model=BIG, keep_recent_tokens=300)
        assert fork.ok and fork.summary_id, fork
        assert set(fork.covers_ids) & set(t["user"] for t in turns[:5]), "the fork summary covers shared turns"
        main_after = await c.render(sid, head=main_tip, model=BIG, format="openai")
        assert main_after.tokens.total == main_before.tokens.total
        assert main_after.messages == main_before.messages and main_after.reads == main_before.reads
        assert main_after.manifest["summaryId"] == first.summary_id
        assert fork.summary_id not in main_after.manifest["supersededSummaries"]
        # the fork uses its own summary; the summary records the head it was made for
        fr = await c.render(sid, head=fork_tip, model=BIG, format="neutral")
        assert fr.manifest["summaryId"] == fork.summary_id
        node = (await c.get_nodes(sid, [fork.summary_id])).nodes[0]
        assert node.metadata["head"] == fork_tip
        # a new turn on main keeps main's own summary
        main_next, _ = await chat(c, sid, main_tip, 1, start=60)
        nxt = await c.render(sid, head=main_next, model=BIG, format="neutral")
        assert nxt.manifest["summaryId"] == first.summary_id
        # a fork made after the compaction (an edited last message) keeps the summary
        edited, _ = await chat(c, sid, turns[-2]["reply"], 1, start=70, tag="edit", move_head=False)
        ed = await c.render(sid, head=edited, model=BIG, format="neutral")
        assert ed.manifest["summaryId"] == first.summary_id
    finally:
        await c.close()


async def c_chat(c: DagctxClient, sid: str, head: str, n: int) -> tuple[str, list[dict[str, str]]]:
    return await chat(c, sid, head, n, lines=40)


async def test_a_bad_summary_head_is_refused(db_path: Path) -> None:
    c = await spawn(db_path, None)
    try:
        s = await c.session_create("bad-head")
        sid = s.session_id
        tip, turns = await chat(c, sid, s.head, 2, lines=3)
        n0 = (await c.session_get(sid)).node_count
        from dagctx.client import RpcError

        with pytest.raises(RpcError) as err:
            await c.append(sid, "llm", name="context/summary", output="[Previous conversation summary]\nx",
                           predecessor=s.root_id, metadata={"covers_ids": [turns[0]["user"]],
                                                            "head": turns[0]["tool"]})
        assert err.value.kind == "InvalidEdge" and "metadata.head" in err.value.message
        assert (await c.session_get(sid)).node_count == n0
    finally:
        await c.close()


# ---------------------------------------------------------------- randomized


class Tree:
    """The conversation nodes the test wrote, with their predecessors."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.pred: dict[str, str] = {}
        self.kind: dict[str, str] = {}

    def add(self, nid: str, pred: str, kind: str) -> None:
        self.pred[nid] = pred
        self.kind[nid] = kind

    def ancestors(self, nid: str) -> set[str]:
        out = {nid}
        while nid in self.pred:
            nid = self.pred[nid]
            out.add(nid)
        return out

    def tips(self) -> list[str]:
        parents = set(self.pred.values())
        return [n for n in self.pred if n not in parents]


async def turn(c: DagctxClient, sid: str, tree: Tree, head: str, i: int, rng: random.Random) -> str:
    path = f"src/r{i}/mod_{i}.py"
    u = await c.append(sid, "user", output=f"Turn {i}: fix ISSUE-{7000 + i} in {path}", predecessor=head,
                       move_head=False)
    tree.add(u.node.id, head, "user")
    l1 = await c.append(sid, "llm", name=BIG, output=f"Reading {path}.", predecessor=u.node.id, move_head=False)
    tree.add(l1.node.id, u.node.id, "llm")
    body = "\n".join(f"    line {k}: value_{i}_{k} = compute(step={k % 5})" for k in range(rng.randint(10, 60)))
    await c.append(sid, "code", name="read_file", input={"path": path}, output=f"# {path}\n{body}",
                   caller=l1.node.id, metadata={"toolCallId": f"call_r{i}"})
    l2 = await c.append(sid, "llm", name=BIG, output=f"Fixed ISSUE-{7000 + i} in {path}.",
                        predecessor=l1.node.id, move_head=False)
    tree.add(l2.node.id, l1.node.id, "llm")
    return l2.node.id


async def renders(c: DagctxClient, sid: str, heads: list[str]) -> dict[str, Any]:
    out = {}
    for h in heads:
        r = await c.render(sid, head=h, model=BIG, format="openai")
        out[h] = (r.messages, r.reads, r.tokens.total, r.manifest["summaryId"])
    return out


@pytest.mark.parametrize("seed", [18, 1803])
async def test_randomized_branches_render_identically_after_each_compaction(db_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    sampler = Sampler()
    c = await spawn(db_path, sampler)
    try:
        s = await c.session_create(f"random-{seed}")
        sid = s.session_id
        tree = Tree(s.root_id)
        head = s.head
        i = 0
        for _ in range(6):
            head = await turn(c, sid, tree, head, i, rng)
            i += 1
        compactions = written = 0
        for _step in range(36):
            op = rng.choices(["turn", "fork", "retry", "compact"], weights=[3, 2, 1, 3])[0]
            nodes = list(tree.pred)
            if op == "turn":
                await turn(c, sid, tree, rng.choice(tree.tips()), i, rng)
                i += 1
            elif op == "fork":
                at = rng.choice([n for n in nodes if tree.kind[n] == "llm"])
                await turn(c, sid, tree, at, i, rng)
                i += 1
            elif op == "retry":
                u = rng.choice([n for n in nodes if tree.kind[n] == "user"])
                r = await c.append(sid, "llm", name=BIG, output=f"Retried turn {i}.", predecessor=u,
                                   move_head=False)
                tree.add(r.node.id, u, "llm")
                i += 1
            else:
                target = rng.choice(nodes)
                tips = tree.tips()
                before = await renders(c, sid, tips + [target])
                res = await c.compact(sid, head=target, model=BIG, keep_recent_tokens=rng.choice([300, 800, 2000]))
                compactions += 1
                after = await renders(c, sid, tips + [target])
                for t in tips:
                    if target in tree.ancestors(t):
                        continue  # descends from the compacted head: may use the new summary
                    assert after[t] == before[t], (
                        f"seed {seed}: compacting {target} changed the render of tip {t}")
                if res.ok and res.summary_id:
                    written += 1
                    # the head uses the new summary, rolled over its own previous one
                    assert after[target][3] == res.summary_id
                    assert res.superseded_summary == before[target][3]
                    if before[target][3] is not None:
                        old = (await c.get_nodes(sid, [before[target][3]])).nodes[0]
                        assert set(old.metadata["covers_ids"]) <= set(res.covers_ids)
                else:
                    assert after[target] == before[target]
        assert compactions >= 5 and written >= 3, (compactions, written)
    finally:
        await c.close()
