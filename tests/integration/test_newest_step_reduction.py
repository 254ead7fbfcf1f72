"""The newest step's completed results may be summarized, last and only when nothing
else fits (SPEC §8, reduction within a turn), through a real daemon.

A just-finished ``Read`` of a large file at a small window: before, the newest step was
protected whole and the request was refused at once (``BudgetExceeded``); now its
result is summarized for this request, with the call id, the arguments and the error
status verbatim — and never while something older can still be reduced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_turn_reduction_daemon import MODELS, TASK, Sampler, calls_and_results, check_request, result_body, spawn

pytestmark = pytest.mark.asyncio

#: a small window: one ordinary file read (under the spill size) does not fit it
TINY = "tiny-4k"
WINDOWS = {**MODELS, TINY: {"contextWindow": 4096, "maxOutput": 1024}}


async def newest_reads(c, sid: str, prev: str, *, lines: int, n: int = 3,
                       status: str = "completed") -> tuple[str, list[str]]:
    """The newest step: one model call reading ``n`` large files at once (the first with ``status``)."""
    llm = await c.append(sid, "llm", name=TINY, output="Reading the build logs.", predecessor=prev)
    tools = []
    for i in range(n):
        t = await c.append(sid, "code", name="Read", input={"file_path": f"logs/build_{i}.log"},
                           output=result_body("log", i, lines), caller=llm.node.id,
                           metadata={"toolCallId": f"call_read_{i}"}, status=status if i == 0 else "completed")
        tools.append(t.node.id)
    return llm.node.id, tools


@pytest.mark.parametrize("status", ["completed", "error"])
async def test_just_finished_large_reads_are_summarized_not_refused(db_path: Path, status: str) -> None:
    sampler = Sampler()
    c = await spawn(db_path, sampler, models=WINDOWS)
    try:
        s = await c.session_create("newest")
        sid = s.session_id
        u = await c.append(sid, "user", output=TASK, predecessor=s.head)
        head, tools = await newest_reads(c, sid, u.node.id, lines=400, status=status)
        unreduced = await c.render(sid, model=TINY, format="neutral")
        assert unreduced.tokens.total > 4096 - 1024 - 256, "the newest step alone is over the limit"
        p = await c.prepare(sid, model=TINY, format="neutral", prompt_mode="none")
        assert p.reduction is not None and p.reduction.results
        assert {x.node_id for x in p.reduction.results} <= set(tools)
        assert {x.tool_call_id for x in p.reduction.results} <= {f"call_read_{i}" for i in range(3)}
        owner, errors = calls_and_results(p.messages)
        assert owner == {f"call_read_{i}": head for i in range(3)}
        assert errors == {f"call_read_{i}": status == "error" and i == 0 for i in range(3)}
        calls = [b for m in p.messages for b in m["content"] if b["type"] == "tool_call"]
        assert [b["input"] for b in calls] == [{"file_path": f"logs/build_{i}.log"} for i in range(3)]
        texts = {b["toolCallId"]: (b["content"][0]["text"] if isinstance(b["content"], list) else b["content"])
                 for m in p.messages for b in m["content"] if b["type"] == "tool_result"}
        for x in p.reduction.results:
            text = texts[x.tool_call_id]
            assert "tool result summarized for this request" in text and x.node_id in text
            assert text.startswith("[error]") == (status == "error" and x.tool_call_id == "call_read_0")
        await check_request(c, sid, p, TINY)
    finally:
        await c.close()


async def test_the_newest_step_is_summarized_last(db_path: Path) -> None:
    """Older results that are enough are summarized; the newest step stays verbatim."""
    sampler = Sampler()
    c = await spawn(db_path, sampler, models=WINDOWS)
    try:
        s = await c.session_create("newest-last")
        sid = s.session_id
        prev = (await c.append(sid, "user", output=TASK, predecessor=s.head)).node.id
        for i in range(6):
            llm = await c.append(sid, "llm", name=TINY, output=f"Step {i}.", predecessor=prev)
            await c.append(sid, "code", name="Read", input={"file_path": f"src/m{i}.py"},
                           output=result_body("m", i, 60), caller=llm.node.id,
                           metadata={"toolCallId": f"call_m{i}"})
            prev = llm.node.id
        head, tools = await newest_reads(c, sid, prev, lines=100, n=1)
        p = await c.prepare(sid, model=TINY, format="neutral", prompt_mode="none")
        assert p.reduction is not None and (p.reduction.results or p.reduction.checkpoint)
        assert not set(tools) & {x.node_id for x in p.reduction.results}
        newest = [b for m in p.messages for b in m["content"] if b["type"] == "tool_result"][-1]
        assert "summarized for this request" not in str(newest["content"]), "the newest step stays verbatim"
        await check_request(c, sid, p, TINY)
    finally:
        await c.close()
