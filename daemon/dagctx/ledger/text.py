"""The searchable text of a node (what FTS indexes and snippets come from).

A node's text may be tens of megabytes (a spilled tool result). Built in one C call —
a join, a JSON decode, a regex substitution over the whole of it — it would hold the
interpreter lock for tens of milliseconds, and every other thread of the daemon (another
connection's requests, SPEC §1.4) would wait. So large texts are built a piece of
``PIECE`` characters (or bytes) at a time, grown in place: between pieces other threads
run. The text is the same as built whole (a test compares them, cutting inside escapes,
multi-byte characters and words).

Architecture Invariant: pure; shared by the store (indexing) and nothing else needs
to know how a node becomes text for search.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from dagctx.protocol.nodes import Call

_json = msgspec.json.Encoder()

# A JSON escape inside an encoded string: ``\\`` (kept as it is, so the ``n`` of an escaped
# backslash is never read as a newline), a whitespace escape, or a ``\uXXXX`` control.
_ESCAPE = re.compile(r"\\(\\|[nrtbf]|u[0-9a-fA-F]{4})")
_UNESCAPED = {"n": "\n", "t": "\t"}

#: how much is copied or converted at a time while the interpreter lock is held (1 MiB)
PIECE = 1 << 20


def _unescape(m: re.Match[str]) -> str:
    return m.group(0) if m.group(1) == "\\" else _UNESCAPED.get(m.group(1), " ")


def joined(parts: list[str], sep: str = "\n", piece: int = PIECE) -> str:
    """``sep.join(parts)``, copied ``piece`` characters at a time into a string grown in place."""
    if sum(len(p) for p in parts) <= piece:
        return sep.join(parts)
    out = ""
    for k, part in enumerate(parts):
        if k:
            out += sep
        for i in range(0, len(part), piece):
            out += part[i: i + piece]  # in place: ``out`` has no other reference
    return out


def _clean_cut(data: bytes, at: int) -> int:
    """A cut of encoded JSON at or before ``at`` that splits no UTF-8 character and no
    escape sequence (every backslash of JSON text starts one: a run of them pairs up)."""
    while at > 0 and 0x80 <= data[at] < 0xC0:  # a continuation byte: inside a character
        at -= 1
    lo = max(0, at - 6)  # the longest escape, ``\uXXXX``, is 6 bytes
    p = data.rfind(b"\\", lo, at)
    if p < 0:
        return at
    run = p
    while run > 0 and data[run - 1] == 0x5C:
        run -= 1
    # the backslashes run..p pair up from ``run``: the escape in the window starts at
    # ``run`` plus an even count, at most ``p``
    start = p if (p - run) % 2 == 0 else p - 1
    size = 6 if start + 1 < len(data) and data[start + 1] == 0x75 else 2  # u: ``\uXXXX``
    return at if start + size <= at else start


def _json_text(value: Any) -> str:
    """A value as JSON, with the whitespace escapes of its strings written as whitespace.

    The ``unicode61`` tokenizer (and PostgreSQL's twin of it) splits on punctuation, not
    on escape sequences: in ``"code": "x = 1;\\nnodeRepl.write(x)"`` the backslash is a
    separator and ``nnodeRepl`` one token, so a search for ``nodeRepl.write`` missed a tool
    call whose JSON input had it at the start of a line (SPEC §5: every word of a node is
    found). The result is search text, not JSON to parse back.
    """
    return _json_pieces(_json.encode(value))


def _json_pieces(data: bytes, piece: int = PIECE) -> str:
    """``_json_text`` of encoded JSON ``data``: decoded and unescaped ``piece`` bytes at a
    time, each cut where no character and no escape is split, into a string grown in place."""
    if len(data) <= piece:
        return _ESCAPE.sub(_unescape, data.decode())
    out = ""
    i = 0
    while i < len(data):
        at = i + piece
        end = _clean_cut(data, at) if at < len(data) else len(data)
        while end <= i:  # a piece smaller than the escape it met: take the escape whole
            at += 6
            end = _clean_cut(data, at) if at < len(data) else len(data)
        out += _ESCAPE.sub(_unescape, data[i:end].decode())
        i = end
    return out


def value_text(value: Any) -> str:
    """Text of an input/output value: strings as they are, text blocks joined, else JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) for b in value):
        parts = []
        for block in value:
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif isinstance(block.get("content"), (str, list)):
                parts.append(value_text(block["content"]))
            elif block.get("type") in ("image", "image_url", "file"):
                parts.append(f"[{block.get('type')}]")
            else:
                parts.append(_json_text(block))
        return joined(parts)
    if isinstance(value, dict) and isinstance(value.get("text"), str) and len(value) <= 2:
        return value["text"]
    return _json_text(value)


def node_text(node: Call) -> str:
    """User text, LLM text, or a function's name + input + output."""
    if node.role == "code":
        return joined([p for p in (node.name, value_text(node.input), value_text(node.output)) if p])
    return joined([p for p in (value_text(node.input), value_text(node.output)) if p])
