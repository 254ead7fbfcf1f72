"""One JSON document in a file, read a piece at a time (SPEC §9 import: memory bounded by
the largest node, for the formats that are one JSON document — a ShareGPT array, an
OpenHands event list, a SWE-agent trajectory).

``open_document`` gives the document's value: decoded whole when the file is small
(``WHOLE_BELOW``), else a ``Span`` — where a value starts and ends in the file. The
helpers below take either, so a parser has one code path: ``fields`` (an object's
members), ``elements`` (an array's items, each decoded on its own), ``last``, ``value``
(decode a member whole) and ``digest`` (the SHA-256 of the value as msgspec re-encodes
it, computed piece by piece). A container is read lazily, its bytes scanned in 1 MiB
chunks by a small state machine (strings and their escapes, brackets and their nesting);
only the elements a parser asks for are decoded, one at a time, with msgspec.

The scan checks what the structure needs (strings closed, brackets matched, members and
items separated, nothing after the value, no nesting deeper than ``MAX_JSON_DEPTH``);
numbers and literals are checked by msgspec when the element holding them is decoded.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from dagctx.protocol.limits import MAX_JSON_DEPTH

from .reading import _BOM, _TOO_DEEP, RecordTooLarge, decode_json, max_line_bytes

#: A document (or, within a streamed one, a ShareGPT conversation) of at most this many
#: bytes is decoded whole: small files keep msgspec's one-call speed, and decoding one
#: costs a few times this in memory at most. Tests set it to 0 (everything streamed) and
#: to a huge value (everything whole) and compare the two.
WHOLE_BELOW = 1 << 20

_CHUNK = 1 << 20
#: a string's body up to its closing quote (or the end of the buffer, or a lone backslash)
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\.)*+', re.S)
#: outside strings: everything up to the next quote or bracket
_PLAIN = re.compile(rb'[^"\[\]{}]*+')
_WS = re.compile(rb"[ \t\r\n]*+")
#: a number or a literal (checked by msgspec when decoded)
_SCALAR = re.compile(rb"[^ \t\r\n,:\[\]{}\"]++")
_CLOSE = {ord("["): ord("]"), ord("{"): ord("}")}


def _malformed(what: str, at: int) -> msgspec.DecodeError:
    return msgspec.DecodeError(f"JSON is malformed: {what} (byte {at})")


class Unreadable:
    """An element that could not be decoded: over the record cap (``size``) or not JSON
    (``reason``). ``elements`` yields it in the element's place."""

    __slots__ = ("size", "reason")

    def __init__(self, size: int | None = None, reason: str | None = None) -> None:
        self.size, self.reason = size, reason


class Span:
    """A value of a ``JsonDocument``: its kind (the first byte: ``{``, ``[``, ``"``, or
    another for numbers and literals), where it starts, where it ends (None until it was
    scanned) and how many containers hold it."""

    __slots__ = ("doc", "kind", "start", "end", "depth", "fields")

    def __init__(self, doc: JsonDocument, kind: int, start: int, end: int | None, depth: int) -> None:
        self.doc, self.kind, self.start, self.end, self.depth = doc, kind, start, end, depth
        self.fields: dict[str, Any] | None = None  # an object's members, once read (``fields``)

    @property
    def size(self) -> int:
        return self.doc.end_of(self) - self.start


class JsonDocument:
    """A JSON file read by offsets: a 1 MiB window of it at a time."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._buf = b""
        self._at = 0  # file offset of _buf[0]
        self._eof = False

    # -- the window

    def _load(self, off: int, size: int = 0) -> None:
        size = max(size, _CHUNK)
        self._fh.seek(off)
        self._buf = self._fh.read(size)
        self._at = off
        self._eof = len(self._buf) < size

    def _window(self, off: int) -> tuple[bytes, int]:
        """The buffer holding offset ``off`` (b"" at the end of the file) and its index."""
        i = off - self._at
        if not 0 <= i < len(self._buf):
            self._load(off)
            i = 0
        return self._buf, i

    def _byte(self, off: int) -> int:
        buf, i = self._window(off)
        return buf[i] if i < len(buf) else -1

    def _skip_ws(self, off: int) -> int:
        while True:
            buf, i = self._window(off)
            if i >= len(buf):
                return off
            j = _WS.match(buf, i).end()  # type: ignore[union-attr]
            off += j - i
            if j < len(buf):
                return off

    def read(self, start: int, end: int) -> bytes:
        i = start - self._at
        if i >= 0 and end - self._at <= len(self._buf):
            return self._buf[i:end - self._at]
        self._fh.seek(start)
        return self._fh.read(end - start)

    # -- scanning

    def _string_end(self, off: int) -> int:
        """The offset after the closing quote of the string whose body starts at ``off``."""
        while True:
            buf, i = self._window(off)
            if i >= len(buf):
                raise _malformed("unterminated string", off)
            j = _STRING_BODY.match(buf, i).end()  # type: ignore[union-attr]
            if j < len(buf) and buf[j] == 0x22:  # '"'
                return off + (j - i) + 1
            if j > i:
                off += j - i  # read on from the end of the window (or from a backslash cut by it)
            elif self._eof:
                raise _malformed("unterminated string", off)  # a lone backslash at the end of the file
            else:
                self._load(off, 2)  # a backslash as the window's last byte: the window starts at it

    def _container_end(self, off: int, depth: int) -> int:
        """The offset after the array or object that opens at ``off`` (``depth``
        containers around it)."""
        stack = [_CLOSE[self._byte(off)]]
        if depth + 1 > MAX_JSON_DEPTH:
            raise msgspec.DecodeError(_TOO_DEEP)
        off += 1
        while True:
            buf, i = self._window(off)
            if i >= len(buf):
                raise _malformed("input data was truncated", off)
            j = _PLAIN.match(buf, i).end()  # type: ignore[union-attr]
            off += j - i
            if j >= len(buf):
                continue
            c = buf[j]
            if c == 0x22:
                off = self._string_end(off + 1)
                continue
            off += 1
            if c in _CLOSE:
                stack.append(_CLOSE[c])
                if depth + len(stack) > MAX_JSON_DEPTH:
                    raise msgspec.DecodeError(_TOO_DEEP)
            elif c != stack.pop():
                raise _malformed("mismatched bracket", off - 1)
            elif not stack:
                return off

    def _value_at(self, off: int, depth: int, scan: bool = True) -> Span:
        c = self._byte(off)
        if c == -1:
            raise _malformed("input data was truncated", off)
        if c == 0x22:
            return Span(self, c, off, self._string_end(off + 1), depth)
        if c in _CLOSE:
            return Span(self, c, off, self._container_end(off, depth) if scan else None, depth)
        buf, i = self._window(off)
        m = _SCALAR.match(buf, i)
        if m is None:
            raise _malformed("invalid character", off)
        end = off + (m.end() - i)
        while m.end() >= len(buf) and not self._eof:  # a number cut by the window
            buf, i = self._window(end)
            m = _SCALAR.match(buf, i)
            if m is None:
                break
            end += m.end() - i
        return Span(self, c, off, end, depth)

    def end_of(self, span: Span) -> int:
        if span.end is None:
            span.end = self._container_end(span.start, span.depth)
        return span.end

    def root(self, check: bool = True) -> Span:
        """The document's value; ``check``: scanned whole first (its structure checked, and
        nothing but whitespace after it), else read lazily."""
        start = self._skip_ws(len(_BOM) if self.read(0, len(_BOM)) == _BOM else 0)
        span = self._value_at(start, 0, scan=check)
        if check:
            after = self._skip_ws(span.end)  # type: ignore[arg-type]
            if self._byte(after) != -1:
                raise _malformed("trailing characters", after)
        return span

    def _items(self, span: Span, close: int) -> Iterator[tuple[int, Span]]:
        """``(offset, value span)`` of each item (array) or member (object: the offset is
        the key's)."""
        off = self._skip_ws(span.start + 1)
        if self._byte(off) == close:
            span.end = off + 1
            return
        while True:
            key_at = off
            if close == 0x7D:  # '}': a key, a colon
                if self._byte(off) != 0x22:
                    raise _malformed("expected a key", off)
                off = self._skip_ws(self._string_end(off + 1))
                if self._byte(off) != 0x3A:
                    raise _malformed("expected ':'", off)
                off = self._skip_ws(off + 1)
            value = self._value_at(off, span.depth + 1)
            yield key_at, value
            off = self._skip_ws(value.end)  # type: ignore[arg-type]
            c = self._byte(off)
            if c == close:
                span.end = off + 1
                return
            if c != 0x2C:
                raise _malformed("expected ',' or a closing bracket", off)
            off = self._skip_ws(off + 1)

    def key(self, off: int) -> str:
        end = self._string_end(off + 1)
        if end - off > max_line_bytes():
            raise RecordTooLarge(f"a key of {end - off:,} bytes")
        return msgspec.json.decode(self.read(off, end))

    def decode(self, span: Span) -> Any:
        """``span``'s value, decoded whole; ``RecordTooLarge`` over the record cap."""
        end = self.end_of(span)
        if end - span.start > max_line_bytes():
            raise RecordTooLarge(f"{end - span.start:,} bytes")
        return decode_json(self.read(span.start, end))


# --------------------------------------------------------------------------- values


def open_document(fh: BinaryIO, size: int) -> Any:
    """The value of the JSON file ``fh`` (``size`` bytes): decoded whole when it is at most
    ``WHOLE_BELOW`` bytes (and within the record cap), else the checked root ``Span``.
    ``msgspec.DecodeError`` when it is not JSON."""
    if size <= min(WHOLE_BELOW, max_line_bytes()):
        return decode_json(fh.read().removeprefix(_BOM))
    return JsonDocument(fh).root()


def is_array(v: Any) -> bool:
    return isinstance(v, list) or isinstance(v, Span) and v.kind == 0x5B


def is_object(v: Any) -> bool:
    return isinstance(v, dict) or isinstance(v, Span) and v.kind == 0x7B


def opened(span: Span) -> Any:
    """A member or item: decoded when it is a string, a number or literal, or a container of
    at most ``WHOLE_BELOW`` bytes; a larger container stays a ``Span``; one that cannot be
    decoded (over the record cap, not JSON) is an ``Unreadable``."""
    if span.kind in _CLOSE and span.size > min(WHOLE_BELOW, max_line_bytes()):
        return span
    try:
        return span.doc.decode(span)
    except RecordTooLarge:
        return Unreadable(size=span.size)
    except msgspec.DecodeError as exc:
        return Unreadable(reason=str(exc))


def fields(v: Any) -> dict[str, Any] | None:
    """An object's members (later duplicates win, in the first one's place, as a decoded
    dict has them), each ``opened``; None when ``v`` is no object. A large member stays a
    ``Span``: pass it to ``value``, ``elements`` or ``fields``."""
    if isinstance(v, dict):
        return v
    if not (isinstance(v, Span) and v.kind == 0x7B):
        return None
    if v.fields is None:
        doc = v.doc
        members: dict[str, Span] = {}
        for key_at, span in doc._items(v, 0x7D):
            members[doc.key(key_at)] = span
        v.fields = {k: opened(s) for k, s in members.items()}
    return v.fields


def value(v: Any) -> Any:
    """``v`` decoded whole (``RecordTooLarge`` over the record cap)."""
    return v.doc.decode(v) if isinstance(v, Span) else v


def elements(v: Any) -> Iterator[Any]:
    """Each item of an array (a list or a ``Span``), decoded on its own; one that cannot be
    is an ``Unreadable`` in its place."""
    if isinstance(v, list):
        yield from v
        return
    if not is_array(v):
        return
    doc = v.doc
    for _, span in doc._items(v, 0x5D):
        try:
            yield doc.decode(span)
        except RecordTooLarge:
            yield Unreadable(size=span.size)
        except msgspec.DecodeError as exc:
            yield Unreadable(reason=str(exc))


def spans(v: Any) -> Iterator[Any]:
    """Each item of an array, ``opened`` (a large container stays a ``Span``)."""
    if isinstance(v, list):
        yield from v
        return
    if is_array(v):
        for _, span in v.doc._items(v, 0x5D):
            yield opened(span)


def last(v: Any) -> Any:
    """The last item of an array (``opened``), None when it has none."""
    if isinstance(v, list):
        return v[-1] if v else None
    end: Span | None = None
    if is_array(v):
        for _, span in v.doc._items(v, 0x5D):
            end = span
    return None if end is None else opened(end)


def digest(v: Any) -> str:
    """``sha256:`` of ``msgspec.json.encode`` of the value, computed a piece at a time
    for a ``Span`` (each small piece decoded and re-encoded whole)."""
    h = hashlib.sha256()
    _encode_into(v, h.update)
    return "sha256:" + h.hexdigest()


def _encode_into(v: Any, out: Any) -> None:
    if isinstance(v, Span) and v.size > max_line_bytes() and v.kind not in _CLOSE:
        # a value over the record cap is not decoded (it is skipped where it is read):
        # its bytes as they are, a MiB at a time, still name the conversation
        for at in range(v.start, v.doc.end_of(v), _CHUNK):
            out(v.doc.read(at, min(at + _CHUNK, v.doc.end_of(v))))
        return
    if not isinstance(v, Span) or v.kind not in _CLOSE or v.size <= min(WHOLE_BELOW, max_line_bytes()):
        out(msgspec.json.encode(value(v)))
        return
    doc = v.doc
    if v.kind == 0x5B:
        out(b"[")
        for n, (_, span) in enumerate(doc._items(v, 0x5D)):
            if n:
                out(b",")
            _encode_into(span, out)
        out(b"]")
        return
    members: dict[str, Span] = {}
    for key_at, span in doc._items(v, 0x7D):
        members[doc.key(key_at)] = span
    out(b"{")
    for n, (k, span) in enumerate(members.items()):
        if n:
            out(b",")
        out(msgspec.json.encode(k))
        out(b":")
        _encode_into(span, out)
    out(b"}")


def preview(path: Path, levels: int = 4, items: int = 20) -> Any:
    """What format detection looks at, without reading a large file whole: containers
    ``levels`` deep (deeper ones empty, of their kind), arrays cut to their first ``items``
    items, long strings empty. Small files are decoded whole."""
    with path.open("rb") as fh:
        size = path.stat().st_size
        if size <= min(WHOLE_BELOW, max_line_bytes()):
            return decode_json(fh.read().removeprefix(_BOM))
        doc = JsonDocument(fh)
        return _preview(doc, doc.root(check=False), levels, items)


def _preview(doc: JsonDocument, span: Span, levels: int, items: int) -> Any:
    if span.kind == 0x22:
        return doc.decode(span) if span.size <= 4096 else ""
    if span.kind not in _CLOSE:
        return doc.decode(span)
    if levels <= 0:
        return [] if span.kind == 0x5B else {}
    if span.kind == 0x5B:
        out: list[Any] = []
        for _, s in doc._items(span, 0x5D):
            if len(out) >= items:
                break
            out.append(_preview(doc, s, levels - 1, items))
        return out
    obj: dict[str, Any] = {}
    for key_at, s in doc._items(span, 0x7D):
        obj[doc.key(key_at)] = _preview(doc, s, levels - 1, items)
    return obj
