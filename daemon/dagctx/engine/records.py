"""What one render produced, as plain data: the record a daemon keeps of it
(``RenderRecord``) and the full outcome before it becomes a protocol result
(``Rendering``). Below every module that passes renders around.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dagctx.context.models import ModelInfo
from dagctx.context.view import View
from dagctx.protocol import context_messages as c


@dataclass
class RenderRecord:
    render_id: str
    session_id: str
    head: str
    chain_ids: frozenset[str]
    format: str
    model: str | None
    reads: list[str]
    manifest: dict[str, Any]
    #: the messages themselves: an unchanged prefix shares its message objects with the
    #: previous render, so comparing lists is cheap (no hashing of every message)
    messages: list[Any]
    message_tokens: list[int]
    total: int
    created_at: float = field(default_factory=time.time)
    #: the decision path of the request, once it was handed out (``context/prepare``): the
    #: llm node appended with this render records it beside the manifest (SPEC §6)
    decision_path: list[str] | None = None


@dataclass
class Rendering:
    """One render's full outcome, before it becomes a protocol result."""

    view: View
    system: str | None
    messages: list[Any]
    node_ids: list[list[str]]
    per_message: list[int]
    system_tokens: int
    total: int
    tokenizer: str
    model: ModelInfo
    manifest: dict[str, Any]
    record: RenderRecord
    stable: c.StablePrefix
