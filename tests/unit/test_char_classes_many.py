"""``char_classes_many`` gives each text the counts ``char_classes`` gives it (SPEC §6):
every block of code points, texts mixing ASCII, CJK, CJK punctuation, other scripts and
astral characters, and the texts it leaves to the regular expressions (a lone
surrogate, kana past U+1B000) among the others."""

from __future__ import annotations

import random

from dagctx.context.char_classes import char_classes, char_classes_many


#: every non-ASCII code point but the surrogates, in order
CODE_POINTS = "".join(map(chr, range(0x80, 0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))


def test_every_block_of_code_points() -> None:
    texts = [CODE_POINTS[i:i + 256] for i in range(0, len(CODE_POINTS), 256)]
    assert char_classes_many(texts) == [char_classes(t) for t in texts]
    # each text one block among ASCII, both sides of the join of two texts
    mixed = [f"x{t[:40]}y" for t in texts[::97]]
    assert char_classes_many(mixed) == [char_classes(t) for t in mixed]


def test_mixed_texts_and_the_ones_measured_alone() -> None:
    rnd = random.Random(5)
    chars = CODE_POINTS
    cjk = "，。、「」试个这数测先了的我有据库迁移脚本成失한글カナ"
    texts = []
    for _ in range(400):
        n = rnd.randint(0, 400)
        texts.append("".join(rnd.choice(chars) if rnd.random() < 0.1 else rnd.choice(cjk) if rnd.random() < 0.2
                             else rnd.choice("ab_/. \n") for _ in range(n)))
    texts[7:7] = ["", "plain ascii", "\ud800 lone", "a\udc00b" * 100, "\U0001B000\U0001B16F\U0001B170 仮名",
                  "x" * 300 + "\U0001B0FF", "中文，。" * 50, "\U0001F600 emoji " * 60, "é" * 10, "—→…" * 70]
    assert char_classes_many(texts) == [char_classes(t) for t in texts]
    # in any order, and one at a time
    texts.reverse()
    assert char_classes_many(texts) == [char_classes(t) for t in texts]
    assert [char_classes_many([t])[0] for t in texts] == [char_classes(t) for t in texts]
    assert char_classes_many([]) == []


def test_each_code_point_its_own_text() -> None:
    """Each code point of the BMP (surrogates excluded) and of the CJK planes' first
    blocks alone in its text, among ASCII: the class byte of every (high byte, low
    byte) pair gives ``char_classes``'s counts, attributed to its own text."""
    points = [*range(0x80, 0xD800), *range(0xE000, 0x10000), *range(0x1B000, 0x1B200), *range(0x20000, 0x20100),
              *range(0x3FF00, 0x40100)]
    texts = [f"a{chr(p)}" if p % 3 else chr(p) for p in points]
    assert char_classes_many(texts) == [char_classes(t) for t in texts]
