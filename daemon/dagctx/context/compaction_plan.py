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

Keep-tail target: ``keep_recent_tokens`` when given, else 5 % of the window clamped
to 4,000–20,000 tokens, and never more than 10 % of the window (SPEC §8, the
small-window cap): a compacted request must leave room to grow, or the next compaction
follows a few requests later and every one rewrites the whole prompt cache; what a
compaction leaves is read from the cache by every request until the next one. Items are
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

Rooms: this module (the cut, what a summary covers, the node to append);
``summarizer_input.py`` (what the summarizer sees: the prompt, stages, and the coverage
check of what was sent); ``summary_check.py`` (whether an answer may be written, and the
structural fallback).

Architecture Invariant: pure functions over the graph and view; no I/O, no clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, repeat
from itertools import chain as joined
from operator import sub
from dataclasses import dataclass
from typing import Any

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SUMMARY_MARKER, SUMMARY_NAME, Call

from .aging import owner_cache, owner_chain_id
from .artifact_trail import trail_files, with_trail
from .cancel import stop_if_cancelled
from .content import covers_of
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
    "CutPlan",
    "cut_decision",
    "keep_target",
    "select_cut",
    "strip_marker",
    "summary_node_input",
    "with_candidate",
]

KEEP_RATIO = 0.05
KEEP_MIN_TOKENS = 4_000
KEEP_MAX_TOKENS = 20_000
#: The kept tail is never more than this share of the window (the small-window cap).
KEEP_MAX_SHARE = 0.10
#: Conversation messages the kept tail holds when the budget allows.
KEEP_MIN_MESSAGES = 4
#: The message minimum may keep at most this multiple of the target.
MESSAGE_RULE_MAX = 2

BELOW_THRESHOLD = "belowThreshold"
NOTHING_TO_COMPACT = "nothingToCompact"


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
        return list(dict.fromkeys([it.node_id for it in self.input_items]))


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


def _walk_groups(view: View, n: int) -> list[str] | None:
    """The group of each of the first ``n`` items of ``view`` (what ``cut_decision`` finds
    with ``owner_chain_id``, a summary's its own id) read off ``View.parts``: the walk
    renders a chain node's turn part — the node, and below it by the caller edge only
    nodes of no chain — as one run of items, so an item's owner is the chain node of the
    run it is in, and the summary's run is the summary alone. None when the view has no
    parts (then each is looked up)."""
    if view.parts is None:
        return None
    starts, ids = view.parts
    if n and (not starts or starts[0] != 0 or len(starts) != len(ids)):
        return None  # (a walk's first item begins its first part: not a walk's parts)
    k = bisect_left(starts, n)  # the parts that begin before item ``n``
    ends = starts[1:k]
    ends.append(n)
    # each part's id, as many times as it has items before ``n`` (in C: thousands of parts)
    return list(joined.from_iterable(map(repeat, ids[:k], map(sub, ends, starts[:k]))))


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
    # a counter may measure every item in one loop (``many``: the same numbers)
    many = getattr(token_of_item, "many", None)
    toks = many(items) if many is not None else [max(0, int(token_of_item(it))) for it in items]
    total = sum(toks)
    if not items or total <= target:
        return None, BELOW_THRESHOLD

    n = len(items)
    # conversation messages (user boundaries, and top-level assistant texts with more than
    # whitespace: ``bool(text.strip())`` without a copy of each reply) and user boundaries
    stop_if_cancelled()  # SPEC §1.4: planning a compaction is cancellable
    conv = [0] * n
    users: list[int] = []
    for i in [i for i, it in enumerate(items) if it.kind == "user" or it.kind == "assistant"]:
        it = items[i]
        if it.kind == "user":
            if _is_user_boundary(it, graph):
                users.append(i)
                conv[i] = 1
        elif it.depth == 0 and (text := it.text) and not text.isspace():
            conv[i] = 1
    stop_if_cancelled()
    # what the tail from each position holds (tail[n] = msgs[n] = 0)
    tail = list(accumulate(reversed(toks), initial=0))[::-1]
    msgs = list(accumulate(reversed(conv), initial=0))[::-1]
    # the last position whose tail still holds the target (tails shrink toward the end)
    i_tok = n - 1
    while tail[i_tok] < target:
        i_tok -= 1

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
    input_items = list(items[:cut])
    stop_if_cancelled()
    # each item's group: a summary is its own, any other item its owner — read off the
    # walk's parts when the view has them, else looked up (cached for most)
    groups = _walk_groups(view, cut)
    if groups is None:
        cache = owner_cache(graph)
        owner = cache.get
        groups = [it.node_id if it.kind == "summary" else owner(it.node_id) or owner_chain_id(graph, it.node_id, cache)
                  for it in input_items]
    stop_if_cancelled()
    summaries = [it for it in input_items if it.kind == "summary"]
    if summaries:  # the last summary in the view is the previous one
        it = summaries[-1]
        prev_id = it.node_id
        prev_text = strip_marker(it.text)
        old_covers = covers_of(graph.nodes[it.node_id])
    old = set(old_covers)
    new_covered = [c for c in covered if c not in old]
    grouped = set(groups)
    empty = [c for c in new_covered if c not in grouped]
    nodes = graph.nodes
    covered_turns = [nodes[c].role for c in new_covered].count("user")
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


def strip_marker(text: str) -> str:
    t = text.strip()
    while t.startswith(SUMMARY_MARKER):
        t = t[len(SUMMARY_MARKER) :].lstrip()
    return t


# ---------------------------------------------------------------- the node


def summary_node_input(
    plan: CutPlan,
    text: str,
    *,
    model: str | None,
    stats: dict[str, Any] | None = None,
    trail: list[str] | None = None,
) -> dict[str, Any]:
    """The ``NodeInput`` fields of the one summary node to append (SPEC §8).

    ``output`` carries the marker exactly once; ``reads`` are the ids whose content
    the summarizer saw; ``metadata.covers_ids`` the real covered chain ids;
    ``metadata.stats`` whatever the engine measured (tokens before/after, retention,
    trigger, duration…). No id, seq or time: the ledger assigns them. The body ends
    with the artifact trail of the summarized part (``artifact_trail``: the files it
    changed, the previous summary's included), whatever the summarizer wrote; ``trail``:
    ``trail_files(plan.input_items)``, when the caller has it already.
    """
    body = with_trail(strip_marker(text), trail_files(plan.input_items) if trail is None else trail)
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
    # the child lists are shared with ``graph``; the two the candidate joins are copied first
    g.conv_children = dict(graph.conv_children)
    g.callees = dict(graph.callees)
    g.by_seq = list(graph.by_seq)
    g.rev = graph.rev
    g.lineage = graph.lineage  # the same nodes: what was derived from ``graph`` holds for the copy
    # the last branch ``graph`` walked: the candidate, a summary beside the branch, is no
    # node's predecessor, so every branch of the copy is the original's (the walk of a
    # 10k-node branch, checks included, is most of the candidate render otherwise)
    g._chain_head, g._chain_ids, g._chain_pos = graph._chain_head, graph._chain_ids, graph._chain_pos
    if graph._chain_nodes is not None and graph._chain_seen == len(graph.updates):
        # its nodes too (the same objects: the copy has replaced none of them)
        g._chain_nodes, g._chain_seen = graph._chain_nodes, len(g.updates)
    next_seq = (graph.by_seq[-1].seq + 1) if graph.by_seq else 1
    node = Call(
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
    for edges, key in ((g.conv_children, node.predecessor), (g.callees, node.caller)):
        if key in edges:
            edges[key] = list(edges[key])
    g.add(node)
    return g
