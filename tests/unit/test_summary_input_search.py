"""The coverage check's search (``summarizer_input._find_from``) and the identifier
sample (``references._even_sample``) give exactly what their plain forms give."""

from __future__ import annotations

import random

from dagctx.context.references import _even_sample
from dagctx.context.summarizer_input import _find_from


def test_find_from_is_str_find() -> None:
    rng = random.Random(7)
    alphabet = "ab\n"
    for _ in range(3000):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 400)))
        if text and rng.random() < 0.7:  # a body taken from the text, often long
            a = rng.randrange(len(text))
            body = text[a : a + rng.randint(1, 200)]
        else:
            body = "".join(rng.choices(alphabet, k=rng.randint(1, 120)))
        pos = rng.randint(0, len(text))
        assert _find_from(text, body, pos) == text.find(body, pos), (text, body, pos)


def test_find_from_many_false_starts() -> None:
    head = "x" * 40
    text = (head + "y") * 10 + head + "z" * 100
    body = head + "z" * 80
    assert _find_from(text, body, 0) == text.find(body) == 410
    assert _find_from(text, body + "!", 0) == -1


def _even_sample_plain(texts: list[str], budget: int) -> list[str]:
    if sum(len(t) for t in texts) <= budget:
        return texts
    out = list(texts)
    remaining, pending = budget, sorted(range(len(texts)), key=lambda i: len(texts[i]))
    while pending:
        share = remaining // len(pending)
        i = pending[0]
        if len(texts[i]) <= share:
            remaining -= len(texts[i])
            pending.pop(0)
            continue
        for j in pending:
            out[j] = texts[j][:share]
        break
    return out


def test_even_sample_unchanged() -> None:
    rng = random.Random(3)
    for _ in range(300):
        texts = ["w" * rng.randint(0, 500) for _ in range(rng.randint(0, 40))]
        budget = rng.randint(0, 6000)
        assert _even_sample(texts, budget) == _even_sample_plain(texts, budget)
