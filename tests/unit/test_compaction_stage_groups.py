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
