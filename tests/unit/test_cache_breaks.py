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
