"""Reduction inside a running function, through a real daemon subprocess (SPEC §6
rendering inside a function, §8 reduction within a turn).

``context/prepare`` takes ``frame`` like ``context/render``: the request of a model
call made inside a running function F. F's finished inner calls are reduced like a
turn's steps — tool results summarized, a checkpoint over the oldest inner calls —
while F's own newest inner call, the open call stack (A's call of F, "[in progress]")
and the user's message stay verbatim. A frame nested two levels deep works the same,
the enclosing function's finished inner calls being summarizable too. Every request is
pair-valid, within its limit, writes nothing, and is replayed byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.context.formats import check_pairs

from sampling_stub import ScriptedSampler

pytestmark = pytest.mark.asyncio

TINY = "tiny-16k"
MODELS = {TINY: {"contextWindow": 16000, "maxOutput": 2000}}
TASK = "Port the parser package to the new tokenizer API"


def body(tag: str, i: int, lines: int = 45) -> str:
    return f"# src/{tag}/part_{i}.py\n" + "\n".join(
        f"    line {k}: value_{i}_{k} = tokenize(source, offset={k * 7})  # {tag}" for k in range(lines))


def condensed(params: Any) -> str:
    text = "\n".join(m.content.text for m in params.messages)
    return "condensed: " + " ".join(text.split()[-30:])


async def spawn(db: Path, sampler: ScriptedSampler) -> DagctxClient:
    c = await DagctxClient.spawn(db, capabilities={"sampling": {}}, initialization_options={"models": MODELS})
    c.on_request("sampling/createMessage", sampler)
    return c


async def inner_loop(c: DagctxClient, sid: str, fn: str, n: int, tag: str) -> tuple[list[str], list[str]]:
    """``n`` inner model calls of the running function ``fn``, each reading a file."""
    calls, results = [], []
    for i in range(n):
        llm = await c.append(sid, "llm", name=TINY, output=f"Inner step {i}: reading src/{tag}/part_{i}.py.",
                             caller=fn)
        res = await c.append(sid, "code", name="read_file", input={"path": f"src/{tag}/part_{i}.py"},
                             output=body(tag, i), caller=llm.node.id, metadata={"toolCallId": f"call_{tag}_{i}"})
        calls.append(llm.node.id)
        results.append(res.node.id)
    return calls, results


def text_of(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages)


async def check_frame_request(c: DagctxClient, sid: str, fn: str, p: Any, calls: list[str],
                              results: list[str], tag: str) -> None:
    b = p.budget
    assert b.input_used <= b.input_budget - b.safety_margin, p.decision_path
    assert check_pairs(p.messages, "neutral") == []
    sent = text_of(p.messages)
    assert TASK in sent
    # the function's own newest inner call and its result are sent verbatim
    assert f"Inner step {len(calls) - 1}: reading" in sent
    assert json.dumps(body(tag, len(calls) - 1))[1:-1] in sent
    red = p.reduction
    assert red is not None and red.tokens_before > red.limit
    reduced = {x.node_id for x in red.results}
    assert results[-1] not in reduced
    if red.checkpoint is not None:
        assert set(red.checkpoint.covers_ids) <= set(calls[:-2]), red.checkpoint.covers_ids
    # replay: the inner call that was sent this request gets exactly it back
    n0 = (await c.session_get(sid)).node_count
    llm = await c.append(sid, "llm", name=TINY, output="Next inner step.", caller=fn, render_id=p.render_id)
    assert (await c.session_get(sid)).node_count == n0 + 1
    again = await c.replay(sid, llm.node.id)
    assert again.exact and again.messages == p.messages
    assert again.manifest.get("turnReduction") == p.manifest.get("turnReduction")


async def test_prepare_reduces_the_finished_inner_calls_of_a_running_function(tmp_path: Path) -> None:
    sampler = ScriptedSampler(condensed)
    c = await spawn(tmp_path / "frame.db", sampler)
    try:
        s = await c.session_create("frame")
        sid = s.session_id
        u = await c.append(sid, "user", output=TASK, predecessor=s.head)
        a = await c.append(sid, "llm", name=TINY, output="Delegating the port to a sub-agent.", predecessor=u.head)
        fn = (await c.append(sid, "code", name="subagent", input={"task": "port src/parser"}, status="running",
                             caller=a.node.id, metadata={"toolCallId": "call_sub"})).node.id
        calls, results = await inner_loop(c, sid, fn, 60, "parser")
        plain = await c.render(sid, frame=fn, model=TINY, format="neutral")
        assert plain.tokens.total > 45000
        n0 = (await c.session_get(sid)).node_count
        # a frame that is no function call, or no node: a clear error, nothing written
        for bad, kind in ((a.node.id, "InvalidParams"), ("no-such-node", "NodeNotFound")):
            with pytest.raises(RpcError) as err:
                await c.prepare(sid, frame=bad, model=TINY, format="neutral", prompt_mode="none")
            assert err.value.kind == kind, err.value
            assert kind != "InvalidParams" or "frame" in err.value.message
        assert (await c.session_get(sid)).node_count == n0
        p = await c.prepare(sid, frame=fn, model=TINY, format="neutral", prompt_mode="none")
        assert (await c.session_get(sid)).node_count == n0, "a prepare wrote to the ledger"
        assert p.manifest["frame"] == fn
        # the call stack stays open and verbatim: A's call of the function, its running result
        assert any(b.get("type") == "tool_call" and b.get("id") == "call_sub"
                   for m in p.messages for b in m["content"])
        assert p.reduction.checkpoint is not None, p.decision_path
        # the same request as context/render with budget: the same reductions, no new call
        asked = len(sampler.requests)
        r = await c.render(sid, frame=fn, model=TINY, format="neutral", budget=True)
        assert len(sampler.requests) == asked
        assert r.reduction is not None and r.reduction.checkpoint is not None
        assert r.reduction.checkpoint.covers_ids == p.reduction.checkpoint.covers_ids
        await check_frame_request(c, sid, fn, p, calls, results, "parser")
        # every provider format: pair-valid, within the limit, the same checkpoint
        for fmt in ("anthropic", "openai"):
            q = await c.prepare(sid, frame=fn, model=TINY, format=fmt, prompt_mode="none")
            assert check_pairs(q.messages, fmt) == [], fmt
            assert q.budget.input_used <= q.budget.input_budget - q.budget.safety_margin
            assert q.reduction is not None and q.reduction.checkpoint is not None, q.decision_path
        # without a summarizer the same request is refused with the numbers, writing nothing
        bare = await DagctxClient.spawn(tmp_path / "frame.db", initialization_options={"models": MODELS})
        try:
            before = (await bare.session_get(sid)).node_count
            more_calls, _ = await inner_loop(bare, sid, fn, 1, "late")
            with pytest.raises(RpcError) as err:
                await bare.prepare(sid, frame=fn, model=TINY, format="neutral", prompt_mode="none",
                                   reduction_timeout_seconds=5)
            assert err.value.kind == "BudgetExceeded"
            d = err.value.data["details"]
            # only the newest inner call and the open stack are protected, not the frame
            assert d["protectedTokens"] < d["limit"], d
            assert (await bare.session_get(sid)).node_count == before + 2
        finally:
            await bare.close()
    finally:
        await c.close()


async def test_a_nested_frame_is_reduced_too(tmp_path: Path) -> None:
    """A → planner G (running) → its inner call K3 → worker F (running) with 30 inner
    calls: the finished inner calls are reduced, F's newest and the open calls stay."""
    sampler = ScriptedSampler(condensed)
    c = await spawn(tmp_path / "nested.db", sampler)
    try:
        s = await c.session_create("nested")
        sid = s.session_id
        u = await c.append(sid, "user", output=TASK, predecessor=s.head)
        a = await c.append(sid, "llm", name=TINY, output="Planning.", predecessor=u.head)
        g = (await c.append(sid, "code", name="planner", input={"goal": "port"}, status="running",
                            caller=a.node.id, metadata={"toolCallId": "call_plan"})).node.id
        g_calls, g_results = await inner_loop(c, sid, g, 3, "plan")
        k3 = g_calls[-1]
        fn = (await c.append(sid, "code", name="worker", input={"part": "lexer"}, status="running",
                             caller=k3, metadata={"toolCallId": "call_work"})).node.id
        calls, results = await inner_loop(c, sid, fn, 30, "lexer")
        plain = await c.render(sid, frame=fn, model=TINY, format="neutral")
        assert plain.tokens.total > 20000
        sent_plain = text_of(plain.messages)
        assert "call_plan" in sent_plain and "call_work" in sent_plain
        n0 = (await c.session_get(sid)).node_count
        p = await c.prepare(sid, frame=fn, model=TINY, format="neutral", prompt_mode="none")
        assert (await c.session_get(sid)).node_count == n0
        sent = text_of(p.messages)
        # both open calls stay: A's call of the planner, the planner's call of the worker
        assert "call_plan" in sent and "call_work" in sent
        red = p.reduction
        assert red is not None and (red.results or red.checkpoint), p.decision_path
        # the worker's finished inner calls, and the planner's results, are what is reduced:
        # results summarized, or the worker's earlier inner calls under a checkpoint (its
        # newest two stay, SPEC §8)
        assert {x.node_id for x in red.results} <= set(results[:-1]) | set(g_results)
        covered = set(red.checkpoint.covers_ids) if red.checkpoint else set()
        assert covered <= set(calls[:-2])
        assert {x.node_id for x in red.results} & set(results) or covered
        await check_frame_request(c, sid, fn, p, calls, results, "lexer")
    finally:
        await c.close()
