"""Hermes's OpenAI-format message list → dagctx nodes, incrementally.

Hermes hands its engine the whole message list (``compress``, preflight, tool calls),
never one message at a time. ``Ledger`` remembers a fingerprint of every message it
has recorded, in Hermes's order, and the chain tip after each one; a new list is
matched against that record and only what follows the common prefix is appended.
Hermes rewrites the head of its list on the way (it merges the consecutive user messages
of a compressed list, for one), so a list whose start differs is first re-aligned: when
the record's whole tail reappears in it, what precedes is taken as Hermes's rewrite of
what was recorded, and only what follows the tail is new. When the list really diverges
(``/retry``, ``/undo``, an edited turn) the new messages follow the tip of the common
prefix with ``moveHead`` — a fork, as SPEC §4 "Retry = fork" says.

Mapping (SPEC §4): ``user`` → a user node; ``assistant`` → an llm node, each of its
``tool_calls`` → a ``code`` node (caller = the llm node, ``metadata.toolCallId``) appended
``running``; ``tool`` → ``node/update`` of that code node to ``completed``. ``system`` is
not recorded (nor matched): Hermes owns its system prompt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


def fingerprint(msg: dict[str, Any]) -> str:
    """What identifies a message: role, text, tool calls, tool call id — not the extra keys
    Hermes adds or drops along the way (``reasoning``, ``finish_reason``, timestamps)."""
    calls = [(c.get("id"), (c.get("function") or {}).get("name"), tool_arguments((c.get("function") or {}).get("arguments")))
             for c in msg.get("tool_calls") or []]
    key = [msg.get("role"), content_text(msg.get("content")).strip(), calls, msg.get("tool_call_id")]
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text":
                parts.append(str(p.get("text", "")))
            elif isinstance(p, str):
                parts.append(p)
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def tool_arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


@dataclass
class Ledger:
    """What one Hermes session has recorded in one dagctx session."""

    session_id: str
    root: str
    prints: list[str] = field(default_factory=list)
    tips: list[str] = field(default_factory=list)  # chain tip after prints[i]
    open_calls: dict[str, str] = field(default_factory=dict)  # toolCallId → running code node
    last_llm: str | None = None
    pending_usage: dict[str, int] | None = None

    def tip(self, upto: int) -> str:
        return self.tips[upto - 1] if upto > 0 else self.root

    def matched(self, prints: list[str]) -> int:
        n = 0
        for a, b in zip(self.prints, prints):
            if a != b:
                break
            n += 1
        return n

    def realign(self, prints: list[str]) -> bool:
        """Map a list whose start Hermes rewrote onto the record: True when the record's tail
        ``prints[b:]`` (longest first) occurs in ``prints`` at some ``a``; the record then
        becomes ``prints[:a + len(tail)]``, the rewritten part at the tip before the tail."""
        rec = self.prints
        for b in range(len(rec)):
            tail = rec[b:]
            for a in range(len(prints) - len(tail) + 1):
                if prints[a:a + len(tail)] == tail:
                    before = self.tip(b)
                    self.prints = prints[:a] + tail
                    self.tips = [before] * a + self.tips[b:]
                    return True
        return False

    def adopt(self, messages: list[dict[str, Any]], head: str) -> None:
        """Hermes continues from ``messages``, all recorded, ending at ``head`` (after ``compress``,
        or on resume: the branch as dagctx renders it)."""
        self.prints = [fingerprint(m) for m in chat_messages(messages)]
        self.tips = [head] * len(self.prints)


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") != "system"]


async def sync(client: Any, led: Ledger, messages: list[dict[str, Any]], model: str) -> int:
    """Append what ``messages`` has beyond ``led``'s record; returns how many were new."""
    messages = chat_messages(messages)
    prints = [fingerprint(m) for m in messages]
    keep = led.matched(prints)
    if keep < len(led.prints) and led.realign(prints):
        keep = len(led.prints)
    if keep == len(prints) and keep == len(led.prints):
        return 0
    fork = keep < len(led.prints)  # the list diverged from (or is shorter than) the record
    tip = led.tip(keep)
    del led.prints[keep:], led.tips[keep:]
    added = 0
    for msg, fp in zip(messages[keep:], prints[keep:]):
        role = msg.get("role")
        if role == "user":
            r = await client.append(led.session_id, "user", output=content_text(msg.get("content")),
                                    predecessor=tip, move_head=True if fork else None)
            tip, fork = r.node.id, False
        elif role == "assistant":
            r = await client.append(led.session_id, "llm", name=model or "assistant",
                                    output=content_text(msg.get("content")), predecessor=tip,
                                    move_head=True if fork else None)
            tip, fork, led.last_llm = r.node.id, False, r.node.id
            for call in msg.get("tool_calls") or []:
                fn = call.get("function") or {}
                code = await client.append(led.session_id, "code", name=str(fn.get("name", "")),
                                           input=tool_arguments(fn.get("arguments")), status="running",
                                           caller=r.node.id, metadata={"toolCallId": call.get("id")})
                if call.get("id"):
                    led.open_calls[call["id"]] = code.node.id
            if led.pending_usage:
                await client.usage_report(led.session_id, r.node.id, model=model or None, **led.pending_usage)
                led.pending_usage = None
        elif role == "tool":
            node_id = led.open_calls.pop(str(msg.get("tool_call_id")), None)
            if node_id is not None:
                await client.update(led.session_id, node_id, "completed", output=content_text(msg.get("content")))
        led.prints.append(fp)
        led.tips.append(tip)
        added += 1
    return added
