"""The token budget of one model call, and calibration of estimates by provider usage.

The context window (never the max output) is split into::

    context window = system prompt + history + tools schema + output reserve + headroom
                     \\_________ input used ________/
                     \\__________________ input budget ______________/   (= window − reserve)

``percentUsed`` is input used over input budget. Everything here works on token
counts already computed and stored per node: a budget over 100k nodes sums
integers and never re-tokenizes.

Calibration rule (``calibrate``). A provider reports, per call, ``input`` (uncached
prompt tokens), ``cacheRead``, ``cacheWrite`` and ``output``. The measured prompt
of that call is ``input + cacheRead + cacheWrite`` (``measured_prompt_tokens``):
it already contains the system prompt, the tools schema and every message, so it
is compared with the estimate of exactly that whole prompt (system + tools +
history), and a calibrated value replaces that whole sum — never add system or
tools on top of a measured or calibrated total. (OpenAI reports ``prompt_tokens``
*including* cached tokens: a client maps it to ``input = prompt_tokens −
cached_tokens`` and ``cacheRead = cached_tokens``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from dagctx.protocol.context_messages import Budget, TokenSource, Usage
from dagctx.protocol.errors import DagctxError
from .models import ModelInfo
from .tokens import TokenCounter

#: Cap on the output reserve when the request does not fix it (SPEC §7).
RESERVE_CAP = 16_384
#: Tokens each tool definition costs beyond its JSON text: the provider wraps every
#: tool in its own framing (name/description/parameters headers). A guess, on the
#: high side of what OpenAI's and Anthropic's reported usage imply per tool.
TOOL_OVERHEAD_TOKENS = 8
#: Percent of the input budget at which compaction is recommended.
RECOMMEND_AT = 70.0
#: Percent of the input budget at which compaction is needed before the next turn.
COMPACT_AT = 80.0
#: Measured/estimated ratios outside this range mean the measurement does not
#: describe what was estimated (images, provider-side injected prompts, a
#: mismatched call); such a ratio is not applied.
CALIBRATION_RANGE = (0.25, 4.0)


def output_reserve(model: ModelInfo, requested: int | None = None) -> int:
    """Tokens kept free for the answer.

    ``requested`` (the request's ``maxOutputTokens``) is used as given — explicit
    caps stay unchanged (SPEC §7). Otherwise
    ``min(model.max_output, 16384, model.context_window // 4)``.
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
            raise DagctxError(
                "InvalidParams",
                f"maxOutputTokens must be a non-negative integer, got {requested!r}",
            )
        return requested
    return min(model.max_output, RESERVE_CAP, model.context_window // 4)


def tools_schema_tokens(tools: Sequence[dict[str, Any]], counter: TokenCounter, tokenizer: str) -> int:
    """Tokens of the tool definitions: their compact JSON plus ``TOOL_OVERHEAD_TOKENS`` each."""
    if not tools:
        return 0
    text = msgspec.json.encode(list(tools)).decode()
    return counter.count(text, tokenizer) + TOOL_OVERHEAD_TOKENS * len(tools)


def compute_budget(
    model: ModelInfo,
    system_tokens: int,
    history_tokens: int,
    tools_tokens: int,
    requested_output: int | None = None,
    source: TokenSource = "estimate",
) -> Budget:
    """The budget of one call. ``headroom`` is negative when the input does not fit."""
    for label, value in (("system", system_tokens), ("history", history_tokens), ("tools", tools_tokens)):
        if value < 0:
            raise ValueError(f"{label} tokens must not be negative, got {value}")
    reserve = output_reserve(model, requested_output)
    input_used = system_tokens + history_tokens + tools_tokens
    input_budget = model.context_window - reserve
    return Budget(
        context_window=model.context_window,
        system_prompt=system_tokens,
        history=history_tokens,
        tools_schema=tools_tokens,
        output_reserve=reserve,
        input_used=input_used,
        input_budget=input_budget,
        percent_used=_percent(input_used, input_budget),
        headroom=input_budget - input_used,
        source=source,
    )


def _percent(used: int, budget: int) -> float:
    # No input budget at all (reserve ≥ window): nothing fits, report it as full.
    if budget <= 0:
        return 100.0
    return round(used * 100.0 / budget, 1)


def thresholds(budget: Budget) -> tuple[bool, bool]:
    """``(recommend, needs)``: input used ≥ ``RECOMMEND_AT`` / ≥ ``COMPACT_AT`` percent
    of the input budget (computed unrounded)."""
    if budget.input_budget <= 0:
        return True, True
    pct = budget.input_used * 100.0 / budget.input_budget
    return pct >= RECOMMEND_AT, pct >= COMPACT_AT


def check_fits(budget: Budget, protected_tokens: int, *, model: str | None = None) -> int:
    """Raise ``BudgetExceeded`` unless the protected content fits in the input budget.

    Protected content is what no reduction may drop: the system prompt, the tools
    schema and the newest user turn (``protected_tokens`` is their sum). Returns
    the tokens left for the rest of the history.
    """
    room = budget.input_budget - protected_tokens
    if room >= 0:
        return room
    newest = max(protected_tokens - budget.system_prompt - budget.tools_schema, 0)
    who = f"model {model}" if model else "the model"
    message = (
        f"The protected part of the prompt needs {protected_tokens:,} tokens "
        f"(system prompt {budget.system_prompt:,}, tools schema {budget.tools_schema:,}, "
        f"newest user turn {newest:,}), but {who} leaves {budget.input_budget:,} for input "
        f"(context window {budget.context_window:,} minus output reserve {budget.output_reserve:,}): "
        f"{-room:,} too many. Use a model with a larger context window, send fewer or smaller "
        f"tool schemas, shorten the system prompt or the newest message, or lower "
        f"maxOutputTokens to shrink the output reserve."
    )
    raise DagctxError(
        "BudgetExceeded",
        message,
        details={
            "model": model,
            "contextWindow": budget.context_window,
            "outputReserve": budget.output_reserve,
            "inputBudget": budget.input_budget,
            "protectedTokens": protected_tokens,
            "systemPrompt": budget.system_prompt,
            "toolsSchema": budget.tools_schema,
            "newestUserTurn": newest,
            "overBy": -room,
            "source": budget.source,
        },
    )


# ---------------------------------------------------------------- calibration


def measured_prompt_tokens(usage: Usage) -> int:
    """The prompt size of one call as the provider measured it: input + cacheRead + cacheWrite."""
    return usage.prompt


def calibrate(
    estimate: int,
    measured_prompt: int | None,
    estimated_then: int | None,
    *,
    same_messages: bool | None = None,
) -> tuple[int, TokenSource]:
    """Turn an estimate of a whole prompt into the best number available.

    - ``measured_prompt`` is the provider's count of an earlier call's whole prompt
      (``measured_prompt_tokens``), ``estimated_then`` our estimate of that same
      prompt, ``estimate`` our estimate of the prompt now (system + tools + history).
    - Same prompt (``same_messages``, or when not given ``estimate == estimated_then``):
      ``(measured_prompt, "provider")``.
    - Otherwise, with both earlier numbers positive and their ratio inside
      ``CALIBRATION_RANGE``: ``(round(estimate × measured_prompt / estimated_then),
      "calibrated")``.
    - Otherwise ``(estimate, "estimate")``.

    The ratio belongs to one model (tokenizer); callers keep it per model.
    """
    if measured_prompt is None or measured_prompt <= 0:
        return estimate, "estimate"
    if same_messages is None:
        same_messages = estimated_then is not None and estimate == estimated_then
    if same_messages:
        return measured_prompt, "provider"
    if estimated_then is None or estimated_then <= 0:
        return estimate, "estimate"
    ratio = measured_prompt / estimated_then
    low, high = CALIBRATION_RANGE
    if not low <= ratio <= high:
        return estimate, "estimate"
    return round(estimate * ratio), "calibrated"


def distribute(
    total: int, system_tokens: int, history_tokens: int, tools_tokens: int
) -> tuple[int, int, int]:
    """Split a measured or calibrated ``total`` over (system, history, tools) in
    proportion to their estimates, summing exactly to ``total``; for building a
    ``Budget`` from a total without counting system or tools twice."""
    parts = (system_tokens, history_tokens, tools_tokens)
    whole = sum(parts)
    if whole <= 0:
        return 0, total, 0
    system = round(total * system_tokens / whole)
    tools = min(round(total * tools_tokens / whole), total - system)
    return system, total - system - tools, tools


__all__ = [
    "CALIBRATION_RANGE",
    "COMPACT_AT",
    "RECOMMEND_AT",
    "RESERVE_CAP",
    "TOOL_OVERHEAD_TOKENS",
    "calibrate",
    "check_fits",
    "compute_budget",
    "distribute",
    "measured_prompt_tokens",
    "output_reserve",
    "thresholds",
    "tools_schema_tokens",
]
