"""When ``context/prepare`` recommends compaction (SPEC §7, compaction signals): at 70 % of
the input budget, and below that once a compaction pays for the prompt-cache rewrite it
causes.

Driven through the real daemon on a real SQLite file: a client loop that prepares a
request, appends the model's answer with the request's ``renderId`` (so the daemon knows
what each request held), then the user's next message. The arithmetic of the rule has
its known-answer test in ``tests/unit/test_cache_breaks.py``; here the daemon must apply
it to the requests it handed out.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import context_messages as pc

LARGE, SMALL = "wide-64k", "narrow-8k"
MODELS = {LARGE: {"contextWindow": 64_000, "maxOutput": 4_000},
          SMALL: {"contextWindow": 8_000, "maxOutput": 1_000}}


def message(i: int, words: int) -> str:
    return f"Step {i}: " + " ".join(f"w{i}x{k}" for k in range(words))


async def spawn(db: Path, **options: Any) -> DagctxClient:
    return await DagctxClient.spawn(db, initialization_options={"models": MODELS, **options})


async def loop(c: DagctxClient, model: str, words: int, *, until: Any, limit: int = 80,
               **prepare: Any) -> list[pc.PrepareResult]:
    return (await loop_in(c, model, words, until=until, limit=limit, **prepare))[1]


async def loop_in(c: DagctxClient, model: str, words: int, *, until: Any,
                  limit: int = 80, **prepare: Any) -> tuple[str, list[pc.PrepareResult]]:
    """Prepare → answer (with the renderId) → next user message, until ``until(result)``."""
    s = await c.session_create("economy")
    sid = s.session_id
    head = (await c.append(sid, "user", output=message(0, words), predecessor=s.head)).node.id
    out: list[pc.PrepareResult] = []
    for i in range(1, limit):
        p = await c.prepare(sid, model=model, format="anthropic", prompt_mode="none", **prepare)
        out.append(p)
        if until(p):
            return sid, out
        llm = await c.append(sid, "llm", name=model, output=f"Done with step {i}.", predecessor=head,
                             render_id=p.render_id)
        head = (await c.append(sid, "user", output=message(i, words), predecessor=llm.node.id)).node.id
    raise AssertionError(f"no request met the condition in {limit} steps: {out[-1].decision_path}")


def numbers(line: str) -> tuple[float, float]:
    m = re.search(r"read ([\d,]+) base-input tokens beyond .*?; it costs ([\d,]+)", line)
    assert m, line
    return float(m.group(1).replace(",", "")), float(m.group(2).replace(",", ""))


async def test_a_large_window_is_compacted_when_it_pays_long_before_it_fills(tmp_path: Path) -> None:
    c = await spawn(tmp_path / "a.db")
    try:
        sid, got = await loop_in(c, LARGE, 150, until=lambda p: p.recommend_compaction)
        last = got[-1]
        # recommended for the cache, not for the budget: far below 70 %
        assert last.budget.percent_used < 50 and not last.needs_compaction
        line = next(x for x in last.decision_path if x.startswith("compaction recommended: it pays"))
        carried, cost = numbers(line)
        assert carried >= cost
        # every request before was not recommended, and each extended the one before it
        assert not any(p.recommend_compaction for p in got[:-1])
        assert all(p.cache_break is None for p in got)
        # the compaction it recommends leaves at most half of the request (MIN_GAIN)
        res = await c.compact(sid, model=LARGE, fallback="structural", format="anthropic")
        assert res.ok and res.summary_id, res
        assert res.tokens_after * 2 <= res.tokens_before
    finally:
        await c.close()


async def test_a_small_window_is_compacted_at_70_percent_where_compaction_does_not_pay_sooner(tmp_path: Path) -> None:
    c = await spawn(tmp_path / "b.db")
    try:
        got = await loop(c, SMALL, 120, until=lambda p: p.recommend_compaction)
        # at 8k the summarizer's read outweighs what a compaction saves before the budget
        # runs out: nothing is recommended below 70 %, and the first request at 70 % is
        assert all(p.budget.percent_used < 70 for p in got[:-1]), [p.budget.percent_used for p in got]
        last = got[-1]
        assert 70 <= last.budget.percent_used < 80 and not last.needs_compaction
        assert "≥ 70 %: compaction recommended" in last.decision_path
        assert not any(x.startswith("compaction recommended: it pays") for p in got for x in p.decision_path)
    finally:
        await c.close()


async def test_a_cold_cache_brings_the_compaction_forward(tmp_path: Path) -> None:
    """The same session twice: with the default cache lifetime, and with a lifetime of 0 s
    (every request finds the cache cold: nothing to rewrite, the removable part would be
    written at 1.25×). The cold one is recommended at an earlier request, and says why."""
    warm = await spawn(tmp_path / "warm.db")
    cold = await spawn(tmp_path / "cold.db", promptCacheTtlSeconds=0)
    try:
        w = await loop(warm, LARGE, 150, until=lambda p: p.recommend_compaction)
        k = await loop(cold, LARGE, 150, until=lambda p: p.recommend_compaction)
        assert len(k) < len(w)
        assert any("the prompt cache has gone cold" in x for x in k[-1].decision_path)
        assert not any("gone cold" in x for x in w[-1].decision_path)
        # the requests themselves are the same bytes: only the advice differs
        assert [p.messages for p in k] == [p.messages for p in w[: len(k)]]
    finally:
        await warm.close()
        await cold.close()


async def test_the_clients_word_on_its_prompt_cache_decides_over_the_daemons_clock(tmp_path: Path) -> None:
    """``promptCache`` (SPEC §7): a client that knows its provider's cache expired (a replay
    of recorded times appends in seconds what took hours) says ``cold`` and the daemon
    treats the cache as cold although its clock saw no pause; ``warm`` keeps the rewrite in
    the reckoning although the daemon's lifetime of 0 s says every cache is cold."""
    c = await spawn(tmp_path / "default.db")
    zero = await spawn(tmp_path / "zero.db", promptCacheTtlSeconds=0)
    try:
        w = await loop(c, LARGE, 150, until=lambda p: p.recommend_compaction)
        k = await loop(c, LARGE, 150, until=lambda p: p.recommend_compaction, prompt_cache="cold")
        assert len(k) < len(w)
        assert any("the prompt cache has gone cold" in x for x in k[-1].decision_path)
        z = await loop(zero, LARGE, 150, until=lambda p: p.recommend_compaction, prompt_cache="warm")
        assert len(z) == len(w)
        assert not any("gone cold" in x for p in z for x in p.decision_path)
        assert [p.messages for p in z] == [p.messages for p in w]
        # a bad value is refused with the field named
        sid = (await c.session_list()).sessions[0].session_id
        with pytest.raises(RpcError) as err:
            await c.request("context/prepare", {"sessionId": sid, "promptCache": "tepid"})
        assert err.value.kind == "InvalidParams" and "promptCache" in err.value.message, err.value
    finally:
        await c.close()
        await zero.close()
