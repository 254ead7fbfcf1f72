"""LSP base-protocol framing over a byte stream, robust to bad input.

Stock pygls matches ``Content-Length: N`` byte-exactly, so a lower-case header or a
missing space desynchronises the stream and the next message is lost. This parser
treats header names case-insensitively, tolerates missing whitespace, reports a
malformed header or an oversized frame as an error event, and resynchronises at the
next ``Content-Length`` header instead of dying.

An oversized frame's body is skipped byte for byte when its length is plausible (up
to ``SKIP_FACTOR`` times the frame limit, at least 1 GiB); a larger declared length is a lie no body
will ever complete, so the header is dropped and the stream resynchronises at the
next header, exactly as for a malformed one (SPEC §1). A header block naming
``Content-Length`` twice is refused whole: which one is right cannot be known.

Architecture Invariant: no I/O and no JSON here; bytes in, events out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER_END = b"\r\n\r\n"
_CANONICAL = b"Content-Length: "
_CONTENT_LENGTH = re.compile(rb"content-length", re.IGNORECASE)
MAX_HEADER_BYTES = 8192
#: an oversized frame is skipped exactly up to ``max(SKIP_FACTOR × limit, MIN_SKIP_BYTES)``
SKIP_FACTOR = 16
MIN_SKIP_BYTES = 1 << 30
#: a body at least this long is handed out as the buffer it arrived in, its header cut off
#: the front, never copied whole: each copy of fresh memory holds the interpreter lock for
#: its whole length (0.1–0.3 s for 50 MB on a loaded two-core machine), felt by every
#: connection (SPEC §1.4)
KEEP_BUFFER_BYTES = 1 << 20


@dataclass
class Body:
    data: bytes | bytearray  # a big body is the bytearray it arrived in


@dataclass
class FrameError:
    kind: str  # "ParseError" | "FrameTooLarge"
    message: str


class FrameParser:
    """Incremental parser: ``feed(bytes)`` returns complete bodies and errors in order."""

    def __init__(self, max_frame_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._skip = 0  # body bytes of an oversized frame still to discard

    @property
    def idle(self) -> bool:
        """Nothing half-read: the next byte fed starts a frame."""
        return not self._buf and not self._skip

    def feed(self, data: bytes) -> list[Body | FrameError]:
        out: list[Body | FrameError] = []
        if not self._buf and not self._skip:
            taken = self._whole_frames(data, out)
            if taken == len(data):
                return out
            if taken:
                data = data[taken:]
        self._buf += data
        while True:
            if self._skip:
                n = min(self._skip, len(self._buf))
                del self._buf[:n]
                self._skip -= n
                if self._skip:
                    return out
            if not self._buf:
                return out
            if not _could_start_header(self._buf):
                m = _CONTENT_LENGTH.search(self._buf, 1)
                if m is not None:
                    junk = bytes(self._buf[: m.start()])
                    del self._buf[: m.start()]
                    out.append(FrameError("ParseError", f"unreadable bytes before a header: {junk[:40]!r}"))
                    continue
                end = self._buf.find(_HEADER_END)
                if end >= 0:
                    junk = bytes(self._buf[:end])
                    del self._buf[: end + 4]
                    out.append(FrameError("ParseError", f"not an LSP header: {junk[:40]!r}"))
                    continue
                if len(self._buf) > MAX_HEADER_BYTES:
                    self._buf.clear()
                    out.append(FrameError("ParseError", "unreadable input without any Content-Length header"))
                return out
            end = self._buf.find(_HEADER_END)
            if end < 0:
                if len(self._buf) > MAX_HEADER_BYTES:
                    self._buf.clear()
                    out.append(FrameError("ParseError", "a header block longer than 8 KiB without a blank line"))
                return out
            header = bytes(self._buf[:end])
            length, problem = _parse_header(header)
            if problem is not None:
                # Drop this header block; whatever follows is examined afresh.
                del self._buf[: end + 4]
                out.append(FrameError("ParseError", problem))
                continue
            assert length is not None
            if length > self.max_frame_bytes:
                del self._buf[: end + 4]
                if length <= max(self.max_frame_bytes * SKIP_FACTOR, MIN_SKIP_BYTES):
                    self._skip = length
                out.append(
                    FrameError(
                        "FrameTooLarge",
                        f"frame of {length:,} bytes is larger than the maximum of "
                        f"{self.max_frame_bytes:,}; split the request or raise maxFrameBytes",
                    )
                )
                continue
            if len(self._buf) < end + 4 + length:
                return out
            if length >= KEEP_BUFFER_BYTES:
                # the buffer becomes the body: what follows it is copied (a few bytes), its
                # header dropped from the front (CPython moves the start, it copies nothing)
                rest = self._buf[end + 4 + length:]
                del self._buf[end + 4 + length:]
                del self._buf[: end + 4]
                body_buf, self._buf = self._buf, bytearray(rest)
                out.append(Body(body_buf))
                continue
            body = bytes(self._buf[end + 4 : end + 4 + length])
            del self._buf[: end + 4 + length]
            out.append(Body(body))


    def _whole_frames(self, data: bytes, out: list[Body | FrameError]) -> int:
        """The canonical frames at the front of ``data`` (``Content-Length: N``, one space,
        no other header, the whole body present, under the limits), appended to ``out``
        straight from ``data``; returns how many bytes they took. Whatever else — another
        header, odd spacing or case, a partial frame, a big body — is left to the general
        parser, which reads a canonical frame exactly as this does. Nearly every client
        write is one or more canonical frames, read whole: this spares them the copy into
        the buffer and the general header parse (SPEC §1)."""
        pos, size = 0, len(data)
        limit = min(self.max_frame_bytes, KEEP_BUFFER_BYTES - 1)
        while data.startswith(_CANONICAL, pos):
            start = pos + len(_CANONICAL)
            end = data.find(_HEADER_END, start, start + 24)
            if end < 0:
                break
            digits = data[start:end]
            if not digits.isdigit():
                break
            length = int(digits)
            if length > limit or end + 4 + length > size:
                break
            pos = end + 4 + length
            out.append(Body(data[end + 4:pos]))
        return pos


def _could_start_header(buf: bytearray) -> bool:
    """True when ``buf`` starts like an LSP header (``Content-…``, any case)."""
    head = bytes(buf[:8]).lower()
    return b"content-"[: len(head)] == head


def _parse_header(header: bytes) -> tuple[int | None, str | None]:
    length: int | None = None
    seen = 0
    garbage_before = b""
    lines = header.split(b"\r\n")
    for line in lines:
        if not line.strip():
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            garbage_before = line
            continue
        key = name.strip().lower()
        if key.endswith(b"content-length"):
            seen += 1
            if seen > 1:
                return None, "the header block names Content-Length twice; send exactly one"
        if key == b"content-length":
            v = value.strip()
            if not v.isdigit():
                return None, f"Content-Length must be a decimal number of bytes, got {v[:40]!r}"
            length = int(v)
        elif key.endswith(b"content-length"):
            # Garbage glued to the front of a real header.
            v = value.strip()
            if v.isdigit():
                length = int(v)
                garbage_before = name[: -len(b"content-length")]
    if length is None:
        shown = header[:60]
        return None, f"header block without Content-Length: {shown!r}"
    if garbage_before:
        return None, f"unreadable bytes before the header: {garbage_before[:40]!r}"
    return length, None
