"""A daemon that served a session answers what a daemon started afresh on the same file
answers (SPEC §6): two real daemons, one warm — it rendered and prepared the session before
— and one that never saw it. (The randomized walk of the same promise, every kind of write
against every kind of request: ``tests/unit/test_render_warm_cold.py``.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from dagctx.client import DagctxClient


def _same_request(r: Any) -> dict[str, Any]:
    """A render's answer without what names the request or compares it with this daemon's
    previous render."""
    out = msgspec.to_builtins(r)
    out.pop("renderId")
    out.pop("stablePrefix")
    out["manifest"].pop("renderId", None)
    return out


async def test_a_render_after_a_prepare_shows_the_system_prompt_in_force_at_its_head(tmp_path: Path) -> None:
    """``context/prepare`` writes its new system prompt node after the head it renders, and
    renders with it; a later ``context/render`` of that head names no node and shows the one
    in force at the head — none here. The warm daemon used to answer from the prepare's
    cached render, system prompt included."""
    db = tmp_path / "a.db"
    warm = await DagctxClient.spawn(db)
    cold = None
    try:
        s = await warm.session_create("system prompt")
        await warm.append(s.session_id, "user", output="rename parse_config in src/app.py", predecessor=s.head)
        await warm.prepare(s.session_id, model="gpt-4o", format="openai")  # writes its system prompt node
        prepared = await warm.prepare(s.session_id, model="gpt-4o", format="openai")  # renders with that node
        assert prepared.manifest["systemNode"], prepared.manifest
        seen = await warm.render(s.session_id, model="gpt-4o", format="openai")
        cold = await DagctxClient.spawn(db)
        fresh = await cold.render(s.session_id, model="gpt-4o", format="openai")
        assert fresh.manifest["systemNode"] is None and fresh.system is None
        assert _same_request(seen) == _same_request(fresh)
    finally:
        if cold is not None:
            await cold.close()
        await warm.close()


async def test_a_render_extended_from_the_cache_lists_its_repairs_as_a_full_render(tmp_path: Path) -> None:
    """The repairs a render records (manifest ``repairs``) come in the order a full render
    makes them — the walk's, the assembly's, then the placeholder opening an Anthropic
    list — also when the render extended a cached one: before, the cached part's list,
    placeholder included, came first."""
    db = tmp_path / "a.db"
    warm = await DagctxClient.spawn(db)
    cold = None
    try:
        s = await warm.session_create("repairs")
        sid = s.session_id
        # the branch opens with the model's message: Anthropic's list needs a placeholder user message
        opening = await warm.append(sid, "llm", output="Hello, what shall we build?", predecessor=s.head)
        first = await warm.render(sid, model="claude-sonnet-4-5", format="anthropic")
        assert [r[:32] for r in first.manifest["repairs"]] == ["inserted a placeholder user mess"]
        # a turn after it whose tool call never finished: the walk gives it a synthetic result
        u = await warm.append(sid, "user", output="a parser for config.toml", predecessor=opening.node.id)
        step = await warm.append(sid, "llm", output="Reading it.", predecessor=u.node.id)
        await warm.append(sid, "code", name="read_file", input={"path": "config.toml"}, status="running",
                          caller=step.node.id, metadata={"toolCallId": "call_2"})
        seen = await warm.render(sid, model="claude-sonnet-4-5", format="anthropic")
        cold = await DagctxClient.spawn(db)
        fresh = await cold.render(sid, model="claude-sonnet-4-5", format="anthropic")
        assert [r[:32] for r in fresh.manifest["repairs"]] == ["synthetic result for unfinished ",
                                                               "inserted a placeholder user mess"]
        assert _same_request(seen) == _same_request(fresh)
    finally:
        if cold is not None:
            await cold.close()
        await warm.close()
