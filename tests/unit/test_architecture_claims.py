"""The numbers and lists ARCHITECTURE.md states, checked against the code where they can
be: a claim that stops being true fails here, not in a newcomer's head."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCH = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _stated(pattern: str) -> str:
    m = re.search(pattern, ARCH, re.S)
    assert m, f"ARCHITECTURE.md no longer says {pattern!r}"
    return m.group(1)


def test_the_backend_primitives_are_counted_right() -> None:
    from dagctx.ledger.backend import Backend

    primitives = [n for n, v in vars(Backend).items() if not n.startswith("_") and callable(v)]
    assert int(_stated(r"the `Backend` Protocol — (\d+) primitives")) == len(primitives), primitives
