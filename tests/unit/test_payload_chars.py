"""One walk of an append's payload (``EngineCore._payload_chars``) answers both questions
the append path asks of its size: whether counting leaves the event loop (64,000
characters) and whether it may commit on the loop (16,000, SPEC §4.2)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.engine.shared import ALONE_APPEND_CHARS, BIG_PAYLOAD_CHARS, StoreCalls
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput


def _over(limit: int, *values: Any) -> bool:
    """What the append path asked before, once per limit: the walk's sum past ``limit``."""
    budget = limit
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            budget -= len(v)
        elif isinstance(v, dict):
            budget -= len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            budget -= len(v)
            stack.extend(v)
        elif v is not None:
            budget -= 8
        if budget < 0:
            return True
    return False


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 3 else 3)
    if kind == 0:
        return "x" * rng.choice([0, 1, 300, 5_000, 15_990, 16_000, 16_001, 40_000, 63_999, 64_001, 90_000])
    if kind == 1:
        return None
    if kind == 2:
        return rng.choice([1, 2.5, True, False])
    if kind == 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(6))}


def test_one_walk_answers_both_limits() -> None:
    rng = random.Random(25)
    for _ in range(3_000):
        values = [_value(rng) for _ in range(rng.randrange(1, 4))]
        size = EngineCore._payload_chars(*values)
        assert (size > BIG_PAYLOAD_CHARS) == _over(BIG_PAYLOAD_CHARS, *values)
        assert (size > ALONE_APPEND_CHARS) == _over(ALONE_APPEND_CHARS, *values)
        assert EngineCore._payload_is_big(*values) == _over(BIG_PAYLOAD_CHARS, *values)
    assert EngineCore._payload_chars("abc", None, {"k": [1, "de"]}) == 3 + 1 + 1 + 2 + 8 + 2


def test_an_append_decides_by_its_size(tmp_path: Path, monkeypatch: Any) -> None:
    """``node/append`` and ``node/appendBatch`` measure their payload once: a small one may
    commit on the loop, one over 16,000 characters goes to the writer thread, one over
    64,000 is counted in a thread first (``write_node_async``); each commits."""
    seen: list[tuple[int, bool]] = []
    start_unit = StoreCalls.start_unit

    def spy(self: StoreCalls, unit: Any, alone: bool, finish: Any) -> Any:
        seen.append((len(unit.nodes), alone))
        return start_unit(self, unit, alone, finish)

    monkeypatch.setattr(StoreCalls, "start_unit", spy)
    e = EngineCore(DaemonConfig(database=str(tmp_path / "d.db")))
    e.initialize(m.InitializeParams())
    try:
        sid = e.store.create_session("sizes").session_id
        a = asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(
            role="user", input="hello there", predecessor="ROOT")))).node
        long = "y" * 20_000
        b = asyncio.run(e.node_append_batch(m.NodeAppendBatchParams(session_id=sid, nodes=[
            NodeInput(role="llm", output="ok", predecessor=a.id, id="b1"),
            NodeInput(role="code", name="bash", input={"cmd": "ls"}, output=long, caller="b1")]))).nodes
        c = asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(
            role="user", input="z" * 70_000, predecessor="b1")))).node
        assert [n.seq for n in (a, *b, c)] == [1, 2, 3, 4]
        assert seen == [(1, True), (2, False)]  # the 70,000 characters went round start_unit
    finally:
        e.close()
