"""A render extended from the render cache (``render_cache.join_views``) numbers its turns
as a cold walk of the same head does: the suffix walked from the cached head counts its
turns from 0, and the joined view shifts its items as well as its ``turns`` list, so
``View.turn_count - item.turn`` (aging by user turns, the current turn of a request) does
not depend on what the daemon had cached."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dagctx.context.render import render_view
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput


def _append(e: EngineCore, sid: str, **node: object) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**node)))).node.id  # type: ignore[arg-type]


def _turns(e: EngineCore, sid: str, head: str, turns: range) -> str:
    for i in turns:
        u = _append(e, sid, role="user", input=f"question {i}", predecessor=head)
        head = _append(e, sid, role="llm", output=f"answer {i}", predecessor=u)
        if i % 2:
            _append(e, sid, role="code", name="read_file", input={"path": f"m{i}.py"}, output=f"def f{i}(): ...",
                    caller=head, metadata={"toolCallId": f"c{i}"})
    return head


def test_a_view_extended_from_the_cache_numbers_turns_as_a_cold_walk(tmp_path: Path) -> None:
    e = EngineCore(DaemonConfig(database=str(tmp_path / "a.db")))
    e.initialize(m.InitializeParams())
    sid = e.store.create_session("turns").session_id
    head = _turns(e, sid, e.store.head(sid), range(3))
    e.views.render(sid, model="gpt-4o")  # cached at this head
    for more in (range(3, 5), range(5, 6)):  # extended twice: a join of a join
        head = _turns(e, sid, head, more)
        hits = e.views.cache_hits
        warm = e.views.render(sid, model="gpt-4o").view
        assert e.views.cache_hits == hits + 1, "the render was not extended from the cache"
        cold = render_view(e.store.graph(sid), head)
        assert warm.turn_count == cold.turn_count == more.stop
        assert [(it.node_id, it.kind, it.turn) for it in warm.items] == [
            (it.node_id, it.kind, it.turn) for it in cold.items]
        assert warm.turns == cold.turns
        current = {it.node_id for it in warm.items if it.turn == warm.turn_count}
        assert head in current
    e.close()
