"""The system prompt as a node: assembled per request, written only with a request that
is handed out (SPEC §7).

The system-prompt part of ``ContextService`` (``engine/views.py``); the assembler itself
is ``context/system_prompt.py`` (pure).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context.system_prompt import PromptOptions, assemble_system_prompt
from dagctx.ledger import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME, Call, NodeInput

if TYPE_CHECKING:
    from .core import EngineCore

#: pending system-prompt nodes kept for requests not yet handed out
PENDING_PROMPTS = 64


@dataclass
class SystemPrompt:
    """The prompt a request is built with (``SystemPromptNode.ensure_system_prompt``)."""

    text: str
    #: the node the render names: stored, or ``pending`` (written when handed out)
    node_id: str | None
    notes: list[str]
    #: the assembler's sections (layers), for ``BudgetExceeded``
    sections: list[Any]
    pending: NodeInput | None = None


class SystemPromptNode:
    """``ensure_system_prompt`` and ``commit_system_prompt``: the one writer of
    ``context/system_prompt`` nodes."""

    e: EngineCore
    #: render id → the pending prompt node of a built request not yet handed out
    _pending_system: OrderedDict[str, NodeInput]

    def ensure_system_prompt(self, session_id: str, graph: SessionGraph, options: PromptOptions,
                             workspace: str | None, *, assembler: Any = None) -> SystemPrompt:
        """Assemble the prompt and decide its node: the newest ``context/system_prompt``
        node when its hash is the same, else a *pending* node, written only when a request
        that uses it is handed out (``commit_system_prompt``; SPEC §7: a refused request
        writes nothing). The pending id is a function of the session, the hash and the
        node it follows, so every build of one request — and a retry — names the same id."""
        assembled = (assembler or assemble_system_prompt)(workspace, options)
        if not assembled.text:
            return SystemPrompt("", None, list(assembled.notes), list(assembled.sections))
        newest: Call | None = None
        for nid in reversed(graph.system_prompts):
            newest = graph.nodes[nid]
            break
        if newest is not None and newest.metadata.get("hash") == assembled.hash:
            return SystemPrompt(assembled.text, newest.id, list(assembled.notes), list(assembled.sections))
        after = newest.id if newest is not None else ""
        node_id = "sp-" + hashlib.sha256(f"{session_id}\x00{assembled.hash}\x00{after}".encode()).hexdigest()[:32]
        if node_id in graph.nodes:  # written meanwhile (another connection handed it out)
            return SystemPrompt(assembled.text, node_id, list(assembled.notes), list(assembled.sections))
        pending = NodeInput(
            role="code",
            id=node_id,
            name=SYSTEM_PROMPT_NAME,
            caller=graph.root_id,
            output=assembled.text,
            metadata={
                "hash": assembled.hash,
                "files": list(assembled.files),
                "sections": [msgspec.to_builtins(s) for s in assembled.sections],
            },
        )
        return SystemPrompt(assembled.text, node_id, list(assembled.notes), list(assembled.sections), pending)

    def hold_system_prompt(self, render_id: str, pending: NodeInput) -> None:
        """Keep a pending prompt node until the request rendered with it is handed out."""
        self._pending_system[render_id] = pending
        while len(self._pending_system) > PENDING_PROMPTS:
            self._pending_system.popitem(last=False)

    def commit_system_prompt(self, session_id: str, render_id: str) -> None:
        """The request ``render_id`` is handed out: write the prompt node it was rendered
        with, if that node is new (SPEC §7). A node another request wrote meanwhile (the
        id is deterministic) is not written twice."""
        pending = self._pending_system.pop(render_id, None)
        if pending is None:
            return
        graph = self.e.store.graph(session_id)
        if pending.id in graph.nodes:
            return
        try:
            self.e.write_node(session_id, pending)
        except DagctxError as err:
            if err.kind != "DuplicateNode":
                raise
