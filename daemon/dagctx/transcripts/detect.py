"""Which transcript format a file is in, from its suffix and its first records: each
reader says which records it recognises and how surely (``base.Reader``); the surest wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


from .base import Rank
from .readers import readers
from .jsonstream import preview
from .reading import _BOM, decode_json, iter_lines


# --------------------------------------------------------------------------- detection


def _best(ranks: list[tuple[Rank, str]]) -> str | None:
    return min(ranks)[1] if ranks else None


def _detect_line(obj: dict) -> str | None:
    """The reader whose rule of lowest rank this record matches."""
    return _best([(r, name) for name, rd in readers().items() if (r := rd.detect_line(obj)) is not None])


def _detect_json(value: Any) -> str | None:
    return _best([(r, name) for name, rd in readers().items() if (r := rd.detect_json(value)) is not None])


def detect_format(path: str | Path) -> str:
    """The format of a transcript file (one of ``FORMATS``); ``ValueError`` if unknown."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a directory; use parse_path")
    for name, rd in readers().items():
        if rd.suffix is not None and p.suffix == rd.suffix:
            return name
    with p.open("rb") as fh:
        first_chunk = fh.read(4096).removeprefix(_BOM).lstrip()
    if first_chunk[:1] == b"[" or (p.suffix == ".json" and first_chunk[:1] == b"{"):
        try:
            fmt = _detect_json(preview(p))  # a large file is not read whole: its first items decide
        except (msgspec.DecodeError, ValueError, RecursionError):
            fmt = None
        if fmt:
            return fmt
    seen = 0
    for _, raw in iter_lines(p):
        if isinstance(raw, int):
            continue  # over the cap: the parser reports it
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except (msgspec.DecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            fmt = _detect_line(obj)
            if fmt:
                return fmt
        seen += 1
        if seen >= 200:
            break
    labels = [rd.label for rd in readers().values()]
    raise ValueError(
        f"cannot tell which transcript format {p} is in (not {', '.join(labels[:-1])} or {labels[-1]}); "
        "pass --format / format if it is one of them"
    )
