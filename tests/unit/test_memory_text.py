"""The pure parts of memory search (SPEC §5.1): chunking, keywords, decay, MMR."""

from __future__ import annotations

import pytest

from dagctx.context import memory_text as mt


def test_chunks_cover_every_line_with_overlap_and_keep_line_numbers() -> None:
    lines = [f"line {i} says something about the build cache and its eviction" for i in range(1, 101)]
    text = "\n".join(lines) + "\n"
    chunks = mt.chunk_text(text, 80, 20)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 100
    for a, b in zip(chunks, chunks[1:]):
        assert b.start_line > a.start_line and b.start_line <= a.end_line  # overlap, never a gap
    for c in chunks:
        assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
    assert mt.chunk_text(text, 80, 0)[1].start_line == mt.chunk_text(text, 80, 0)[0].end_line + 1


def test_a_line_longer_than_a_chunk_is_cut_and_keeps_its_number() -> None:
    long = "word " * 2000
    chunks = mt.chunk_text("intro\n" + long + "\noutro\n", 100, 10)
    middle = [c for c in chunks if c.start_line == c.end_line == 2]
    assert len(middle) > 5 and "".join(c.text for c in middle if c.text.startswith("word"))
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 3
    assert mt.chunk_text("", 100, 10) == [] and mt.chunk_text("\n\n  \n", 100, 10) == []


def test_keywords_of_conversational_queries() -> None:
    assert mt.expression("what did we decide about the cache eviction policy?") == (
        "cache OR eviction OR policy", ["cache", "eviction", "policy"])
    assert mt.expression('"cache eviction" AND lru') == ('"cache eviction" AND lru', [])
    assert mt.expression("src/app.py*") == ("src/app.py*", [])
    expr, words = mt.expression("缓存淘汰策略")
    assert words == ["缓存", "存淘", "淘汰", "汰策", "策略"] and expr == " OR ".join(words)
    assert mt.expression("what is it") == ("what OR is OR it", ["what", "is", "it"])  # nothing else left


def test_decay_halves_per_half_life() -> None:
    day = 86_400.0
    assert mt.decay(0.8, 0, 30) == 0.8
    assert mt.decay(0.8, 30 * day, 30) == pytest.approx(0.4)
    assert mt.decay(0.8, 60 * day, 30) == pytest.approx(0.2)
    assert mt.decay(0.8, -5 * day, 30) == 0.8  # a time in the future is age 0
    assert mt.text_score(0) == 0 and mt.text_score(1) == 0.5 and mt.text_score(-3) == 0


def test_mmr_prefers_a_different_hit_over_a_near_duplicate() -> None:
    items = [("a", 1.0, "deploy pipeline blue green canary"), ("b", 0.98, "deploy pipeline blue green canary today"),
             ("c", 0.7, "rollback procedure for incidents in the deploy step")]
    pick = lambda lam: [i[0] for i in mt.mmr(items, lambda i: i[1], lambda i: i[2], lam, 2)]  # noqa: E731
    assert pick(1.0) == ["a", "b"]
    assert pick(0.5) == ["a", "c"]
    assert mt.mmr([], lambda i: 0.0, str, 0.5, 3) == []


def test_a_keyword_hit_scores_by_the_share_of_the_query_it_holds() -> None:
    words = ["cache", "eviction", "policy"]
    assert mt.coverage("The cache eviction policy is LRU.", words) == 1.0
    assert mt.coverage("The CI CACHE is keyed by the lockfile.", words) == pytest.approx(1 / 3)
    # the full-text index matched it on something (folding this does not repeat): one at least
    assert mt.coverage("nothing here", words) == pytest.approx(1 / 3)
    assert mt.coverage("anything", []) == 1.0  # a query used as written
    full = mt.keyword_score(4.0, "cache eviction policy", words)
    assert full == pytest.approx(mt.text_score(4.0)) == pytest.approx(0.8)
    assert mt.keyword_score(4.0, "a cache", words) == pytest.approx(0.8 / 9)
    assert mt.keyword_score(0.0, "cache eviction policy", words) == 0.0
    # CJK keywords are character pairs, found as substrings
    assert mt.coverage("我们决定把数据库迁移安排在周二", ["数据", "据库", "库迁", "迁移"]) == 1.0
