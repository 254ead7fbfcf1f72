"""Prompt-cache breaks: where a request stops matching the previous request of its branch,
why, and what that costs (SPEC §7, cache breaks). Pure.

A provider's prompt cache matches a prefix: the tools, then the system prompt, then the
messages. A request *breaks* the cache when that prefix ends before the previous
request's end — some of what the provider holds cached is sent again, differently. The
cause is read from what the two requests' manifests recorded (the decisions, never the
bytes alone): a new system prompt or tools schema, a compaction (another summary), a
request checkpoint, tool results summarized within the turn, the aging boundary, and —
from the messages themselves — reasoning blocks a new user turn no longer sends.

The cost is in base-input-token units with the documented price ratios of prompt
caching (a cache write 1.25× a base input token, a cache read 0.1×): what this request
costs with the break, minus what it would cost had it read the whole previous request
from the cache and written only what it adds. It assumes a warm cache (the daemon does
not know when the provider's cache expires); it is negative when the request shrank by
more than it rewrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: price of a cache write and of a cache read, in base input tokens
WRITE_PRICE = 1.25
READ_PRICE = 0.1

#: causes, in the order they are reported (the most decisive first)
CAUSES = ("systemPrompt", "tools", "compaction", "checkpoint", "reduction", "aging", "reasoning", "other")

_REASONING = frozenset({"thinking", "redacted_thinking", "reasoning"})


def _without_reasoning(message: Any) -> Any:
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        return {**message, "content": [b for b in message["content"]
                                       if not (isinstance(b, dict) and b.get("type") in _REASONING)]}
    if isinstance(message, dict) and "reasoning_content" in message:
        return {k: v for k, v in message.items() if k != "reasoning_content"}
    return message


def _turn_reduction(manifest: Mapping[str, Any]) -> dict[str, Any]:
    tr = manifest.get("turnReduction")
    return tr if isinstance(tr, dict) else {}


def causes(prev: Mapping[str, Any], cur: Mapping[str, Any], prev_message: Any = None,
           cur_message: Any = None) -> list[str]:
    """Why the prefix changed, from the two manifests (and the first differing message)."""
    out: list[str] = []
    if prev.get("systemNode") != cur.get("systemNode"):
        out.append("systemPrompt")
    if prev.get("toolsHash", prev.get("toolsTokens")) != cur.get("toolsHash", cur.get("toolsTokens")):
        out.append("tools")
    if prev.get("summaryId") != cur.get("summaryId"):
        out.append("compaction")
    ptr, ctr = _turn_reduction(prev), _turn_reduction(cur)
    if (ptr.get("checkpoint") or {}).get("id") != (ctr.get("checkpoint") or {}).get("id"):
        out.append("checkpoint")
    reduced_prev, reduced_cur = ptr.get("results") or {}, ctr.get("results") or {}
    if reduced_prev != reduced_cur:
        out.append("reduction")
    aged_prev = {k: v for k, v in (prev.get("agedText") or {}).items() if k not in reduced_prev}
    aged_cur = {k: v for k, v in (cur.get("agedText") or {}).items() if k not in reduced_cur}
    boundary_moved = prev.get("agingBoundary") != cur.get("agingBoundary")
    if prev.get("summaryId") != cur.get("summaryId"):
        # results a new summary folds in leave the request with it, and the boundary is
        # recomputed on what is left: that is the compaction (which rewrites everything
        # after the summary anyway), not aging
        aged_prev = {k: v for k, v in aged_prev.items() if k in aged_cur}
        aged_cur = {k: v for k, v in aged_cur.items() if k in aged_prev}
        boundary_moved = False
    if boundary_moved or prev.get("agingLongTurn") != cur.get("agingLongTurn") or aged_prev != aged_cur:
        out.append("aging")
    if not out and prev_message is not None and cur_message is not None and prev_message != cur_message \
            and _without_reasoning(prev_message) == _without_reasoning(cur_message):
        out.append("reasoning")
    return out or ["other"]


@dataclass(frozen=True, slots=True)
class Break:
    at_message: int
    causes: list[str]
    invalidated_tokens: int
    rewritten_tokens: int
    estimated_cost: float


def measure(*, prev_total: int, total: int, stable_tokens: int, at_message: int, why: list[str]) -> Break:
    """The break's numbers: ``stable_tokens`` of this request are read from the cache (the
    tools, the system prompt and the leading identical messages when they held)."""
    stable = max(0, min(stable_tokens, total, prev_total))
    invalidated = prev_total - stable
    rewritten = total - stable
    with_break = WRITE_PRICE * rewritten + READ_PRICE * stable
    without = READ_PRICE * prev_total + WRITE_PRICE * max(0, total - prev_total)
    return Break(at_message, why, invalidated, rewritten, round(with_break - without, 1))


__all__ = ["CAUSES", "READ_PRICE", "WRITE_PRICE", "Break", "causes", "measure"]
