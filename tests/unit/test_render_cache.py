"""Incremental re-renders return exactly what a full render returns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagctx.context.render import render_view
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.engine.views import ContextService
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput


@pytest.fixture
def engine(fresh_sqlite: Path) -> Iterator[EngineCore]:
    e = EngineCore(DaemonConfig(database=str(fresh_sqlite)))
    e.initialize(m.InitializeParams())
    yield e
    e.close()


def _append(e: EngineCore, sid: str, **kw) -> str:
    # the write handlers are awaitables run by the database's writer thread
    out = asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw))))
    return out.node.id


def _same(e: EngineCore, sid: str, fmt: str) -> None:
    cached = e.views.render(sid, fmt=fmt, model="gpt-4o")
    fresh = ContextService(e).render(sid, fmt=fmt, model="gpt-4o")
    assert cached.messages == fresh.messages
    assert cached.per_message == fresh.per_message
    assert list(cached.view.reads) == list(fresh.view.reads)
    assert cached.view.turns == fresh.view.turns
    strip = lambda man: {k: v for k, v in man.items() if k != "renderId"}  # noqa: E731
    assert strip(cached.manifest) == strip(fresh.manifest)
    assert cached.total == fresh.total


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "neutral"])
def test_every_kind_of_change_matches_a_full_render(engine: EngineCore, fmt: str) -> None:
    e = engine
    sid = e.store.create_session("cache").session_id
    head = e.store.head(sid)
    for i in range(3):
        u = _append(e, sid, role="user", output=f"turn {i} 迁移 src/a{i}.py", predecessor=head)
        head = _append(e, sid, role="llm", name="gpt-4o", output=f"reply {i}", predecessor=u)
        _append(e, sid, role="code", name="bash", input={"cmd": f"ls {i}"}, output="x\n" * 5, caller=head,
                metadata={"toolCallId": f"c{i}"})
    _same(e, sid, fmt)
    hits = e.views.cache_hits
    # a tool-loop step: a new llm node after the last one (suffix only)
    step = _append(e, sid, role="llm", name="gpt-4o", output="next step", predecessor=head)
    running = _append(e, sid, role="code", name="bash", input={"cmd": "make"}, status="running", caller=step,
                      metadata={"toolCallId": "c9"})
    _same(e, sid, fmt)
    assert e.views.cache_hits > hits
    # the running call finishes (an update inside the newest turn)
    asyncio.run(e.node_update(m.NodeUpdateParams(session_id=sid, node_id=running, status="completed", output="built")))
    _same(e, sid, fmt)
    # a late tool result under an OLD llm node (must not be served from the stale prefix)
    _append(e, sid, role="code", name="cat", input={"f": "late"}, output="late", caller=head,
            metadata={"toolCallId": "late1"})
    _same(e, sid, fmt)
    # a new user turn, then a fork and a checkout back
    u = _append(e, sid, role="user", output="new turn", predecessor=step)
    _same(e, sid, fmt)
    _append(e, sid, role="user", output="forked", predecessor=step)
    e.store.checkout(sid, u)
    _same(e, sid, fmt)
    # a summary over the prefix
    chain = [n.id for n in e.store.graph(sid).chain(u)]
    _append(e, sid, role="llm", name="context/summary", output="[Previous conversation summary]\nS",
            predecessor=e.store.graph(sid).root_id, metadata={"covers_ids": chain[:4]})
    _same(e, sid, fmt)
    # a new system prompt node
    _append(e, sid, role="code", name="context/system_prompt", output="You are new.", caller="ROOT")
    _append(e, sid, role="llm", name="gpt-4o", output="after prompt", predecessor=u)
    _same(e, sid, fmt)


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "neutral"])
def test_renders_of_one_branch_age_its_one_unaged_walk(engine: EngineCore, fmt: str) -> None:
    """An aging plan's walk of a branch (or a render's) is kept and aged by the renders
    that follow (``render.age_view``, ``render.with_system_prompt``) instead of walking the
    branch again — the builds of one request differ only in aging and the system prompt.
    Each is byte-identical to a full render, and a walk of an older graph is never used."""
    from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME

    e = engine
    sid = e.store.create_session("aged").session_id
    head = e.store.head(sid)
    root = e.store.graph(sid).root_id
    sys_a = _append(e, sid, role="code", name=SYSTEM_PROMPT_NAME, output="You are A.", caller=root)
    for i in range(4):
        u = _append(e, sid, role="user", output=f"turn {i}", predecessor=head)
        head = _append(e, sid, role="llm", name="gpt-4o", output=f"reply {i}", predecessor=u)
        _append(e, sid, role="code", name="bash", input={"cmd": f"cat f{i}"}, output=f"line {i}\n" * 50,
                caller=head, metadata={"toolCallId": f"c{i}"})
    sys_b = _append(e, sid, role="code", name=SYSTEM_PROMPT_NAME, output="You are B.", caller=root)
    top = _append(e, sid, role="code", name="lint", input={"p": "src"}, output="3 warnings", predecessor=head)
    code = [n.id for n in e.store.graph(sid).by_seq if n.role == "code" and n.name != SYSTEM_PROMPT_NAME]
    info = e.models.get("gpt-4o")
    e.views._aging_cache.clear()
    e.views.aging_for(sid, top, info)
    walk = e.views._unaged
    assert walk is not None
    pending = NodeInput(id="pending-sys", role="code", name=SYSTEM_PROMPT_NAME, output="You are pending.")
    for aged, system, pend in (({}, None, None), ({code[0]: "[removed]", code[2]: "[trimmed]", top: "[aged]"}, None, None),
                               ({code[1]: "[x]"}, sys_a, None), ({}, sys_b, None), ({code[3]: "[y]"}, None, pending)):
        kw = dict(head=top, fmt=fmt, model="gpt-4o", aged=aged, use_cache=False, system_node_id=system,
                  pending_system=pend)
        got = e.views.render(sid, **kw)
        assert e.views._unaged is walk  # the same walk, aged again
        fresh = ContextService(e).render(sid, **kw)
        assert got.messages == fresh.messages and got.per_message == fresh.per_message
        assert got.view == fresh.view and got.total == fresh.total and got.system == fresh.system
        # and both are the one walk of the pure view function with every argument
        assert got.view == render_view(e.store.graph(sid), top, aged=aged, system_node_id=system,
                                       pending_system=None if pend is None else (pend.id, pend.output))
        expected = "You are pending." if pend is not None else "You are A." if system == sys_a else "You are B."
        assert got.system == expected
    # a node written since: the kept walk is stale and not used
    late = _append(e, sid, role="code", name="cat", input={"f": "late"}, output="late", caller=head,
                   metadata={"toolCallId": "late"})
    aged = {code[1]: "[gone]"}
    got = e.views.render(sid, head=top, fmt=fmt, model="gpt-4o", aged=aged, use_cache=False)
    assert e.views._unaged is not walk
    fresh = ContextService(e).render(sid, head=top, fmt=fmt, model="gpt-4o", aged=aged, use_cache=False)
    assert got.messages == fresh.messages and got.view == fresh.view
    assert got.view == render_view(e.store.graph(sid), top, aged=aged)
    assert late in got.view.reads


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "neutral"])
def test_an_extension_renames_a_call_id_the_cached_prefix_used(engine: EngineCore, fmt: str) -> None:
    """A tool call id repeated on the branch (a provider that numbers calls per response,
    a resumed Claude Code session replaying ids) is renamed in a full render (SPEC §6, pair
    validity); extending a cached render by the next step renames it the same way, so the
    list never carries one id twice (before: the suffix was assembled without the prefix's
    ids, and OpenAI would reject the duplicate)."""
    from dagctx.context import formats

    e = engine
    sid = e.store.create_session("dup").session_id
    u = _append(e, sid, role="user", output="go", predecessor=e.store.head(sid))
    head = _append(e, sid, role="llm", name="gpt-4o", output="step 0", predecessor=u)
    _append(e, sid, role="code", name="bash", input={"cmd": "ls"}, output="a", caller=head,
            metadata={"toolCallId": "call_0"})
    e.views.render(sid, fmt=fmt, model="gpt-4o")  # cached
    for k in range(1, 3):
        hits = e.views.cache_hits
        head = _append(e, sid, role="llm", name="gpt-4o", output=f"step {k}", predecessor=head)
        _append(e, sid, role="code", name="bash", input={"cmd": "ls"}, output="b", caller=head,
                metadata={"toolCallId": "call_0"})
        _same(e, sid, fmt)
        assert e.views.cache_hits > hits  # the render was an extension of the cached one
        r = e.views.render(sid, fmt=fmt, model="gpt-4o")
        assert formats.check_pairs(r.messages, fmt) == []
        assert sum("renamed to call_0_" in x for x in r.manifest["repairs"]) == k
