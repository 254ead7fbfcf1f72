"""A big request body read in pieces, so no single call holds the interpreter lock for
its whole length (SPEC §1.4: one connection's 50 MB ``node/append`` is never felt by
another connection).

msgspec decodes a body in one call that holds the interpreter lock throughout (0.2–0.3 s
for a 50 MB tool output on a loaded two-core machine), and the door check's byte scans
(``guards.check_body``) are one call each over the whole body too. Here every string
value of at least ``LONG_STRING`` bytes is *lifted* out of the body first: its raw
content is found by a scan for quotes in bounded windows, then decoded as JSON in pieces
of about ``PIECE_BYTES``, each cut where no escape sequence and no UTF-8 character is
split, so the pieces joined are exactly the string msgspec would have made. What is left
— the body with each lifted string replaced by a unique placeholder — is small; it passes
the same door check and the same typed decode as any body, and each placeholder is then
put back where the method's params type takes a plain string (no length or pattern
constraint) or any JSON value.

Whenever that cannot be shown to give exactly what the whole decode gives — a body with
too many strings to scan, a lifted string that is not valid JSON, a placeholder that
lands in a constrained field, a field the params type does not know, a notification or
an answer — ``predecode`` returns ``None`` and the body is decoded whole, as before.

Architecture Invariant: no I/O here; bytes in, a decoded request (or ``None``) out.
"""

from __future__ import annotations

import re
import secrets
from functools import lru_cache
from typing import Any

import msgspec
import msgspec.inspect as mi

from dagctx.protocol import codec
from dagctx.protocol.methods import METHODS

from . import guards

#: string values at least this many bytes long (raw, in the body) are lifted out
LONG_STRING = 1 << 20
#: a lifted string is decoded in pieces of about this many bytes
PIECE_BYTES = 1 << 20
#: a quote search looks this far at a time (each ``bytes.find`` is one call)
_WINDOW = 1 << 20
#: quotes a scan may look at before the body is decoded whole instead
MAX_QUOTES = 200_000
#: positions tried for a cut near each piece boundary
_CUT_TRIES = 4096

_KEY_AFTER = re.compile(rb"[ \t\r\n]*:")
_decode_str = msgspec.json.Decoder(str).decode
#: unique per daemon: a client cannot name a placeholder it did not cause
_TAG = "\x00dagctx-lifted:" + secrets.token_hex(8) + ":"


def _next_quote(body: bytes | bytearray, pos: int, n: int) -> int:
    while pos < n:
        q = body.find(b'"', pos, min(n, pos + _WINDOW))
        if q >= 0:
            return q
        pos += _WINDOW
    return -1


def long_strings(body: bytes | bytearray, least: int | None = None) -> list[tuple[int, int]] | None:
    """``(start, end)`` of the raw content of every string *value* in the JSON text
    ``body`` at least ``least`` bytes long (object keys are never lifted); ``None`` when the
    body holds more than ``MAX_QUOTES`` quotes or a string that never ends. Exact for
    valid JSON: outside strings a quote can only open one."""
    least = LONG_STRING if least is None else least
    n = len(body)
    spans: list[tuple[int, int]] = []
    pos = 0
    quotes = 0
    while True:
        s = _next_quote(body, pos, n)
        if s < 0:
            return spans
        e = s
        while True:  # the closing quote: one not escaped by an odd run of backslashes
            e = _next_quote(body, e + 1, n)
            quotes += 1
            if e < 0 or quotes > MAX_QUOTES:
                return None
            k = e - 1
            while body[k] == 0x5C:
                k -= 1
            if (e - 1 - k) % 2 == 0:
                break
        if e - s - 1 >= least and _KEY_AFTER.match(body, e + 1) is None:
            spans.append((s + 1, e))
        pos = e + 1


def _cut(body: bytes | bytearray, at: int, end: int) -> int:
    """A position in ``[at, end)`` where the raw string content may be cut: it starts a
    character (not a UTF-8 continuation byte) and is not inside an escape sequence (no
    backslash in the six bytes before it, the longest escape being ``\\uXXXX``; this also
    keeps a ``\\uD83D\\uDE00`` surrogate pair whole). -1 when none is near ``at``."""
    for p in range(at, min(end, at + _CUT_TRIES)):
        if body[p] & 0xC0 != 0x80 and body.find(b"\\", max(0, p - 6), p) < 0:
            return p
    return -1


def decode_string(body: bytes | bytearray, start: int, end: int) -> str | None:
    """The JSON string whose raw content is ``body[start:end]``, decoded piece by piece;
    ``None`` when it is not valid JSON string content (the whole decode then says why)."""
    pieces: list[str] = []
    pos = start
    try:
        while end - pos > PIECE_BYTES:
            cut = -1
            at = pos + PIECE_BYTES
            while cut < 0 and at < end:
                cut = _cut(body, at, end)
                at += PIECE_BYTES
            if cut < 0:
                break
            pieces.append(_decode_str(b'"' + body[pos:cut] + b'"'))
            pos = cut
        pieces.append(_decode_str(b'"' + body[pos:end] + b'"'))
    except msgspec.DecodeError:
        return None
    return "".join(pieces)


@lru_cache(maxsize=None)
def _info(tp: Any) -> Any:
    return mi.type_info(tp)


class _Putback:
    """Puts the lifted strings back into a decoded value, where its type takes them."""

    def __init__(self, strings: list[str]) -> None:
        self.strings = strings
        self.put = 0

    def _lifted(self, value: Any) -> int:
        if isinstance(value, str) and value.startswith(_TAG):
            try:
                return int(value[len(_TAG):])
            except ValueError:
                return -1
        return -1

    def _string(self, value: str) -> str:
        k = self._lifted(value)
        if 0 <= k < len(self.strings):
            self.put += 1
            return self.strings[k]
        return value

    def any(self, value: Any) -> Any:
        """An untyped JSON value: every placeholder in it, at any depth."""
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, (str, dict, list)):
                    value[k] = self.any(v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, (str, dict, list)):
                    value[i] = self.any(v)
        return value

    def typed(self, value: Any, t: Any) -> Any:
        if isinstance(t, mi.AnyType):
            return self.any(value)
        if isinstance(t, mi.StrType):
            if isinstance(value, str) and t.min_length is None and t.max_length is None and t.pattern is None:
                return self._string(value)
            return value  # a constrained string keeps its placeholder: the body is decoded whole
        if isinstance(t, mi.UnionType):
            for member in t.types:
                if isinstance(member, mi.StructType) and type(value) is member.cls:
                    return self.typed(value, member)
            for member in t.types:
                if isinstance(value, str) and isinstance(member, (mi.StrType, mi.AnyType)):
                    return self.typed(value, member)
                if isinstance(value, dict) and isinstance(member, (mi.DictType, mi.AnyType)):
                    return self.typed(value, member)
                if isinstance(value, list) and isinstance(member, (mi.ListType, mi.AnyType)):
                    return self.typed(value, member)
            return value
        if isinstance(t, mi.StructType):
            if type(value) is not t.cls:
                return value
            for f in t.fields:
                v = getattr(value, f.name)
                if isinstance(v, (str, dict, list, msgspec.Struct)):
                    nv = self.typed(v, f.type)
                    if nv is not v:
                        setattr(value, f.name, nv)
            return value
        if isinstance(t, mi.DictType) and isinstance(value, dict):
            for k, v in value.items():
                value[k] = self.typed(v, t.value_type)
            return value
        if isinstance(t, mi.ListType) and isinstance(value, list):
            for i, v in enumerate(value):
                value[i] = self.typed(v, t.item_type)
            return value
        return value  # a type that takes no lifted string: any placeholder stays, counted out


def predecode(body: bytes | bytearray) -> tuple[Any, ...] | None:
    """``("message", envelope, params)`` of a big request body, its long strings decoded in
    pieces — the same result ``Incoming._predecode`` gets from the whole body — or ``None``
    when this body must be decoded whole."""
    spans = long_strings(body)
    if not spans:
        return None
    strings: list[str] = []
    parts: list[bytes | bytearray] = []
    pos = 0
    for start, end in spans:
        text = decode_string(body, start, end)
        if text is None:
            return None
        parts.append(body[pos:start])
        parts.append(f"{_TAG}{len(strings)}".encode().replace(b"\x00", b"\\u0000"))
        strings.append(text)
        pos = end
    parts.append(body[pos:])
    skeleton = b"".join(parts)
    if guards.check_body(skeleton) is not None:
        return None
    try:
        env = codec.envelope_decoder.decode(skeleton)
    except msgspec.MsgspecError:
        return None
    if not isinstance(env.method, str) or env.id is msgspec.UNSET:
        return None
    spec = METHODS.get(env.method)
    if spec is None or spec.direction != "client-to-server" or spec.notification:
        return None
    try:
        params = codec.decode_params(spec.params, env.params)
    except msgspec.MsgspecError:
        return None
    back = _Putback(strings)
    try:
        params = back.typed(params, _info(spec.params))
    except (AttributeError, TypeError):  # a frozen Struct, a type inspect cannot describe
        return None
    if back.put != len(strings):
        return None  # a placeholder the params type dropped or does not take as it is
    return ("message", env, params)
