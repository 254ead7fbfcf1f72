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
import struct
from collections.abc import Sequence
from typing import Any

from .tokens import (_ASCII, _CJK_HIGH, _CJK_LOW, _KANA_HIGH, _KANA_LOW, _NOT_CJK_BLOCKS, _PUNCT_HIGH, _PUNCT_LOW,
                     ASCII_CHARS_PER_TOKEN, ESTIMATE, SHORT_DENSE_TEXT, SHORT_TEXT, TokenCounter, _char_classes,
                     _char_classes_re, _estimate)

__all__ = ["NO_CLASSES", "CharClasses", "add_classes", "char_classes", "char_classes_encoded", "char_classes_many",
           "estimate_of_classes", "stored_classes", "classes_from_stored", "classes_from_stored_many", "counts_and_classes"]

#: ``(characters, non-ASCII, CJK, CJK punctuation)`` of a text
CharClasses = tuple[int, int, int, int]
NO_CLASSES: CharClasses = (0, 0, 0, 0)


def char_classes(text: str) -> CharClasses:
    """``text``'s counts (``estimate_of_classes(char_classes(t)) == estimate_tokens(t)``)."""
    n = len(text)
    if n == 0 or text.isascii():
        return (n, 0, 0, 0)
    if n >= SHORT_TEXT:
        non_ascii, cjk, punct = _char_classes(text)
    elif n >= SHORT_DENSE_TEXT and len(utf8 := text.encode("utf-8", "surrogatepass")) >= 2 * n:
        # mostly CJK (``estimate_tokens``' own choice): the tables are quicker from 16 characters
        # on (2.4 against 5.5 us for a 120-character Chinese message)
        non_ascii, cjk, punct = _char_classes(text, utf8)
    else:
        non_ascii, cjk, punct = _char_classes_re(text)
    return (n, non_ascii, cjk, punct)


def char_classes_encoded(text: str, utf8: bytes) -> CharClasses:
    """``char_classes(text)`` from ``utf8``, ``text`` encoded already (UTF-8,
    ``surrogatepass``: a lone surrogate then fails to decode and is counted as
    ``char_classes`` counts it): a text both hashed and estimated is encoded once."""
    n = len(text)
    if n == len(utf8):  # every character one byte: ASCII (any other takes two or more)
        return (n, 0, 0, 0)
    dense = n >= SHORT_TEXT or n >= SHORT_DENSE_TEXT and len(utf8) >= 2 * n
    non_ascii, cjk, punct = _char_classes(text, utf8) if dense else _char_classes_re(text)
    return (n, non_ascii, cjk, punct)


# ``char_classes_many`` classifies each UTF-16 code unit by one byte, ``high class << 4 |
# low class``: the high byte's class says whether its block is wholly inside ``_CJK``, or
# which of the blocks partly inside ``_CJK`` or ``_CJK_PUNCT`` it is (the tables of
# ``tokens``: U+11xx, U+2Exx, U+2F00–U+9FFF, U+A9xx, U+AC00–U+D7FF, U+D8xx, U+F9xx–U+FAxx,
# U+FExx, U+FFxx, and U+30xx for the punctuation), and the low byte's class which of the
# ranges those blocks cut the low byte into it falls in; every flag of ``_CJK_HIGH`` /
# ``_CJK_LOW``, ``_PUNCT_HIGH`` / ``_PUNCT_LOW`` and ``_KANA_HIGH`` / ``_KANA_LOW`` is
# a function of the two classes (built from those very tables below).
#: the low byte's ranges: the first byte of each
_LOW_CUTS = (0x00, 0x10, 0x20, 0x2C, 0x2D, 0x30, 0x40, 0x50, 0x60, 0x80, 0xC0, 0xF0)
#: the high bytes with a class of their own (partly CJK, or CJK punctuation); class 1 is
#: every other block wholly inside ``_CJK``, class 0 every block outside it
_HIGH_OWN = (0x2E, 0x30, 0xA9, 0xD8, 0xFE, 0xFF)
_WHOLLY_CJK = frozenset(b for b in range(256) if b not in _NOT_CJK_BLOCKS)


def _high_class(b: int) -> int:
    if b in _HIGH_OWN:
        return 2 + _HIGH_OWN.index(b)
    return 1 if b in _WHOLLY_CJK else 0


def _low_class(b: int) -> int:
    return sum(1 for cut in _LOW_CUTS if b >= cut) - 1


_HIGH_CLASS = bytes(_high_class(b) << 4 for b in range(256))
_LOW_CLASS = bytes(_low_class(b) for b in range(256))
#: a representative (high byte, low byte) of each class byte
_CLASS_OF: dict[int, tuple[int, int]] = {}
for _h in range(256):
    for _lo in _LOW_CUTS:
        _CLASS_OF.setdefault(_HIGH_CLASS[_h] | _LOW_CLASS[_lo], (_h, _lo))


def _class_flags(test: object) -> bytes:
    return bytes(1 if c in _CLASS_OF and test(*_CLASS_OF[c]) else 0 for c in range(256))  # type: ignore[operator]


#: class byte → 1 when its units are CJK, resp. CJK punctuation, resp. kana past U+1B000
_CJK_CLASSES = _class_flags(lambda h, lo: h in _WHOLLY_CJK or bool(_CJK_HIGH[h] & _CJK_LOW[lo]))
_PUNCT_CLASSES = _class_flags(lambda h, lo: bool(_PUNCT_HIGH[h] & _PUNCT_LOW[lo]))
_KANA_CLASSES = _class_flags(lambda h, lo: bool(_KANA_HIGH[h] & _KANA_LOW[lo]))
#: the class bytes of kana past U+1B000 (one: ``bytes.find`` looks for it)
_KANA_CLASS = bytes(c for c in range(256) if _KANA_CLASSES[c])
assert len(_KANA_CLASS) == 1


def char_classes_many(texts: Sequence[str]) -> list[CharClasses]:
    """``[char_classes(t) for t in texts]``, the non-ASCII characters of all of them
    classified in one pass (SPEC §6: the same counts). A compaction measures thousands
    of transcript entries; classifying each text's few non-ASCII characters on its own
    cost a dozen calls a text, more than reading its ASCII. Here each text only has its
    non-ASCII characters taken out (as ``_char_classes`` does); they are joined and
    each UTF-16 code unit given its class byte once (the classes of its high byte and
    its low byte, combined: two tables and one bitwise OR for all of them), then one
    flag byte a unit, nonzero exactly when ``_char_classes`` counts it as CJK, resp.
    CJK punctuation; each text's counts are its units' nonzero flags. A text with a
    lone surrogate, or with kana past U+1B000 (both counted by the regular
    expressions), is measured on its own."""
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
    size = len(units) // 2
    classes = (int.from_bytes(units[1::2].translate(_HIGH_CLASS), "little")
               | int.from_bytes(units[::2].translate(_LOW_CLASS), "little")).to_bytes(size, "little")
    kana = _KANA_CLASS in classes
    cjk = classes.translate(_CJK_CLASSES)
    punct = classes.translate(_PUNCT_CLASSES)
    at = 0
    for (k, non_ascii), rest16 in zip(which, rests):
        end = at + len(rest16) // 2
        if kana and classes.find(_KANA_CLASS, at, end) >= 0:
            out[k] = char_classes(texts[k])  # kana past U+1B000: the regular expressions
        else:
            n_cjk = end - at - cjk.count(0, at, end)
            # CJK punctuation is CJK: none without CJK
            out[k] = (len(texts[k]), non_ascii, n_cjk, end - at - punct.count(0, at, end) if n_cjk else 0)
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


# A node's counts are measured once, when it is written, and kept beside its token counts
# (``NodeDerived.chars``): a compaction estimates thousands of transcript entries whose
# bodies are those very texts, and classifying them again was a tenth of its time. Kept
# as 8 unsigned 32-bit integers (the input's four, then the output's), one msgpack ``bin``:
# a list of lists cost every reader of the token counts (each render) twice as much to
# decode, bytes nearly nothing.
_STORED = struct.Struct("<8I")
_HALF = struct.Struct("<4I")
_STORED_MAX = (1 << 32) - 1


def counts_and_classes(counter: TokenCounter, value: Any, tokenizers: list[str],
                       ) -> tuple[dict[str, int], CharClasses | None]:
    """``counter.count_values(value, tokenizers)``, and when ``value`` is a text its counts,
    with its estimate read off them (``estimate_of_classes``: the same arithmetic on the
    same counts as ``estimate_tokens``), so keeping them costs a write no second reading."""
    if not isinstance(value, str):
        return counter.count_values(value, tokenizers), None
    classes = char_classes(value)
    counts = counter.count_values(value, [tok for tok in tokenizers if tok != ESTIMATE])
    if ESTIMATE in tokenizers:
        counts[ESTIMATE] = estimate_of_classes(classes)
    return counts, classes


def stored_classes(input_classes: CharClasses | None, output_classes: CharClasses | None) -> bytes | None:
    """The kept form of a node's input's and output's counts (None for a value that is not
    a text: zeros; only a text's counts are ever read back); None when neither is a text
    or a count does not fit 32 bits (a reader then measures)."""
    if input_classes is None and output_classes is None:
        return None
    values = (*(input_classes or NO_CLASSES), *(output_classes or NO_CLASSES))
    if max(values) > _STORED_MAX:
        return None
    return _STORED.pack(*values)


def classes_from_stored(kept: bytes) -> tuple[CharClasses, CharClasses] | None:
    """``stored_classes``' two counts back; None for bytes not of that form (a reader
    then measures)."""
    if len(kept) != _STORED.size:
        return None
    v = _STORED.unpack(kept)
    return (v[0], v[1], v[2], v[3]), (v[4], v[5], v[6], v[7])


def classes_from_stored_many(halves: bytes) -> list[CharClasses]:
    """The counts of many texts at once: ``halves`` joins, for each, one half of what
    ``stored_classes`` kept (its first 16 bytes, the input's counts, or its last 16, the
    output's)."""
    return list(_HALF.iter_unpack(halves))
