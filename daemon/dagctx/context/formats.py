"""Neutral ``View`` → provider messages (OpenAI Chat Completions, Anthropic Messages,
neutral), always pair-valid.

``to_messages(view, format)`` returns ``(system, messages, node_ids)`` -- a tuple
subclass (``Rendered``) that also carries ``.repairs``: every change made to keep the
list valid, for the render manifest.

Pair validity (SPEC §6; OpenClaw #3243/#4839/#7865 crashed on each of these):

- a tool result whose call is not in the open call group right before it is an
  *orphan* and is dropped (``repairs``: ``dropped orphan tool result …``);
- a call without a result gets the synthetic result ``[no result recorded]``
  (render already does this for unfinished calls; this catches any other view);
- results are emitted in call order, right after their assistant message;
- a tool call id already used earlier in the conversation is renamed
  ``<id>_2`` (``_3``, …) together with its result.

Formats:

``openai``
    ``{"role": "system"}`` first when ``include_system`` and there is a system text;
    user ``content`` is a string, or a parts list (``text`` / ``image_url``) when
    images are present; assistant ``content`` is a string or ``None`` with
    ``tool_calls: [{id, type: "function", function: {name, arguments}}]``, where
    ``arguments`` is the stored input as compact JSON in stored key order (a stored
    string that already is a JSON object is passed through); one ``{"role": "tool",
    "tool_call_id", "content": str}`` per result. Consecutive same-role messages are
    allowed by the API and kept apart (their node ids stay separable).
``anthropic``
    The system text is returned separately, never in ``messages``. Content is always
    a block list: ``text``, ``image{source}``, ``tool_use{id, name, input}``,
    ``tool_result{tool_use_id, content, is_error?}`` (results open the next user
    message, before any text). Consecutive same-role messages are merged, empty text
    blocks are dropped, and when the first message would be an assistant message a
    placeholder user message ``[conversation start]`` is inserted (recorded in
    ``repairs``; this happens only when a branch starts with a function call or a
    model reply, e.g. imported transcripts).
``neutral``
    ``{"role": "user"|"assistant"|"tool", "content": [blocks], "nodeIds": [...]}``;
    blocks ``text``, ``image{url|path|source…}``, ``file{…}``,
    ``tool_call{id, name, input}``, ``tool_result{toolCallId, content, isError}``.
    All results of one call group share one ``tool`` message. System is returned
    separately (as with Anthropic).

Reasoning (``Item.reasoning``, SPEC §6): ``to_messages(..., reasoning=)`` picks the llm
nodes whose blocks are sent (``reasoning_owners``); they open their assistant message.
Anthropic gets signed ``thinking`` / ``redacted_thinking`` blocks unchanged, OpenAI a
``reasoning_content`` string (mode ``all`` only), neutral the stored blocks.

Images stay references: OpenAI gets ``image_url.url`` = the stored url, a
``data:`` URL for an inline base64 source, or the stored path as is (the sending
layer resolves paths); Anthropic gets ``source`` as stored, or ``{"type": "url"}`` /
``{"type": "path"}`` built from a url / path reference.

Deterministic: the same view gives equal lists (and the same bytes once encoded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagctx.protocol.context_messages import Format

from .render import NO_RESULT, Item, View, block_text, json_text

PLACEHOLDER_USER = "[conversation start]"


class Rendered(tuple):
    """``(system, messages, node_ids)`` plus ``.repairs``; unpacks as a 3-tuple."""

    repairs: list[str]

    def __new__(cls, system: str | None, messages: list[dict[str, Any]], node_ids: list[list[str]], repairs: list[str]):
        self = super().__new__(cls, (system, messages, node_ids))
        self.repairs = repairs
        return self

    @property
    def system(self) -> str | None:
        return self[0]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self[1]

    @property
    def node_ids(self) -> list[list[str]]:
        return self[2]


# ---------------------------------------------------------------- neutral assembly


@dataclass(slots=True)
class _Msg:
    role: str  # user | assistant | tool
    blocks: list[dict[str, Any]] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)

    def add_id(self, node_id: str | None) -> None:
        if node_id and node_id not in self.node_ids:
            self.node_ids.append(node_id)


@dataclass(slots=True)
class _Group:
    msg: _Msg
    owner: str | None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (node id, effective call id)
    results: dict[str, Item] = field(default_factory=dict)  # node id → result item
    results_started: bool = False


def _is_error(item: Item) -> bool:
    return item.status in ("error", "cancelled")


def _result_block(call_id: str, item: Item | None) -> dict[str, Any]:
    if item is None:
        return {"type": "tool_result", "toolCallId": call_id, "content": NO_RESULT, "isError": False}
    blocks = [b for b in item.content if not (b.get("type") == "text" and not b.get("text"))]
    if all(b.get("type") == "text" for b in blocks):
        content: Any = "\n\n".join(b["text"] for b in blocks)
    else:
        content = [dict(b) for b in blocks]
    return {"type": "tool_result", "toolCallId": call_id, "content": content, "isError": _is_error(item)}


#: neutral block types of reasoning (``metadata.reasoning``, SPEC §6)
REASONING_TYPES = frozenset({"thinking", "redacted_thinking", "reasoning"})


def reasoning_owners(view: View, format: str, mode: str) -> frozenset[str]:
    """The llm nodes whose reasoning blocks a render sends (SPEC §6).

    ``none``: none. ``all``: every top-level llm node that has some. ``provider``: none for
    OpenAI Chat Completions (it takes no reasoning back); for Anthropic and neutral the
    assistant turns of the current tool loop — the top-level llm nodes after the branch's
    newest user message (a new user message ends the loop: its thinking is no longer
    required, Anthropic's documented rule for extended thinking with tools).
    """
    if mode == "none" or (mode == "provider" and format == "openai"):
        return frozenset()
    items = view.items
    start = 0
    if mode == "provider":
        for k in range(len(items) - 1, -1, -1):
            if items[k].kind == "user" and items[k].depth == 0:
                start = k + 1
                break
    return frozenset(it.node_id for it in items[start:]
                     if it.kind == "assistant" and it.depth == 0 and it.reasoning)


def _assemble(view: View, owners: frozenset[str] = frozenset()) -> tuple[list[_Msg], list[str]]:
    msgs: list[_Msg] = []
    repairs: list[str] = list(view.repairs)
    used_ids: set[str] = set()
    group: _Group | None = None

    def close() -> None:
        nonlocal group
        if group is None:
            return
        if group.calls:
            tool = _Msg("tool")
            for node_id, call_id in group.calls:
                item = group.results.get(node_id)
                if item is None:
                    repairs.append(f"synthetic result for tool call {call_id} (node {node_id}): no result in the view")
                tool.blocks.append(_result_block(call_id, item))
                tool.add_id(node_id)
            msgs.append(tool)
        group = None

    def unique(call_id: str | None, node_id: str) -> str:
        base = call_id or f"call_{node_id}"
        cid = base
        n = 2
        while cid in used_ids:
            cid = f"{base}_{n}"
            n += 1
        if cid != base:
            repairs.append(f"duplicate tool call id {base} (node {node_id}) renamed to {cid}")
        elif not call_id:
            repairs.append(f"tool call node {node_id} had no call id; using {cid}")
        used_ids.add(cid)
        return cid

    for it in view.items:
        if it.kind == "tool_call":
            if group is None or group.results_started or group.owner != it.owner:
                close()
                msg = _Msg("assistant")
                msg.add_id(it.owner)
                msgs.append(msg)
                group = _Group(msg, it.owner)
            cid = unique(it.tool_call_id, it.node_id)
            group.calls.append((it.node_id, cid))
            group.msg.blocks.append({"type": "tool_call", "id": cid, "name": it.name, "input": it.input})
            group.msg.add_id(it.node_id)
            continue
        if it.kind == "tool_result":
            match = None
            if group is not None:
                for node_id, cid in group.calls:
                    if node_id == it.node_id and node_id not in group.results:
                        match = node_id
                        break
                if match is None and it.tool_call_id:
                    # a foreign view: match by the provider id
                    for node_id, cid in group.calls:
                        if node_id not in group.results and cid == it.tool_call_id:
                            match = node_id
                            break
            if group is None or match is None:
                repairs.append(f"dropped orphan tool result {it.tool_call_id} (node {it.node_id}): its call is not right before it")
                continue
            group.results[match] = it
            group.results_started = True
            continue
        close()
        role = "assistant" if it.role == "assistant" else "user"
        lead = [dict(b) for b in it.reasoning] if it.node_id in owners and it.kind == "assistant" else []
        msg = _Msg(role, lead + [dict(b) for b in it.content], [])
        msg.add_id(it.node_id)
        msgs.append(msg)
        if it.kind == "assistant":
            group = _Group(msg, it.node_id)
    close()
    return msgs, repairs


# ---------------------------------------------------------------- arguments / images


def _arguments(value: Any) -> str:
    """OpenAI ``arguments``: compact JSON of the stored input (stored key order)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value if _json_object(value) is not None else json_text({"input": value})
    if isinstance(value, dict):
        return json_text(value)
    return json_text({"input": value})


def _input_object(value: Any) -> dict[str, Any]:
    """Anthropic ``tool_use.input`` must be an object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and (parsed := _json_object(value)) is not None:
        return parsed
    return {"input": value}


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object, or None (stored arguments may be a JSON string)."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _media_type(block: dict[str, Any]) -> str | None:
    mt = block.get("media_type") or block.get("mediaType") or block.get("mimeType")
    return str(mt) if mt else None


def _inline_data(block: dict[str, Any]) -> str | None:
    data = block.get("data")
    return data if isinstance(data, str) and data and data != "<omitted>" else None


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
    data = _inline_data(block)
    if data is not None:
        return f"data:{_media_type(block) or 'application/octet-stream'};base64,{data}"
    return None


def _anthropic_image(block: dict[str, Any]) -> dict[str, Any]:
    src = block.get("source")
    if isinstance(src, dict):
        return {"type": "image", "source": dict(src)}
    if block.get("url"):
        return {"type": "image", "source": {"type": "url", "url": block["url"]}}
    mt = _media_type(block)
    if block.get("path"):
        source: dict[str, Any] = {"type": "path", "path": block["path"]}
        if mt:
            source["media_type"] = mt
        return {"type": "image", "source": source}
    data = _inline_data(block)
    if data is not None:
        return {"type": "image", "source": {"type": "base64", "media_type": mt or "application/octet-stream", "data": data}}
    return {"type": "text", "text": block_text(block)}


def _plain(blocks: Sequence[dict[str, Any]]) -> str:
    return "\n\n".join(block_text(b) for b in blocks if not (b.get("type") == "text" and not b.get("text")))


# ---------------------------------------------------------------- per format


def _openai(view: View, msgs: list[_Msg], include_system: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
    out: list[dict[str, Any]] = []
    ids: list[list[str]] = []
    if include_system and view.system:
        out.append({"role": "system", "content": view.system})
        ids.append([view.system_node] if view.system_node else [])
    for m in msgs:
        if m.role == "tool":
            for b, nid in zip(m.blocks, m.node_ids, strict=True):
                content = b["content"] if isinstance(b["content"], str) else _plain(b["content"])
                out.append({"role": "tool", "tool_call_id": b["toolCallId"], "content": content})
                ids.append([nid])
            continue
        if m.role == "assistant":
            texts = [b for b in m.blocks if b["type"] != "tool_call" and b["type"] not in REASONING_TYPES]
            calls = [b for b in m.blocks if b["type"] == "tool_call"]
            text = _plain(texts)
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
            text = _plain(m.blocks)
            if not text:
                continue
            out.append({"role": "user", "content": text})
        ids.append(list(m.node_ids))
    return out, ids


def _anthropic_blocks(m: _Msg) -> list[dict[str, Any]]:
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
            out.append(_anthropic_image(b))
        elif kind == "tool_call":
            out.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": _input_object(b["input"])})
        elif kind == "tool_result":
            content = b["content"]
            if not isinstance(content, str):
                content = [
                    _anthropic_image(x) if x.get("type") == "image" else {"type": "text", "text": block_text(x)}
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


def _anthropic(msgs: list[_Msg], repairs: list[str]) -> tuple[list[dict[str, Any]], list[list[str]]]:
    out: list[dict[str, Any]] = []
    ids: list[list[str]] = []
    for m in msgs:
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _anthropic_blocks(m)
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


def _neutral(msgs: list[_Msg]) -> tuple[list[dict[str, Any]], list[list[str]]]:
    out: list[dict[str, Any]] = []
    ids: list[list[str]] = []
    for m in msgs:
        blocks = [dict(b) for b in m.blocks if not (b.get("type") == "text" and not b.get("text"))]
        if not blocks:
            continue
        out.append({"role": m.role, "content": blocks, "nodeIds": list(m.node_ids)})
        ids.append(list(m.node_ids))
    return out, ids


def reasoning_text(block: dict[str, Any]) -> str:
    """What a reasoning block holds for a reader (and a tokenizer): its text, else its
    summary, else its signed or encrypted payload."""
    text = block.get("text")
    if isinstance(text, str) and text:
        return text
    summary = block.get("summary")
    if isinstance(summary, list) and summary:
        return "\n\n".join(x for x in summary if isinstance(x, str))
    return ""


def reasoning_payload(message: dict[str, Any]) -> list[str]:
    """The reasoning a rendered message carries, as the strings the model reads: thinking
    and reasoning text, summaries, ``reasoning_content``, and a redacted block's data (its
    only measure); signatures and encrypted content are opaque and not counted. What the
    render adds to its node's own token count (SPEC §6)."""
    out: list[str] = []
    rc = message.get("reasoning_content")
    if isinstance(rc, str) and rc:
        out.append(rc)
    content = message.get("content")
    if isinstance(content, list):
        for b in content:
            if not isinstance(b, dict) or b.get("type") not in REASONING_TYPES:
                continue
            keys = ("data",) if b.get("type") == "redacted_thinking" else ("thinking", "text")
            for key in keys:
                v = b.get(key)
                if isinstance(v, str) and v:
                    out.append(v)
            if isinstance(b.get("summary"), list):
                out.extend(x for x in b["summary"] if isinstance(x, str) and x)
    return out


def to_messages(view: View, format: Format = "neutral", *, include_system: bool = True,
                reasoning: str = "provider") -> Rendered:
    """Provider messages for a view; see the module docstring. Never raises on data.

    ``reasoning`` (``provider`` | ``all`` | ``none``) picks the llm nodes whose reasoning
    blocks are sent (``reasoning_owners``), first in their message."""
    msgs, repairs = _assemble(view, reasoning_owners(view, format, reasoning))
    if format == "openai":
        messages, ids = _openai(view, msgs, include_system)
    elif format == "anthropic":
        messages, ids = _anthropic(msgs, repairs)
    elif format == "neutral":
        messages, ids = _neutral(msgs)
    else:
        raise ValueError(f"unknown format {format!r}: use 'openai', 'anthropic' or 'neutral'")
    return Rendered(view.system, messages, ids, repairs)


# ---------------------------------------------------------------- checks


def check_pairs(messages: Sequence[dict[str, Any]], format: Format) -> list[str]:
    """Problems that a provider would reject (or that break pairing); empty = valid."""
    if format == "openai":
        return _check_openai(messages)
    if format == "anthropic":
        return _check_anthropic(messages)
    if format == "neutral":
        return _check_neutral(messages)
    raise ValueError(f"unknown format {format!r}")


def _check_openai(messages: Sequence[dict[str, Any]]) -> list[str]:
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
            answered: list[str] = []
            while j < len(messages) and messages[j].get("role") == "tool":
                tid = messages[j].get("tool_call_id")
                if tid not in ids:
                    problems.append(f"message {j}: tool result {tid!r} answers no call of message {i}")
                elif tid in answered:
                    problems.append(f"message {j}: second result for tool call {tid!r}")
                if not isinstance(messages[j].get("content"), str | list):
                    problems.append(f"message {j}: tool result content is not a string")
                answered.append(tid)
                j += 1
            for cid in ids:
                if cid not in answered:
                    problems.append(f"message {i}: tool call {cid!r} has no result")
            i = j
            continue
        if role == "user" and m.get("content") in (None, "", []):
            problems.append(f"message {i}: empty user message")
        i += 1
    return problems


def _check_anthropic(messages: Sequence[dict[str, Any]]) -> list[str]:
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


def _check_neutral(messages: Sequence[dict[str, Any]]) -> list[str]:
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
        answered: list[str] = []
        while j < len(messages) and messages[j].get("role") == "tool":
            for b in messages[j].get("content") or []:
                tid = b.get("toolCallId")
                if b.get("type") != "tool_result":
                    problems.append(f"message {j}: {b.get('type')!r} block in a tool message")
                elif tid not in calls:
                    problems.append(f"message {j}: tool result {tid!r} answers no call of message {i}")
                elif tid in answered:
                    problems.append(f"message {j}: second result for tool call {tid!r}")
                answered.append(tid)
            j += 1
        for cid in calls:
            if cid not in answered:
                problems.append(f"message {i}: tool call {cid!r} has no result")
        i = j
    return problems


# ---------------------------------------------------------------- tokens


def message_text(message: dict[str, Any]) -> str:
    """Every string a provider bills for in one message (any format), newline-joined."""
    parts: list[str] = []

    def walk(value: Any, key: str | None = None) -> None:
        if isinstance(value, str):
            if key in (None, "content", "text", "arguments", "name", "input"):
                parts.append(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if k in ("nodeIds", "role", "type", "id", "tool_call_id", "tool_use_id", "toolCallId", "isError", "is_error"):
                    continue
                if k == "input" and not isinstance(v, str):
                    parts.append(json_text(v))
                    continue
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)

    walk(message)
    return "\n".join(p for p in parts if p)


def message_tokens(
    messages: Sequence[dict[str, Any]], count: Callable[[str], int], *, overhead: int = 0
) -> list[int]:
    """Per-message token counts with a caller-supplied counter (e.g. a bound
    ``TokenCounter.count``) plus a fixed per-message framing overhead."""
    return [count(message_text(m)) + overhead for m in messages]
