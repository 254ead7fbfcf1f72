"""Tool-result aging: old, large, unused tool results shrink to a placeholder. No LLM.

SPEC §8. ``plan_aging`` looks at a rendered ``View`` and decides, for
every tool result in it, whether the model still needs it verbatim. The decision is
returned as ``AgingPlan.aged`` (node id → replacement text), which is exactly the
``aged`` argument of ``render_view``: the ledger is never touched, aging is part of
the view.

Gates
=====

A result ages only when **all** of these pass (each one alone blocks it; the first
one that blocks is recorded in ``AgingPlan.decisions`` under the name in brackets):

1. the tool is not exempt (``exempt``): ``AgingPolicy.exempt_tools``, compared
   case-insensitively, holds tools whose results are the agent's working memory
   (todo lists, plans, memory reads). Their results are small and the agent relies
   on seeing the latest state;
2. it is not among the first ``protect_first`` messages of the view
   (``protectedFirst``; usually the initial task, SPEC §8). A message is a
   provider message: an assistant item and its tool calls are one message, and the
   consecutive results of one call group are one message;
3. turn distance ``>= keep_recent_turns`` (``recentTurn``). By default turns are
   real user turns as numbered by the view (``view.turn_count - item.turn``): a
   summary node is not a turn (SPEC §8), the turns it covers still count.
   ``turn_unit="step"`` counts top-level model calls instead ("assistant
   turns"): one long autonomous user turn with a hundred tool calls has a hundred
   steps but only one user turn, so under the default nothing in it ever ages
   (``bench/bench_aging.py`` shows both). Steps are numbered along the chain, covered
   ones included, so a summary does not shift them either;
4. ``node.seq <= boundary_seq`` (``boundary``): only results at or before the
   committed aging boundary may age. The boundary advances only when a turn is
   committed (``boundary_after_commit``), so between two commits the set of aged
   results cannot grow and the rendered prefix stays byte-stable for prompt caches.
   ``boundary_seq=None`` means no boundary was committed yet: nothing ages;
5. wall-clock age ``now - node.created_at >= min_age_seconds`` (``tooRecent``);
6. size: ``token_of(node id) >= min_tokens`` (``tooSmall``);
7. not cited later (``cited``): none of the result's ``max_refs_per_result`` most
   frequent references (``references.top_references``) is cited by a later
   *mention*. A mention of a reference cites the newest result before it that holds
   the reference: when a later result repeats it (the file was read again, a
   project-wide name such as ``session_id`` shows up in every read), mentions after
   that later result are attributed to it, and the old copy may age. A result's
   references are its ranked list of ``STORED_REFERENCES`` (``stored_references``),
   mined once when it is written and kept in the ledger beside its token counts
   (``refs_of``): "holds" means "is in that list", so no render reads a result's
   whole text for the gate, however many megabytes old sessions hold. Without this
   rule every old read in a coding session stays pinned forever by the names the
   agent keeps using (``bench/bench_aging.py``). Mentions are what the user or the
   model wrote after the result:
   user messages (and ask-user answers, summaries) of any turn, and the model's
   text, tool-call arguments and function calls of turns *before* the current one.
   The current turn's own model output counts from the next turn on: this keeps a
   turn in progress from flipping a decision (byte-stable prefix within a turn).
   Other tool results are not mentions (an ``ls`` repeating a path cites nothing).

Passing results are replaced:

- **soft trim** while ``distance < hard_clear_after_turns``: the first
  ``soft_trim_head_chars`` and last ``soft_trim_tail_chars`` characters around the
  marker ``\\n[… aged: N of M characters omitted from this old tool result …]\\n``.
  A result not longer than head + tail would not shrink: it stays (``noGain``)
  until it is old enough for a hard clear;
- **hard clear** once ``distance >= hard_clear_after_turns``:
  ``[tool result aged out: <tool>, <M> characters / <T> tokens removed; call the
  tool again if you need it]``.

Single-result cap
=================

Independently of every gate — for the newest turn, exempt tools, protected and cited
results alike — no single result may exceed ``max_single_result_share`` of the
context window (default 50 %): a larger one is cut to head + tail around
``\\n[… truncated: N of M characters omitted; one tool result may use at most P % of
the context window …]\\n``, sized with ``count`` to fit. A result that also passes
the aging gates gets its (smaller) aging replacement instead.

Determinism
===========

Replacement texts depend only on the stored output, the policy, the window and the
counter — no clock, no ids, no randomness — so the same decision renders the same
bytes any day. ``AgingPlan.kinds`` (id → ``softTrim`` | ``hardClear`` | ``capped``)
plus the policy, window and boundary are enough to rebuild ``aged`` for replay
(``rebuild_aged``); record them in the render manifest.

The policy, the plan's records and the replacement texts are ``aging_policy.py``; this
module exports them with its own names (``__all__``), so ``aging`` is the one API.

Architecture Invariant: pure functions, no I/O, no clock (``now`` is a parameter).
"""

from __future__ import annotations

import math
import weakref
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence

from dagctx.context.cancel import stop_if_cancelled
from dagctx.ledger.graph import SessionGraph

from .aging_policy import (
    AGING_POLICY_VERSION,
    CAPPED,
    DEFAULT_EXEMPT_TOOLS,
    DEFAULT_POLICY,
    GATE_AGE,
    GATE_BOUNDARY,
    GATE_CITED,
    GATE_EXEMPT,
    GATE_FIRST,
    GATE_SIZE,
    GATE_TURN,
    HARD_CLEAR,
    NO_GAIN,
    NO_RESULT,
    SOFT_TRIM,
    TURN_UNITS,
    AgingPlan,
    AgingPolicy,
    AgingStats,
    cap_limit,
    cap_text,
    hard_clear_text,
    result_text,
    soft_trim_text,
    stored_references,
)
from .content import covers_of, json_text
from .references import MentionIndex
from .summary_choice import is_chain_member
from .view import Item, View

__all__ = [
    "AGING_POLICY_VERSION",
    "DEFAULT_EXEMPT_TOOLS",
    "AgingPlan",
    "AgingPolicy",
    "AgingStats",
    "CAPPED",
    "HARD_CLEAR",
    "SOFT_TRIM",
    "TURN_UNITS",
    "boundary_after_commit",
    "long_turn_cap",
    "cap_text",
    "hard_clear_text",
    "owner_chain_id",
    "plan_aging",
    "rebuild_aged",
    "result_text",
    "soft_trim_text",
    "stored_references",
    "turn_numbers",
]


# ---------------------------------------------------------------- view helpers


def _is_result(item: Item, graph: SessionGraph) -> bool:
    if item.kind == "tool_result" or (item.kind == "text_pair" and item.part == "result"):
        node = graph.nodes.get(item.node_id)
        return node is not None and node.role == "code"
    return False


def _mention_text(item: Item) -> str | None:
    """The text a later item contributes as a mention, or None when it is not one."""
    if item.kind in ("user", "summary"):
        return item.text
    if item.kind == "assistant":
        return item.text
    if item.kind == "tool_call":
        args = "" if item.input is None else (item.input if isinstance(item.input, str) else json_text(item.input))
        return f"{item.name} {args}"
    if item.kind == "text_pair":
        return item.text  # call halves; result halves of ask-user (user-authored) too
    return None


def _is_mention(item: Item) -> bool:
    """``_mention_text(item) is not None``, without building the text."""
    kind = item.kind
    if kind == "tool_call":
        return True
    return (kind == "user" or kind == "summary" or kind == "assistant" or kind == "text_pair") \
        and item.text is not None


def _is_user_authored(item: Item, graph: SessionGraph) -> bool:
    if item.kind in ("user", "summary"):
        return True
    if item.kind == "text_pair" and item.part == "result":
        node = graph.nodes.get(item.node_id)
        return node is not None and node.role == "user"  # an ask-user answer
    return False


def _message_ordinals(items: list[Item]) -> list[int]:
    """Provider-message index of each item (tool calls join their assistant message,
    consecutive results of one call group share one message)."""
    out: list[int] = []
    put = out.append
    n = -1
    prev_kind: str | None = None  # the previous item's kind and owner
    prev_owner: str | None = None
    for it in items:
        kind = it.kind
        owner = it.owner
        if n >= 0 and (kind == "tool_call" or (kind == "tool_result" and prev_kind == "tool_result"
                                               and prev_owner == owner)):
            pass
        else:
            n += 1
        put(n)
        prev_kind, prev_owner = kind, owner
    return out


_OWNERS: weakref.WeakKeyDictionary[SessionGraph, tuple[int, dict[str, str]]] = weakref.WeakKeyDictionary()


def owner_cache(graph: SessionGraph) -> dict[str, str]:
    """``owner_chain_id``'s cache for every walk of this graph object: a node's owner
    follows from its own caller edges, which appending never changes (the caller exists
    first); a node replaced by ``node/update`` starts it afresh."""
    got = _OWNERS.get(graph)
    if got is None or got[0] != len(graph.updates):
        got = _OWNERS[graph] = (len(graph.updates), {})
    return got[1]


def owner_chain_id(graph: SessionGraph, node_id: str, cache: dict[str, str] | None = None) -> str:
    """The chain node whose turn part renders ``node_id``: follow ``caller`` up to a chain
    member (a summary or an unknown id is its own owner)."""
    if cache is not None and node_id in cache:
        return cache[node_id]
    node = graph.nodes.get(node_id)
    if node is not None and (node.caller is None or node.caller == graph.root_id):
        # its own owner whether or not it is a chain member (the walk below stops at it
        # either way): no membership test for the conversation's own nodes
        if cache is not None:
            cache[node_id] = node_id
        return node_id
    path: list[str] = []
    nid: str | None = node_id
    out = node_id
    while nid is not None and nid in graph.nodes:
        if cache is not None and nid in cache:
            out = cache[nid]
            break
        node = graph.nodes[nid]
        path.append(nid)
        if is_chain_member(graph, node) or node.caller is None or node.caller == graph.root_id:
            out = nid
            break
        nid = node.caller
    if cache is not None:
        for p in path:
            cache[p] = out
    return out


def turn_numbers(view: View, graph: SessionGraph, unit: str = "user") -> tuple[list[int], int]:
    """``(number of each item's turn, number of the current turn)`` in ``unit``s.

    ``"user"``: the view's own numbering (``Item.turn``, ``View.turn_count``: real user
    turns, covered turns counted, summaries not). ``"step"``: top-level model calls
    along ``graph.chain(view.head)`` — an item belongs to the newest chain llm node at
    or before its owning chain node, a summary to the newest one it covers — so covered
    steps still count and a summary is never a step.
    """
    if unit == "user":
        return [it.turn for it in view.items], view.turn_count
    if unit != "step":
        raise ValueError(f"turn unit must be one of {TURN_UNITS}, not {unit!r}")
    steps: dict[str, int] = {}
    n = 0
    head = view.head if view.frame is None else owner_chain_id(graph, view.frame)
    before = math.inf if view.before_seq is None else view.before_seq
    for node in graph.chain(head):
        if node.seq >= before:
            break
        if node.role == "llm":
            n += 1
        steps[node.id] = n
    cache = owner_cache(graph)
    out: list[int] = []
    for it in view.items:
        if it.kind == "summary":
            covers = covers_of(graph.nodes[it.node_id])
            out.append(steps.get(covers[-1], 0) if covers else 0)
        else:
            out.append(steps.get(owner_chain_id(graph, it.node_id, cache), 0))
    return out, n


# ---------------------------------------------------------------- the plan


def _results_and_mentions(items: list[Item], graph: SessionGraph, units: list[int],
                          current: int) -> tuple[list[tuple[int, Item, int]], list[Item]]:
    """``(results, mentions)``: each result (``_is_result``) once, as ``(item index, item,
    mentions before it)``, and the mentions (``_is_mention``) written by the user
    (``_is_user_authored``) or in a turn before ``current``; the three tests in line (three
    calls an item were most of this loop; ``test_aging.py`` compares with them)."""
    mentioned: list[Item] = []
    results: list[tuple[int, Item, int]] = []
    seen: set[str] = set()
    nodes_get = graph.nodes.get
    for idx, it in enumerate(items):
        if not idx & 1023:
            stop_if_cancelled()
        kind = it.kind
        if kind == "tool_result" or (kind == "text_pair" and it.part == "result"):
            node = nodes_get(it.node_id)
            if node is not None and node.role == "code":  # a result
                if it.node_id not in seen:
                    seen.add(it.node_id)
                    results.append((idx, it, len(mentioned)))
            # else the result half of another pair: user-authored when an ask-user answer
            elif kind != "tool_result" and it.text is not None and (
                    (node is not None and node.role == "user") or units[idx] < current):
                mentioned.append(it)
            continue
        if kind == "tool_call":
            authored = False
        elif kind == "user" or kind == "summary":
            if it.text is None:
                continue
            authored = True
        elif kind == "assistant" or kind == "text_pair":
            if it.text is None:
                continue
            authored = False
        else:
            continue
        if authored or units[idx] < current:
            mentioned.append(it)
    return results, mentioned


def plan_aging(
    view: View,
    graph: SessionGraph,
    *,
    now: float,
    boundary_seq: int | None,
    policy: AgingPolicy = DEFAULT_POLICY,
    token_of: Callable[[str], int],
    window: int,
    count: Callable[[str], int],
    current_cap: int | None = None,
    refs_of: Callable[[str], Sequence[str]] | None = None,
) -> AgingPlan:
    """Decide which tool results of ``view`` age, and their replacement texts.

    ``current_cap`` holds the current turn number at most this value (the coarse step
    boundary of a long turn, ``long_turn_cap``): between two quanta every render makes
    the same decisions.

    ``token_of(node_id)`` gives the tokens of a code node's stored (unaged) result;
    ``count(text)`` counts replacement texts with the same tokenizer; ``window`` is the
    model's context window (for the single-result cap). ``refs_of(node_id)`` gives a code
    node's stored ranked references (``stored_references``; mined here when not given).
    The view may be rendered with or without a previous ``aged`` map: decisions read
    stored outputs, not item texts.
    """
    if refs_of is None:
        refs_of = _mining_refs_of(graph)
    items = view.items
    ordinals = _message_ordinals(items)
    stop_if_cancelled()
    units, current = turn_numbers(view, graph, policy.turn_unit)
    stop_if_cancelled()
    if current_cap is not None:
        current = min(current, current_cap)
    # the items that are mentions; their texts (``_mention_text``: a tool call's is its
    # arguments as JSON) are read only when a result passes every gate below
    results, mentioned = _results_and_mentions(items, graph, units, current)

    plan = AgingPlan(boundary_seq=boundary_seq)
    stats = plan.stats
    # built on first need: mentions (what was written after each result) and holders
    # (reference → the results holding it, in order: the next result repeating it)
    index: MentionIndex | None = None
    holders: dict[str, list[int]] | None = None
    limit = cap_limit(policy, window)

    for k, (idx, it, before) in enumerate(results):
        stop_if_cancelled()  # one result can cost a tokenization of a quarter window
        node = graph.nodes[it.node_id]
        if node.output is None or it.synthetic or it.status == "running":
            plan.decisions[node.id] = NO_RESULT
            continue
        tokens = token_of(node.id)
        distance = current - units[idx]
        gate: str | None = None
        if policy.is_exempt(node.name):
            gate = GATE_EXEMPT
        elif ordinals[idx] < policy.protect_first:
            gate = GATE_FIRST
        elif distance < policy.keep_recent_turns:
            gate = GATE_TURN
        elif boundary_seq is None or node.seq > boundary_seq:
            gate = GATE_BOUNDARY
        elif now - node.created_at < policy.min_age_seconds:
            gate = GATE_AGE
        elif tokens < policy.min_tokens:
            gate = GATE_SIZE

        text: str | None = None
        if gate is None:
            text = result_text(node)
            if index is None or holders is None:
                texts = [t for m in mentioned if (t := _mention_text(m)) is not None]  # every one
                index, holders = MentionIndex(texts), _holders(results, refs_of)
            hits = []
            for ref in refs_of(node.id)[: policy.max_refs_per_result]:
                # a mention cites the newest result before it holding the reference
                at = holders.get(ref, ())
                j = bisect_right(at, k)
                hi = results[at[j]][2] if j < len(at) else len(mentioned)
                if index.mentioned_between(ref, before, hi):
                    hits.append(ref)
            if hits:
                gate = GATE_CITED
                plan.cited[node.id] = hits
                stats.references_protected += 1

        kind: str | None = None
        replacement: str | None = None
        rep_tokens = 0
        if gate is None and text is not None:
            if distance >= policy.hard_clear_after_turns:
                kind, replacement = HARD_CLEAR, hard_clear_text(node.name, len(text), tokens)
            else:
                trimmed = soft_trim_text(text, policy)
                if trimmed is not None:
                    kind, replacement = SOFT_TRIM, trimmed
            if replacement is not None:
                rep_tokens = count(replacement)
                if rep_tokens >= tokens:
                    kind, replacement = None, None
            if replacement is None:
                gate = NO_GAIN
        if tokens > limit and (replacement is None or rep_tokens > limit):
            if text is None:
                text = result_text(node)
            kind, replacement = CAPPED, cap_text(text, tokens, limit, policy.max_single_result_share, count)
            rep_tokens = count(replacement)

        if replacement is None or kind is None:
            plan.decisions[node.id] = gate or NO_GAIN
            continue
        plan.aged[node.id] = replacement
        plan.kinds[node.id] = kind
        plan.decisions[node.id] = kind
        stats.tool_results_aged += 1
        stats.tokens_freed_by_aging += max(0, tokens - rep_tokens)
        if kind == SOFT_TRIM:
            stats.soft_trimmed += 1
        elif kind == HARD_CLEAR:
            stats.hard_cleared += 1
        else:
            stats.capped += 1
    return plan


def _mining_refs_of(graph: SessionGraph) -> Callable[[str], Sequence[str]]:
    """``refs_of`` for a caller without stored references: mine each result once."""
    memo: dict[str, list[str]] = {}

    def refs_of(node_id: str) -> list[str]:
        got = memo.get(node_id)
        if got is None:
            got = memo[node_id] = stored_references(graph.nodes[node_id].output)
        return got

    return refs_of


def _holders(results: list[tuple[int, Item, int]], refs_of: Callable[[str], Sequence[str]]) -> dict[str, list[int]]:
    """Reference → indexes (into ``results``, ascending) of the results whose stored
    references hold it."""
    out: dict[str, list[int]] = {}
    for k, (_, it, _) in enumerate(results):
        if not k & 255:
            stop_if_cancelled()
        for ref in refs_of(it.node_id):
            out.setdefault(ref, []).append(k)
    return out


def rebuild_aged(
    graph: SessionGraph,
    kinds: Mapping[str, str],
    *,
    policy: AgingPolicy = DEFAULT_POLICY,
    token_of: Callable[[str], int],
    window: int,
    count: Callable[[str], int],
) -> dict[str, str]:
    """The ``aged`` map for recorded decisions (replay): id → replacement text."""
    out: dict[str, str] = {}
    limit = cap_limit(policy, window)
    for node_id, kind in kinds.items():
        node = graph.nodes.get(node_id)
        if node is None or node.role != "code":
            continue
        text = result_text(node)
        tokens = token_of(node_id)
        if kind == HARD_CLEAR:
            out[node_id] = hard_clear_text(node.name, len(text), tokens)
        elif kind == SOFT_TRIM:
            trimmed = soft_trim_text(text, policy)
            if trimmed is not None:
                out[node_id] = trimmed
        elif kind == CAPPED:
            out[node_id] = cap_text(text, tokens, limit, policy.max_single_result_share, count)
    return out


def long_turn_cap(graph: SessionGraph, head: str, policy: AgingPolicy = DEFAULT_POLICY, *,
                  before_seq: int | None = None) -> tuple[int, int, str] | None:
    """``(steps in the current user turn, quantized step number, the quantum's first step id)``
    when the current user turn is long enough to age within itself, else None.

    Steps are top-level model calls numbered as ``turn_numbers(..., "step")`` does. The
    cap is the step number at the start of the current quantum: it moves only every
    ``step_quantum`` steps, so the aged prefix of a long turn changes in coarse
    increments (prompt-cache stable in between).
    """
    if policy.turn_unit != "user" or policy.long_turn_steps <= 0:
        return None
    before = math.inf if before_seq is None else before_seq
    n = 0
    turn_start = 0
    step_ids: list[str] = []
    for node in graph.chain(head):
        if node.seq >= before:
            break
        if node.role == "llm":
            n += 1
            step_ids.append(node.id)
        elif node.role == "user" and not node.metadata.get("spawn_branch_root"):
            turn_start = n
            step_ids = []
    steps = n - turn_start
    if steps < policy.long_turn_steps:
        return None
    q = (steps // policy.step_quantum) * policy.step_quantum
    if q <= 0:
        return None
    return steps, turn_start + q, step_ids[q - 1]


def boundary_after_commit(
    view: View,
    graph: SessionGraph,
    policy: AgingPolicy = DEFAULT_POLICY,
    *,
    previous: int | None = None,
    current_cap: int | None = None,
) -> int:
    """The aging boundary after the turn shown in ``view`` is committed.

    The seq of the newest node rendered in a turn at least ``keep_recent_turns`` turns
    back (``turn_numbers`` in the policy's unit: summaries are not turns), never at or
    past the oldest node of a more recent turn. A ratchet: ``max(previous, new)``. Returns
    ``previous`` (or 0: nothing ages) when no turn is old enough yet.

    Call it when a turn is committed (its final reply written; with
    ``turn_unit="step"``, after every top-level model call), with the view of the
    branch tip, and store the result per branch; pass it as ``boundary_seq`` to
    ``plan_aging`` until the next commit.
    """
    units, current = turn_numbers(view, graph, policy.turn_unit)
    if current_cap is not None:
        current = min(current, current_cap)
    threshold = current - policy.keep_recent_turns
    # the seqs of the items of old turns and of recent ones (a summary is appended after
    # what it covers: its seq says nothing about turns), then the largest and the smallest
    old: list[int] = []
    recent: list[int] = []
    put_old, put_recent = old.append, recent.append
    for it, unit in zip(view.items, units):
        if it.kind != "summary":
            (put_old if unit <= threshold else put_recent)(it.seq)
    old_max = max(old) if old else None
    recent_min = min(recent) if recent else None
    new = old_max
    if new is not None and recent_min is not None:
        new = min(new, recent_min - 1)
    if new is None:
        return previous if previous is not None else 0
    return new if previous is None else max(previous, new)
