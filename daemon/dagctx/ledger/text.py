"""The searchable text of a node (what FTS indexes and snippets come from).

Architecture Invariant: pure; shared by the store (indexing) and nothing else needs
to know how a node becomes text for search.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dagctx.protocol.nodes import Call

_json = msgspec.json.Encoder()


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
                parts.append(_json.encode(block).decode())
        return "\n".join(parts)
    if isinstance(value, dict) and isinstance(value.get("text"), str) and len(value) <= 2:
        return value["text"]
    return _json.encode(value).decode()


def node_text(node: Call) -> str:
    """User text, LLM text, or a function's name + input + output."""
    if node.role == "code":
        return "\n".join(p for p in (node.name, value_text(node.input), value_text(node.output)) if p)
    return "\n".join(p for p in (value_text(node.input), value_text(node.output)) if p)
