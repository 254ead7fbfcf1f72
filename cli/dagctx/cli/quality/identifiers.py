"""Identifiers by class, for measuring what a request or a summary kept.

Our own extractor, written apart from the daemon's reference miner
(``daemon/dagctx/context/references.py``) on purpose: a metric computed with the code
that made the decision could only agree with it. Classes, matched in this order (a span
taken by one class is not matched again by a later one):

* ``url``     — ``http(s)://…``
* ``id``      — UUIDs and prefixed ids (``toolu_01Ab…``, ``call_x9…``, ``msg_…``): a
  lowercase word, ``_`` or ``-``, then 8+ letters and digits holding a digit
* ``hash``    — 7 to 64 hexadecimal characters holding both a digit and a letter
* ``path``    — something with a ``/`` and a name (``src/app.py``, ``/etc/hosts``), or a
  file name with a known extension (``mix.exs``)
* ``symbol``  — ``snake_case``, ``CamelCase``, ``dotted.names`` and ``call()`` names
* ``number``  — numbers of 3 or more digits (ports, line numbers, sizes, counts)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

CLASSES = ("path", "symbol", "hash", "id", "url", "number")

_URL = re.compile(r"https?://[^\s\"'<>()\[\]{}`]+[^\s\"'<>()\[\]{}`.,;:!?]")
_UUID = r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
_PREFIXED = r"\b[a-z]{2,12}[_-](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{8,}\b"
_ID = re.compile(f"{_UUID}|{_PREFIXED}")
_HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b")
_EXT = (
    "py|pyi|js|mjs|cjs|ts|tsx|jsx|json|jsonl|md|rst|txt|toml|yaml|yml|ini|cfg|lock|sh|bash|zsh|rs|go|c|h|cc|cpp|hpp|"
    "java|kt|rb|ex|exs|eex|heex|erl|php|cs|swift|sql|html|htm|css|scss|vue|svelte|xml|csv|log|db|proto|"
    "gradle|mk|env|conf|traj|patch|diff"
)
_PATH = re.compile(
    r"(?<![\w/.-])(?:~|\.{1,2})?/?(?:[\w@.+-]+/)+[\w@.+-]*\w"  # with a slash
    rf"|\b[\w.-]+\.(?:{_EXT})\b"  # a file name
)
_SYMBOL = re.compile(
    r"\b[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+\b(?:\(\))?"  # dotted
    r"|\b_*[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b(?:\(\))?"  # snake_case
    r"|\b[A-Z][A-Z0-9_]*_[A-Z0-9_]+\b"  # CONSTANT_CASE
    r"|\b[A-Z]?[a-z][a-z0-9]*(?:[A-Z][a-z0-9]+)+\b(?:\(\))?"  # CamelCase / camelCase
    r"|\b[A-Za-z_][A-Za-z0-9_]{2,}\(\)"  # call()
)
_NUMBER = re.compile(r"(?<![\w.])\d{3,}(?:\.\d+)?(?![\w])")

_ORDER = (("url", _URL), ("id", _ID), ("hash", _HASH), ("path", _PATH), ("symbol", _SYMBOL), ("number", _NUMBER))


def extract(text: str) -> dict[str, str]:
    """identifier → class, in first-appearance order."""
    out: dict[str, str] = {}
    if not text:
        return out
    work = text
    for cls, rx in _ORDER:
        spans: list[tuple[int, int]] = []
        for m in rx.finditer(work):
            ident = m.group(0)
            if cls == "path" and ident.strip("./~") == "":
                continue
            if cls == "symbol" and ident.endswith("()"):
                # ``foo()`` and ``foo`` are one identifier: the name is what must survive
                ident = ident[:-2]
            if cls == "path" and "/" in ident and "." not in ident.rsplit("/", 1)[-1] and not ident.startswith(("/", "~", ".")):
                # ``and/or``, ``input/output``: a slash between two words is not a path
                if ident.count("/") < 2:
                    continue
            if len(ident) < 3:
                continue
            out.setdefault(ident, cls)
            spans.append(m.span())
        if spans:
            chars = list(work)
            for a, b in spans:
                chars[a:b] = " " * (b - a)
            work = "".join(chars)
    return out


def counted(texts: Iterable[str]) -> Counter[str]:
    """How often each identifier occurs over ``texts`` (once per text)."""
    c: Counter[str] = Counter()
    for t in texts:
        c.update(extract(t).keys())
    return c


def kept(ident: str, text: str) -> bool:
    """Whether ``text`` still carries ``ident`` (exactly, as a model would have to copy it)."""
    return ident in text


def retention(idents: dict[str, str], text: str) -> dict[str, list[int]]:
    """class → [kept, total] of ``idents`` in ``text``."""
    out = {cls: [0, 0] for cls in CLASSES}
    for ident, cls in idents.items():
        out[cls][1] += 1
        if kept(ident, text):
            out[cls][0] += 1
    return out
