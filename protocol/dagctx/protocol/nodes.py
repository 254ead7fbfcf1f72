"""The one node type of the ledger, shared by the wire and the store.

A session is an append-only DAG of ``Call`` nodes (SPEC §4). The same Struct
is sent to clients and stored (msgpack-encoded) in the ledger, so there is exactly one
definition of what a node is.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Role = Literal["user", "llm", "code"]
Status = Literal["running", "completed", "error", "cancelled"]

TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "error", "cancelled"})

#: The predecessor sentinel a client may use for "the session's root" (SPEC §4).
ROOT_SENTINEL = "ROOT"

#: Reserved names (SPEC §4).
SUMMARY_NAME = "context/summary"
SYSTEM_PROMPT_NAME = "context/system_prompt"

#: The first line of a summary's text as rendered (SPEC §6): how a reader of rendered
#: messages tells a summary from a user's own message.
SUMMARY_MARKER = "[Previous conversation summary]"


#: The llm node's metadata key holding its reasoning blocks (SPEC §4, §6).
REASONING_KEY = "reasoning"


class ReasoningBlock(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """One reasoning block of an llm call, kept as the provider returned it, in order, in
    the llm node's ``metadata.reasoning`` (a list of these; SPEC §4).

    * Anthropic ``thinking``: ``text`` (the thinking) and ``signature``;
      ``redacted_thinking``: ``data``. Sent back unchanged (SPEC §6).
    * OpenAI Responses / Codex ``reasoning`` items: ``id``, ``summary`` (the summary
      texts), ``text`` (reasoning content, if any) and ``encryptedContent``.
    * Plain reasoning text (OpenHands ``reasoning_content``, DeepSeek-style models):
      ``type: "reasoning"`` with ``text`` only.
    """

    type: Literal["thinking", "redacted_thinking", "reasoning"]
    text: str | None = None
    signature: str | None = None
    data: str | None = None
    id: str | None = None
    summary: list[str] | None = None
    encrypted_content: str | None = None


class Call(msgspec.Struct, rename="camel", kw_only=True):
    """One node: a user message, an LLM call, or a function/tool call.

    ``caller`` (who invoked me: nesting) and ``predecessor`` (what I follow in the
    chat: branches) are two separate edges and are never merged. ``seq`` is a
    per-session monotonically increasing integer and the only ordering key;
    ``createdAt`` (Unix seconds) is for people, never for ordering.
    """

    id: str
    seq: int
    created_at: float
    role: Role
    name: str = ""
    input: Any = None
    output: Any = None
    status: Status = "completed"
    caller: str | None = None
    predecessor: str | None = None
    reads: list[str] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class NodeInput(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=False):
    """What a client sends to ``node/append``: a ``Call`` without ``seq``/``createdAt``.

    ``id`` is optional (the ledger makes one); ``predecessor`` may be the literal
    ``"ROOT"`` for the session's root.
    """

    role: Role
    id: str | None = None
    name: str = ""
    input: Any = None
    output: Any = None
    status: Status = "completed"
    caller: str | None = None
    predecessor: str | None = None
    reads: list[str] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
