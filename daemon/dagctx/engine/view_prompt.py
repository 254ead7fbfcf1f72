"""The system prompt as a node: assembled per request, appended when its hash changed.

The system-prompt part of ``ContextService`` (``engine/views.py``); the assembler itself
is ``context/system_prompt.py`` (pure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context.system_prompt import PromptOptions, assemble_system_prompt
from dagctx.ledger import SessionGraph
from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME, Call, NodeInput

if TYPE_CHECKING:
    from .core import EngineCore


class SystemPromptNode:
    """``ensure_system_prompt``: the one writer of ``context/system_prompt`` nodes."""

    e: EngineCore

    def ensure_system_prompt(self, session_id: str, graph: SessionGraph, options: PromptOptions,
                             workspace: str | None, *, assembler: Any = None) -> tuple[str, str | None, list[str]]:
        """Assemble the prompt; append a ``context/system_prompt`` node when its hash changed."""
        assembled = (assembler or assemble_system_prompt)(workspace, options)
        if not assembled.text:
            return "", None, list(assembled.notes)
        newest: Call | None = None
        for n in reversed(graph.by_seq):
            if n.name == SYSTEM_PROMPT_NAME:
                newest = n
                break
        if newest is not None and newest.metadata.get("hash") == assembled.hash:
            return assembled.text, newest.id, list(assembled.notes)
        out = self.e.write_node(
            session_id,
            NodeInput(
                role="code",
                name=SYSTEM_PROMPT_NAME,
                caller=graph.root_id,
                output=assembled.text,
                metadata={
                    "hash": assembled.hash,
                    "files": list(assembled.files),
                    "sections": [msgspec.to_builtins(s) for s in assembled.sections],
                },
            ),
        )
        return assembled.text, out.node.id, list(assembled.notes)
