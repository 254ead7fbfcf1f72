"""The request checkpoint (SPEC §8, step 2 of reduction within a turn): which of the
turn's steps it may cover, how many it covers as the turn grows, how its summary is
asked for segment by segment, and the view with those steps replaced.

``checkpoint_steps`` / ``choose_checkpoint`` / ``settled_checkpoint`` pick a prefix of
the turn's steps, never the newest ``KEEP_RECENT_STEPS``, stopping before any step that
holds a user-authored message, multimodal content, an unfinished tool call or signed
reasoning *that this render sends* (``signed_reasoning_sent``: by format and reasoning
mode, SPEC §6). ``apply_checkpoint`` replaces those steps' items with one task summary
(``Checkpoint.text``); the user's message stays first. One room: where a checkpoint
lands and how it is written are one algorithm — its segments are cut from the start of
the turn so a larger checkpoint reuses a smaller one's summaries.

Architecture Invariant: no I/O, no clock, no store (ARCHITECTURE.md context layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dagctx.ledger.graph import SessionGraph

from .aging import owner_cache
from .content import json_text
from .formats import RenderFormat, reasoning_owners
from .formats import get as get_format
from .turn_shape import TurnShape, turn_shape, unit_of
from .view import Item, View

#: A checkpoint made because the turn outgrew its limit covers enough steps to bring
#: the request down to this share of the limit, so the turn grows for many steps before
#: the next checkpoint breaks the prompt cache again (``settled_checkpoint``).
TARGET_SHARE = 0.5
#: The most recent steps of the turn never go into a checkpoint.
KEEP_RECENT_STEPS = 2
#: A checkpoint grows in multiples of this many steps (fewer, coarser prefix changes).
CHECKPOINT_QUANTUM = 8

CHECKPOINT_MARKER = "[Checkpoint: summary of the {steps} earlier steps of this turn; the full record is in the ledger]"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A request checkpoint: ``covers`` (steps) render as one user message ``text``."""

    id: str
    covers: tuple[str, ...]
    #: the summary itself (input of a later, larger checkpoint)
    summary: str
    key: str
    tokens_before: int = 0
    tokens_after: int = 0
    segments: int = 1
    cached: bool = False

    @property
    def text(self) -> str:
        return CHECKPOINT_MARKER.format(steps=len(self.covers)) + "\n" + self.summary.strip()


def _step_blocked(graph: SessionGraph, step: str, items: Sequence[Item], signed: frozenset[str]) -> str | None:
    """Why a step (with its rendered ``items``) may not go into a checkpoint, or None.

    ``signed``: the llm nodes whose signed or encrypted reasoning this render sends
    (``signed_reasoning_sent``); a checkpoint would drop those blocks, so it stops there."""
    node = graph.nodes.get(step)
    if node is None:
        return "unknown"
    if step in signed:
        return "signedReasoning"
    for it in items:
        if it.synthetic or it.status == "running":
            return "unfinished"
        if any(b.get("type") != "text" for b in it.content):
            return "multimodal"
        inner = graph.nodes.get(it.node_id)
        if inner is not None and inner.role == "user":
            return "userMessage"
    return None


def signed_reasoning_sent(view: View, format: str | RenderFormat, mode: str) -> frozenset[str]:  # noqa: A002
    """The llm nodes whose signed or encrypted reasoning blocks this render sends (SPEC §6:
    by format and ``reasoning`` mode). Only those blocks bind a request: they go out
    byte for byte, so no checkpoint may cover their step. Stored blocks that are not sent
    (OpenAI Chat Completions, mode ``none``, an earlier turn under ``provider``) bind nothing.
    Which stored blocks a format sends signed is the format's own knowledge
    (``RenderFormat.sends_signed``)."""
    fmt = get_format(format) if isinstance(format, str) else format
    owners = reasoning_owners(view, fmt, mode)
    if not owners:
        return frozenset()
    return frozenset(it.node_id for it in view.items
                     if it.node_id in owners and it.kind == "assistant"
                     and any(fmt.sends_signed(b) for b in it.reasoning))


def checkpoint_steps(graph: SessionGraph, view: View, shape: TurnShape,
                     signed: frozenset[str] = frozenset()) -> tuple[list[str], str | None]:
    """The steps a checkpoint may cover (a prefix of the turn), and what stopped it.
    ``signed``: the steps whose signed reasoning the render sends (``signed_reasoning_sent``)."""
    limit = max(0, len(shape.steps) - KEEP_RECENT_STEPS)
    by_owner: dict[str, list[Item]] = {}
    for it, owner in zip(view.items, shape.owners):
        by_owner.setdefault(owner, []).append(it)
    out: list[str] = []
    for step in shape.steps[:limit]:
        why = _step_blocked(graph, step, by_owner.get(step, ()), signed)
        if why is not None:
            return out, why
        out.append(step)
    return out, None


def step_tokens(shape: TurnShape, graph: SessionGraph, node_ids: Sequence[Sequence[str]],
                per_message: Sequence[int]) -> dict[str, int]:
    """Tokens of each step's messages (a message counts for the step owning its first node)."""
    cache: dict[str, str] = owner_cache(graph) if shape.frame is None else {}
    steps = set(shape.steps)
    out = dict.fromkeys(shape.steps, 0)
    for ids, n in zip(node_ids, per_message):
        for i in ids:
            if i in graph.nodes:
                owner = unit_of(graph, shape, i, cache)
                if owner in steps:
                    out[owner] += n
                break
    return out


def choose_checkpoint(eligible: Sequence[str], tokens: Mapping[str, int], need: int, summary_tokens: int,
                      *, already: int = 0) -> int:
    """How many of the eligible steps to cover: the fewest that free ``need`` tokens,
    rounded up to ``CHECKPOINT_QUANTUM`` (never fewer than ``already``)."""
    total = 0
    k = 0
    for k, step in enumerate(eligible, start=1):
        total += tokens.get(step, 0)
        if total - summary_tokens >= need:
            break
    else:
        k = len(eligible)
    k = min(len(eligible), math.ceil(k / CHECKPOINT_QUANTUM) * CHECKPOINT_QUANTUM)
    return max(k, min(already, len(eligible)))


def settled_checkpoint(steps: Sequence[str], eligible: int, tokens: Mapping[str, int], base: int, limit: int,
                       summary_tokens: int) -> tuple[int, int]:
    """The checkpoint of the turn's growth replayed step by step: ``(k_before, k_now)``,
    the number of steps covered when the turn had one step fewer, and now.

    Every earlier request of the turn is a prefix of this one, so its checkpoint can be
    recomputed from this request alone (a pure function of the request, SPEC §8): with
    ``m`` steps present the request is estimated at ``base`` (everything outside the
    turn's steps) + the steps after the checkpoint + ``summary_tokens`` for the checkpoint
    itself. While that fits ``limit`` the checkpoint stays where it is — consecutive
    requests keep a byte-stable prefix; when it no longer fits, the checkpoint jumps to
    the fewest whole quanta (``CHECKPOINT_QUANTUM``) that bring the request to
    ``TARGET_SHARE`` of the limit (never covering the newest ``KEEP_RECENT_STEPS`` or more
    than ``eligible`` steps). A break that only just fits would come back a step later;
    one that lands at half the limit pays for itself over the steps that follow."""
    pre = [0]
    for st in steps:
        pre.append(pre[-1] + max(0, tokens.get(st, 0)))
    target = limit * TARGET_SHARE

    def size(m: int, k: int) -> int:
        return base + pre[m] - pre[k] + (summary_tokens if k else 0)

    k = before = 0
    for m in range(1, len(steps) + 1):
        before = k
        if size(m, k) <= limit:
            continue
        avail = max(k, min(eligible, m - KEEP_RECENT_STEPS))
        nxt = k
        while nxt < avail:
            nxt = min(avail, (nxt // CHECKPOINT_QUANTUM + 1) * CHECKPOINT_QUANTUM)
            if size(m, nxt) <= target:
                break
        k = nxt
    return before, k


def checkpoint_segments(texts: Sequence[str], max_tokens: int, count: Callable[[str], int]) -> list[tuple[int, int]]:
    """Steps (their ``texts``, oldest first) cut into consecutive segments ``(lo, hi)`` of
    at most ``max_tokens`` each (a larger step is a segment alone), from the start of the
    turn: a checkpoint of more steps shares the segments of a smaller one. ``count``
    sizes one of ``texts`` (the reduction passes step ids and their texts' estimates)."""
    out: list[tuple[int, int]] = []
    lo = 0
    size = 0
    for i, t in enumerate(texts):
        n = count(t) + 1
        if i > lo and size + n > max_tokens:
            out.append((lo, i))
            lo, size = i, 0
        size += n
    if lo < len(texts):
        out.append((lo, len(texts)))
    return out


def checkpoint_summary_cap(window: int) -> int:
    return max(256, min(2048, window // 16))


def _item_line(it: Item) -> str:
    if it.kind == "assistant":
        return f"assistant: {it.text}"
    if it.kind == "tool_call":
        args = "" if it.input is None else (it.input if isinstance(it.input, str) else json_text(it.input))
        return f"call {it.name}({args})"
    if it.kind == "tool_result":
        return f"result of {it.name} [{it.status}]:\n{it.text}"
    return f"{it.role}: {it.text}"


def steps_text(view: View, shape: TurnShape, steps: Sequence[str]) -> str:
    """The plain-text transcript of some steps, as the summarizer reads it."""
    wanted = set(steps)
    return "\n".join(_item_line(it) for it, owner in zip(view.items, shape.owners) if owner in wanted)


def step_texts(view: View, shape: TurnShape, steps: Sequence[str]) -> dict[str, str]:
    """``steps_text`` of each of ``steps`` alone, in one pass over the view (not one per step)."""
    lines: dict[str, list[str]] = {st: [] for st in steps}
    for it, owner in zip(view.items, shape.owners):
        got = lines.get(owner)
        if got is not None:
            got.append(_item_line(it))
    return {st: "\n".join(ls) for st, ls in lines.items()}


def task_text(view: View, shape: TurnShape, graph: SessionGraph | None = None) -> str:
    """The task a checkpoint summarizes toward: the user's message of the turn, and in a
    frame the running function's call (its name and arguments)."""
    text = "\n".join(it.text for it, o in zip(view.items, shape.owners) if o == shape.user and it.kind == "user")
    if shape.frame is not None and graph is not None and shape.frame in graph.nodes:
        f = graph.nodes[shape.frame]
        args = "" if f.input is None else (f.input if isinstance(f.input, str) else json_text(f.input))
        text += f"\n\nThe steps below are the inner calls of the running function {f.name or 'function'}({args})."
    return text


def checkpoint_messages(task: str, segment: str | Sequence[str], *, previous: str | None,
                        words: int) -> tuple[str, str]:
    """(system, user) of one checkpoint request (one segment, rolling over ``previous``).
    ``segment``: its text, or its steps' texts (non-empty), which are its lines: the
    request is then joined once, the segment not built apart (tens of kilobytes)."""
    system = (
        "You write a checkpoint of an agent's work within one task, so that the agent can continue "
        "from the checkpoint without the full history of its steps. Keep every file path, identifier, "
        "command, number, error message and decision; say what was done, what was found and what "
        "remains. Answer with the checkpoint only."
    )
    parts = [f"<task>\n{task}\n</task>"]
    if previous:
        parts.append(f"<checkpoint-so-far>\n{previous}\n</checkpoint-so-far>")
    # one copy of a long segment, not two
    parts += ["<steps>", segment, "</steps>"] if isinstance(segment, str) else ["<steps>", *segment, "</steps>"]
    parts.append(f"Write the updated checkpoint in at most {words} words.")
    return system, "\n".join(parts)


def apply_checkpoint(view: View, graph: SessionGraph, cp: Checkpoint) -> View:
    """The view with the checkpoint's steps replaced by one user message (pure)."""
    covered = set(cp.covers)
    owners = turn_shape(view, graph).owners
    items: list[Item] = []
    placed = False
    for it, owner in zip(view.items, owners):
        if owner in covered:
            if not placed:
                items.append(Item(kind="summary", node_id=cp.id, role="user", seq=it.seq,
                                  content=[{"type": "text", "text": cp.text}], text=cp.text, turn=it.turn))
                placed = True
            continue
        items.append(it)
    return replace(view, items=items, parts=None)  # the items moved: no parts by position


def checkpoint_from_manifest(manifest: Mapping[str, Any]) -> Checkpoint | None:
    """The checkpoint a recorded request carried (replay), or None."""
    tr = manifest.get("turnReduction")
    if not isinstance(tr, dict) or not isinstance(tr.get("checkpoint"), dict):
        return None
    cp = tr["checkpoint"]
    return Checkpoint(id=str(cp["id"]), covers=tuple(cp.get("coversIds") or ()), summary=str(cp.get("summary") or ""),
                      key=str(cp.get("summaryKey") or ""))


__all__ = ["CHECKPOINT_MARKER", "CHECKPOINT_QUANTUM", "KEEP_RECENT_STEPS", "TARGET_SHARE", "Checkpoint",
           "apply_checkpoint", "checkpoint_from_manifest", "checkpoint_messages", "checkpoint_segments",
           "checkpoint_steps", "checkpoint_summary_cap", "choose_checkpoint", "settled_checkpoint",
           "signed_reasoning_sent", "step_texts", "step_tokens", "steps_text", "task_text"]
