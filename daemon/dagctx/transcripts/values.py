"""Small conversions every importer shares: timestamps, tool arguments, content blocks
(images scrubbed to references), one-line previews.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import msgspec

from .reading import decode_json



# --------------------------------------------------------------------------- values

_NAIVE_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")


def to_epoch(value: Any) -> float | None:
    """Unix seconds from an ISO-8601 string (naive = UTC) or a number (ms when huge)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        return v / 1000.0 if v > 1e11 else v
    if not isinstance(value, str) or not value:
        return None
    s = value.strip()
    if s.endswith("Z") or s.endswith("z"):
        s = s[:-1] + "+00:00"
    # Python 3.11 fromisoformat accepts up to 6 fractional digits; trim longer ones.
    s = re.sub(r"(\.\d{6})\d+", r"\1", s)
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return round(dt.timestamp(), 6)


def parse_arguments(raw: Any) -> tuple[dict, bool]:
    """Tool-call arguments as a dict. Returns ``(args, ok)``; ``ok`` is False when the
    source string was not a JSON object (the raw value is then kept under ``"raw"``)."""
    if isinstance(raw, dict):
        return raw, True
    if raw is None or raw == "":
        return {}, True
    if isinstance(raw, str):
        try:
            value = decode_json(raw.encode("utf-8", "surrogatepass"))
        except (msgspec.DecodeError, UnicodeError):
            return {"raw": raw}, False
        if isinstance(value, dict):
            return value, True
        return {"raw": value}, False
    return {"raw": raw}, False


def _image_ref(media_type: str | None, data: str | None, url: str | None = None) -> dict:
    ref: dict[str, Any] = {"type": "image"}
    if media_type:
        ref["mediaType"] = media_type
    if data:
        try:
            decoded = base64.b64decode(data, validate=False)
            size = len(decoded)
            digest = hashlib.sha256(decoded).hexdigest()
        except (binascii.Error, ValueError):
            size = len(data)
            digest = hashlib.sha256(data.encode("utf-8", errors="replace")).hexdigest()
        ref["data"] = "<omitted>"
        ref["bytes"] = size
        ref["sha256"] = digest
    elif url:
        ref["url"] = url
    return ref


_DATA_URI = re.compile(r"^data:([^;,]+)?(;base64)?,(.*)$", re.S)


def scrub_block(block: Any) -> Any:
    """One content block with any inline image replaced by a small reference."""
    if not isinstance(block, dict):
        return block
    btype = block.get("type")
    if btype == "image":
        src = block.get("source")
        if isinstance(src, dict):  # Anthropic
            if src.get("type") == "base64":
                return _image_ref(src.get("media_type"), src.get("data"))
            return _image_ref(src.get("media_type"), None, src.get("url"))
        # pi / OpenClaw: {type:image, data, mimeType}
        return _image_ref(block.get("mimeType") or block.get("mediaType"), block.get("data"), block.get("url"))
    if btype in ("image_url", "input_image"):
        url = block.get("image_url")
        if isinstance(url, dict):
            url = url.get("url")
        if isinstance(url, str):
            m = _DATA_URI.match(url)
            if m:
                return _image_ref(m.group(1), m.group(3) if m.group(2) else None)
            return _image_ref(None, None, url)
        return {"type": "image"}
    if btype == "tool_result" and isinstance(block.get("content"), list):
        return {**block, "content": [scrub_block(b) for b in block["content"]]}
    return block


def content_blocks(content: Any) -> list[Any]:
    """Message content as a list of blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def text_of_blocks(blocks: Iterable[Any], sep: str = "\n\n") -> str:
    parts: list[str] = []
    for b in blocks:
        if isinstance(b, str):
            parts.append(b)
        elif isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text"):
            t = b.get("text")
            if isinstance(t, str):
                parts.append(t)
    return sep.join(parts)


def content_output(content: Any, sep: str = "\n") -> Any:
    """A tool result or user message body: text when it is only text, else scrubbed blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(
            isinstance(b, str) or (isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text"))
            for b in content
        ):
            return text_of_blocks(content, sep)
        return [scrub_block(b) for b in content]
    if isinstance(content, dict):
        return scrub_block(content)
    return content


def has_images(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("image", "image_url", "input_image") for b in content
    )


def one_line(text: str, limit: int = 80) -> str:
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"
