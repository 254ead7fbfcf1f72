"""Writing one branch's turns as neutral items: the walk of ``render.render_view``.

``ItemWriter`` emits a ``View``'s ``Item``s for chain nodes and their filtered caller
subtrees — user turns, llm replies with their tool call/result pairs, functions as text
pairs, an inner ask-user, the active summary — following the rule in ``render.py``'s
docstring (turn contents, status markers, expose, ``render_range.subcalls``).
``added_text`` is the text those markers add, for token counts. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.nodes import SUMMARY_MARKER, Call

from .content import (
    blocks_text,
    error_message,
    json_text,
    message_blocks,
    node_meta,
    reasoning_of,
    render_range,
    text_block,
    tool_call_id_of,
    value_blocks,
)
from .summary_choice import beside_chain, is_chain_member
from .view import IN_PROGRESS, NO_OUTPUT, NO_RESULT, Item


class ItemWriter:
    def __init__(
        self,
        graph: SessionGraph,
        *,
        expose_default: str,
        aged: Mapping[str, str],
        before_seq: float,
        frame: Call | None,
        frame_set: frozenset[str],
        open_ids: frozenset[str],
    ) -> None:
        self.g = graph
        self.expose_default = expose_default
        self.aged_map = aged
        self.before = before_seq
        self.frame = frame
        self.frame_set = frame_set
        self.open_ids = open_ids
        self.items: list[Item] = []
        self.reads: list[str] = []
        self.turns: list[tuple[str, int]] = []
        self._read_set: set[str] = set()
        self.turn = 0
        self.repairs: list[str] = []
        self.aged_used: list[str] = []

    # -------------------------------------------------- basics

    def visible(self, node: Call) -> bool:
        if node.seq >= self.before:
            return False
        if self.frame is not None and node.seq > self.frame.seq and node.id not in self.frame_set:
            return False
        return True

    def callees(self, node_id: str) -> list[Call]:
        out = []
        for cid in self.g.callees.get(node_id, ()):
            c = self.g.nodes[cid]
            if beside_chain(c) or is_chain_member(self.g, c) or not self.visible(c):
                continue
            out.append(c)
        return out

    def emit_blocks(self, kind: str, node: Call, role: str, blocks: list[dict[str, Any]], **fields: Any) -> None:
        """Emit an item whose content is ``blocks`` (its text derived from them)."""
        self.emit(Item(kind=kind, node_id=node.id, role=role, seq=node.seq, content=blocks,
                       text=blocks_text(blocks), **fields))

    def emit(self, item: Item) -> None:
        item.turn = self.turn
        self.items.append(item)
        if item.node_id not in self._read_set:
            self._read_set.add(item.node_id)
            self.reads.append(item.node_id)
            self.turns.append((item.node_id, self.turn))

    def shows_insides(self, node: Call) -> bool:
        if node.id in self.open_ids:
            return True
        expose = node.metadata.get("expose")
        if expose not in ("io", "full"):
            expose = self.expose_default
        return expose == "full"

    # -------------------------------------------------- chain nodes

    def chain_node(self, node: Call) -> None:
        if node.role == "user":
            self.turn += 1
            self.user_turn(node)
            self.inner(self.callees(node.id), 1)
        elif node.role == "llm":
            self.llm(node, depth=0, nested=False)
        else:
            self.function(node, depth=0)

    def user_turn(self, node: Call) -> None:
        value = node.output if node.output is not None else node.input
        blocks: list[dict[str, Any]] = []
        for key in (("memory_prefetch", "memoryPrefetch"), ("prepend_context", "prependContext")):
            extra = node_meta(node, *key)
            if isinstance(extra, str) and extra:
                blocks.append(text_block(extra))
        blocks.extend(message_blocks(value))
        if not blocks:
            return  # an empty user message contributes nothing (the turn still counts)
        self.emit_blocks("user", node, "user", blocks, name=node.name, status=node.status)

    def summary(self, node: Call, covered_users: int) -> None:
        self.turn += covered_users
        blocks = message_blocks(node.output)
        text = blocks_text([b for b in blocks if b.get("type") == "text"])
        if not text.startswith(SUMMARY_MARKER):
            text = f"{SUMMARY_MARKER}\n{text}"
        self.emit_blocks("summary", node, "user", [text_block(text)], name=node.name, status=node.status)

    # -------------------------------------------------- llm

    def llm(self, node: Call, *, depth: int, nested: bool) -> None:
        if nested and node.input is not None:
            prompt = message_blocks(node.input)
            if prompt:
                self.emit_blocks("user", node, "user", prompt, name=node.name, status=node.status, depth=depth)
        blocks = message_blocks(node.output)
        if node.status == "error":
            msg = error_message(node)
            blocks.append(text_block("[error] the model call failed" + (f": {msg}" if msg else "")))
        elif node.status == "cancelled":
            blocks.append(text_block("[cancelled] the model call was cancelled"))

        tools: list[Call] = []
        others: list[Call] = []
        by_tid: dict[str, int] = {}
        for c in self.callees(node.id):
            tid = tool_call_id_of(c) if c.role == "code" else None
            if tid is None:
                others.append(c)
                continue
            if tid in by_tid:
                old = tools[by_tid[tid]]
                self.repairs.append(
                    f"tool call {tid} of {node.id}: retry {c.id} supersedes {old.id}"
                )
                tools[by_tid[tid]] = c
            else:
                by_tid[tid] = len(tools)
                tools.append(c)
        tools.sort(key=lambda n: n.seq)
        reasoning = reasoning_of(node) if not nested else []

        if blocks or tools or reasoning:
            self.emit_blocks(
                "assistant",
                node,
                "assistant",
                blocks,
                name=node.name,
                status=node.status,
                depth=depth,
                reasoning=reasoning,
            )
        for t in tools:
            self.emit(
                Item(
                    kind="tool_call",
                    node_id=t.id,
                    role="assistant",
                    seq=t.seq,
                    name=t.name,
                    input=t.input,
                    tool_call_id=tool_call_id_of(t),
                    owner=node.id,
                    status=t.status,
                    depth=depth,
                )
            )
        for t in tools:
            self.tool_result(t, node.id, depth)

        tool_ids = {t.id for t in tools}
        after = [t for t in tools if self.shows_insides(t)] + others
        after.sort(key=lambda n: n.seq)
        for c in after:
            if c.id in tool_ids:
                self.insides(c, depth + 1)
            else:
                self.inner([c], depth + 1)

    def tool_result(self, t: Call, owner: str, depth: int) -> None:
        tid = tool_call_id_of(t)
        synthetic = False
        if t.id in self.open_ids:
            blocks = [text_block(IN_PROGRESS)]
            status = "running"
        else:
            blocks, synthetic = self.result_blocks(t)
            status = t.status
            if synthetic:
                self.repairs.append(f"synthetic result for unfinished tool call {tid} (node {t.id})")
        self.emit_blocks(
            "tool_result",
            t,
            "tool",
            blocks,
            name=t.name,
            tool_call_id=tid,
            owner=owner,
            status=status,
            depth=depth,
            aged=t.id in self.aged_map,
            synthetic=synthetic,
        )

    def result_blocks(self, node: Call) -> tuple[list[dict[str, Any]], bool]:
        """Result content of a code node with its status marker; (blocks, synthetic)."""
        if node.id in self.aged_map:
            blocks = [text_block(str(self.aged_map[node.id]))]
            self.aged_used.append(node.id)
        else:
            blocks = value_blocks(node.output)
        synthetic = False
        if node.status == "error":
            msg = error_message(node) if not blocks else ""
            prefix = "[error]" + (f" {msg}" if msg else "")
            blocks = _prefixed(prefix, blocks or [])
            if len(blocks) == 1 and blocks[0]["text"] == "[error]":
                blocks = [text_block("[error] the call failed")]
        elif node.status == "cancelled":
            blocks = _prefixed("[cancelled]", blocks or [text_block(NO_RESULT)])
        elif node.status == "running" and not blocks:
            blocks = [text_block(NO_RESULT)]
            synthetic = True
        elif not blocks:
            blocks = [text_block(NO_OUTPUT)]
        return blocks, synthetic

    # -------------------------------------------------- functions

    def function(self, node: Call, *, depth: int) -> None:
        """A code node as a text pair (no llm owner to pair a tool call with)."""
        args = "" if node.input is None else json_text(node.input)
        call = f"Called {node.name or 'function'}({args})"
        self.emit_blocks(
            "text_pair",
            node,
            "assistant",
            [text_block(call)],
            name=node.name,
            input=node.input,
            tool_call_id=tool_call_id_of(node),
            status=node.status,
            part="call",
            depth=depth,
        )
        if self.shows_insides(node):
            self.insides(node, depth + 1)
        if node.id in self.open_ids:
            return
        if node.status == "running" and node.output is None:
            return
        self.emit_blocks(
            "text_pair",
            node,
            "user",
            self.function_result_blocks(node),
            name=node.name,
            tool_call_id=tool_call_id_of(node),
            status=node.status,
            part="result",
            depth=depth,
            aged=node.id in self.aged_map,
        )

    def function_result_blocks(self, node: Call) -> list[dict[str, Any]]:
        """The result half of a text pair: ``Result of name:`` and the result content."""
        blocks, _ = self.result_blocks(node)
        head = f"Result of {node.name or 'function'}:"
        if blocks and blocks[0].get("type") == "text":
            return [text_block(f"{head}\n{blocks[0]['text']}")] + blocks[1:]
        return [text_block(head)] + blocks

    def ask_user(self, node: Call, *, depth: int) -> None:
        question = message_blocks(node.input)
        q = f"Asked the user: {blocks_text(question)}"
        self.emit_blocks(
            "text_pair",
            node,
            "assistant",
            [text_block(q)],
            name="ask_user",
            input=node.input,
            status=node.status,
            part="call",
            depth=depth,
        )
        if node.output is None and node.status == "running":
            return
        answer = message_blocks(node.output)
        head = "The user answered:"
        if node.status in ("error", "cancelled") and not answer:
            answer = [text_block(f"[{node.status}]")]
        if answer and answer[0].get("type") == "text":
            answer = [text_block(f"{head} {answer[0]['text']}")] + answer[1:]
        else:
            answer = [text_block(head)] + answer
        self.emit_blocks(
            "text_pair",
            node,
            "user",
            answer,
            name="ask_user",
            status=node.status,
            part="result",
            depth=depth,
        )

    def insides(self, node: Call, depth: int) -> None:
        callees = self.callees(node.id)
        _, subcalls = render_range(node)
        if subcalls is not None:
            callees = callees[len(callees) - subcalls :] if subcalls else []
        self.inner(callees, depth)

    def inner(self, nodes: list[Call], depth: int) -> None:
        for c in nodes:
            if c.role == "llm":
                self.llm(c, depth=depth, nested=True)
            elif c.role == "code":
                self.function(c, depth=depth)
            else:
                self.ask_user(c, depth=depth)


def added_text(node: Call, side: str, aged: bool = False) -> str:
    """The text a render adds around a node's own content, so token counts include it
    (SPEC §6): status markers and placeholders of a tool result (``side="result"``),
    of a failed or cancelled reply (``"reply"``), the summary marker (``"summary"``).

    Mirrors ``result_blocks``, ``llm`` and ``summary`` above; a prefix is counted on its
    own, beside the content (within a token of the joined text).
    """
    if side == "summary":
        text = node.output if isinstance(node.output, str) else ""
        return "" if text.startswith(SUMMARY_MARKER) else SUMMARY_MARKER + "\n"
    if side == "reply":
        if node.status == "error":
            msg = error_message(node)
            return "\n[error] the model call failed" + (f": {msg}" if msg else "")
        if node.status == "cancelled":
            return "\n[cancelled] the model call was cancelled"
        return ""
    if node.status == "completed" and node.output not in (None, "", []):
        return ""
    has = aged or bool(value_blocks(node.output))
    if node.status == "error":
        if has:
            return "[error] "
        msg = error_message(node)
        return f"[error] {msg}" if msg else "[error] the call failed"
    if node.status == "cancelled":
        return "[cancelled] " if has else f"[cancelled] {NO_RESULT}"
    if not has:
        return NO_RESULT if node.status == "running" else NO_OUTPUT
    return ""


def _prefixed(prefix: str, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if blocks and blocks[0].get("type") == "text":
        text = blocks[0]["text"]
        return [text_block(f"{prefix} {text}" if text else prefix)] + blocks[1:]
    return [text_block(prefix)] + blocks
