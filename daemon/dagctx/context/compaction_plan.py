"""Compaction planning and validation: what a summary covers, what the summarizer sees,
whether its answer may be written. Pure; the engine runs the sampling request and
writes the one node.

SPEC §8. The pipeline (manual, auto, reactive):

1. ``select_cut(view, graph, token_of_item, window=…)`` on the view the model would
   see (aged as rendered) → a ``CutPlan`` or None (``cut_decision`` also says why:
   ``belowThreshold`` / ``nothingToCompact``);
2. ``summarizer_messages(plan, …)`` → ``(systemPrompt, messages)`` for
   ``sampling/createMessage``; a prefix too large for one call is split with
   ``split_stages`` and summarized stage by stage (``stage_plan``), each stage in
   update mode on top of the previous stage's summary;
3. ``validate_summary(text, plan, …)`` with ``fidelity_terms(plan)``; on
   ``lowFidelity`` one retry with ``retry_messages``; never write a failed summary
   (opt-in ``structural_summary`` is the only fallback);
4. ``summary_node_input(plan, text, …)`` → the fields of the one node to append;
   ``with_candidate`` gives an in-memory graph to measure the rendered result before
   writing (``tokensAfter`` is measured on the render, never on the raw branch).

The cut (``select_cut``)
========================

Keep-tail target: ``keep_recent_tokens`` when given, else 10 % of the window clamped
to 8,000–40,000 tokens, and never more than 20 % of the window (SPEC §8, the
small-window cap): a compacted request must leave room to grow, or the next compaction
follows a few requests later and every one rewrites the whole prompt cache. Items are
summed with ``token_of_item`` (tokens as rendered, aged results included).

- total ≤ target → None (``belowThreshold``): no LLM call;
- tokens: going back from the end, ``i_tok`` is the last position whose tail still
  holds the target; the cut snaps *forward* to the first real user message at or
  after it — the earliest user boundary whose tail fits the target. Cuts are only
  ever at the start of a user turn, so a turn (its tool calls and their results) is
  never split;
- messages: when the last two turns together fit the target, the cut moves back to
  the latest user boundary whose tail holds at least four conversation messages
  (user turns and assistant texts; tool traffic does not count), as long as the tail
  stays within twice the target ("when possible"). When the last two turns exceed
  the target, the cut may advance to the newest user message: the finished previous
  turn is summarized and the newest turn stays verbatim;
- the newest user turn always stays verbatim, even when it alone exceeds the target
  (there is no cut point inside or after it);
- a cut that would cover nothing new (only the previous summary) → None
  (``nothingToCompact``).

What a plan covers
==================

``covered_ids`` are the **real chain nodes** before the kept turn, in chain order:
``graph.chain(head)[:k]`` where ``k`` is the kept user node. With an active summary S
in the view, S's ``covers_ids`` are a contiguous part of that prefix, so the new
segment extends the old one and never names a summary (SPEC §8). The summarizer
input (``input_items``) is every item of the view before the cut: S's text and every
covered turn's visible items (its tool calls, results, inner calls), aged as rendered,
media as ``[image: …]`` placeholders. Hence covered ⊆ summarized (SPEC §8),
checkable after the fact with ``covered_in_input(plan, messages_sent)``.

Architecture Invariant: pure functions over the graph and view; no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SUMMARY_MARKER, SUMMARY_NAME, Call

from .aging import owner_chain_id
from .cancel import stop_if_cancelled
from .references import distinctive_identifiers
from .content import covers_of, json_text
from .summary_choice import is_chain_member
from .view import Item, View

__all__ = [
    "BELOW_THRESHOLD",
    "KEEP_MAX_SHARE",
    "KEEP_MAX_TOKENS",
    "KEEP_MIN_MESSAGES",
    "KEEP_MIN_TOKENS",
    "KEEP_RATIO",
    "NOTHING_TO_COMPACT",
    "SECTIONS",
    "SUMMARIZER_SYSTEM_PROMPT",
    "CutPlan",
    "Validation",
    "covered_in_input",
    "cut_decision",
    "fidelity_terms",
    "keep_target",
    "retry_messages",
    "select_cut",
    "split_stages",
    "stage_plan",
    "structural_summary",
    "summarized_ids",
    "summarizer_messages",
    "summary_node_input",
    "transcript_entry",
    "validate_summary",
    "with_candidate",
]

KEEP_RATIO = 0.10
KEEP_MIN_TOKENS = 8_000
KEEP_MAX_TOKENS = 40_000
#: The kept tail is never more than this share of the window (the small-window cap).
KEEP_MAX_SHARE = 0.20
#: Conversation messages the kept tail holds when the budget allows.
KEEP_MIN_MESSAGES = 4
#: The message minimum may keep at most this multiple of the target.
MESSAGE_RULE_MAX = 2
#: Default share of identifiers a summary must keep.
MIN_RETENTION = 0.5

BELOW_THRESHOLD = "belowThreshold"
NOTHING_TO_COMPACT = "nothingToCompact"

# Validation reasons.
EMPTY = "empty"
TOO_LONG = "tooLong"
NOT_SMALLER = "notSmaller"
LOW_FIDELITY = "lowFidelity"


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class CutPlan:
    """Where to cut a branch and what the summarizer must see."""

    head: str
    #: ordered ids of the real chain nodes the summary replaces (never a summary id)
    covered_ids: list[str]
    #: the part of ``covered_ids`` not covered by the previous summary
    new_covered_ids: list[str]
    #: first kept chain node (a real user turn)
    kept_from: str
    #: predecessor of the first covered node: where the summary node splices in
    summary_predecessor: str | None
    previous_summary_id: str | None
    #: the previous summary's text without the ``[Previous conversation summary]`` marker
    previous_summary_text: str | None
    #: every item the summarizer must see, in view order (the previous summary first)
    input_items: list[Item]
    #: the chain node (or summary) each input item belongs to, parallel to ``input_items``
    input_groups: list[str]
    #: covered chain nodes that render nothing (empty messages): trivially seen
    empty_ids: list[str]
    cut_index: int
    target_tokens: int
    #: tokens of all history items of the view (rendered, aged)
    tokens_before: int
    tokens_covered: int
    tokens_kept: int
    #: real user turns newly covered
    covered_turns: int
    #: ``(index, total)`` for one stage of a staged summary (``stage_plan``)
    stage: tuple[int, int] | None = None

    @property
    def input_ids(self) -> list[str]:
        """Ids whose content is in the summarizer input, first appearance order (the
        summary node's ``reads``)."""
        seen: set[str] = set()
        out: list[str] = []
        for it in self.input_items:
            if it.node_id not in seen:
                seen.add(it.node_id)
                out.append(it.node_id)
        return out


def keep_target(window: int, keep_recent_tokens: int | None = None) -> int:
    """Tokens the kept tail aims at (see the module docstring)."""
    if keep_recent_tokens is not None:
        if isinstance(keep_recent_tokens, bool) or not isinstance(keep_recent_tokens, int) or keep_recent_tokens < 0:
            raise DagctxError(
                "InvalidParams", f"keepRecentTokens must be a non-negative integer, got {keep_recent_tokens!r}"
            )
        return keep_recent_tokens
    desired = min(max(round(window * KEEP_RATIO), KEEP_MIN_TOKENS), KEEP_MAX_TOKENS)
    return max(1, min(desired, math.floor(window * KEEP_MAX_SHARE)))


def _is_user_boundary(item: Item, graph: SessionGraph) -> bool:
    if item.kind != "user" or item.depth != 0:
        return False
    node = graph.nodes.get(item.node_id)
    return node is not None and node.role == "user" and is_chain_member(graph, node)


def _is_conversation_message(item: Item, graph: SessionGraph) -> bool:
    if item.kind == "user":
        return _is_user_boundary(item, graph)
    return item.kind == "assistant" and item.depth == 0 and bool(item.text.strip())


def cut_decision(
    view: View,
    graph: SessionGraph,
    token_of_item: Callable[[Item], int],
    *,
    window: int,
    keep_recent_tokens: int | None = None,
) -> tuple[CutPlan | None, str]:
    """``(plan, "ok")`` or ``(None, "belowThreshold" | "nothingToCompact")``."""
    if view.frame is not None:
        raise DagctxError("InvalidParams", "compaction works on a branch view, not on a function frame view")
    items = view.items
    target = keep_target(window, keep_recent_tokens)
    toks = [max(0, int(token_of_item(it))) for it in items]
    total = sum(toks)
    if not items or total <= target:
        return None, BELOW_THRESHOLD

    n = len(items)
    tail = [0] * (n + 1)
    msgs = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        if not i & 1023:
            stop_if_cancelled()  # SPEC §1.4: planning a compaction is cancellable
        tail[i] = tail[i + 1] + toks[i]
        msgs[i] = msgs[i + 1] + (1 if _is_conversation_message(items[i], graph) else 0)
    i_tok = max(i for i in range(n) if tail[i] >= target)

    users = [b for b in range(n) if _is_user_boundary(items[b], graph)]
    first_real = next((i for i, it in enumerate(items) if it.kind != "summary"), n)
    bounds = [b for b in users if b > first_real]
    if not bounds:
        return None, NOTHING_TO_COMPACT
    # tokens: the earliest cut whose tail fits the target (snap forward to a user message)
    cut = next((b for b in bounds if b >= i_tok), bounds[-1])
    # messages: keep at least four conversation messages when possible -- unless the
    # last two turns alone exceed the target (then the newest turn alone may stay)
    last_two = users[-2] if len(users) >= 2 else users[-1] if users else 0
    if tail[last_two] <= target:
        enough = [b for b in bounds if msgs[b] >= KEEP_MIN_MESSAGES]
        goal = enough[-1] if enough else bounds[0]
        if goal < cut:
            cut = next((b for b in bounds if goal <= b < cut and tail[b] <= MESSAGE_RULE_MAX * target), cut)

    before = math.inf if view.before_seq is None else view.before_seq
    chain = [c for c in graph.chain(view.head) if c.seq < before]
    index = {c.id: i for i, c in enumerate(chain)}
    kept_from = items[cut].node_id
    k = index.get(kept_from)
    if k is None:  # pragma: no cover - a user boundary is always on the chain
        raise DagctxError("InvalidParams", f"kept node {kept_from!r} is not on the branch of {view.head!r}")
    covered = [c.id for c in chain[:k]]

    prev_id: str | None = None
    prev_text: str | None = None
    old_covers: list[str] = []
    cache: dict[str, str] = {}
    input_items = list(items[:cut])
    groups: list[str] = []
    stop_if_cancelled()
    for k, it in enumerate(input_items):
        if not k & 1023:
            stop_if_cancelled()
        if it.kind == "summary":
            prev_id = it.node_id
            prev_text = _strip_marker(it.text)
            old_covers = covers_of(graph.nodes[it.node_id])
            groups.append(it.node_id)
        else:
            groups.append(owner_chain_id(graph, it.node_id, cache))
    old = set(old_covers)
    new_covered = [c for c in covered if c not in old]
    grouped = set(groups)
    empty = [c for c in new_covered if c not in grouped]
    covered_turns = sum(1 for c in new_covered if graph.nodes[c].role == "user")
    if not new_covered:
        return None, NOTHING_TO_COMPACT
    plan = CutPlan(
        head=view.head,
        covered_ids=covered,
        new_covered_ids=new_covered,
        kept_from=kept_from,
        summary_predecessor=chain[0].predecessor,
        previous_summary_id=prev_id,
        previous_summary_text=prev_text,
        input_items=input_items,
        input_groups=groups,
        empty_ids=empty,
        cut_index=cut,
        target_tokens=target,
        tokens_before=total,
        tokens_covered=total - tail[cut],
        tokens_kept=tail[cut],
        covered_turns=covered_turns,
    )
    return plan, "ok"


def select_cut(
    view: View,
    graph: SessionGraph,
    token_of_item: Callable[[Item], int],
    *,
    window: int,
    keep_recent_tokens: int | None = None,
) -> CutPlan | None:
    """The cut for ``view`` or None when there is nothing to compact (see ``cut_decision``)."""
    plan, _ = cut_decision(view, graph, token_of_item, window=window, keep_recent_tokens=keep_recent_tokens)
    return plan


def _strip_marker(text: str) -> str:
    t = text.strip()
    while t.startswith(SUMMARY_MARKER):
        t = t[len(SUMMARY_MARKER) :].lstrip()
    return t


# ---------------------------------------------------------------- summarizer prompt

#: The five sections of SPEC §8, in order: (heading, what goes in it).
SECTIONS: tuple[tuple[str, str], ...] = (
    ("1. User intent", "the user's overall goal, in one or two sentences."),
    (
        "2. Decisions and constraints",
        "every specific instruction, preference, constraint and decision the user stated, close to their "
        "own words; later instructions override earlier ones.",
    ),
    (
        "3. Work completed",
        "files read, created or changed, commands run and what they returned, conclusions reached — with "
        "exact paths, ids, values and error messages.",
    ),
    (
        "4. Outstanding",
        "what the user is still waiting for: unfinished steps, open questions, failing checks, and the "
        "immediate next step.",
    ),
    (
        "5. Active context",
        "the state the work depends on: working directory, branches, running services and their ports, "
        "open files, environment settings, the names and ids currently in use.",
    ),
)

SUMMARIZER_SYSTEM_PROMPT = (
    "You compact the context of an AI agent. You write a working summary of an earlier part of a "
    "conversation between a user and an assistant that uses tools. Your summary replaces those "
    "messages: whatever you leave out is lost to the assistant.\n"
    "Rules:\n"
    "- Be concrete: name files, paths, commands, functions, classes, ids, hashes, URLs, ports, numbers "
    "and error messages.\n"
    "- Copy every identifier exactly as written, character for character. Never shorten, paraphrase or "
    "invent an identifier.\n"
    "- Write only the summary: no preamble such as \"Here is a summary\", no closing remarks, no hedging, "
    "no advice, no questions.\n"
    "- Do not answer, continue or comment on the conversation, and do not address the user.\n"
    "- Write in the language the conversation mostly uses."
)

_FORMAT_RULES = (
    "Use exactly these five sections, as Markdown headings, in this order:\n"
    + "\n".join(f"## {head}\n{what}" for head, what in SECTIONS)
    + "\nKeep identifiers verbatim: file paths, ids, hashes, URLs, host:port pairs and ports, function and "
    "class names, commands. Write \"none\" under a section that has nothing."
)

_FRESH_TASK = (
    "Summarize the conversation above for the assistant that will continue it without seeing it.\n"
    + _FORMAT_RULES
)

_UPDATE_TASK = (
    "Update the previous summary with the new messages above. Merge the new messages in, drop details "
    "that are no longer true, and refresh progress and next steps. Where the new messages contradict the "
    "previous summary, the new messages win. Keep everything from the previous summary that still "
    "matters: it is the only record of that earlier part of the conversation. Output the complete "
    "updated summary.\n" + _FORMAT_RULES
)

_EARLIER = "[summary of the conversation before this point]"


def _item_body(item: Item) -> str:
    """The content of an item as the summarizer sees it (also what the coverage check seeks)."""
    if item.kind == "summary":
        return _strip_marker(item.text)
    if item.kind == "tool_call":
        if item.input is None:
            return ""
        return item.input if isinstance(item.input, str) else json_text(item.input)
    return item.text


def _item_header(item: Item) -> str:
    kind = item.kind
    if kind == "summary":
        return _EARLIER
    if kind == "user":
        return "[user]" if item.depth == 0 else "[prompt of an inner model call]"
    if kind == "assistant":
        return "[assistant]" if item.depth == 0 else "[reply of an inner model call]"
    if kind == "tool_call":
        return f"[tool call: {item.name or 'tool'}]"
    if kind == "tool_result":
        return f"[tool result: {item.name or 'tool'}]"
    if item.name == "ask_user":
        return "[assistant]" if item.part == "call" else "[user]"
    return "[function call]" if item.part == "call" else "[function result]"


def transcript_entry(item: Item) -> str:
    """One item as a transcript entry: a bracketed header line, then its content."""
    body = _item_body(item)
    return f"{_item_header(item)}\n{body}" if body else _item_header(item)


def summarizer_messages(
    plan: CutPlan,
    *,
    instructions: str | None = None,
    update: bool | None = None,
    max_chars: int | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """``(systemPrompt, messages)`` for an MCP-style ``sampling/createMessage`` request.

    One user message: the transcript of ``plan.input_items``, then the task. ``update``
    (default: whether the plan has a previous summary) puts the previous summary in
    ``<previous-summary>`` and asks for a merge; without update mode a previous summary
    is the first transcript entry. ``instructions`` (the user's ``/compact`` focus) are
    appended; ``max_chars`` adds a length limit to the task.
    """
    prev = plan.previous_summary_text
    if update is None:
        update = prev is not None
    use_update = bool(update) and prev is not None
    entries = [transcript_entry(it) for it in plan.input_items if it.kind != "summary"]
    if prev is not None and not use_update:
        entries.insert(0, f"{_EARLIER}\n{prev}")
    parts: list[str] = []
    if plan.stage is not None and plan.stage[1] > 1:
        i, total = plan.stage
        parts.append(
            f"The conversation is too long for one request; this is part {i} of {total}, in order."
            + (" The previous summary covers the parts before it." if use_update and i > 1 else "")
        )
    tag = "new-messages" if use_update else "conversation"
    if use_update:
        parts.append(f"<previous-summary>\n{prev}\n</previous-summary>")
    parts.append(f"<{tag}>\n" + "\n\n".join(entries) + f"\n</{tag}>")
    parts.append(_UPDATE_TASK if use_update else _FRESH_TASK)
    if instructions and instructions.strip():
        parts.append("Additional instructions from the user for this summary:\n" + instructions.strip())
    if max_chars is not None:
        parts.append(f"Keep the whole summary under {max_chars} characters.")
    text = "\n\n".join(parts)
    return SUMMARIZER_SYSTEM_PROMPT, [{"role": "user", "content": {"type": "text", "text": text}}]


def retry_messages(messages: Sequence[dict[str, Any]], missing: Sequence[str]) -> list[dict[str, Any]]:
    """A copy of ``messages`` whose last user message also lists the ``missing`` identifiers."""
    note = (
        "\n\nYour previous answer was not a usable summary: it left out identifiers the conversation "
        "depends on. Write the complete summary again, in the five sections, and copy each of these "
        "exactly where it belongs:\n" + "\n".join(f"- {m}" for m in missing)
    )
    out = [dict(m) for m in messages]
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user":
            content = out[i].get("content")
            if isinstance(content, dict) and content.get("type") == "text":
                out[i]["content"] = {**content, "text": str(content.get("text", "")) + note}
            elif isinstance(content, str):
                out[i]["content"] = content + note
            elif isinstance(content, list):
                out[i]["content"] = [*content, {"type": "text", "text": note.lstrip()}]
            else:
                continue
            return out
    out.append({"role": "user", "content": {"type": "text", "text": note.lstrip()}})
    return out


# ---------------------------------------------------------------- stages

#: Long lines are cut into segments of this many characters for staging and coverage.
_SEGMENT_CHARS = 1000


def _segments(text: str) -> list[str]:
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= _SEGMENT_CHARS:
            out.append(line)
        else:
            out.extend(line[i : i + _SEGMENT_CHARS] for i in range(0, len(line), _SEGMENT_CHARS))
    return out


def _with_body(item: Item, body: str) -> Item:
    if item.kind == "tool_call":
        return replace(item, input=body)
    return replace(item, text=body, content=[{"type": "text", "text": body}])


def split_stages(plan: CutPlan, max_input_tokens: int, count: Callable[[str], int]) -> list[list[Item]]:
    """``plan.input_items`` in consecutive stages of at most ``max_input_tokens`` each.

    Counted on transcript entries (``transcript_entry``); the instructions around them
    are not included, so pass the summarizer's input budget minus the prompt overhead.
    Items stay whole and in order; an item larger than a whole stage is cut at line
    boundaries (long lines at ``1000``-character segments) into pieces marked
    ``(part k of n)``, one stage after another. The previous summary stays in the first
    stage whatever its size. Summarize stage 1 (update mode when there is a previous
    summary), then each next stage in update mode with the summary so far
    (``stage_plan``); the last answer is the summary of the whole prefix.
    """
    if max_input_tokens <= 0:
        raise DagctxError("InvalidParams", f"max_input_tokens must be positive, got {max_input_tokens}")
    stages: list[list[Item]] = []
    cur: list[Item] = []
    cur_tokens = 0

    def flush() -> None:
        nonlocal cur, cur_tokens
        if cur:
            stages.append(cur)
        cur, cur_tokens = [], 0

    for it in plan.input_items:
        stop_if_cancelled()  # each item is a tokenization
        t = count(transcript_entry(it)) + 2
        if it.kind == "summary":
            cur.append(it)
            cur_tokens += t
            continue
        if t <= max_input_tokens:
            if cur and cur_tokens + t > max_input_tokens:
                flush()
            cur.append(it)
            cur_tokens += t
            continue
        flush()
        header_tokens = count(_item_header(it)) + 8
        pieces: list[list[str]] = []
        group: list[str] = []
        group_tokens = header_tokens
        for seg in _segments(_item_body(it)):
            st = count(seg) + 1
            if group and group_tokens + st > max_input_tokens:
                pieces.append(group)
                group, group_tokens = [], header_tokens
            group.append(seg)
            group_tokens += st
        if group:
            pieces.append(group)
        total = len(pieces)
        for k, segs in enumerate(pieces, 1):
            piece = _with_body(it, f"(part {k} of {total})\n" + "\n".join(segs))
            if k < total:
                stages.append([piece])
            else:
                cur, cur_tokens = [piece], header_tokens + sum(count(s) + 1 for s in segs)
    flush()
    return stages


def stage_owners(plan: CutPlan) -> dict[str, str]:
    """Item node id → the chain node (or summary) it belongs to, for ``stage_plan``."""
    return dict(zip((it.node_id for it in plan.input_items), plan.input_groups))


def stage_plan(
    plan: CutPlan,
    items: list[Item],
    *,
    index: int,
    total: int,
    previous_text: str | None = None,
    owner: dict[str, str] | None = None,
) -> CutPlan:
    """The plan for one stage (1-based ``index`` of ``total``): its items, and as previous
    summary ``previous_text`` (the summary of the stages before; for stage 1 the plan's
    own previous summary when ``previous_text`` is None)."""
    prev = previous_text if previous_text is not None else (plan.previous_summary_text if index == 1 else None)
    if owner is None:  # pass stage_owners(plan) when building many stages of one plan
        owner = stage_owners(plan)
    return replace(
        plan,
        input_items=list(items),
        input_groups=[owner.get(it.node_id, it.node_id) for it in items],
        previous_summary_text=prev,
        stage=(index, total),
    )


# ---------------------------------------------------------------- coverage (defect 1)


def _message_texts(messages: Any) -> list[str]:
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            if "content" in v:
                walk(v["content"])
            elif isinstance(v.get("text"), str):
                out.append(v["text"])
            if isinstance(v.get("systemPrompt"), str):
                out.append(v["systemPrompt"])
            if "messages" in v:
                walk(v["messages"])
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(messages)
    return out


def summarized_ids(plan: CutPlan, messages_sent: Any) -> set[str]:
    """Node ids whose content was in ``messages_sent`` (one request's messages, or a list
    of several requests' messages for a staged summary).

    An item was sent when its content is a substring of the sent text, or — for items
    split across stages — when every line segment of it is. A node counts when all its
    items were sent; a chain node when all items of its turn part (itself, its tool
    calls and results, inner calls) were; the previous summary's ``covers_ids`` when its
    text was; covered nodes that render nothing always count.
    """
    joined = "\n".join(_message_texts(messages_sent))
    pos = 0
    found: list[bool] = []
    for it in plan.input_items:
        body = _item_body(it)
        if not body:
            found.append(True)
            continue
        i = joined.find(body, pos)
        if i < 0:
            i = joined.find(body)
        if i >= 0:
            pos = i + len(body)
            found.append(True)
            continue
        found.append(all(seg in joined for seg in _segments(body) if seg.strip()))
    node_ok: dict[str, bool] = {}
    group_ok: dict[str, bool] = {}
    for it, group, ok in zip(plan.input_items, plan.input_groups, found):
        node_ok[it.node_id] = node_ok.get(it.node_id, True) and ok
        group_ok[group] = group_ok.get(group, True) and ok
    # a chain node counts by its whole turn part, any other node by its own items
    out = {nid for nid, ok in node_ok.items() if ok and nid not in group_ok}
    out |= {g for g, ok in group_ok.items() if ok}
    out.update(plan.empty_ids)
    if plan.previous_summary_id is not None and group_ok.get(plan.previous_summary_id):
        covered_by_old = set(plan.covered_ids) - set(plan.new_covered_ids)
        out.update(covered_by_old)
    return out


def covered_in_input(plan: CutPlan, messages_sent: Any) -> bool:
    """True when every covered chain node's content was in the summarizer input."""
    return set(plan.covered_ids) <= summarized_ids(plan, messages_sent)


# ---------------------------------------------------------------- validation


@dataclass(frozen=True, slots=True)
class Validation:
    ok: bool
    #: None when ok, else ``empty`` | ``tooLong`` | ``notSmaller`` | ``lowFidelity``
    reason: str | None
    #: share of ``identifiers`` the summary keeps (1.0 when there are none)
    retention: float
    #: identifiers the summary left out (for ``retry_messages``)
    missing: list[str] = field(default_factory=list)


def _kept(ident: str, text: str, folded: str) -> bool:
    if ident in text:
        return True
    if ident.endswith("()") and ident[:-2] in text:
        return True
    return ident.casefold() in folded


def validate_summary(
    text: str | None,
    plan: CutPlan | None = None,
    *,
    tokens_before: int,
    candidate_tokens_after: int,
    max_chars: int | None,
    identifiers: Sequence[str],
    min_retention: float = MIN_RETENTION,
) -> Validation:
    """May this summary be written? Checks, in order: non-empty after stripping (the
    marker alone is empty) → ``empty``; at most ``max_chars`` → ``tooLong``; the
    candidate render (summary applied, same aging boundary) strictly smaller than
    before → ``notSmaller``; keeps at least ``min_retention`` of ``identifiers``
    (``fidelity_terms(plan)``) → ``lowFidelity`` with the ``missing`` list.
    ``plan`` is accepted for symmetry with the pipeline and not needed otherwise."""
    del plan
    body = _strip_marker(text or "")
    if not body:
        return Validation(False, EMPTY, 0.0, list(identifiers))
    if max_chars is not None and len(body) > max_chars:
        return Validation(False, TOO_LONG, 0.0, [])
    if candidate_tokens_after >= tokens_before:
        return Validation(False, NOT_SMALLER, 0.0, [])
    idents = list(dict.fromkeys(identifiers))
    if not idents:
        return Validation(True, None, 1.0, [])
    folded = body.casefold()
    missing = [i for i in idents if not _kept(i, body, folded)]
    retention = (len(idents) - len(missing)) / len(idents)
    if retention < min_retention:
        return Validation(False, LOW_FIDELITY, retention, missing)
    return Validation(True, None, retention, missing)


_CONTENT_WORD = re.compile(r"\b[A-Za-z][a-z]{6,}\b", re.ASCII)
_COMMON_WORDS = frozenset(
    """
    because between through without another already however something anything everything nothing
    should would could please thanks believe example following instead actually whether further
    include including different possible currently running results result question answer assistant
    message messages conversation summary function functions command commands output outputs
    """.split()
)


def fidelity_terms(plan: CutPlan, top: int = 20, *, min_identifiers: int = 5, fill_to: int = 10) -> list[str]:
    """What the fidelity gate checks: the ``top`` most distinctive identifiers of the
    summarizer input (``references.distinctive_identifiers``). When fewer than
    ``min_identifiers`` exist (plain chat), the list is topped up to ``fill_to`` with the
    most frequent long English content words, so a non-answer ("I'm ready to help")
    still fails. Text without either (e.g. Chinese prose) has no gate."""
    texts = [_item_body(it) for it in plan.input_items]
    idents = distinctive_identifiers(texts, top)
    if len(idents) >= min_identifiers:
        return idents
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    n = 0
    for t in texts:
        for m in _CONTENT_WORD.finditer(t):
            w = m.group(0).lower()
            if w in _COMMON_WORDS:
                continue
            counts[w] = counts.get(w, 0) + 1
            first.setdefault(w, n)
            n += 1
    have = {i.casefold() for i in idents}
    words = [w for w in sorted(counts, key=lambda w: (-counts[w], first[w])) if counts[w] >= 2 and w not in have]
    return idents + words[: max(0, fill_to - len(idents))]


# ---------------------------------------------------------------- structural fallback

_KEY_ARGS = ("file_path", "path", "filePath", "filename", "command", "cmd", "pattern", "query", "url", "name", "id")
STRUCTURAL_HEADER = (
    "[Structural summary: generated mechanically, without a model. It lists what happened in the "
    "earlier conversation; it is not a written summary.]"
)


def _one_line(text: str, limit: int) -> str:
    t = " ".join(text.split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def _key_args(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        keys = [k for k in _KEY_ARGS if k in value][:2] or list(value)[:2]
        parts = []
        for k in keys:
            v = value[k]
            s = v if isinstance(v, str) else json_text(v)
            parts.append(f"{k}={_one_line(s, 120)!r}" if isinstance(v, str) else f"{k}={_one_line(s, 120)}")
        return ", ".join(parts)
    s = value if isinstance(value, str) else json_text(value)
    return _one_line(s, 120)


def structural_summary(plan: CutPlan) -> str:
    """The deterministic fallback (``fallback: "structural"``, opt-in only): the earlier
    summary verbatim, the user's requests, the tool calls made (name and key
    arguments), the files and identifiers mentioned, and the last assistant reply.
    Clearly labelled as structural. Same plan, same text."""
    items = plan.input_items
    out = [STRUCTURAL_HEADER]
    if plan.previous_summary_text:
        out += ["", "Earlier summary (verbatim):", plan.previous_summary_text]
    requests = [it.text for it in items if it.kind == "user" and it.depth == 0 and it.text.strip()]
    if requests:
        out += ["", f"User requests ({len(requests)}):"]
        shown = list(enumerate(requests, 1))
        if len(shown) > 40:
            shown = shown[:10] + [(0, f"… {len(requests) - 40} requests omitted …")] + shown[-30:]
        out += [f"{n}. {_one_line(t, 300)}" if n else t for n, t in shown]
    calls = [it for it in items if it.kind == "tool_call" or (it.kind == "text_pair" and it.part == "call")]
    if calls:
        out += ["", f"Tool calls ({len(calls)}):"]
        lines = [f"- {c.name or 'function'}({_key_args(c.input)})" for c in calls]
        if len(lines) > 60:
            lines = lines[:20] + [f"- … {len(lines) - 60} calls omitted …"] + lines[-40:]
        out += lines
    # a superset of fidelity_terms(plan): the fallback keeps what the gate checks
    idents = fidelity_terms(plan, 40, fill_to=20)
    if idents:
        out += ["", "Files, identifiers and key terms mentioned:", ", ".join(idents)]
    last = next((it for it in reversed(items) if it.kind == "assistant" and it.depth == 0 and it.text.strip()), None)
    if last is not None:
        out += ["", "Last assistant reply:", _one_line(last.text, 800)]
    return "\n".join(out)


# ---------------------------------------------------------------- the node


def summary_node_input(
    plan: CutPlan,
    text: str,
    *,
    model: str | None,
    stats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``NodeInput`` fields of the one summary node to append (SPEC §8).

    ``output`` carries the marker exactly once; ``reads`` are the ids whose content
    the summarizer saw; ``metadata.covers_ids`` the real covered chain ids;
    ``metadata.stats`` whatever the engine measured (tokens before/after, retention,
    trigger, duration…). No id, seq or time: the ledger assigns them.
    """
    body = _strip_marker(text)
    meta: dict[str, Any] = {
        "covers_ids": list(plan.covered_ids),
        # the head this summary was made for: which heads use it (SPEC §8)
        "head": plan.head,
        "compaction": True,
        "previous_summary": plan.previous_summary_id,
        "kept_from": plan.kept_from,
        "model": model,
    }
    if stats:
        meta["stats"] = dict(stats)
    return {
        "role": "llm",
        "name": SUMMARY_NAME,
        "output": f"{SUMMARY_MARKER}\n{body}",
        "status": "completed",
        "predecessor": plan.summary_predecessor,
        "reads": plan.input_ids,
        "metadata": meta,
    }


def with_candidate(
    graph: SessionGraph,
    node_input: dict[str, Any],
    *,
    node_id: str = "summary_candidate",
    seq: int | None = None,
    created_at: float = 0.0,
) -> SessionGraph:
    """A copy of ``graph`` with the candidate summary added (the original is untouched):
    render it with the same ``aged`` map to measure the candidate's ``tokensAfter``
    before anything is written (SPEC §8)."""
    g = SessionGraph(graph.session_id, graph.root_id)
    g.nodes = dict(graph.nodes)
    g.conv_children = {k: list(v) for k, v in graph.conv_children.items()}
    g.callees = {k: list(v) for k, v in graph.callees.items()}
    g.by_seq = list(graph.by_seq)
    g.rev = graph.rev
    next_seq = (graph.by_seq[-1].seq + 1) if graph.by_seq else 1
    g.add(
        Call(
            id=node_id,
            seq=next_seq if seq is None else seq,
            created_at=created_at,
            role="llm",
            name=str(node_input.get("name", SUMMARY_NAME)),
            output=node_input.get("output"),
            status=node_input.get("status", "completed"),
            caller=node_input.get("caller"),
            predecessor=node_input.get("predecessor"),
            reads=list(node_input.get("reads") or []),
            metadata=dict(node_input.get("metadata") or {}),
        )
    )
    return g
