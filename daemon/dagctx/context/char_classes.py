"""The estimate of a text built from measured parts, without reading it again (SPEC §6).

``tokens.estimate_tokens`` reads four counts of a text: its characters, non-ASCII
characters, CJK characters and CJK punctuation. Each counts characters, so the counts of
a concatenation are the sums of its parts' counts: a summary request assembled from
transcript entries that staging already measured is estimated from those measures and
the few words around them (``estimate_of_classes(add_classes(…))`` equals
``estimate_tokens`` of the joined text, the same arithmetic on the same counts).
Pure.
"""

from __future__ import annotations

import math

from collections.abc import Sequence

from .tokens import (_ASCII, _CJK_HIGH, _CJK_LOW, _KANA_HIGH, _KANA_LOW, _NOT_CJK_BLOCKS, _PUNCT_HIGH, _PUNCT_LOW,
                     ASCII_CHARS_PER_TOKEN, SHORT_TEXT, _char_classes, _char_classes_re, _estimate, _joint)

__all__ = ["NO_CLASSES", "CharClasses", "add_classes", "char_classes", "char_classes_encoded", "char_classes_many",
           "estimate_of_classes"]

#: ``(characters, non-ASCII, CJK, CJK punctuation)`` of a text
CharClasses = tuple[int, int, int, int]
NO_CLASSES: CharClasses = (0, 0, 0, 0)


def char_classes(text: str) -> CharClasses:
    """``text``'s counts (``estimate_of_classes(char_classes(t)) == estimate_tokens(t)``)."""
    n = len(text)
    if n == 0 or text.isascii():
        return (n, 0, 0, 0)
    non_ascii, cjk, punct = _char_classes(text) if n >= SHORT_TEXT else _char_classes_re(text)
    return (n, non_ascii, cjk, punct)


def char_classes_encoded(text: str, utf8: bytes) -> CharClasses:
    """``char_classes(text)`` from ``utf8``, ``text`` encoded already (UTF-8,
    ``surrogatepass``: a lone surrogate then fails to decode and is counted as
    ``char_classes`` counts it): a text both hashed and estimated is encoded once."""
    n = len(text)
    if n == len(utf8):  # every character one byte: ASCII (any other takes two or more)
        return (n, 0, 0, 0)
    non_ascii, cjk, punct = _char_classes(text, utf8) if n >= SHORT_TEXT else _char_classes_re(text)
    return (n, non_ascii, cjk, punct)


#: a flag for the high bytes of the blocks wholly inside ``_CJK`` (a bit no other table uses)
_CJK_BLOCK = bytes(0 if b in _NOT_CJK_BLOCKS else 0x20 for b in range(256))


def char_classes_many(texts: Sequence[str]) -> list[CharClasses]:
    """``[char_classes(t) for t in texts]``, the non-ASCII characters of all of them
    classified in one pass (SPEC §6: the same counts). A compaction measures thousands
    of transcript entries; classifying each text's few non-ASCII characters on its own
    cost a dozen calls a text, more than reading its ASCII. Here each text only has its
    non-ASCII characters taken out (as ``_char_classes`` does); they are joined and
    their UTF-16 code units flagged once (one flag byte a unit, nonzero when the unit
    is CJK, resp. CJK punctuation: each table has one bit per high byte, and the
    wholly-CJK blocks a bit of their own, so a unit's flag byte is nonzero exactly
    when ``_char_classes`` counts it), and each text's counts are its units' nonzero
    flags. A text with a lone surrogate, or with kana past U+1B000 (both counted by
    the regular expressions), is measured on its own."""
    out: list[CharClasses] = [(len(t), 0, 0, 0) for t in texts]
    rests: list[bytes] = []  # each text's non-ASCII characters, as UTF-16-LE
    which: list[tuple[int, int]] = []  # (the text's index, how many of them)
    for k, t in enumerate(texts):
        if t.isascii():
            continue
        try:
            rest = t.encode("utf-8").translate(None, _ASCII).decode("utf-8")
        except UnicodeError:  # a lone surrogate
            out[k] = char_classes(t)
            continue
        rests.append(rest.encode("utf-16-le"))
        which.append((k, len(rest)))
    if not rests:
        return out
    units = b"".join(rests)
    low, high = units[::2], units[1::2]
    size = len(high)

    def flags(high_flags: bytes, low_flags: bytes, extra: int = 0) -> bytes:
        both = int.from_bytes(high.translate(high_flags), "little") & int.from_bytes(low.translate(low_flags), "little")
        return (both | extra).to_bytes(size, "little")

    kana = flags(_KANA_HIGH, _KANA_LOW) if _joint(high, low, _KANA_HIGH, _KANA_LOW) else None
    cjk = flags(_CJK_HIGH, _CJK_LOW, int.from_bytes(high.translate(_CJK_BLOCK), "little"))
    punct = flags(_PUNCT_HIGH, _PUNCT_LOW)
    at = 0
    for (k, non_ascii), rest16 in zip(which, rests):
        end = at + len(rest16) // 2
        if kana is not None and kana.count(0, at, end) != end - at:
            out[k] = char_classes(texts[k])  # kana past U+1B000: the regular expressions
        else:
            out[k] = (len(texts[k]), non_ascii, end - at - cjk.count(0, at, end), end - at - punct.count(0, at, end))
        at = end
    return out


def add_classes(*parts: CharClasses) -> CharClasses:
    """The counts of the concatenation of texts with these counts."""
    n = non_ascii = cjk = punct = 0
    for p in parts:
        n += p[0]
        non_ascii += p[1]
        cjk += p[2]
        punct += p[3]
    return (n, non_ascii, cjk, punct)


def estimate_of_classes(classes: CharClasses) -> int:
    """``estimate_tokens`` of a text with these counts."""
    n, non_ascii, cjk, punct = classes
    if n == 0:
        return 0
    if non_ascii == 0:
        return math.ceil(n / ASCII_CHARS_PER_TOKEN)
    return _estimate(n, non_ascii, cjk, punct)
