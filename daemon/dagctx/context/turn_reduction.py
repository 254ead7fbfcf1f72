"""Reduction within one user turn: what to reduce so one request fits (SPEC §8).

A coding agent spends most of its tokens inside one user turn — "fix the failing
test" and then a hundred tool calls. Aging works on turns and compaction keeps the
newest turn verbatim, so neither can shrink that turn. This module plans, as pure
functions over a rendered ``View``, how one *request* is brought under its budget:

1. **The check.** ``input_limit`` is the input budget (window − output cap) minus a
   safety margin for estimate error (``safety_margin``). Protected content — the
   system prompt, the tools, the user's messages of the turn and the newest step —
   must fit (``protected_parts``; else ``budget_exceeded``).
2. **Result summaries.** ``result_candidates`` lists tool results whose group has
   fully returned, with plain-text content, outside the newest step, not already
   aged, oldest first. A chosen result renders as a summary
   (``reduced_result_text``) through the ``aged`` map of ``render_view``: its call id,
   its error status and everything else of the message stay as they were.
3. **The request checkpoint.** When summaries are not enough,
   ``checkpoint_steps`` / ``choose_checkpoint`` pick a prefix of the turn's steps (top-level
   model calls after the user's message), never the newest ``KEEP_RECENT_STEPS``, and
   stopping before any step that holds a user-authored message, multimodal content,
   an unfinished tool call or signed reasoning *that this render sends*
   (``signed_reasoning_sent``: by format and reasoning mode, SPEC §6). ``apply_checkpoint`` replaces those
   steps' items with one task summary (``checkpoint_text``); the user's message
   stays first.

Nothing here writes: the ledger keeps every original node. A summary is cached
under ``summary_key`` (a hash of the summarized content and the model
configuration); the manifest (``Reductions.manifest``) names what was reduced and by
which summary, so replay rebuilds the request byte for byte.

Architecture Invariant: no I/O, no clock, no store (SPEC §8; ARCHITECTURE.md context layer).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.context_messages import Budget, BudgetExceededDetails, PromptLayer
from dagctx.protocol.errors import DagctxError

from .aging import owner_chain_id
from .formats import reasoning_owners
from .render import Item, View, is_chain_member, json_text, value_blocks

#: Bumped whenever a rule here changes what a reduced request looks like.
REDUCTION_POLICY_VERSION = 1
#: Limits per request build (SPEC §8).
MAX_SUMMARY_CALLS = 32
MAX_SECONDS = 60.0
#: Summaries run at most this many at once.
CONCURRENT_CALLS = 4
#: Safety margin below the input budget: this share of the window, at least the minimum.
SAFETY_MARGIN_SHARE = 0.02
SAFETY_MARGIN_MIN = 256
#: A checkpoint made because the turn outgrew its limit covers enough steps to bring
#: the request down to this share of the limit, so the turn grows for many steps before
#: the next checkpoint breaks the prompt cache again (``settled_checkpoint``).
TARGET_SHARE = 0.5
#: Results smaller than this are not worth a summary call.
MIN_RESULT_TOKENS = 300
#: The most recent steps of the turn never go into a checkpoint.
KEEP_RECENT_STEPS = 2
#: A checkpoint grows in multiples of this many steps (fewer, coarser prefix changes).
CHECKPOINT_QUANTUM = 8
#: The summarizer's input is cut into segments of at most this share of the window.
SEGMENT_SHARE = 0.5
#: Results are summarized in chunks oldest first, each expected to free about this
#: share of the request's limit: a reduced request keeps that much room for the next
#: steps of the turn, so its reduced prefix stays the same for several requests.
CHUNK_SHARE = 0.15

RESULT_MARKER = "[tool result summarized for this request: {tool}, {tokens} tokens; the full output is node {node}]"
CHECKPOINT_MARKER = "[Checkpoint: summary of the {steps} earlier steps of this turn; the full record is in the ledger]"

_OVERFLOW = re.compile(
    r"context[ _-]?(length|window|limit|overflow)|too (long|large|many tokens)|maximum context|"
    r"exceeds? the (model'?s? )?(context|maximum)|prompt is too long|context_length_exceeded",
    re.IGNORECASE,
)


# ---------------------------------------------------------------- the check


def safety_margin(window: int) -> int:
    """Tokens kept free below the input budget for the local estimate's error."""
    return max(SAFETY_MARGIN_MIN, math.ceil(window * SAFETY_MARGIN_SHARE))


def input_limit(budget: Budget) -> int:
    """What one request may use: the input budget minus the safety margin."""
    return budget.input_budget - budget.safety_margin


def fits(budget: Budget) -> bool:
    return budget.input_used <= input_limit(budget)


@dataclass(frozen=True, slots=True)
class TurnShape:
    """The current user turn of a view: its user node and its steps, oldest first.

    In a frame (``View.frame``, a running function F, SPEC §6) the steps are F's own
    inner calls — its direct callees — and every item belongs to a *unit*: a chain node
    (the turn's earlier steps, the user's message), a direct callee of a function or
    call on the open stack A → … → F (a finished inner call, reducible like a step), or
    an open stack node itself (protected with F's newest step, SPEC §8)."""

    user: str | None
    steps: tuple[str, ...]
    #: the unit of every item (parallel to ``view.items``); the chain owner outside a frame
    owners: tuple[str, ...]
    #: the running function of a frame, else None
    frame: str | None = None
    #: the open call stack of a frame, A … F (chain node down to the function)
    stack: frozenset[str] = frozenset()


def frame_stack(graph: SessionGraph, frame: str) -> list[str]:
    """[A, …, F]: the chain node down to the running function ``frame`` by ``caller``."""
    out = [frame]
    node = graph.nodes[frame]
    while not is_chain_member(graph, node) and node.caller in graph.nodes and node.caller != graph.root_id:
        if node.caller in out:
            break
        node = graph.nodes[node.caller]
        out.append(node.id)
    out.reverse()
    return out


def unit_of(graph: SessionGraph, shape: TurnShape, node_id: str, cache: dict[str, str]) -> str:
    """The unit ``node_id`` belongs to (see ``TurnShape``): its chain owner outside a frame."""
    if shape.frame is None:
        return owner_chain_id(graph, node_id, cache)
    if node_id in cache:
        return cache[node_id]
    path: list[str] = []
    nid = node_id
    out = node_id
    while nid in graph.nodes:
        if nid in cache:
            out = cache[nid]
            break
        node = graph.nodes[nid]
        path.append(nid)
        if (nid in shape.stack or node.caller in shape.stack or is_chain_member(graph, node)
                or node.caller is None or node.caller == graph.root_id):
            out = nid
            break
        nid = node.caller
    for x in path:
        cache[x] = out
    return out


def turn_shape(view: View, graph: SessionGraph) -> TurnShape:
    user: str | None = None
    start = 0
    for i in range(len(view.chain) - 1, -1, -1):
        node = graph.nodes.get(view.chain[i])
        if node is not None and node.role == "user" and not node.metadata.get("spawn_branch_root"):
            user, start = node.id, i + 1
            break
    cache: dict[str, str] = {}
    if view.frame is not None and view.frame in graph.nodes:
        # inside a running function: its own inner calls are the steps (SPEC §8)
        stack = frozenset(frame_stack(graph, view.frame))
        shape = TurnShape(user, (), (), view.frame, stack)
        owners = tuple(unit_of(graph, shape, it.node_id, cache) for it in view.items)
        inner = {o for o in owners if o in graph.nodes and graph.nodes[o].caller == view.frame and o not in stack}
        steps = tuple(sorted(inner, key=lambda o: graph.nodes[o].seq))
        return TurnShape(user, steps, owners, view.frame, stack)
    owners = tuple(owner_chain_id(graph, it.node_id, cache) for it in view.items)
    steps = tuple(
        nid for nid in view.chain[start:]
        if nid in graph.nodes and graph.nodes[nid].role in ("llm", "code") and nid != user
    )
    return TurnShape(user, steps, owners)


@dataclass(frozen=True, slots=True)
class ProtectedParts:
    """Token counts of what no reduction may drop (item 5 of SPEC §8's list)."""

    system: int
    tools: int
    user_messages: int
    newest_step: int
    hooks: int = 0

    @property
    def total(self) -> int:
        return self.system + self.tools + self.user_messages + self.newest_step + self.hooks


def protected_parts(
    graph: SessionGraph,
    shape: TurnShape,
    node_ids: Sequence[Sequence[str]],
    per_message: Sequence[int],
    *,
    system: int,
    tools: int,
    hooks: int = 0,
    system_in_messages: bool = False,
) -> ProtectedParts:
    """Tokens of the turn's user messages and of its newest step, from per-message counts.

    A message belongs to the user's part when one of its nodes is the turn's user node
    or a user-authored node inside the turn (an ask-user answer); to the newest step
    when one of its nodes is owned by the turn's newest step.
    """
    newest = shape.steps[-1] if shape.steps else None
    turn = set(shape.steps)
    cache: dict[str, str] = {}
    user_tokens = 0
    step_tokens = 0
    for k, (ids, n) in enumerate(zip(node_ids, per_message)):
        if system_in_messages and k == 0:
            continue
        owners = {unit_of(graph, shape, i, cache) for i in ids if i in graph.nodes}
        if shape.user is not None and (shape.user in owners or any(
            graph.nodes[i].role == "user" and unit_of(graph, shape, i, cache) in turn for i in ids if i in graph.nodes
        )):
            user_tokens += n
        elif owners & shape.stack:
            # a frame's open call stack (its calls, their "[in progress]" results)
            step_tokens += n
        elif newest is not None and newest in owners:
            # the newest step's finished plain-text results may be summarized, last
            # (SPEC §8): what is protected of them is about a summary's size
            if ids and all(_finished_result(graph, i) for i in ids):
                step_tokens += min(n, sum(result_summary_cap(n) + 40 for _ in ids))
            else:
                step_tokens += n
    return ProtectedParts(system, tools, user_tokens, step_tokens, hooks)


def _finished_result(graph: SessionGraph, node_id: str) -> bool:
    node = graph.nodes.get(node_id)
    return (node is not None and node.role == "code" and node.status in ("completed", "error", "cancelled")
            and node.output is not None and _plain_text(node.output) is not None)


def budget_exceeded(
    budget: Budget,
    parts: ProtectedParts,
    *,
    input_used: int,
    model: str | None,
    summary_calls: int = 0,
    failures: Sequence[str] = (),
    system_layers: Sequence[PromptLayer] = (),
) -> DagctxError:
    """``BudgetExceeded`` with the numbers: the request is never handed out over budget.

    ``system_layers``: the system prompt's layers and sizes; a prompt that alone does not
    fit is named layer by layer (SPEC §7: it is never cut to make it fit)."""
    limit = input_limit(budget)
    protected = parts.total
    who = f"model {model}" if model else "the model"
    if parts.system > limit:
        over = protected - limit
        layers = sorted(system_layers, key=lambda x: -x.tokens)
        listed = ", ".join(f"{x.name} {x.tokens:,} tokens ({x.chars:,} chars)" for x in layers)
        what = (f"The system prompt alone needs {parts.system:,} tokens"
                + (f" — layers: {listed} —" if listed else "")
                + f" but {who} leaves {limit:,} for input; the whole request needs {protected:,}")
        fix = ("The system prompt is never cut: shorten its largest layers (workspace files such as "
               "AGENTS.md, the skills in skills/, MEMORY.md), use promptMode 'minimal', use a model with a "
               "larger context window, or lower maxOutputTokens to shrink the output reserve.")
    elif protected > limit:
        over = protected - limit
        what = (
            f"The protected part of the request needs {protected:,} tokens (system prompt {parts.system:,}, "
            f"tools schema {parts.tools:,}, the user's messages of this turn {parts.user_messages:,}, "
            f"the newest step {parts.newest_step:,}"
            + (f", turn hooks {parts.hooks:,}" if parts.hooks else "")
            + f"), but {who} leaves {limit:,} for input"
        )
        fix = ("Use a model with a larger context window, send fewer or smaller tool schemas, shorten the "
               "system prompt or the newest message, or lower maxOutputTokens to shrink the output reserve.")
    else:
        over = input_used - limit
        what = (f"After reduction within the turn the request still needs {input_used:,} tokens, but {who} "
                f"leaves {limit:,} for input")
        why = f" ({'; '.join(dict.fromkeys(failures))})" if failures else ""
        fix = (f"{summary_calls} summary calls were made{why}. Compact earlier turns (context/compact or "
               "allowCompaction), make sure the client answers sampling/createMessage, use a model with a "
               "larger window, or lower maxOutputTokens.")
    message = (f"{what} (context window {budget.context_window:,} minus output reserve "
               f"{budget.output_reserve:,} minus safety margin {budget.safety_margin:,}): {over:,} too many. {fix}")
    details = BudgetExceededDetails(
        context_window=budget.context_window,
        output_reserve=budget.output_reserve,
        input_budget=budget.input_budget,
        safety_margin=budget.safety_margin,
        limit=limit,
        protected_tokens=protected,
        system_prompt=parts.system,
        tools_schema=parts.tools,
        user_messages=parts.user_messages,
        newest_step=parts.newest_step,
        newest_user_turn=parts.user_messages,
        input_used=input_used,
        over_by=over,
        model=model,
        source=budget.source,
        summary_calls=summary_calls,
        failures=list(dict.fromkeys(failures)),
        system_prompt_layers=list(system_layers),
    )
    return DagctxError("BudgetExceeded", message, details=msgspec.to_builtins(details))


# ---------------------------------------------------------------- result summaries


@dataclass(frozen=True, slots=True)
class ResultCandidate:
    node_id: str
    tool: str
    tool_call_id: str | None
    tokens: int
    #: the exact stored text the summary condenses
    text: str
    arguments: str
    status: str


def _plain_text(value: Any) -> str | None:
    """The text of a stored result when every block is text, else None (multimodal)."""
    blocks = value_blocks(value)
    if not blocks or any(b.get("type") != "text" for b in blocks):
        return None
    return "\n\n".join(b.get("text", "") for b in blocks)


def result_candidates(
    view: View,
    graph: SessionGraph,
    shape: TurnShape,
    token_of: Callable[[str], int],
    *,
    aged: Mapping[str, str],
    min_tokens: int = MIN_RESULT_TOKENS,
    newest_step: bool = False,
) -> list[ResultCandidate]:
    """Tool results that may be summarized for this request, oldest first.

    The group has fully returned (no call of the owning step is still running, the
    result is not synthetic), the content is plain text, the result is not in the
    newest step and not already aged, and it is large enough to be worth a call.
    ``newest_step``: the newest step's own finished results instead (the last resort,
    SPEC §8: only its completed results, never its calls).
    """
    newest = shape.steps[-1] if shape.steps else None
    unfinished: set[str] = set()
    for it, owner in zip(view.items, shape.owners):
        if it.kind in ("tool_result", "text_pair") and (it.synthetic or it.status == "running"):
            unfinished.add(owner)
    out: list[ResultCandidate] = []
    seen: set[str] = set()
    for it, owner in zip(view.items, shape.owners):
        if not (it.kind == "tool_result" or (it.kind == "text_pair" and it.part == "result")):
            continue
        node = graph.nodes.get(it.node_id)
        if node is None or node.role != "code" or node.id in seen or (node.id in aged and not newest_step):
            continue
        seen.add(node.id)
        if (owner == newest) != newest_step or node.status not in ("completed", "error", "cancelled"):
            continue
        if owner in unfinished and not newest_step:
            continue
        if node.output is None:
            continue
        tokens = token_of(node.id)
        if tokens < min_tokens:
            continue
        text = _plain_text(node.output)
        if text is None:
            continue
        args = "" if node.input is None else (node.input if isinstance(node.input, str) else json_text(node.input))
        out.append(ResultCandidate(node.id, node.name, it.tool_call_id, tokens, text, args, node.status))
    out.sort(key=lambda c: graph.nodes[c.node_id].seq)
    return out


def result_chunks(cands: Sequence[ResultCandidate], chunk_tokens: int) -> list[list[ResultCandidate]]:
    """``cands`` (oldest first) in consecutive chunks whose expected saving reaches
    ``chunk_tokens`` (the last may be smaller). A function of the results alone, so the
    chunk boundaries stay where they are while the turn grows."""
    out: list[list[ResultCandidate]] = []
    cur: list[ResultCandidate] = []
    saved = 0
    for x in cands:
        cur.append(x)
        saved += max(0, expected_saving(x))
        if saved >= chunk_tokens:
            out.append(cur)
            cur, saved = [], 0
    if cur:
        out.append(cur)
    return out


def results_needed(cands: Sequence[ResultCandidate], need: int) -> int:
    """How many results (oldest first) are expected to free ``need`` tokens."""
    saved = 0
    for n, x in enumerate(cands, start=1):
        saved += max(0, expected_saving(x))
        if saved >= need:
            return n
    return len(cands)


def result_summary_cap(tokens: int) -> int:
    """The summary's token cap for a result of ``tokens`` tokens."""
    return max(64, min(600, tokens // 5))


def expected_saving(c: ResultCandidate) -> int:
    return c.tokens - result_summary_cap(c.tokens) - 40


def reduced_result_text(c: ResultCandidate, summary: str) -> str:
    """What the model sees in place of the result (the call id and status stay)."""
    return RESULT_MARKER.format(tool=c.tool or "function", tokens=c.tokens, node=c.node_id) + "\n" + summary.strip()


def result_messages(c: ResultCandidate, text: str, *, previous: str | None = None) -> tuple[str, str]:
    """(system, user) of the summary request for one result (or one segment of it)."""
    words = max(40, int(result_summary_cap(c.tokens) * 0.7))
    system = (
        "You condense one tool result for a coding agent that is in the middle of a task and will "
        "keep working from your condensed version. Keep exactly: file paths, identifiers, names, "
        "numbers, versions, error messages and test names, and anything the agent must act on. "
        "Drop repetition and boilerplate. Answer with the condensed result only."
    )
    parts = [f"Tool: {c.tool or 'function'}", f"Arguments: {c.arguments}", f"Status: {c.status}"]
    if previous:
        parts.append(f"<condensed-so-far>\n{previous}\n</condensed-so-far>\nThe result continues:")
    parts.append(f"<result>\n{text}\n</result>")
    parts.append(f"Condense this result to at most {words} words.")
    return system, "\n".join(parts)


# ---------------------------------------------------------------- checkpoints


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


def _signed_block(block: dict[str, Any], format: str) -> bool:
    """Whether ``block`` (a stored reasoning block) goes out signed or encrypted in ``format``:
    Anthropic sends signed ``thinking`` and ``redacted_thinking`` unchanged; neutral every
    block as stored (a Codex ``encrypted_content`` too); Chat Completions only text."""
    kind = block.get("type")
    if format == "openai":
        return False
    if kind == "thinking":
        return bool(block.get("signature"))
    if kind == "redacted_thinking":
        return bool(block.get("data")) or format == "neutral"
    return format == "neutral" and bool(block.get("encrypted_content") or block.get("encryptedContent"))


def signed_reasoning_sent(view: View, format: str, mode: str) -> frozenset[str]:
    """The llm nodes whose signed or encrypted reasoning blocks this render sends (SPEC §6:
    by format and ``reasoning`` mode). Only those blocks bind a request: they go out
    byte for byte, so no checkpoint may cover their step. Stored blocks that are not sent
    (OpenAI Chat Completions, mode ``none``, an earlier turn under ``provider``) bind nothing."""
    owners = reasoning_owners(view, format, mode)
    if not owners:
        return frozenset()
    return frozenset(it.node_id for it in view.items
                     if it.node_id in owners and it.kind == "assistant"
                     and any(_signed_block(b, format) for b in it.reasoning))


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
    cache: dict[str, str] = {}
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
    turn: a checkpoint of more steps shares the segments of a smaller one."""
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


def steps_text(view: View, shape: TurnShape, steps: Sequence[str]) -> str:
    """The plain-text transcript of some steps, as the summarizer reads it."""
    wanted = set(steps)
    lines: list[str] = []
    for it, owner in zip(view.items, shape.owners):
        if owner not in wanted:
            continue
        if it.kind == "assistant":
            lines.append(f"assistant: {it.text}")
        elif it.kind == "tool_call":
            args = "" if it.input is None else (it.input if isinstance(it.input, str) else json_text(it.input))
            lines.append(f"call {it.name}({args})")
        elif it.kind == "tool_result":
            lines.append(f"result of {it.name} [{it.status}]:\n{it.text}")
        else:
            lines.append(f"{it.role}: {it.text}")
    return "\n".join(lines)


def task_text(view: View, shape: TurnShape, graph: SessionGraph | None = None) -> str:
    """The task a checkpoint summarizes toward: the user's message of the turn, and in a
    frame the running function's call (its name and arguments)."""
    text = "\n".join(it.text for it, o in zip(view.items, shape.owners) if o == shape.user and it.kind == "user")
    if shape.frame is not None and graph is not None and shape.frame in graph.nodes:
        f = graph.nodes[shape.frame]
        args = "" if f.input is None else (f.input if isinstance(f.input, str) else json_text(f.input))
        text += f"\n\nThe steps below are the inner calls of the running function {f.name or 'function'}({args})."
    return text


def checkpoint_messages(task: str, segment: str, *, previous: str | None, words: int) -> tuple[str, str]:
    """(system, user) of one checkpoint request (one segment, rolling over ``previous``)."""
    system = (
        "You write a checkpoint of an agent's work within one task, so that the agent can continue "
        "from the checkpoint without the full history of its steps. Keep every file path, identifier, "
        "command, number, error message and decision; say what was done, what was found and what "
        "remains. Answer with the checkpoint only."
    )
    parts = [f"<task>\n{task}\n</task>"]
    if previous:
        parts.append(f"<checkpoint-so-far>\n{previous}\n</checkpoint-so-far>")
    parts.append(f"<steps>\n{segment}\n</steps>")
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
    return replace(view, items=items)


# ---------------------------------------------------------------- segments, keys


def split_segments(text: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    """``text`` cut at line boundaries into pieces of at most ``max_tokens`` (by ``count``).

    Sized by the text's own characters-per-token ratio (one count of the whole text),
    then each piece is checked and halved while it is still too large: a few counts,
    not one per line.
    """
    max_tokens = max(64, max_tokens)
    total = count(text)
    if total <= max_tokens:
        return [text]
    per_token = len(text) / max(1, total)
    width = max(1, int(max_tokens * per_token * 0.95))
    out: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        end = min(n, pos + width)
        if end < n:
            cut = text.rfind("\n", pos + 1, end)
            end = cut if cut > pos else end
        piece = text[pos:end]
        while count(piece) > max_tokens and len(piece) > 1:
            half = len(piece) // 2
            cut = piece.rfind("\n", 1, half)
            piece = piece[: cut if cut > 0 else half]
        out.append(piece)
        pos += len(piece)
        if pos < n and text[pos] == "\n":
            pos += 1  # the line break between two pieces
    return out


def summary_key(kind: str, content: str, config: Mapping[str, Any]) -> str:
    """The cache key of a summary: its kind, the exact content and the model configuration."""
    h = hashlib.sha256()
    h.update(json.dumps([REDUCTION_POLICY_VERSION, kind, dict(sorted(config.items()))], ensure_ascii=False).encode())
    h.update(b"\0")
    h.update(content.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:40]


def is_context_overflow(message: str) -> bool:
    """Whether a summarizer's error says its input was too large for it."""
    return bool(_OVERFLOW.search(message or ""))


# ---------------------------------------------------------------- what a request carries


@dataclass(frozen=True, slots=True)
class ReducedText:
    node_id: str
    tool_call_id: str | None
    text: str
    key: str
    tokens_before: int
    tokens_after: int
    cached: bool = False


@dataclass(slots=True)
class Reductions:
    """The reductions one request applies: summarized results and at most one checkpoint."""

    results: dict[str, ReducedText] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None

    def __bool__(self) -> bool:
        return bool(self.results) or self.checkpoint is not None

    def aged_overlay(self, aged: Mapping[str, str]) -> dict[str, str]:
        """``aged`` plus the summarized results. Only results aging left whole are chosen,
        except the newest step's (capped by aging at most), whose summary replaces the cap."""
        out = dict(aged)
        out.update({k: r.text for k, r in self.results.items()})
        return out

    def tokens_saved(self, aged: Mapping[str, str]) -> int:
        """Local-estimate tokens these reductions take out of the request."""
        saved = sum(r.tokens_before - r.tokens_after for k, r in self.results.items() if k not in aged)
        if self.checkpoint is not None:
            saved += self.checkpoint.tokens_before - self.checkpoint.tokens_after
        return max(0, saved)

    def manifest(self) -> dict[str, Any]:
        """What the render manifest records (SPEC §8): what was reduced, by which summary."""
        out: dict[str, Any] = {
            "policyVersion": REDUCTION_POLICY_VERSION,
            "results": {k: r.key for k, r in sorted(self.results.items())},
            "checkpoint": None,
        }
        if self.checkpoint is not None:
            cp = self.checkpoint
            out["checkpoint"] = {"id": cp.id, "coversIds": list(cp.covers), "summaryKey": cp.key,
                                 "summary": cp.summary}
        return out


def checkpoint_from_manifest(manifest: Mapping[str, Any]) -> Checkpoint | None:
    """The checkpoint a recorded request carried (replay), or None."""
    tr = manifest.get("turnReduction")
    if not isinstance(tr, dict) or not isinstance(tr.get("checkpoint"), dict):
        return None
    cp = tr["checkpoint"]
    return Checkpoint(id=str(cp["id"]), covers=tuple(cp.get("coversIds") or ()), summary=str(cp.get("summary") or ""),
                      key=str(cp.get("summaryKey") or ""))


__all__ = [
    "CHECKPOINT_MARKER",
    "CHECKPOINT_QUANTUM",
    "CHUNK_SHARE",
    "CONCURRENT_CALLS",
    "KEEP_RECENT_STEPS",
    "MAX_SECONDS",
    "MAX_SUMMARY_CALLS",
    "MIN_RESULT_TOKENS",
    "REDUCTION_POLICY_VERSION",
    "RESULT_MARKER",
    "SEGMENT_SHARE",
    "TARGET_SHARE",
    "Checkpoint",
    "ProtectedParts",
    "ReducedText",
    "Reductions",
    "ResultCandidate",
    "TurnShape",
    "apply_checkpoint",
    "budget_exceeded",
    "checkpoint_from_manifest",
    "checkpoint_messages",
    "checkpoint_segments",
    "checkpoint_steps",
    "checkpoint_summary_cap",
    "choose_checkpoint",
    "expected_saving",
    "frame_stack",
    "fits",
    "input_limit",
    "is_context_overflow",
    "protected_parts",
    "reduced_result_text",
    "result_candidates",
    "result_chunks",
    "result_messages",
    "result_summary_cap",
    "results_needed",
    "safety_margin",
    "settled_checkpoint",
    "signed_reasoning_sent",
    "split_segments",
    "step_tokens",
    "steps_text",
    "summary_key",
    "task_text",
    "turn_shape",
    "unit_of",
]
