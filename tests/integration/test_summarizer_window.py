"""Summary requests fit the summarizer (SPEC §8), through a real daemon.

Compaction (staged or not), tool-result summaries and request checkpoints size
``maxTokens`` and their input from the summarizing model's window and check each
request against it before sending; a summarizer too small for one chunk fails with a
clear ``SamplingFailed`` reason, sends nothing and writes nothing. Checked at an
8k-window model (before: every compaction request was 11.6k–12.2k tokens with
``maxTokens`` 8,192) and at a 1k one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dagctx.context.tokens import estimate_tokens

from test_compaction_daemon import Sampler as CompactionSampler
from test_compaction_daemon import chat
from test_compaction_daemon import spawn as spawn_compaction
from test_turn_reduction_daemon import Sampler as ReductionSampler
from test_turn_reduction_daemon import long_turn
from test_turn_reduction_daemon import spawn as spawn_reduction

pytestmark = pytest.mark.asyncio

TINY = "tiny-8k"
NANO = "nano-1k"
MODELS = {TINY: {"contextWindow": 8192, "maxOutput": 8192}, NANO: {"contextWindow": 1024, "maxOutput": 1024}}


def request_size(params: Any) -> int:
    """Estimated input tokens of one sampling request (the models here have no exact tokenizer)."""
    return estimate_tokens(params.system_prompt or "") + sum(estimate_tokens(m.content.text) + 4
                                                             for m in params.messages)


def assert_all_fit(requests: list[Any], window: int) -> None:
    assert requests
    for params in requests:
        assert params.max_tokens <= window // 4, params.max_tokens
        assert request_size(params) + params.max_tokens <= window, (request_size(params), params.max_tokens)


async def test_compaction_at_an_8k_window_fits_every_request(db_path: Path) -> None:
    sampler = CompactionSampler()
    c = await spawn_compaction(db_path, sampler, models=MODELS)
    try:
        s = await c.session_create("tiny")
        sid = s.session_id
        await chat(c, sid, s.head, 24, lines=60)
        res = await c.compact(sid, model=TINY)
        assert res.ok and res.summary_id, res
        assert_all_fit(sampler.requests, 8192)
        assert len(sampler.requests) > 1, "a prefix this long is summarized in stages at 8k"
        r = await c.render(sid, model=TINY, format="neutral")
        assert r.reads[0] == res.summary_id
    finally:
        await c.close()


async def test_a_summarizer_too_small_for_one_chunk_writes_nothing(db_path: Path) -> None:
    sampler = CompactionSampler()
    c = await spawn_compaction(db_path, sampler, models=MODELS)
    try:
        s = await c.session_create("nano")
        sid = s.session_id
        await chat(c, sid, s.head, 6, lines=30)
        n0 = (await c.session_get(sid)).node_count
        res = await c.compact(sid, model=NANO, keep_recent_tokens=100)
        assert not res.ok and res.reason == "failed" and res.summary_id is None, res
        assert "SamplingFailed" in res.error and "too small" in res.error and NANO in res.error, res.error
        assert sampler.requests == [], "nothing is sent to a summarizer that cannot take it"
        assert (await c.session_get(sid)).node_count == n0
    finally:
        await c.close()


async def test_reduction_within_a_turn_at_an_8k_window_fits_every_request(db_path: Path) -> None:
    sampler = ReductionSampler()
    c = await spawn_reduction(db_path, sampler, models=MODELS)
    try:
        sid, _ = await long_turn(c, 30, tag="tiny", model=TINY, lines=20)
        p = await c.prepare(sid, model=TINY, format="neutral", prompt_mode="none")
        assert p.reduction is not None and p.reduction.summary_calls > 0
        assert p.budget.input_used <= p.budget.input_budget - p.budget.safety_margin
        assert_all_fit(sampler.requests, 8192)
        assert {params.metadata["purpose"] for params in sampler.requests} <= {
            "dagctx/turn-reduction", "dagctx/turn-checkpoint"}
    finally:
        await c.close()
