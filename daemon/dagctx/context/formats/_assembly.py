"""What every render format shares: the neutral assembly of a view into pair-valid
messages (``assemble``), the ``Rendered`` result, helpers for arguments and images, and
``RenderFormat``, the base every format module's ``FORMAT`` object extends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.content import block_text, json_text
from dagctx.context.view import NO_RESULT, Item, View


class Rendered(tuple):
    """``(system, messages, node_ids)`` plus ``.repairs`` and ``.call_ids`` (every tool call
    id the messages use, so a render extended later keeps them unique); unpacks as a 3-tuple.

    ``repairs`` holds, in this order, the view's (walk order), the assembly's (message
    order) and, from ``built_at`` on, those the format's last pass made over the whole list
    (a placeholder opening it): a render extended from the cache puts the repairs of the
    new part where a full render has them (``ContextService._extend_cached``)."""

    repairs: list[str]
    call_ids: frozenset[str]
    built_at: int

    def __new__(cls, system: str | None, messages: list[dict[str, Any]], node_ids: list[list[str]], repairs: list[str],
                call_ids: frozenset[str] = frozenset(), built_at: int | None = None):
        self = super().__new__(cls, (system, messages, node_ids))
        self.repairs = repairs
        self.call_ids = call_ids
        self.built_at = len(repairs) if built_at is None else built_at
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
class Msg:
    role: str  # user | assistant | tool
    blocks: list[dict[str, Any]] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)

    def add_id(self, node_id: str | None) -> None:
        if node_id and node_id not in self.node_ids:
            self.node_ids.append(node_id)


@dataclass(slots=True)
class Group:
    msg: Msg
    owner: str | None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (node id, effective call id)
    results: dict[str, Item] = field(default_factory=dict)  # node id → result item
    results_started: bool = False


def is_error(item: Item) -> bool:
    return item.status in ("error", "cancelled")


def result_block(call_id: str, item: Item | None) -> dict[str, Any]:
    if item is None:
        return {"type": "tool_result", "toolCallId": call_id, "content": NO_RESULT, "isError": False}
    blocks = [b for b in item.content if not (b.get("type") == "text" and not b.get("text"))]
    if all(b.get("type") == "text" for b in blocks):
        content: Any = "\n\n".join(b["text"] for b in blocks)
    else:
        content = [dict(b) for b in blocks]
    return {"type": "tool_result", "toolCallId": call_id, "content": content, "isError": is_error(item)}


#: neutral block types of reasoning (``metadata.reasoning``, SPEC §6)
REASONING_TYPES = frozenset({"thinking", "redacted_thinking", "reasoning"})


def reasoning_owners(view: View, fmt: RenderFormat, mode: str) -> frozenset[str]:
    """The llm nodes whose reasoning blocks a render sends (SPEC §6).

    ``none``: none. ``all``: every top-level llm node that has some. ``provider``: none for
    a format that takes no reasoning back (``RenderFormat.takes_reasoning_back``); for the
    others the assistant turns of the current tool loop — the top-level llm nodes after the
    branch's newest user message (a new user message ends the loop: its thinking is no
    longer required, Anthropic's documented rule for extended thinking with tools).
    """
    if mode == "none" or (mode == "provider" and not fmt.takes_reasoning_back):
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


def assemble(view: View, owners: frozenset[str] = frozenset()) -> tuple[list[Msg], list[str]]:
    """The view as neutral messages, pair-valid; the llm nodes in ``owners`` open their
    message with their reasoning blocks (``reasoning_owners``)."""
    a = Assembler(owners, list(view.repairs))
    a.feed(view.items)
    return a.finish(), a.repairs


class Assembler:
    """``assemble`` an item at a time: ``feed`` items in view order, take the messages that
    are final with ``ready`` (all but an assistant message whose tool calls may still
    grow), ``finish`` after the last item. A tool call id is unique across everything fed
    (SPEC §6, pair validity), so a view may be fed in pieces with the same result as whole
    (a streamed export, SPEC §9)."""

    __slots__ = ("owners", "repairs", "msgs", "used_ids", "group")

    def __init__(self, owners: frozenset[str] = frozenset(), repairs: list[str] | None = None) -> None:
        self.owners = owners
        self.repairs: list[str] = [] if repairs is None else repairs
        self.msgs: list[Msg] = []
        self.used_ids: set[str] = set()
        self.group: Group | None = None

    def _close(self) -> None:
        group = self.group
        if group is None:
            return
        if group.calls:
            tool = Msg("tool")
            for node_id, call_id in group.calls:
                item = group.results.get(node_id)
                if item is None:
                    self.repairs.append(
                        f"synthetic result for tool call {call_id} (node {node_id}): no result in the view")
                tool.blocks.append(result_block(call_id, item))
                tool.add_id(node_id)
            self.msgs.append(tool)
        self.group = None

    def _unique(self, call_id: str | None, node_id: str) -> str:
        base = call_id or f"call_{node_id}"
        cid = base
        n = 2
        while cid in self.used_ids:
            cid = f"{base}_{n}"
            n += 1
        if cid != base:
            self.repairs.append(f"duplicate tool call id {base} (node {node_id}) renamed to {cid}")
        elif not call_id:
            self.repairs.append(f"tool call node {node_id} had no call id; using {cid}")
        self.used_ids.add(cid)
        return cid

    def feed(self, items: Sequence[Item]) -> None:
        msgs = self.msgs
        for it in items:
            stop_if_cancelled()  # SPEC §1.4: a cancelled render stops within one item
            group = self.group
            if it.kind == "tool_call":
                if group is None or group.results_started or group.owner != it.owner:
                    self._close()
                    msg = Msg("assistant")
                    msg.add_id(it.owner)
                    msgs.append(msg)
                    group = self.group = Group(msg, it.owner)
                cid = self._unique(it.tool_call_id, it.node_id)
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
                    self.repairs.append(f"dropped orphan tool result {it.tool_call_id} (node {it.node_id}): "
                                        "its call is not right before it")
                    continue
                group.results[match] = it
                group.results_started = True
                continue
            self._close()
            role = "assistant" if it.role == "assistant" else "user"
            lead = [dict(b) for b in it.reasoning] if it.node_id in self.owners and it.kind == "assistant" else []
            msg = Msg(role, lead + [dict(b) for b in it.content], [])
            msg.add_id(it.node_id)
            msgs.append(msg)
            if it.kind == "assistant":
                self.group = Group(msg, it.node_id)

    def ready(self) -> list[Msg]:
        """The messages fed so far that nothing fed later can change, handed out once: every
        one but the assistant message of an open tool call group (always the newest)."""
        keep = 1 if self.group is not None else 0
        out = self.msgs[: len(self.msgs) - keep]
        del self.msgs[: len(out)]
        return out

    def finish(self) -> list[Msg]:
        """After the last item: the messages not yet handed out, every group closed."""
        self._close()
        out, self.msgs = self.msgs, []
        return out


def json_object(text: str) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object, or None (stored arguments may be a JSON string)."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def media_type(block: dict[str, Any]) -> str | None:
    mt = block.get("media_type") or block.get("mediaType") or block.get("mimeType")
    return str(mt) if mt else None


def inline_data(block: dict[str, Any]) -> str | None:
    data = block.get("data")
    return data if isinstance(data, str) and data and data != "<omitted>" else None


def plain(blocks: Sequence[dict[str, Any]]) -> str:
    return "\n\n".join(block_text(b) for b in blocks if not (b.get("type") == "text" and not b.get("text")))


@dataclass(slots=True)
class CallAnswers:
    """The pairing check of one assistant message's tool calls against the results after
    it, for a format's ``check_pairs``: each result answers one call of message ``index``,
    once, and every call gets one (``close``). Problems go to ``problems``."""

    index: int
    calls: Sequence[Any]
    problems: list[str]
    answered: list[Any] = field(default_factory=list)

    def answer(self, at: int, call_id: Any) -> None:
        """A result in message ``at`` naming ``call_id``."""
        if call_id not in self.calls:
            self.problems.append(f"message {at}: tool result {call_id!r} answers no call of message {self.index}")
        elif call_id in self.answered:
            self.problems.append(f"message {at}: second result for tool call {call_id!r}")
        self.answered.append(call_id)

    def close(self) -> None:
        """After the last result: every call without one is a problem."""
        for cid in self.calls:
            if cid not in self.answered:
                self.problems.append(f"message {self.index}: tool call {cid!r} has no result")


# ---------------------------------------------------------------- the format object


class RenderFormat:
    """One provider's message format. Everything that differs between formats is a method
    here, so a new format is one module of this package defining ``FORMAT`` (an instance
    of a subclass) and its name in the wire ``Format`` literal."""

    #: the wire name (``Format``)
    name: ClassVar[str]
    #: whether the provider reads reasoning blocks back, so reasoning mode ``provider``
    #: sends the current tool loop's (SPEC §6); False sends none unless mode is ``all``
    takes_reasoning_back: ClassVar[bool] = True

    def build(self, view: View, msgs: list[Msg], repairs: list[str], *,
              include_system: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
        """The provider messages for the assembled ``msgs`` and the node ids of each;
        a change made to keep the list valid is appended to ``repairs``."""
        raise NotImplementedError

    def check_pairs(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        """Problems a provider would reject (or that break pairing); empty = valid."""
        raise NotImplementedError

    def sends_signed(self, block: dict[str, Any]) -> bool:
        """Whether this format sends the stored reasoning ``block`` signed or encrypted, so
        it goes out byte for byte and no request checkpoint may cover the step holding it
        (SPEC §6, §8). The default is a format that sends reasoning as text, if at all."""
        return False

    def leads_with_system(self, messages: Sequence[dict[str, Any]]) -> bool:
        """Whether ``messages[0]`` is the system text (otherwise it is returned beside them)."""
        return False

    def can_stitch(self, prefix: Sequence[dict[str, Any]], first_role: str) -> bool:
        """Whether messages built for the rest of a branch may follow ``prefix`` as they are
        (a format that merges neighbours cannot always); ``first_role`` is the role of the
        rest's first view item."""
        return True

    def user_text_at(self, message: dict[str, Any]) -> int | None:
        """Where text a user wrote starts in ``message`` (0 for a plain string content),
        or None when the message holds none (a tool result)."""
        if message.get("role") != "user":
            return None
        content = message.get("content")
        if isinstance(content, str):
            return 0
        if isinstance(content, list):
            return 0
        raise ValueError(f"{self.name}: a user message without string or list content cannot take turn hooks")

    def prepend_to_newest_user(self, messages: list[Any], prefix: str) -> list[Any]:
        """``messages`` with ``prefix`` put before the newest user-written text (SPEC §7 turn
        hooks). Never silently unchanged: a user message this format cannot prefix raises."""
        out = list(messages)
        for i in range(len(out) - 1, -1, -1):
            msg = out[i]
            if not isinstance(msg, dict):
                continue
            at = self.user_text_at(msg)
            if at is None:
                continue
            msg = dict(msg)
            content = msg["content"]
            if isinstance(content, str):
                msg["content"] = prefix + "\n\n" + content
            else:
                msg["content"] = [*content[:at], {"type": "text", "text": prefix}, *content[at:]]
            out[i] = msg
            return out
        return out

    def message_text(self, message: dict[str, Any]) -> str:
        """Every string a provider bills for in one message, newline-joined."""
        parts: list[str] = []

        def walk(value: Any, key: str | None = None) -> None:
            if isinstance(value, str):
                if key in (None, "content", "text", "arguments", "name", "input"):
                    parts.append(value)
            elif isinstance(value, dict):
                for k, v in value.items():
                    if k in ("nodeIds", "role", "type", "id", "tool_call_id", "tool_use_id", "toolCallId", "isError",
                             "is_error"):
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
