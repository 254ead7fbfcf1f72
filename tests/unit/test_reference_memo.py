"""Reference extraction's shortcuts (SPEC §8): skipping a pattern whose required
character is absent finds the same references, and the per-text memo is bounded by
the characters it holds, returning the same answer on a hit."""

from __future__ import annotations

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


def test_distinctive_identifiers_ranks_by_total_then_first_appearance() -> None:
    texts = ["render_view and SessionGraph", "SessionGraph again, README.md", "render_view, SessionGraph"]
    assert refs.distinctive_identifiers(texts, top=5) == ["SessionGraph", "render_view"]
