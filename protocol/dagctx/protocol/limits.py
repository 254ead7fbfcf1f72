"""Limits of the wire contract every party shares (SPEC §1, §3).

``MAX_JSON_DEPTH``: decoders and every walk over a decoded value recurse once per
level, so a value nested thousands of levels deep would fail deep inside the daemon
(``RecursionError``) instead of being refused. The daemon refuses deeper messages
at the door and skips deeper transcript lines on import; clients may check before
they send. ``safe_text``: every string sent or stored is valid UTF-8, also one made
from a file name whose bytes are not.
"""

from __future__ import annotations

import re

#: Arrays and objects nested in one JSON text, counted from its outermost value
#: (``{"params": {"node": {"input": …}}}`` is three levels before ``input``'s value).
MAX_JSON_DEPTH = 100

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_FOLD = bytes.maketrans(b"{}", b"[]")


def too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays/objects in the JSON text ``data`` nest more than ``limit`` levels.

    Costs two byte counts for the common case (fewer opening brackets than ``limit``);
    otherwise strings are dropped and brackets reduced pair by pair, in C. Exact for
    valid JSON; for invalid JSON it says "too deep" whenever a decoder could recurse
    that far before noticing the error.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    # Strings may hold brackets: drop them, keep only brackets, one kind of pair.
    proj = _STRING.sub(b"", data).translate(_FOLD, _NOT_BRACKETS)
    # Each pass removes every innermost pair, i.e. one level of every subtree.
    for passes in range(limit):
        if not proj:
            return False
        shorter = proj.replace(b"[]", b"")
        if len(shorter) == len(proj):
            # Unbalanced (invalid JSON): a decoder may still descend this far first.
            return passes + shorter.count(b"[") > limit
        proj = shorter
    return bool(proj)


def safe_text(s: str) -> str:
    """``s`` made encodable as UTF-8 (every string on the wire and in the ledger is).

    A file name's undecodable bytes (surrogate escapes, as ``os.fsdecode`` makes them)
    become ``\\xNN``, other lone surrogates ``\\udNNN``; valid text is returned as is.
    """
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    try:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
