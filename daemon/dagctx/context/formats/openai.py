"""``openai``: OpenAI Chat Completions messages.

``{"role": "system"}`` first when ``include_system`` and there is a system text; user
``content`` is a string, or a parts list (``text`` / ``image_url``) when images are
present; assistant ``content`` is a string or ``None`` with ``tool_calls: [{id, type:
"function", function: {name, arguments}}]``, where ``arguments`` is the stored input as
compact JSON in stored key order (a stored string that already is a JSON object is passed
through); one ``{"role": "tool", "tool_call_id", "content": str}`` per result.
Consecutive same-role messages are allowed by the API and kept apart (their node ids
stay separable).

Images stay references: ``image_url.url`` is the stored url, a ``data:`` URL for an
inline base64 source, or the stored path as is (the sending layer resolves paths).

Reasoning: Chat Completions takes none back (mode ``provider`` sends none); mode ``all``
sends it as a ``reasoning_content`` string, never signed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.content import block_text, json_text
from dagctx.context.view import View

from ._assembly import (
    REASONING_TYPES,
    CallAnswers,
    Msg,
    RenderFormat,
    inline_data,
    json_object,
    media_type,
    plain,
    reasoning_text,
)


def _arguments(value: Any) -> str:
    """OpenAI ``arguments``: compact JSON of the stored input (stored key order)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value if json_object(value) is not None else json_text({"input": value})
    if isinstance(value, dict):
        return json_text(value)
    return json_text({"input": value})


def _image_url(block: dict[str, Any]) -> str | None:
    """A url for OpenAI's ``image_url``; None when the image has no usable reference
    (e.g. an imported image whose bytes were omitted)."""
    src = block.get("source")
    if isinstance(src, dict):
        if src.get("type") == "base64" and isinstance(src.get("data"), str):
            return f"data:{src.get('media_type', 'application/octet-stream')};base64,{src['data']}"
        for key in ("url", "path", "file_id"):
            if src.get(key):
                return str(src[key])
    for key in ("url", "path"):
        if block.get(key):
            return str(block[key])
    data = inline_data(block)
    if data is not None:
        return f"data:{media_type(block) or 'application/octet-stream'};base64,{data}"
    return None


def _build(view: View, msgs: list[Msg], include_system: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
    out: list[dict[str, Any]] = []
    ids: list[list[str]] = []
    if include_system and view.system:
        out.append({"role": "system", "content": view.system})
        ids.append([view.system_node] if view.system_node else [])
    for m in msgs:
        stop_if_cancelled()
        if m.role == "tool":
            for b, nid in zip(m.blocks, m.node_ids, strict=True):
                content = b["content"] if isinstance(b["content"], str) else plain(b["content"])
                out.append({"role": "tool", "tool_call_id": b["toolCallId"], "content": content})
                ids.append([nid])
            continue
        if m.role == "assistant":
            texts = [b for b in m.blocks if b["type"] != "tool_call" and b["type"] not in REASONING_TYPES]
            calls = [b for b in m.blocks if b["type"] == "tool_call"]
            text = plain(texts)
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            thought = "\n\n".join(t for b in m.blocks if b["type"] in REASONING_TYPES and (t := reasoning_text(b)))
            if thought:
                # reasoning: "all" — the field OpenAI-compatible servers read back
                msg["reasoning_content"] = thought
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": _arguments(c["input"])},
                    }
                    for c in calls
                ]
            elif not text and not thought:
                continue
            out.append(msg)
            ids.append(list(m.node_ids))
            continue
        has_image = any(b.get("type") == "image" and _image_url(b) is not None for b in m.blocks)
        if has_image:
            parts: list[dict[str, Any]] = []
            for b in m.blocks:
                url = _image_url(b) if b.get("type") == "image" else None
                if url is not None:
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                elif b.get("type") == "text":
                    if b.get("text"):
                        parts.append({"type": "text", "text": b["text"]})
                else:
                    parts.append({"type": "text", "text": block_text(b)})
            out.append({"role": "user", "content": parts})
        else:
            text = plain(m.blocks)
            if not text:
                continue
            out.append({"role": "user", "content": text})
        ids.append(list(m.node_ids))
    return out, ids


def _check(messages: Sequence[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            problems.append(f"message {i}: unknown role {role!r}")
        if role == "system" and i != 0:
            problems.append(f"message {i}: system message not first")
        if role == "tool":
            problems.append(f"message {i}: tool result {m.get('tool_call_id')!r} does not follow an assistant tool call")
            i += 1
            continue
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if m.get("content") in (None, "") and not calls:
                problems.append(f"message {i}: empty assistant message")
            ids: list[str] = []
            for c in calls:
                cid = c.get("id")
                if not cid:
                    problems.append(f"message {i}: tool call without id")
                    continue
                if cid in seen:
                    problems.append(f"message {i}: duplicate tool call id {cid!r}")
                seen.add(cid)
                ids.append(cid)
                fn = c.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments", ""))
                except (TypeError, ValueError):
                    args = None
                if not isinstance(args, dict):
                    problems.append(f"message {i}: tool call {cid!r} arguments are not a JSON object")
                if not fn.get("name"):
                    problems.append(f"message {i}: tool call {cid!r} has no function name")
            j = i + 1
            answers = CallAnswers(i, ids, problems)
            while j < len(messages) and messages[j].get("role") == "tool":
                answers.answer(j, messages[j].get("tool_call_id"))
                if not isinstance(messages[j].get("content"), str | list):
                    problems.append(f"message {j}: tool result content is not a string")
                j += 1
            answers.close()
            i = j
            continue
        if role == "user" and m.get("content") in (None, "", []):
            problems.append(f"message {i}: empty user message")
        i += 1
    return problems


class OpenAIFormat(RenderFormat):
    name = "openai"
    takes_reasoning_back = False  # Chat Completions takes no reasoning back (SPEC §6)
    # ``sends_signed`` stays False: reasoning goes out as ``reasoning_content`` text only

    def build(self, view: View, msgs: list[Msg], repairs: list[str], *,
              include_system: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
        return _build(view, msgs, include_system)

    def check_pairs(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        return _check(messages)

    def leads_with_system(self, messages: Sequence[dict[str, Any]]) -> bool:
        return bool(messages) and isinstance(messages[0], dict) and messages[0].get("role") == "system"


FORMAT = OpenAIFormat()
