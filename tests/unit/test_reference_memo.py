"""Reference extraction's shortcuts (SPEC §8): skipping a pattern whose required
character is absent finds the same references, and the per-text memo is bounded by
the characters it holds, returning the same answer on a hit."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dagctx.context import references as refs


def test_each_kind_is_found_when_its_text_holds_only_what_it_needs() -> None:
    cases = {
        "id deadbeef-dead-beef-dead-beefdeadbeef here": "deadbeef-dead-beef-dead-beefdeadbeef",
        "see http://example.org/a, then": "http://example.org/a",
        "the SessionGraph class": "SessionGraph",
        "call render_view now": "render_view",
        "open localhost:8080 please": "localhost:8080",
        "port :5432 only": ":5432",
        "edit ~/.bashrc": "~/.bashrc",
        "read notes.md first": "notes.md",
        "sha abcdef1 it is": "abcdef1",
        "pid 123456 died": "123456",
        "run `make -j4` again": "make -j4",
        "请修改src/app.py文件": "src/app.py",
    }
    for text, want in cases.items():
        assert want in refs.extract_references(text), text
    assert refs.extract_references("plain words and 中文 only") == set()


def test_memo_is_bounded_by_characters_and_keeps_answers() -> None:
    calls: list[str] = []

    def fn(text: str) -> int:
        calls.append(text)
        return len(text)

    memo = refs._TextMemo(fn, max_chars=3 * (100 + refs._TextMemo.ENTRY_CHARGE))
    texts = [c * 100 for c in "abcd"]
    assert [memo(t) for t in texts] == [100] * 4
    assert memo(texts[3]) == 100 and len(calls) == 4  # the newest is a hit
    assert memo(texts[0]) == 100 and len(calls) == 5  # the oldest was evicted
    memo.cache_clear()
    assert memo(texts[3]) == 100 and len(calls) == 6


def _many_as_before(memo: Any, texts: list[str]) -> list[Any]:
    """``_TextMemo.many`` as it was written before (a lookup and a renewal per text)."""
    out: list[Any] = []
    with memo._lock:
        get, renew = memo._data.get, memo._data.move_to_end
        for t in texts:
            hit = get(t, refs._MISSING)
            if hit is not refs._MISSING:
                renew(t)
            out.append(hit)
    for i, got in enumerate(out):
        if got is refs._MISSING:
            out[i] = memo(texts[i])
    return out


@pytest.mark.parametrize("seed", range(8))
def test_memo_many_leaves_what_it_left_before(seed: int) -> None:
    """``_TextMemo.many`` answers what a call per text answers and leaves the memo as the
    former loop left it: the same texts held, in the same order of use (what is evicted
    next), whether every text asked is held, some are, or a text is asked twice."""
    rnd = random.Random(seed)
    pool = [c * rnd.randint(1, 60) for c in "abcdefghijkl"]

    def fresh() -> Any:
        return refs._TextMemo(len, max_chars=6 * (30 + refs._TextMemo.ENTRY_CHARGE))

    now, before = fresh(), fresh()
    held = 0
    for _ in range(60):
        # copies: equal texts that are other objects, as a compaction's bodies are
        asked = ["".join(list(t)) for t in rnd.choices(pool, k=rnd.randint(0, 7))]
        if rnd.random() < 0.3:
            asked += asked[:2]  # asked twice
        held += all(t in now._data for t in asked)
        assert now.many(asked) == _many_as_before(before, asked) == [len(t) for t in asked]
        assert list(now._data.items()) == list(before._data.items())
        assert now._chars == before._chars
    assert held >= 5  # the case of every text held came up


def test_distinctive_identifiers_ranks_by_total_then_first_appearance() -> None:
    texts = ["render_view and SessionGraph", "SessionGraph again, README.md", "render_view, SessionGraph"]
    assert refs.distinctive_identifiers(texts, top=5) == ["SessionGraph", "render_view"]
