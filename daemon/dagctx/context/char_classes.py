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

from .tokens import ASCII_CHARS_PER_TOKEN, SHORT_TEXT, _char_classes, _char_classes_re, _estimate

__all__ = ["NO_CLASSES", "CharClasses", "add_classes", "char_classes", "char_classes_encoded", "estimate_of_classes"]

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
