"""Checks a message body must pass before anything decodes it (SPEC §1, §3).

msgspec, ``json`` and every walk over a decoded value recurse once per level of
nesting, so a body nested a few thousand levels deep would raise ``RecursionError``
inside the decoder (or later, in the token counter or an export) instead of being
answered. And SQLite and msgpack hold integers of at most 64 bits, so a larger
integer accepted at the door would fail only when it is stored. Both are refused
here, before the body is decoded for real, with the field that is wrong.

The common case costs almost nothing: a body with fewer opening brackets than the
depth limit cannot be too deep, and a body without a run of 19 digits cannot hold
an integer beyond 64 bits; only bodies that fail those byte counts are scanned.

Architecture Invariant: no I/O here; bytes and values in, a verdict out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import logging

import msgspec

from dagctx.protocol import codec
from dagctx.protocol.limits import INT64_MAX, INT64_MIN, MAX_JSON_DEPTH, safe_text, too_deep
from dagctx.protocol.errors import ErrorData, ResponseError

_log = logging.getLogger("dagctx.server")

#: digits → "0", everything else → " ": a 19-digit run is then a plain substring search
_DIGITS_ONLY = bytes.maketrans(bytes(range(256)), bytes(48 if 48 <= b <= 57 else 32 for b in range(256)))
_RUN = b"0" * 19
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: strings and brackets: what a scan for the top-level ``id`` has to look at
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_ID_VALUE = re.compile(rb'\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|"[^"\\]*(?:\\.[^"\\]*)*"|null)\s*[,}]', re.DOTALL)
#: how many tokens the id scan of a too-deep body looks at before it gives up
_ID_SCAN_TOKENS = 2_000_000


@dataclass(frozen=True)
class Refusal:
    """Why a body is refused: the JSON-RPC kind, a message for a person, the field."""

    kind: str
    message: str
    path: str | None = None


def top_level_id(body: bytes) -> tuple[bool, Any]:
    """``(found, id)`` of a body too deep to decode: the ``id`` member of the outer
    object when it is a number, a string or null, so the refusal can be answered to
    the request that caused it. Any other id (an array, an object) is not found."""
    depth = 0
    n = 0
    for m in _TOKEN.finditer(body):
        n += 1
        if n > _ID_SCAN_TOKENS:
            break
        tok = m.group()
        if tok in (b"{", b"["):
            depth += 1
            continue
        if tok in (b"}", b"]"):
            depth -= 1
            continue
        if depth != 1 or tok != b'"id"':
            continue
        # a key is a string at depth 1 followed by a colon
        v = _ID_VALUE.match(body, m.end())
        if v is None:
            if re.match(rb"\s*:", body[m.end() : m.end() + 64]):
                return False, None  # the id is there but is not a scalar
            continue
        try:
            value = msgspec.json.decode(v.group(1))
        except msgspec.DecodeError:
            return False, None
        if isinstance(value, (int, str)) or value is None:
            return True, value
        return False, None
    return False, None


def big_integer(params: Any, prefix: str = "params") -> Refusal | None:
    """The first integer in ``params`` that does not fit in 64 bits (signed), if any."""
    stack: list[tuple[str, Any]] = [(prefix, params)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            if value < INT64_MIN or value > INT64_MAX:
                shown = str(value)
                if len(shown) > 40:
                    shown = shown[:20] + "…" + shown[-8:]
                return Refusal(
                    "InvalidParams",
                    f"{path} is {shown}, which does not fit in a 64-bit signed integer "
                    f"({INT64_MIN}..{INT64_MAX}); send a smaller number, or a string",
                    path,
                )
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def _has_long_digit_run(data: bytes) -> bool:
    """True when ``data`` holds 19 digits in a row (an integer that may exceed 64 bits)."""
    return _RUN in data.translate(_DIGITS_ONLY)


def depth_refusal() -> Refusal:
    return Refusal(
        "InvalidParams",
        f"the message nests arrays/objects more than {MAX_JSON_DEPTH} levels deep "
        "(counted from the message object); flatten the value, or send it as a string",
        "params",
    )


def sanitize(value: Any) -> Any:
    """A builtins value (``msgspec.to_builtins`` output) with every string made safe."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(k) if isinstance(k, str) else k: sanitize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitize(v) for v in value]
    return value


@dataclass(frozen=True)
class RefusedBody:
    """A body refused before decoding, and the id to answer (``None`` when unknown)."""

    id: Any
    refusal: Refusal


def check_body(body: bytes) -> RefusedBody | None:
    """The one door check of a message body (SPEC §1): nesting, then integer sizes."""
    if too_deep(body):
        found, msg_id = top_level_id(body)
        if found and msg_id is not None:
            return RefusedBody(msg_id, depth_refusal())
        r = depth_refusal()
        return RefusedBody(None, Refusal("InvalidRequest", r.message, None))
    if not _has_long_digit_run(body) or not _has_long_digit_run(_STRING.sub(b'""', body)):
        return None  # no 19-digit run at all, or only inside strings
    try:
        whole = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None  # the real decode reports it
    if not isinstance(whole, dict) or "params" not in whole or "id" not in whole:
        return None
    msg_id = whole["id"]
    if isinstance(msg_id, bool) or not isinstance(msg_id, (int, str)):
        return None  # the envelope check answers it
    refusal = big_integer(whole["params"])
    return None if refusal is None else RefusedBody(msg_id, refusal)


def encode_sanitized(message: Any) -> bytes:
    """Encode ``message`` whose plain encoding failed: every string made valid UTF-8
    (a file name with undecodable bytes is reported, not fatal). Should even that
    fail, a request still gets an answer: an ``InternalError`` with its id."""
    try:
        return codec.encoder.encode(sanitize(msgspec.to_builtins(message)))
    except Exception as exc:  # noqa: BLE001 - the answer must be written
        error = ResponseError(
            code=-32603,
            message=f"the answer could not be encoded ({type(exc).__name__}: {safe_text(str(exc))[:200]}); "
            "the daemon is still running",
            data=ErrorData(kind="InternalError"),
        )
        return codec.encoder.encode(codec.ErrorResponse(id=getattr(message, "id", None), error=error))


def encode_message_safely(message: Any) -> bytes:
    """The framed message; text that cannot be encoded as is (undecodable bytes in a file
    name, say) is sent escaped instead of failing the answer (SPEC §1)."""
    try:
        return codec.encode_message(message)
    except (UnicodeEncodeError, OverflowError, TypeError) as exc:
        _log.warning("message not encodable as is (%s); sending it with escaped text", exc)
        return codec.frame(encode_sanitized(message))
