"""Reduction within a turn (SPEC §8) sizes a summary request from its parts' character
counts instead of reading the assembled request again (``ReductionRun.call`` with
``user_tokens``). That holds because a request builder puts the summarized text into
the user message once, as it is: the request's estimate is then its shell's (the same
request around an empty text) plus the text's. These check that for both builders."""

from __future__ import annotations

import pytest

from dagctx.context import turn_reduction as tr
from dagctx.context.char_classes import add_classes, char_classes, estimate_of_classes
from dagctx.context.tokens import estimate_tokens

TEXTS = ["", "x", "plain ASCII line\n" * 40, "混合 text — 中文，还有 emoji \U0001f600\n" * 25, "\ud800 lone"]
PREVIOUS = [None, "so far: 已读 src/a.py"]


@pytest.mark.parametrize("previous", PREVIOUS)
def test_checkpoint_request_estimate_is_its_shell_plus_its_steps(previous: str | None) -> None:
    for body in TEXTS:
        _, user = tr.checkpoint_messages("Fix the 测试 under src/", body, previous=previous, words=700)
        _, shell = tr.checkpoint_messages("Fix the 测试 under src/", "", previous=previous, words=700)
        assert estimate_of_classes(add_classes(char_classes(shell), char_classes(body))) == estimate_tokens(user)


@pytest.mark.parametrize("previous", PREVIOUS)
def test_result_request_estimate_is_its_shell_plus_its_result(previous: str | None) -> None:
    for text in TEXTS:
        x = tr.ResultCandidate("n1", "read_file", "call_1", 900, text, '{"path": "ä.py"}', "completed")
        _, user = tr.result_messages(x, text, previous=previous)
        _, shell = tr.result_messages(x, "", previous=previous)
        assert estimate_of_classes(add_classes(char_classes(shell), char_classes(text))) == estimate_tokens(user)


def test_a_key_in_parts_is_the_key_of_their_concatenation() -> None:
    """A checkpoint segment's key is hashed from its parts, its steps already encoded."""
    cfg = {"summarizer": "host", "model": "m", "window": 32000}
    parts = ["prev-key", "\0", "Fix 测试", "\0", "step one é".encode(), b"\n", "two \ud800 \U0001f600".encode(
        "utf-8", "surrogatepass"), b"\n", "three"]
    whole = "prev-key\0Fix 测试\0step one é\ntwo \ud800 \U0001f600\nthree"
    assert tr.summary_key("checkpoint", parts, cfg) == tr.summary_key("checkpoint", whole, cfg)
    assert tr.summary_key("checkpoint", [whole], cfg) == tr.summary_key("checkpoint", whole, cfg)


@pytest.mark.parametrize("previous", PREVIOUS)
def test_a_segment_given_as_its_steps_is_the_same_request(previous: str | None) -> None:
    """A checkpoint segment passed as its steps' texts is the request of their lines joined."""
    steps = [t for t in TEXTS if t] + ["last step"]
    for k in range(1, len(steps) + 1):
        assert tr.checkpoint_messages("task", steps[:k], previous=previous, words=70) == tr.checkpoint_messages(
            "task", "\n".join(steps[:k]), previous=previous, words=70)


def test_classes_of_an_encoded_text_are_its_classes() -> None:
    """``char_classes_encoded`` reads the same counts from a text's UTF-8 (surrogatepass)."""
    from dagctx.context.char_classes import char_classes_encoded

    for text in [*TEXTS, "中" * 200, "é" * 300 + "\ud800", "a" * 500, "\U0001b000" * 130]:
        assert char_classes_encoded(text, text.encode("utf-8", "surrogatepass")) == char_classes(text)
