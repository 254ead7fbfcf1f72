"""``neutral``: dagctx's own blocks, each message naming its ``nodeIds``.

``{"role": "user"|"assistant"|"tool", "content": [blocks], "nodeIds": [...]}``; blocks
``text``, ``image{url|path|source…}``, ``file{…}``, ``tool_call{id, name, input}``,
``tool_result{toolCallId, content, isError}``. All results of one call group share one
``tool`` message. System is returned separately (as with Anthropic).

Reasoning: the stored blocks as they are, signed or encrypted ones included
(``sends_signed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.view import View

from ._assembly import CallAnswers, Msg, RenderFormat


def _build(msgs: list[Msg]) -> tuple[list[dict[str, Any]], list[list[str]]]:
    out: list[dict[str, Any]] = []
    ids: list[list[str]] = []
    for m in msgs:
        stop_if_cancelled()
        blocks = [dict(b) for b in m.blocks if not (b.get("type") == "text" and not b.get("text"))]
        if not blocks:
            continue
        out.append({"role": m.role, "content": blocks, "nodeIds": list(m.node_ids)})
        ids.append(list(m.node_ids))
    return out, ids


def _check(messages: Sequence[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role")
        blocks = m.get("content") or []
        if not blocks:
            problems.append(f"message {i}: empty content")
        if role == "tool":
            problems.append(f"message {i}: tool message does not follow an assistant tool call")
            i += 1
            continue
        calls = [b.get("id") for b in blocks if b.get("type") == "tool_call"]
        if any(b.get("type") == "tool_result" for b in blocks):
            problems.append(f"message {i}: tool_result outside a tool message")
        if calls and role != "assistant":
            problems.append(f"message {i}: tool_call in a {role} message")
        for cid in calls:
            if cid in seen:
                problems.append(f"message {i}: duplicate tool call id {cid!r}")
            seen.add(cid)
        if not calls:
            i += 1
            continue
        j = i + 1
        answers = CallAnswers(i, calls, problems)
        while j < len(messages) and messages[j].get("role") == "tool":
            for b in messages[j].get("content") or []:
                if b.get("type") != "tool_result":
                    problems.append(f"message {j}: {b.get('type')!r} block in a tool message")
                    answers.answered.append(b.get("toolCallId"))
                else:
                    answers.answer(j, b.get("toolCallId"))
            j += 1
        answers.close()
        i = j
    return problems


class NeutralFormat(RenderFormat):
    name = "neutral"

    def build(self, view: View, msgs: list[Msg], repairs: list[str], *,
              include_system: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
        return _build(msgs)

    def check_pairs(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        return _check(messages)

    def sends_signed(self, block: dict[str, Any]) -> bool:
        # every block goes out as stored: signed thinking, redacted thinking, a Codex
        # ``encrypted_content`` too
        kind = block.get("type")
        if kind in ("thinking", "redacted_thinking"):
            return kind == "redacted_thinking" or bool(block.get("signature"))
        return bool(block.get("encrypted_content") or block.get("encryptedContent"))


FORMAT = NeutralFormat()
