"""The check of one request (SPEC §8): its limit, the part no reduction may drop, and the
``BudgetExceeded`` answer when it cannot be brought under.

``input_limit`` is the input budget (window − output cap) minus a safety margin for
the local estimate's error (``safety_margin``). Protected content — the system prompt,
the tools, the user's messages of the turn and the newest step — must fit
(``protected_parts``); else ``budget_exceeded`` names every number. Kept apart from
the reductions themselves: it decides whether to reduce and whether the result may be
handed out, never what is reduced.

Architecture Invariant: no I/O, no clock, no store (ARCHITECTURE.md context layer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.context_messages import Budget, BudgetExceededDetails, PromptLayer
from dagctx.protocol.errors import DagctxError

from .aging import owner_cache
from .result_summaries import plain_text, result_summary_cap
from .turn_shape import TurnShape, unit_of

#: Safety margin below the input budget: this share of the window, at least the minimum.
SAFETY_MARGIN_SHARE = 0.02
SAFETY_MARGIN_MIN = 256


def safety_margin(window: int) -> int:
    """Tokens kept free below the input budget for the local estimate's error."""
    return max(SAFETY_MARGIN_MIN, math.ceil(window * SAFETY_MARGIN_SHARE))


def input_limit(budget: Budget) -> int:
    """What one request may use: the input budget minus the safety margin."""
    return budget.input_budget - budget.safety_margin


def fits(budget: Budget) -> bool:
    return budget.input_used <= input_limit(budget)


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
    # outside a frame a unit is the chain owner, kept per graph for every walk of it
    cache: dict[str, str] = owner_cache(graph) if shape.frame is None else {}
    nodes = graph.nodes
    user_tokens = 0
    step_tokens = 0
    for k, (ids, n) in enumerate(zip(node_ids, per_message)):
        if system_in_messages and k == 0:
            continue
        owners: set[str] = set()
        user_in_turn = False  # a user-authored node inside the turn (an ask-user answer)
        for i in ids:
            node = nodes.get(i)
            if node is not None:
                unit = unit_of(graph, shape, i, cache)
                owners.add(unit)
                user_in_turn = user_in_turn or (node.role == "user" and unit in turn)
        if shape.user is not None and (shape.user in owners or user_in_turn):
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
            and node.output is not None and plain_text(node.output) is not None)


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


__all__ = ["SAFETY_MARGIN_MIN", "SAFETY_MARGIN_SHARE", "ProtectedParts", "budget_exceeded", "fits", "input_limit",
           "protected_parts", "safety_margin"]
