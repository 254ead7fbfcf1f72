"""An in-memory ``SessionGraph`` built node by node, for the pure views' unit tests.

Each test module adds its own shape on top (turns, tool calls, long agent turns); the
part every one of them needs — a ROOT, a seq counter, ``add`` — lives here once.
"""

from __future__ import annotations

from typing import Any

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.nodes import Call


class GraphBuilder:
    def __init__(self) -> None:
        self.g = SessionGraph("s", "root")
        self.seq = 0
        self.g.add(Call(id="root", seq=0, created_at=0.0, role="user"))
        self.tip = "root"

    def add(self, id: str, role: str, *, created_at: float | None = None, **kw: Any) -> str:
        """Append node ``id`` with the next seq; ``created_at`` defaults to the seq."""
        self.seq += 1
        when = float(self.seq) if created_at is None else created_at
        self.g.add(Call(id=id, seq=self.seq, created_at=when, role=role, **kw))  # type: ignore[arg-type]
        return id
