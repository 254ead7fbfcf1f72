"""Reduction within a turn through a real daemon subprocess (SPEC §8).

The client answers the daemon's ``sampling/createMessage`` with a scripted
``Sampler``: an extractive condensation of the text it was sent (always shorter), or
— per test — an error, a slow answer, nothing, too much, or a context-overflow error
for large inputs. Sessions are a generated long turn (one user message, then N model
calls each with a tool call; every 50th result an error) and real corpus sessions.

Every prepared request is checked the same way (``check_request``): within its limit,
pair-valid, every tool call with its result, call ids and error flags as in the
unreduced render (calls only missing when their step is inside the checkpoint), the
user's message verbatim, the ledger unchanged, and replay of the call byte for byte.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from dagctx.client import DagctxClient, RpcError
from dagctx.context.formats import check_pairs
from dagctx.context.references import reference_counts
from dagctx.context.turn_reduction import MAX_SUMMARY_CALLS
from dagctx.protocol import context_messages as pc

from chat_stub import ChatEndpoint
from sampling_stub import ScriptedSampler, request_text

SMALL = "small-32k"
BIG = "big-128k"
MODELS = {
    SMALL: {"contextWindow": 32000, "maxOutput": 4000},
    BIG: {"contextWindow": 128000, "maxOutput": 8000},
}
TASK = "Fix every failing test under src/pkg and tell me what was wrong"
TOOLS = [{"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]
CC = "claude-code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
CODEX = "codex/rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl"

pytestmark = pytest.mark.asyncio(loop_scope="module")


# ---------------------------------------------------------------- the scripted sampler



def condensed(params: Any) -> str:
    """A deterministic, always shorter answer: compaction gets the identifiers (its
    fidelity check), result and checkpoint requests the first words of their input."""
    text = request_text(params)
    if params.metadata.get("purpose") == "dagctx/compaction":
        counts, pos = reference_counts(text)
        idents = sorted(counts, key=lambda r: (-counts[r], pos[r]))[:80]
        return "## 1. User intent\nsee below\n## 3. Work completed\n" + "\n".join(f"- {i}" for i in idents)
    m = re.search(r"<(result|steps)>\n(.*?)\n</\1>", text, re.S)
    words = (m.group(2) if m else text).split()
    return "condensed: " + " ".join(words[:30])


class Sampler(ScriptedSampler):
    def __init__(self) -> None:
        super().__init__(condensed)


async def spawn(db: Path, sampler: Sampler | None, **options: Any) -> DagctxClient:
    caps = {"sampling": {}} if sampler is not None else {}
    c = await DagctxClient.spawn(db, capabilities=caps, initialization_options={"models": MODELS, **options})
    if sampler is not None:
        c.on_request("sampling/createMessage", sampler)
    return c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("turn") / "shared.db"
    c = await spawn(db, Sampler())
    try:
        yield c, db
    finally:
        await c.close()


@pytest.fixture
def sampler():
    s = Sampler()
    try:
        yield s
    finally:
        s.release.set()


@pytest_asyncio.fixture(loop_scope="module")
async def tc(shared: tuple[DagctxClient, Path], sampler: Sampler):
    c, _ = shared
    c.on_request("sampling/createMessage", sampler)
    c.notifications.clear()
    yield c


# ---------------------------------------------------------------- sessions


def result_body(tag: str, i: int, lines: int = 40) -> str:
    return (f"# src/pkg/{tag}_{i}.py\n"
            + "\n".join(f"    line {k}: total_{i} = accumulate(values, step={k % 7})  # {tag}" for k in range(lines)))


async def long_turn(c: DagctxClient, n: int, *, tag: str = "mod", model: str = SMALL, lines: int = 40,
                    session: tuple[str, str] | None = None) -> tuple[str, str]:
    """One user message, then ``n`` model calls each reading a file (every 50th fails)."""
    if session is None:
        s = await c.session_create(f"long-{tag}")
        sid, head = s.session_id, s.head
    else:
        sid, head = session
    prev = (await c.append(sid, "user", output=TASK, predecessor=head)).node.id
    for i in range(n):
        prev = await step(c, sid, prev, i, tag=tag, model=model, lines=lines)
    return sid, prev


async def step(c: DagctxClient, sid: str, prev: str, i: int, *, tag: str = "mod", model: str = SMALL,
               lines: int = 40) -> str:
    llm = await c.append(sid, "llm", name=model, output=f"Step {i}: reading src/pkg/{tag}_{i}.py.", predecessor=prev)
    await c.append(sid, "code", name="read_file", input={"path": f"src/pkg/{tag}_{i}.py"},
                   output=result_body(tag, i, lines), caller=llm.node.id, metadata={"toolCallId": f"call_{tag}_{i}"},
                   status="error" if i % 50 == 7 else "completed")
    return llm.node.id


def within(budget: Any) -> bool:
    return budget.input_used <= budget.input_budget - budget.safety_margin and budget.safety_margin > 0


def calls_and_results(messages: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, bool]]:
    """Neutral messages → (call id → owning llm node, call id → isError)."""
    owner: dict[str, str] = {}
    errors: dict[str, bool] = {}
    for m in messages:
        for b in m["content"]:
            if b["type"] == "tool_call":
                owner[b["id"]] = m["nodeIds"][0]
            elif b["type"] == "tool_result":
                errors[b["toolCallId"]] = b["isError"]
    return owner, errors


async def node_count(c: DagctxClient, sid: str) -> int:
    return (await c.session_get(sid)).node_count


async def check_request(c: DagctxClient, sid: str, req: Any, model: str, *, user_text: str | None = TASK) -> None:
    """The invariants of every request handed out (see the module docstring)."""
    assert within(req.budget), req.budget
    assert check_pairs(req.messages, "neutral") == []
    base = await c.render(sid, model=model, format="neutral", head=req.manifest["head"])
    base_owner, base_errors = calls_and_results(base.messages)
    owner, errors = calls_and_results(req.messages)
    assert set(owner) == set(errors), "a tool call without its result"
    for cid, err in errors.items():
        assert base_errors[cid] == err, f"error status of {cid} changed"
    covered = set(req.reduction.checkpoint.covers_ids) if req.reduction and req.reduction.checkpoint else set()
    missing = set(base_owner) - set(owner)
    assert {base_owner[cid] for cid in missing} <= covered, "a call left the request outside the checkpoint"
    if user_text is not None:
        texts = [b.get("text", "") for m in req.messages if m["role"] == "user" for b in m["content"]]
        assert user_text in texts, "the user's message was not kept verbatim"
    # replay of the call that was sent this request is byte for byte
    n = await node_count(c, sid)
    call = await c.append(sid, "llm", name=model, output="(answer)", predecessor=req.manifest["head"],
                          render_id=req.render_id, move_head=False)
    rep = await c.replay(sid, call.node.id)
    assert rep.exact and msgspec.json.encode(rep.messages) == msgspec.json.encode(req.messages)
    assert rep.manifest.get("turnReduction") == req.manifest.get("turnReduction")
    assert await node_count(c, sid) == n + 1


# ---------------------------------------------------------------- 1. the generated 300-call turn


@pytest.mark.parametrize("model", [SMALL, BIG])
async def test_generated_300_call_turn_fits(tc: DagctxClient, sampler: Sampler, model: str) -> None:
    sid, head = await long_turn(tc, 300, tag=f"gen{model[:3]}", model=model)
    unreduced = await tc.render(sid, model=model, format="neutral")
    n0 = await node_count(tc, sid)
    p = await tc.prepare(sid, model=model, format="neutral", tools=TOOLS, prompt_mode="none")
    assert await node_count(tc, sid) == n0, "reduction wrote to the ledger"
    assert unreduced.tokens.total > p.budget.input_budget  # it really needed reducing
    r = p.reduction
    assert r is not None and r.tokens_before > r.limit >= r.tokens_after == p.budget.input_used
    assert 0 < r.summary_calls <= MAX_SUMMARY_CALLS == 32 and len(sampler.requests) == r.summary_calls
    assert set(sampler.purposes()) <= {"dagctx/turn-reduction", "dagctx/turn-checkpoint"}
    assert r.summary_input_tokens > 0 and r.summary_output_tokens > 0
    assert r.checkpoint is not None and r.checkpoint.covers_ids and r.checkpoint.segments >= 1
    assert p.max_output_tokens == p.budget.output_reserve == min(MODELS[model]["maxOutput"], 16384,
                                                                 MODELS[model]["contextWindow"] // 4)
    assert p.manifest["turnReduction"]["checkpoint"]["summaryKey"] == r.checkpoint.summary_key
    assert any("reduction within the turn" in line for line in p.decision_path)
    # the same turn again: everything comes from the cache, the request is the same bytes
    asked = len(sampler.requests)
    again = await tc.prepare(sid, model=model, format="neutral", tools=TOOLS, prompt_mode="none")
    assert len(sampler.requests) == asked, "a second prepare of the same turn called the summarizer"
    assert again.messages == p.messages and again.reduction and again.reduction.reused >= 1
    assert again.stable_prefix and again.stable_prefix.messages == len(again.messages)
    # more steps: the reduction is recomputed from the data for each request, and the
    # checkpoint grows in quanta of 8 steps, so the reduced prefix changes rarely
    prev, more = again, again  # the branch's newest request: what the next one is compared with
    changes = 0
    for j in range(16):
        head = await step(tc, sid, head, 300 + j, tag=f"gen{model[:3]}", model=model)
        more = await tc.prepare(sid, model=model, format="neutral", tools=TOOLS, prompt_mode="none")
        assert within(more.budget)
        kept = more.stable_prefix.messages if more.stable_prefix else 0
        if kept < len(prev.messages) - 1:
            changes += 1
        # every break of the prompt cache is reported, with its cause and its numbers (SPEC §7)
        brk = more.cache_break
        assert (brk is not None) == (kept < len(prev.messages)), (kept, len(prev.messages), brk)
        if brk is not None:
            assert brk.previous_render_id == prev.render_id and brk.at_message == kept
            assert brk.causes and set(brk.causes) <= {"checkpoint", "reduction", "aging"}, brk.causes
            assert brk.rewritten_tokens > 0 and brk.invalidated_tokens > 0
            assert any(line.startswith("prompt cache break") for line in more.decision_path)
        prev = more
    assert changes <= 3, changes  # 16 steps: about one change per quantum of 8
    await check_request(tc, sid, p, model)
    await check_request(tc, sid, more, model)


async def test_render_with_budget_is_checked_and_reduced(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 120, tag="rb")
    plain = await tc.render(sid, model=SMALL, format="anthropic")
    assert plain.budget is None and plain.reduction is None and plain.tokens.total > 28000
    r = await tc.render(sid, model=SMALL, format="anthropic", budget=True, tools=TOOLS, work_done_token="rb-1")
    assert r.budget is not None and within(r.budget) and r.reduction is not None and r.reduction.summary_calls > 0
    assert check_pairs(r.messages, "anthropic") == []
    assert r.manifest["tokens"] == r.tokens.total + r.budget.tools_schema
    # the same request as a neutral prepare reuses every summary
    asked = len(sampler.requests)
    p = await tc.prepare(sid, model=SMALL, format="neutral", tools=TOOLS, prompt_mode="none")
    assert len(sampler.requests) == asked and within(p.budget)
    await check_request(tc, sid, p, SMALL)
    await asyncio.sleep(0.05)
    kinds = [p["value"]["kind"] for m, p in ((m, msgspec.to_builtins(p)) for m, p in tc.notifications)
             if m == "$/progress" and p["token"] == "rb-1"]
    assert kinds[0] == "begin" and kinds[-1] == "end" and kinds.count("report") >= 1


async def test_explicit_output_cap_is_kept(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 60, tag="cap")
    p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none", max_output_tokens=12000)
    assert p.max_output_tokens == p.budget.output_reserve == 12000
    assert p.budget.input_budget == 32000 - 12000 and within(p.budget)
    await check_request(tc, sid, p, SMALL)


# ---------------------------------------------------------------- 2. real sessions


@pytest.mark.parametrize("model", [SMALL, BIG])
@pytest.mark.parametrize("rel", [CODEX, CC])
async def test_real_sessions_fit(tc: DagctxClient, sampler: Sampler, corpus: Path, rel: str, model: str,
                                  request: pytest.FixtureRequest) -> None:
    sid = (await tc.import_path(str(corpus / rel))).sessions[0].session_id
    n0 = await node_count(tc, sid)
    p = await tc.prepare(sid, model=model, format="neutral", prompt_mode="none")
    assert await node_count(tc, sid) == n0
    await check_request(tc, sid, p, model, user_text=None)
    if model == SMALL:
        assert p.reduction is not None and p.reduction.tokens_before > p.reduction.limit
    if rel == CC:
        # the loop's signed thinking goes out byte for byte, reduced or not (SPEC §6, §8)
        plain = await tc.render(sid, model=model, format="neutral")

        def signed(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [b for m in msgs for b in m["content"] if b.get("type") in ("thinking", "redacted_thinking")]

        assert signed(plain.messages) and signed(p.messages) == signed(plain.messages)
    asked = len(sampler.requests)
    again = await tc.prepare(sid, model=model, format="neutral", prompt_mode="none")
    assert len(sampler.requests) == asked and again.messages == p.messages


@pytest.mark.parametrize("rel", [CODEX, CC])
async def test_real_sessions_with_auto_compaction_fit_at_32k(tc: DagctxClient, sampler: Sampler, corpus: Path,
                                                            rel: str) -> None:
    """Compaction first (the older turns), then reduction within the newest turn."""
    sid = (await tc.import_path(str(corpus / rel))).sessions[0].session_id
    p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none", allow_compaction=True)
    await check_request(tc, sid, p, SMALL, user_text=None)
    assert p.compaction is not None, p.decision_path
    if p.compaction["ok"] and p.compaction.get("summaryId"):
        assert p.summary_id == p.compaction["summaryId"]
    # the reduction's summaries were asked for now, or found stored by an earlier test
    assert p.reduction is None or (any(x.startswith("dagctx/turn-") for x in sampler.purposes())
                                   or p.reduction.cache_hits > 0)


async def test_a_fresh_daemon_reuses_the_cached_summaries(tmp_path: Path, sampler: Sampler) -> None:
    db = tmp_path / "fresh.db"
    c = await spawn(db, sampler)
    try:
        sid, _ = await long_turn(c, 150, tag="fresh")
        first = await c.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
        assert first.reduction and first.reduction.summary_calls > 0
    finally:
        await c.close()
    asked = len(sampler.requests)
    c = await spawn(db, sampler)
    try:
        again = await c.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
        assert len(sampler.requests) == asked, "the derived summary table was not reused"
        assert again.messages == first.messages and again.reduction and again.reduction.cache_hits > 0
        assert again.reduction.summary_calls == 0
    finally:
        await c.close()


# ---------------------------------------------------------------- 3. failure paths


async def state(c: DagctxClient, sid: str) -> tuple[int, str]:
    info = await c.session_get(sid)
    return info.node_count, info.head


async def expect_refused(c: DagctxClient, sid: str, **kw: Any) -> dict[str, Any]:
    before = await state(c, sid)
    with pytest.raises(RpcError) as err:
        await c.prepare(sid, model=SMALL, format="neutral", prompt_mode="none", **kw)
    assert err.value.kind == "BudgetExceeded", err.value
    d = err.value.data["details"]
    assert d["inputUsed"] > d["limit"] and d["overBy"] == d["inputUsed"] - d["limit"]
    assert d["limit"] == d["inputBudget"] - d["safetyMargin"]
    assert await state(c, sid) == before, "a refused request changed the ledger"
    return d


def _raise(params: Any) -> str:
    raise RuntimeError("summarizer down")


@pytest.mark.parametrize("mode", ["error", "empty", "longer"])
async def test_failed_summaries_refuse_the_request(tc: DagctxClient, sampler: Sampler, mode: str) -> None:
    sid, _ = await long_turn(tc, 80, tag=f"fail{mode}")
    sampler.answer = {"error": _raise, "empty": lambda p: "   ",
                      "longer": lambda p: request_text(p) * 2}[mode]
    d = await expect_refused(tc, sid)
    assert 0 < d["summaryCalls"] <= MAX_SUMMARY_CALLS and d["summaryCalls"] == len(sampler.requests)
    want = {"error": "summarizer down", "empty": "empty", "longer": "notSmaller"}[mode]
    assert any(want in f for f in d["failures"]), d["failures"]
    # nothing bad was cached: with a working summarizer the same request now fits
    sampler.answer = condensed
    p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
    await check_request(tc, sid, p, SMALL)


async def test_partial_success_fits_or_is_refused_never_over(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 70, tag="partial")
    n = 0

    def every_other(params: Any) -> str:
        nonlocal n
        n += 1
        if n % 2:
            raise RuntimeError("flaky summarizer")
        return condensed(params)

    sampler.answer = every_other
    try:
        p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
    except RpcError as err:
        assert err.kind == "BudgetExceeded" and "flaky" in err.message
    else:
        assert p.reduction and any("flaky" in f for f in p.reduction.failures)
        await check_request(tc, sid, p, SMALL)


async def test_timeout_refuses_within_the_time_limit(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 80, tag="slow")

    async def never(params: Any) -> str:  # answers only at teardown: the limit must not wait for it
        await sampler.release.wait()
        return "late"

    sampler.answer = never
    d = await expect_refused(tc, sid, reduction_timeout_seconds=0.5)
    assert sampler.requests and not sampler.release.is_set()  # refused while every summary was still pending
    assert any("timeLimit" in f for f in d["failures"]), d["failures"]
    with pytest.raises(RpcError) as err:
        await tc.prepare(sid, model=SMALL, reduction_timeout_seconds=0)
    assert err.value.kind == "InvalidParams" and err.value.data["path"] == "params.reductionTimeoutSeconds"


async def test_the_32_call_cap(tc: DagctxClient, sampler: Sampler) -> None:
    """Many earlier turns, each with one large result, and a short newest turn: only
    result summaries can help, and one build makes at most 32 calls."""
    s = await tc.session_create("cap32")
    sid, head = s.session_id, s.head
    for i in range(50):
        u = await tc.append(sid, "user", output=f"Turn {i}: read src/pkg/big_{i}.py", predecessor=head)
        l1 = await tc.append(sid, "llm", name=SMALL, output="Reading.", predecessor=u.node.id)
        await tc.append(sid, "code", name="read_file", input={"path": f"src/pkg/big_{i}.py"},
                        output=result_body("big", i, 120), caller=l1.node.id, metadata={"toolCallId": f"call_big_{i}"})
        head = (await tc.append(sid, "llm", name=SMALL, output="Done.", predecessor=l1.node.id)).node.id
    await tc.append(sid, "user", output="Now summarize what you found.", predecessor=head)
    d = await expect_refused(tc, sid)
    assert d["summaryCalls"] == MAX_SUMMARY_CALLS == len(sampler.requests) == 32
    assert "callLimit" in d["failures"], d["failures"]
    # what succeeded is cached: the next build goes on from there, again within 32 calls
    p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
    assert p.reduction and p.reduction.cache_hits >= MAX_SUMMARY_CALLS
    assert 0 < p.reduction.summary_calls <= MAX_SUMMARY_CALLS
    assert len(sampler.requests) == MAX_SUMMARY_CALLS + p.reduction.summary_calls
    await check_request(tc, sid, p, SMALL, user_text="Now summarize what you found.")


async def test_cancel_answers_32800_and_writes_nothing(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 80, tag="cancel")
    sampler.answer = lambda p: sampler.slow(30)
    before = await state(tc, sid)
    msg_id, fut = tc.send_request("context/prepare", pc.PrepareParams(
        session_id=sid, model=SMALL, prompt_mode="none", work_done_token="cancel-me"))
    await asyncio.wait_for(sampler.called.wait(), 10)
    tc.cancel(msg_id)
    with pytest.raises(RpcError) as err:
        await asyncio.wait_for(fut, 10)
    assert err.value.code == -32800 and err.value.kind == "RequestCancelled"
    sampler.release.set()
    await asyncio.sleep(0.1)
    assert await state(tc, sid) == before
    assert any(m == "$/cancelRequest" for m, _ in tc.notifications), "the sampling request was not withdrawn"
    sampler.answer = condensed
    p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
    await check_request(tc, sid, p, SMALL)


async def test_context_overflow_retries_with_smaller_segments(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 150, tag="overflow")
    sizes: list[int] = []

    def small_window(params: Any) -> str:
        n = len(request_text(params))
        sizes.append(n)
        if n > 20_000:
            raise ValueError("context length exceeded: the summarizer takes 20000 characters")
        return condensed(params)

    sampler.answer = small_window
    p = await tc.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
    assert any(n > 20_000 for n in sizes) and any(n <= 20_000 for n in sizes[sizes.index(max(sizes)):])
    assert p.reduction and p.reduction.checkpoint and p.reduction.checkpoint.segments > 1
    await check_request(tc, sid, p, SMALL)


async def test_client_that_cannot_sample_is_refused_clearly(tmp_path: Path) -> None:
    c = await spawn(tmp_path / "nosample.db", None)
    try:
        sid, _ = await long_turn(c, 80, tag="nosample")
        d = await expect_refused(c, sid)
        assert d["summaryCalls"] == 0 and any("no summarizer" in f for f in d["failures"])
    finally:
        await c.close()


async def test_protected_content_that_cannot_fit(tc: DagctxClient, sampler: Sampler) -> None:
    s = await tc.session_create("protected")
    huge = " ".join(f"requirement-{i} must hold" for i in range(12000))
    await tc.append(s.session_id, "user", output=huge, predecessor=s.head)
    d = await expect_refused(tc, s.session_id)
    assert d["userMessages"] > d["limit"] and d["protectedTokens"] >= d["userMessages"]
    assert sampler.requests == [], "no summary can make protected content fit"
    with pytest.raises(RpcError) as err:
        await tc.render(s.session_id, model=SMALL, budget=True)
    assert err.value.kind == "BudgetExceeded"


async def test_no_reduction_engine_refuses_instead_of_reducing(tc: DagctxClient, sampler: Sampler) -> None:
    sid, _ = await long_turn(tc, 80, tag="noreduce")
    d = await expect_refused(tc, sid, context_engine="no-reduction")
    assert d["summaryCalls"] == 0 and sampler.requests == []


def endpoint_condensed(body: dict[str, Any]) -> str:
    """The endpoint's summary: the first 30 words of the result or steps it was shown."""
    text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
    hit = re.search(r"<(result|steps)>\n(.*?)\n</\1>", text, re.S)
    return "condensed: " + " ".join((hit.group(2) if hit else text).split()[:30])


async def test_summaries_from_the_configured_endpoint(tmp_path: Path) -> None:
    """No client sampling: the summaries come from the endpoint compaction uses; a 503
    is retried once."""
    stub = ChatEndpoint(endpoint_condensed, statuses=[503])
    c = await spawn(tmp_path / "endpoint.db", None, samplingEndpoint={"baseUrl": stub.url, "model": "stub-model"})
    try:
        sid, _ = await long_turn(c, 120, tag="endpoint")
        p = await c.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
        assert p.reduction and p.reduction.summary_calls > 0
        assert len(stub.calls) == p.reduction.summary_calls + 1 and stub.calls[0]["model"] == "stub-model"
        await check_request(c, sid, p, SMALL)
    finally:
        await c.close()
        stub.close()


# ---------------------------------------------------------------- 4. aging within a long turn


async def test_long_turn_ages_in_coarse_step_quanta(tmp_path: Path) -> None:
    c = await spawn(tmp_path / "aging.db", None, aging={"minAgeSeconds": 0, "minTokens": 200,
                                                        "softTrimHeadChars": 300, "softTrimTailChars": 100})
    try:
        sid, head = await long_turn(c, 30, tag="age", model=BIG)
        renders = []
        for i in range(30, 50):
            renders.append(await c.render(sid, model=BIG, format="openai"))
            head = await step(c, sid, head, i, tag="age", model=BIG)
        lt = [r.manifest.get("agingLongTurn") for r in renders]
        assert all(x is not None for x in lt)
        # 30–31 steps: the quantum that starts at step 16; 32–47: at 32; 48–49: at 48
        caps = [x["stepCap"] for x in lt]
        assert caps == [16] * 2 + [32] * 16 + [48] * 2
        kinds = [r.manifest["agingKinds"] for r in renders]
        assert kinds[2] and all(k == kinds[2] for k in kinds[2:18]) and kinds[18] != kinds[2] != kinds[1]
        # within a quantum the whole previous request is a stable prefix; the next quantum breaks it once
        for prev, r in zip(renders[2:18], renders[3:18]):
            assert r.stable_prefix.messages >= len(prev.messages)
        assert renders[18].stable_prefix.messages < len(renders[17].messages)
    finally:
        await c.close()
