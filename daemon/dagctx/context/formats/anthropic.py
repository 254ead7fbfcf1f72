"""``anthropic``: Anthropic Messages.

The system text is returned separately, never in ``messages``. Content is always a block
list: ``text``, ``image{source}``, ``tool_use{id, name, input}``, ``tool_result{tool_use_id,
content, is_error?}`` (results open the next user message, before any text). Consecutive
same-role messages are merged, empty text blocks are dropped, and when the first message
would be an assistant message a placeholder user message ``[conversation start]``
(``PLACEHOLDER_USER``) is inserted (recorded in ``repairs``; this happens only when a
branch starts with a function call or a model reply, e.g. imported transcripts).

Images stay references: ``source`` as stored, or ``{"type": "url"}`` / ``{"type": "path"}``
built from a url / path reference.

Reasoning: signed ``thinking`` / ``redacted_thinking`` blocks go back unchanged, first in
their message (``sends_signed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.content import block_text
from dagctx.context.view import View

from ._assembly import REASONING_TYPES, Msg, RenderFormat, inline_data, json_object, media_type

PLACEHOLDER_USER = "[conversation start]"


def _input_object(value: Any) -> dict[str, Any]:
    """Anthropic ``tool_use.input`` must be an object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and (parsed := json_object(value)) is not None:
        return parsed
    return {"input": value}


def _image(block: dict[str, Any]) -> dict[str, Any]:
    src = block.get("source")
    if isinstance(src, dict):
        return {"type": "image", "source": dict(src)}
    if block.get("url"):
        return {"type": "image", "source": {"type": "url", "url": block["url"]}}
    mt = media_type(block)
    if block.get("path"):
        source: dict[str, Any] = {"type": "path", "path": block["path"]}
        if mt:
            source["media_type"] = mt
        return {"type": "image", "source": source}
    data = inline_data(block)
    if data is not None:
        return {"type": "image", "source": {"type": "base64", "media_type": mt or "application/octet-stream", "data": data}}
    return {"type": "text", "text": block_text(block)}


def _blocks(m: Msg) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in m.blocks:
        kind = b.get("type")
        if kind == "text":
            if b.get("text"):
                out.append({"type": "text", "text": b["text"]})
        elif kind in REASONING_TYPES:
            # sent unchanged: only what Anthropic signed can go back (SPEC §6)
            if kind == "thinking" and b.get("signature"):
                out.append({"type": "thinking", "thinking": b.get("text") or "", "signature": b["signature"]})
            elif kind == "redacted_thinking" and b.get("data"):
                out.append({"type": "redacted_thinking", "data": b["data"]})
        elif kind == "image":
            out.append(_image(b))
        elif kind == "tool_call":
            out.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": _input_object(b["input"])})
        elif kind == "tool_result":
            content = b["content"]
            if not isinstance(content, str):
                content = [
                    _image(x) if x.get("type") == "image" else {"type": "text", "text": block_text(x)}
                    for x in content
                    if not (x.get("type") == "text" and not x.get("text"))
                ]
            res: dict[str, Any] = {"type": "tool_result", "tool_use_id": b["toolCallId"], "content": content}
            if b.get("isError"):
                res["is_error"] = True
            out.append(res)
        else:
            out.append({"type": "text", "text": block_text(b)})
    return out


def _build(msgs: list[Msg], repairs: list[str]) -> tuple[list[dict[str, Any]], list[list[str]]]:
    out: list[dict[str, Any]] = []
    ids: list[list[str]] = []
    for m in msgs:
        stop_if_cancelled()
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            prev = out[-1]["content"]
            if role == "user" and any(b["type"] == "tool_result" for b in blocks):
                # results must open a user message: put them before what is there
                results = [b for b in blocks if b["type"] == "tool_result"]
                rest = [b for b in blocks if b["type"] != "tool_result"]
                lead = [b for b in prev if b["type"] == "tool_result"]
                tail = [b for b in prev if b["type"] != "tool_result"]
                out[-1]["content"] = lead + results + tail + rest
            else:
                prev.extend(blocks)
            for nid in m.node_ids:
                if nid not in ids[-1]:
                    ids[-1].append(nid)
            continue
        out.append({"role": role, "content": blocks})
        ids.append(list(m.node_ids))
    if out and out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": PLACEHOLDER_USER}]})
        ids.insert(0, [])
        repairs.append("inserted a placeholder user message: the branch starts with an assistant message")
    return out, ids


def _check(messages: Sequence[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    prev_role = None
    pending: list[str] = []  # tool_use ids of the previous assistant message
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: role {role!r} is not user/assistant")
        if i == 0 and role != "user":
            problems.append("message 0: the first message must be a user message")
        if role == prev_role:
            problems.append(f"message {i}: two {role} messages in a row")
        content = m.get("content")
        blocks: list[dict[str, Any]]
        if isinstance(content, str):
            if not content:
                problems.append(f"message {i}: empty content")
            blocks = []
        elif isinstance(content, list):
            if not content:
                problems.append(f"message {i}: empty content")
            blocks = content
        else:
            problems.append(f"message {i}: content is neither a string nor a list")
            blocks = []
        results: list[str] = []
        uses: list[str] = []
        other_seen = False
        for b in blocks:
            kind = b.get("type")
            if kind == "text" and not b.get("text"):
                problems.append(f"message {i}: empty text block")
            if kind == "tool_use":
                if role != "assistant":
                    problems.append(f"message {i}: tool_use in a {role} message")
                tid = b.get("id")
                if tid in seen:
                    problems.append(f"message {i}: duplicate tool_use id {tid!r}")
                seen.add(tid)
                uses.append(tid)
                if not isinstance(b.get("input"), dict):
                    problems.append(f"message {i}: tool_use {tid!r} input is not an object")
            elif kind == "tool_result":
                if role != "user":
                    problems.append(f"message {i}: tool_result in a {role} message")
                if other_seen:
                    problems.append(f"message {i}: tool_result after other content")
                tid = b.get("tool_use_id")
                if tid not in pending:
                    problems.append(f"message {i}: tool_result {tid!r} answers no tool_use of the previous message")
                elif tid in results:
                    problems.append(f"message {i}: second tool_result for {tid!r}")
                results.append(tid)
            else:
                other_seen = True
        for tid in pending:
            if tid not in results:
                problems.append(f"message {i}: tool_use {tid!r} of message {i - 1} has no tool_result")
        pending = uses
        prev_role = role
    for tid in pending:
        problems.append(f"message {len(messages) - 1}: tool_use {tid!r} has no tool_result")
    return problems


class AnthropicFormat(RenderFormat):
    name = "anthropic"

    def build(self, view: View, msgs: list[Msg], repairs: list[str], *,
              include_system: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
        return _build(msgs, repairs)

    def check_pairs(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        return _check(messages)

    def sends_signed(self, block: dict[str, Any]) -> bool:
        # signed ``thinking`` and ``redacted_thinking`` go back unchanged; unsigned thinking
        # and another provider's encrypted reasoning are never sent
        key = {"thinking": "signature", "redacted_thinking": "data"}.get(str(block.get("type")))
        return key is not None and bool(block.get(key))

    def can_stitch(self, prefix: Sequence[dict[str, Any]], first_role: str) -> bool:
        # Same-role neighbours merge and a branch may open with a placeholder: only a
        # clean assistant → user boundary can be stitched.
        return prefix[-1].get("role") == "assistant" and first_role == "user"

    def user_text_at(self, message: dict[str, Any]) -> int | None:
        # Tool results are user messages here and must open theirs: the user's own text
        # starts after them, and a message of results only holds none.
        if message.get("role") != "user" or isinstance(message.get("content"), str):
            return super().user_text_at(message)
        content = message.get("content")
        if not isinstance(content, list):
            return super().user_text_at(message)
        at = 0
        while at < len(content) and isinstance(content[at], dict) and content[at].get("type") == "tool_result":
            at += 1
        return at if at < len(content) else None


FORMAT = AnthropicFormat()
