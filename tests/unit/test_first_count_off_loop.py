"""A count that would build a tokenizer's encoder (tiktoken's constructor holds the
interpreter lock for a fraction of a second) never runs on the event loop: a small append
that arrives before the daemon built its encoders at a quiet moment is derived in a
thread, every later one on the loop as before (SPEC §1.4)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagctx.context import tokens
from dagctx.engine.core import EngineCore
from dagctx.engine.config import DaemonConfig
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineCore]:
    e = EngineCore(DaemonConfig(database=str(tmp_path / "c.db")))
    e.initialize(m.InitializeParams())
    yield e
    e.close()


def test_a_count_before_the_encoders_are_built_leaves_the_loop(engine: EngineCore) -> None:
    kept = dict(tokens._encoders)
    sid = engine.store.create_session("t").session_id
    threads: list[int] = []
    real = engine.derive_node

    def derive(*a, **kw):
        threads.append(threading.get_ident())
        return real(*a, **kw)

    engine.derive_node = derive  # type: ignore[method-assign]
    try:
        tokens.forget_encoders()
        assert not engine.counter.ready
        node = NodeInput(role="user", output="hello there", predecessor="ROOT")
        first = asyncio.run(engine.node_append(m.NodeAppendParams(session_id=sid, node=node)))
        assert engine.counter.ready  # that count built them, in a thread
        node = NodeInput(role="user", output="again", predecessor="ROOT")
        asyncio.run(engine.node_append(m.NodeAppendParams(session_id=sid, node=node)))
    finally:
        tokens.forget_encoders()
        tokens._encoders.update(kept)
    loop_thread = threading.get_ident()  # asyncio.run runs its loop in this thread
    assert threads[0] != loop_thread and threads[1] == loop_thread
    assert first.node.metadata is not None and engine.store.get_nodes(sid, [first.node.id])[0].output == "hello there"
