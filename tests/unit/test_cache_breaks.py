"""Prompt-cache breaks (SPEC §7): causes from two manifests, the numbers of one break."""

from __future__ import annotations

from dagctx.context import cache_breaks as cb


def test_causes_come_from_the_manifests() -> None:
    base = {"systemNode": "s1", "toolsHash": "t1", "summaryId": None, "agingBoundary": 10, "agedText": {}}
    assert cb.causes(base, dict(base)) == ["other"]
    assert cb.causes(base, {**base, "summaryId": "sum1"}) == ["compaction"]
    assert cb.causes(base, {**base, "systemNode": "s2"}) == ["systemPrompt"]
    assert cb.causes(base, {**base, "toolsHash": "t2"}) == ["tools"]
    assert cb.causes(base, {**base, "agingBoundary": 20, "agedText": {"n1": "[aged]"}}) == ["aging"]
    cp = {**base, "turnReduction": {"results": {}, "checkpoint": {"id": "checkpoint-1"}}}
    assert cb.causes(base, cp) == ["checkpoint"]
    red = {**base, "turnReduction": {"results": {"n1": "k1"}, "checkpoint": None}, "agedText": {"n1": "sum"}}
    assert cb.causes(base, red) == ["reduction"]  # a summarized result's text is not aging
    both = {**cp, "summaryId": "sum1"}
    assert cb.causes(base, both) == ["compaction", "checkpoint"]


def test_reasoning_dropped_at_a_new_turn_is_named() -> None:
    base = {"systemNode": "s1"}
    with_thinking = {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                                      {"type": "text", "text": "done"}]}
    without = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
    assert cb.causes(base, base, with_thinking, without) == ["reasoning"]
    other = {"role": "assistant", "content": [{"type": "text", "text": "changed"}]}
    assert cb.causes(base, base, with_thinking, other) == ["other"]


def test_the_numbers_of_a_break() -> None:
    # previous request 10,000 tokens; this one 10,500, identical for its first 4,000
    b = cb.measure(prev_total=10_000, total=10_500, stable_tokens=4_000, at_message=3, why=["aging"])
    assert (b.invalidated_tokens, b.rewritten_tokens) == (6_000, 6_500)
    # with the break: 6,500 written, 4,000 read; without: 10,000 read, 500 written
    assert b.estimated_cost == round(1.25 * 6_500 + 0.1 * 4_000 - (0.1 * 10_000 + 1.25 * 500), 1) == 6_900.0
    # a compaction that shrinks the request to 1,000 tokens pays at once
    c = cb.measure(prev_total=10_000, total=1_000, stable_tokens=0, at_message=0, why=["compaction"])
    assert c.rewritten_tokens == 1_000 and c.estimated_cost == 1.25 * 1_000 - 0.1 * 10_000


# ---------------------------------------------------------------- when compaction pays (SPEC §7)

from dagctx.context import cache_economy as ce  # noqa: E402


def test_a_compaction_pays_once_the_excess_reads_cover_its_rewrite_and_the_summarizer() -> None:
    # After a compaction the request would hold 10,000 tokens; the history grows by
    # 1,000 a request from there. Before a request of T tokens, n = T/1000 − 10 earlier
    # requests read 1,000 … n·1,000 tokens beyond 10,000 (0.1× each), this one (n+1)·1,000;
    # a compaction costs 1.15 × 10,000 for the rewrite + T for the summarizer's read.
    after = 10_000

    def at(tokens: int) -> ce.CompactionEconomy:
        n = tokens // 1000 - 10
        return ce.compaction_economy([after + 1000 * k for k in range(1, n)], tokens, after)

    # 40,000: 0.1 × (1+…+30) × 1,000 = 46,500 < 11,500 + 40,000 = 51,500 → deferred
    e = at(40_000)
    assert (e.pays, e.carried, e.cost) == (False, 46_500.0, 51_500.0)
    # 42,000: 0.1 × (1+…+32) × 1,000 = 52,800 < 11,500 + 42,000 = 53,500 → still deferred
    assert not at(42_000).pays
    # 43,000: 0.1 × (1+…+33) × 1,000 = 56,100 ≥ 54,500: it pays, the first size at which it does
    e = at(43_000)
    assert (e.pays, e.carried, e.cost, e.requests) == (True, 56_100.0, 54_500.0, 32)
    assert next(t for t in range(21_000, 60_000, 1000) if at(t).pays) == 43_000


def test_a_compaction_that_would_not_halve_the_request_or_has_no_history_never_pays() -> None:
    # a huge excess, but the request is less than twice what a compaction leaves
    assert not ce.compaction_economy([19_000] * 1000, 19_000, 10_000).pays
    assert ce.compaction_economy([20_000] * 1000, 20_000, 10_000).pays
    # the first request of a branch (or right after a compaction): nothing to learn from
    assert not ce.compaction_economy([], 10**6, 10_000).pays


def test_aged_results_a_new_summary_folds_in_are_the_compaction_not_aging() -> None:
    prev = {"systemNode": "s1", "summaryId": None, "agingBoundary": 10, "agedText": {"r1": "[aged]", "r2": "[aged]"}}
    cur = {"systemNode": "s1", "summaryId": "sum1", "agingBoundary": 4, "agedText": {"r2": "[aged]"}}
    assert cb.causes(prev, cur) == ["compaction"]
    # an aged text that changed in a result both requests send is aging still
    assert cb.causes(prev, {**cur, "agedText": {"r2": "[cleared]"}}) == ["compaction", "aging"]
    # without a new summary, a result that stops being aged is aging
    assert cb.causes(prev, {**prev, "agedText": {"r2": "[aged]"}}) == ["aging"]


def test_an_aging_change_pays_once_the_reads_since_the_last_break_cover_its_rewrite() -> None:
    """SPEC §8, aging and the prompt cache: 8,000 tokens freed, 30,000 rewritten after the
    first changed result. The rewrite costs (1.25 − 0.1) × 30,000 = 34,500; each request
    since the last break read the 8,000 at 0.1× = 800: it pays from the 44th request on
    (43 × 800 = 34,400 < 34,500 ≤ 44 × 800 = 35,200)."""
    assert not ce.aging_economy(8_000, 30_000, 43).pays
    e = ce.aging_economy(8_000, 30_000, 44)
    assert e.pays and e.carried == 35_200 and e.cost == 34_500
    assert e.as_dict() == {"carried": 35_200, "cost": 34_500, "freed": 8_000, "rewrite": 30_000,
                           "requests": 44, "cold": False}
    # a cold cache has nothing to rewrite: any change that frees tokens is made at once
    assert ce.aging_economy(8_000, 30_000, 0, cold=True).pays
    # a change that frees nothing never pays while the cache is warm
    assert not ce.aging_economy(0, 10, 10**6).pays
    assert not ce.aging_economy(-50, 10, 10**6).pays
