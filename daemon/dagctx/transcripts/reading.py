"""Size-capped streaming reads of transcript files: lines, JSON Lines, digests (one JSON
document read a piece at a time: ``jsonstream.py``).

A record longer than ``max_line_bytes()`` is reported by size, never read whole; a value
nested deeper than the protocol's limit is refused before anything recurses into it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import msgspec

from dagctx.protocol.context_messages import Skipped
from dagctx.protocol.limits import MAX_JSON_DEPTH, too_deep

from .base import quote


# --------------------------------------------------------------------------- reading

_BOM = b"\xef\xbb\xbf"

#: Default cap on one JSONL line, and on one element of a ``.json``/``.traj`` document:
#: 16 MiB. Longer records are skipped with their size, so import memory stays bounded
#: whatever the input (SPEC §9 import). ``DAGCTX_IMPORT_MAX_LINE_BYTES`` overrides it.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1 << 20


#: The environment of the client whose import runs (SPEC §1.3: the shared daemon's own
#: environment is not the client's); None: this process's environment.
CLIENT_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("dagctx_client_environ", default=None)


def max_line_bytes() -> int:
    """The record cap in bytes (read on every call, from the requesting client's
    ``DAGCTX_IMPORT_MAX_LINE_BYTES``)."""
    env = CLIENT_ENVIRON.get()
    raw = (os.environ if env is None else env).get("DAGCTX_IMPORT_MAX_LINE_BYTES", "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_MAX_LINE_BYTES
    return value if value > 0 else DEFAULT_MAX_LINE_BYTES


class RecordTooLarge(ValueError):
    """A JSON value over the cap (``max_line_bytes``), not decoded."""


def iter_lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, bytes | int]]:
    """``(line_no, bytes)`` for each line of ``path``, read in 1 MiB chunks; a line longer
    than ``limit`` bytes is given as ``(line_no, size)`` instead, without ever holding
    more than ``limit`` + one chunk in memory. A leading BOM is dropped; lines split on
    ``\\n`` only."""
    cap = max_line_bytes() if limit is None else limit
    no = 0
    buf = bytearray()
    over = 0  # bytes of the current line when it is over the cap (0: not over)
    first = True
    with path.open("rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if first:
                chunk = chunk.removeprefix(_BOM)
                first = False
            if not chunk:
                break
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                piece = chunk[start:] if nl < 0 else chunk[start:nl]
                if over:
                    over += len(piece)
                elif len(buf) + len(piece) > cap:
                    over = len(buf) + len(piece)
                    buf = bytearray()
                else:
                    buf += piece
                if nl < 0:
                    break
                no += 1
                if over:
                    yield no, over
                else:
                    yield no, bytes(buf)
                buf = bytearray()
                over = 0
                start = nl + 1
    if over:
        yield no + 1, over
    elif buf:
        yield no + 1, bytes(buf)


def too_large(size: int) -> str:
    return f"line of {size:,} bytes is over the {max_line_bytes():,}-byte limit (DAGCTX_IMPORT_MAX_LINE_BYTES); not read"


def iter_jsonl(path: Path, *, label: str = "") -> Iterator[tuple[int, dict] | Skipped]:
    """Each JSON-object line of ``path`` as ``(line_no, object)``, each bad line as a
    ``Skipped`` (not JSON, not an object, over the size cap), streaming."""
    prefix = f"{label}: " if label else ""
    for no, raw in iter_lines(path):
        if isinstance(raw, int):
            yield Skipped(no, prefix + too_large(raw))
            continue
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except msgspec.DecodeError as exc:
            if str(exc) == _TOO_DEEP:
                yield Skipped(no, f"{prefix}{_TOO_DEEP}")
                continue
            yield Skipped(no, f"{prefix}not JSON: {quote(text, 20)}")
            continue
        except RecursionError:
            yield Skipped(no, f"{prefix}{_TOO_DEEP}")
            continue
        if not isinstance(obj, dict):
            yield Skipped(no, f"{prefix}not a JSON object ({type(obj).__name__})")
            continue
        yield no, obj


def read_jsonl(path: Path, *, label: str = "") -> tuple[list[tuple[int, dict]], list[Skipped]]:
    """Decode a JSONL file into ``(line_no, object)`` pairs; bad lines become ``Skipped``.

    Lines are split on ``\\n`` only (JSON text may contain a raw U+2028), blank lines are
    ignored silently, and a line that is not a JSON object (or is over the size cap) is
    reported, never raised. ``label`` prefixes the reasons (used for files folded into
    another transcript).
    """
    rows: list[tuple[int, dict]] = []
    skipped: list[Skipped] = []
    for item in iter_jsonl(path, label=label):
        if isinstance(item, Skipped):
            skipped.append(item)
        else:
            rows.append(item)
    return rows, skipped


_TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"


def decode_json(data: bytes) -> Any:
    """``msgspec.json.decode``, but a text nested deeper than ``MAX_JSON_DEPTH`` is a
    ``DecodeError`` (SPEC §3): deeper values would fail later walks by recursion."""
    if too_deep(data):
        raise msgspec.DecodeError(_TOO_DEEP)
    return msgspec.json.decode(data)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def text_digest(text: str | bytes) -> str:
    if isinstance(text, str):
        text = text.encode("utf-8")
    return "sha256:" + hashlib.sha256(text).hexdigest()
