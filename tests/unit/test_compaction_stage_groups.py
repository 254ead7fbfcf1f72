"""A staged compaction's stage plans take their groups off the plan's by place
(``summarizer_input.stage_groups``): the same groups as looking each item's node up, on
stages that are runs of the plan's items and on stages of a cut item's pieces."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagctx.context import compaction_plan, summarizer_input
from dagctx.context.render import render_view
from dagctx.context.tokens import estimate_tokens
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput


def _plan(path: Path) -> compaction_plan.CutPlan:
    e = EngineCore(DaemonConfig(database=str(path)))
    e.initialize(m.InitializeParams())
    store = e.store
    sid = store.create_session("groups").session_id
    head = store.head(sid)
    for i in range(10):
        u = store.append(sid, NodeInput(role="user", output=f"turn {i}: 修复 src/mod_{i}.py", predecessor=head)).node
        a = store.append(sid, NodeInput(role="llm", name="gpt-4o", output=f"reading src/mod_{i}.py",
                                        predecessor=u.id)).node
        # every third result far larger than a stage: cut into pieces
        lines = 400 if i % 3 == 0 else 20
        body = "\n".join(f"def f_{i}_{k}(x): return x + {k}  # 结果 {k}" for k in range(lines))
        store.append(sid, NodeInput(role="code", name="read_file", input={"path": f"src/mod_{i}.py"}, output=body,
                                    caller=a.id, metadata={"toolCallId": f"call_{i}"}))
        head = store.append(sid, NodeInput(role="llm", name="gpt-4o", output=f"done src/mod_{i}.py",
                                           predecessor=a.id)).node.id
    graph = store.graph(sid)
    plan = compaction_plan.select_cut(render_view(graph, head), graph, lambda it: len(it.text) // 3 + 1,
                                      window=8000, keep_recent_tokens=300)
    e.close()
    assert plan is not None
    return plan


@pytest.mark.parametrize("budget", [300, 900, 5000, 10**6])
def test_stage_groups_are_the_looked_up_groups(fresh_sqlite: Path, budget: int) -> None:
    plan = _plan(fresh_sqlite)
    stages = summarizer_input.split_stages(plan, budget, estimate_tokens, summarizer_input.Transcript())
    held = {id(it) for it in plan.input_items}
    pieces = sum(1 for st in stages for it in st if id(it) not in held)
    if budget <= 900:
        assert pieces > 0 and len(stages) > 3  # pieces of cut items, between runs of whole ones
    owners = summarizer_input.stage_owners(plan)
    looked_up = [summarizer_input.stage_plan(plan, st, index=i, total=len(stages), owner=owners).input_groups
                 for i, st in enumerate(stages, 1)]
    assert summarizer_input.stage_groups(plan, stages) == looked_up
    for i, (st, groups) in enumerate(zip(stages, summarizer_input.stage_groups(plan, stages)), 1):
        given = summarizer_input.stage_plan(plan, st, index=i, total=len(stages), groups=groups)
        assert given == summarizer_input.stage_plan(plan, st, index=i, total=len(stages))


def test_stage_groups_of_stages_in_any_order(fresh_sqlite: Path) -> None:
    """Stages are usually read where the one before ended; stages given in another order,
    twice, or made of items out of order are found by place or looked up: the same groups."""
    import random

    plan = _plan(fresh_sqlite)
    stages = summarizer_input.split_stages(plan, 900, estimate_tokens, summarizer_input.Transcript())
    owners = summarizer_input.stage_owners(plan)
    rnd = random.Random(5)
    shuffled = [list(st) for st in stages]
    rnd.shuffle(shuffled)
    items = plan.input_items
    odd = [[items[3], items[1]], [], items[5:9], [items[-1]], items[:2]]
    for order in (stages[::-1], stages + stages, shuffled, odd):
        looked_up = [[owners.get(it.node_id, it.node_id) for it in st] for st in order]
        assert summarizer_input.stage_groups(plan, order) == looked_up
