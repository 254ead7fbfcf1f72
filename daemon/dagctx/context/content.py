"""A stored node's values as neutral content blocks, and the node metadata a render reads.

Pure helpers shared by the renderer (``render.py``, ``render_items.py``) and the
formats: a user/llm message value or a function result becomes ``{"type": "text"}``,
``{"type": "image", …reference}`` or ``{"type": "file", …reference}`` blocks; images
and files stay references (SPEC §6). No I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dagctx.protocol.nodes import REASONING_KEY, Call

_IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})
_FILE_TYPES = frozenset({"file", "document", "input_file"})
#: Blocks in a stored llm output that are not replayed as text: tool calls are their
#: own code nodes; reasoning is sent only from ``metadata.reasoning`` (``Item.reasoning``).
_SKIP_TYPES = frozenset(
    {"tool_use", "tool_call", "function_call", "tool_result", "thinking", "redacted_thinking", "reasoning"}
)


def json_text(value: Any) -> str:
    """Compact JSON of a stored value, keys in stored order (deterministic)."""
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image_block(block: dict[str, Any]) -> dict[str, Any]:
    """Normalise an image reference to ``{"type": "image", url|path|source, …}``."""
    out: dict[str, Any] = {"type": "image"}
    kind = block.get("type")
    if kind == "image_url":
        ref = block.get("image_url")
        if isinstance(ref, dict):
            ref = ref.get("url")
        if ref is not None:
            out["url"] = ref
    elif kind == "input_image":
        ref = block.get("image_url") or block.get("url")
        if ref is not None:
            out["url"] = ref
    for key in ("source", "url", "path", "data", "media_type", "mediaType", "mimeType", "name", "alt", "detail", "bytes", "sha256"):
        if key in block and key not in out:
            out[key] = block[key]
    return out


def _file_block(block: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k != "type"}
    return {"type": "file", **out}


def _is_block_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in value
    )


def _blocks_from_list(blocks: list[dict[str, Any]], *, lenient: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        kind = b["type"]
        if kind in ("text", "input_text", "output_text"):
            text = b.get("text")
            if isinstance(text, str):
                if text:
                    out.append(text_block(text))
            elif text is not None:
                out.append(text_block(json_text(text)))
        elif kind in _IMAGE_TYPES:
            out.append(_image_block(b))
        elif kind in _FILE_TYPES:
            out.append(_file_block(b))
        elif kind in _SKIP_TYPES:
            continue
        elif lenient and isinstance(b.get("text"), str):
            if b["text"]:
                out.append(text_block(b["text"]))
        else:
            out.append(text_block(json_text(b)))
    return out


def message_blocks(value: Any) -> list[dict[str, Any]]:
    """Blocks of a user/llm message value: str, block list, or a dict with text/content."""
    if value is None:
        return []
    if isinstance(value, str):
        return [text_block(value)] if value else []
    if _is_block_list(value):
        return _blocks_from_list(value, lenient=True)
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            return _blocks_from_list([value], lenient=True)
        for key in ("text", "content", "prompt", "message"):
            if key in value and value[key] is not None:
                inner = value[key]
                if isinstance(inner, str | list | dict):
                    return message_blocks(inner)
        return [text_block(json_text(value))]
    return [text_block(json_text(value))]


def value_blocks(value: Any) -> list[dict[str, Any]]:
    """Blocks of a function result, literal: str as is, block lists, anything else JSON."""
    if value is None:
        return []
    if isinstance(value, str):
        return [text_block(value)] if value else []
    if _is_block_list(value):
        return _blocks_from_list(value, lenient=False)
    if isinstance(value, dict) and value.get("type") in _IMAGE_TYPES | _FILE_TYPES:
        return _blocks_from_list([value], lenient=False)
    return [text_block(json_text(value))]


def block_text(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    ref = block.get("url") or block.get("path") or block.get("name") or block.get("sha256")
    if ref is None and isinstance(block.get("source"), dict):
        src = block["source"]
        ref = src.get("url") or src.get("path") or src.get("file_id") or src.get("media_type") or "inline"
    return f"[{kind}: {ref}]" if ref is not None else f"[{kind}]"


def blocks_text(blocks: list[dict[str, Any]]) -> str:
    return "\n\n".join(block_text(b) for b in blocks)


def node_meta(node: Call, *keys: str) -> Any:
    for key in keys:
        if key in node.metadata and node.metadata[key] is not None:
            return node.metadata[key]
    return None


def tool_call_id_of(node: Call) -> str | None:
    tid = node_meta(node, "toolCallId", "tool_call_id")
    return str(tid) if tid not in (None, "") else None


def reasoning_of(node: Call) -> list[dict[str, Any]]:
    """The reasoning blocks of an llm node (``metadata.reasoning``, SPEC §4), as stored."""
    got = node.metadata.get(REASONING_KEY) if node.role == "llm" else None
    if not isinstance(got, list):
        return []
    return [b for b in got if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking", "reasoning")]


def covers_of(node: Call) -> list[str]:
    covers = node_meta(node, "covers_ids", "coversIds")
    return list(map(str, covers)) if isinstance(covers, list) else []


def error_message(node: Call) -> str:
    err = node_meta(node, "error", "error_message", "errorMessage")
    if isinstance(err, dict):
        msg = err.get("message") or err.get("type")
        return str(msg) if msg else json_text(err)
    if err is not None:
        return str(err)
    etype = node_meta(node, "error_type", "errorType")
    return str(etype) if etype is not None else ""


def render_range(node: Call) -> tuple[int | None, int | None]:
    rr = node_meta(node, "render_range", "renderRange")
    if not isinstance(rr, dict):
        return None, None

    def limit(key: str) -> int | None:
        v = rr.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
        return v

    return limit("callers"), limit("subcalls")
