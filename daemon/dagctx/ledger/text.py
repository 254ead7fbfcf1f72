"""The searchable text of a node (what FTS indexes and snippets come from).

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


def _json_text(value: Any) -> str:
    """A value as JSON, with the whitespace escapes of its strings written as whitespace.

    The ``unicode61`` tokenizer (and PostgreSQL's twin of it) splits on punctuation, not
    on escape sequences: in ``"code": "x = 1;\\nnodeRepl.write(x)"`` the backslash is a
    separator and ``nnodeRepl`` one token, so a search for ``nodeRepl.write`` missed a tool
    call whose JSON input had it at the start of a line (SPEC §5: every word of a node is
    found). The result is search text, not JSON to parse back.
    """
    return _ESCAPE.sub(lambda m: m.group(0) if m.group(1) == "\\" else _UNESCAPED.get(m.group(1), " "),
                       _json.encode(value).decode())


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
        return "\n".join(parts)
    if isinstance(value, dict) and isinstance(value.get("text"), str) and len(value) <= 2:
        return value["text"]
    return _json_text(value)


def node_text(node: Call) -> str:
    """User text, LLM text, or a function's name + input + output."""
    if node.role == "code":
        return "\n".join(p for p in (node.name, value_text(node.input), value_text(node.output)) if p)
    return "\n".join(p for p in (value_text(node.input), value_text(node.output)) if p)
