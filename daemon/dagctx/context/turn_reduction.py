"""Reduction within one user turn: what to reduce so one request fits (SPEC §8).

A coding agent spends most of its tokens inside one user turn — "fix the failing
test" and then a hundred tool calls. Aging works on turns and compaction keeps the
newest turn verbatim, so neither can shrink that turn. The context layer plans, as
pure functions over a rendered ``View``, how one *request* is brought under its
budget, in rooms of one job each:

1. **The turn** (``turn_shape.py``): the turn's user node, its steps and the unit of
   every rendered item (in a frame, the running function's inner calls).
2. **The check** (``reduction_limits.py``): the request's limit (input budget minus a
   safety margin), the protected part that must fit, ``BudgetExceeded`` with the numbers.
3. **Result summaries** (``result_summaries.py``): which fully returned plain-text tool
   results to summarize, in which chunks, and what the model sees in their place.
4. **The request checkpoint** (``request_checkpoint.py``): which prefix of the turn's
   steps one task summary replaces, where it settles as the turn grows, and how it is
   written segment by segment.

This module holds what they share: the per-build limits, the segmentation of a long
text for the summarizer, the cache key of a summary, and ``Reductions`` — what one
request applies and what its manifest records, so replay rebuilds the request byte
for byte. It also re-exports the rooms' names, so ``dagctx.context.turn_reduction``
stays the one name the engine reads the plan by.

Nothing here writes: the ledger keeps every original node. A summary is cached
under ``summary_key`` (a hash of the summarized content and the model
configuration).

Architecture Invariant: no I/O, no clock, no store (SPEC §8; ARCHITECTURE.md context layer).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .reduction_limits import (
    SAFETY_MARGIN_MIN,
    SAFETY_MARGIN_SHARE,
    ProtectedParts,
    budget_exceeded,
    fits,
    input_limit,
    protected_parts,
    safety_margin,
)
from .request_checkpoint import (
    CHECKPOINT_MARKER,
    CHECKPOINT_QUANTUM,
    KEEP_RECENT_STEPS,
    TARGET_SHARE,
    Checkpoint,
    apply_checkpoint,
    checkpoint_from_manifest,
    checkpoint_messages,
    checkpoint_segments,
    checkpoint_steps,
    checkpoint_summary_cap,
    choose_checkpoint,
    settled_checkpoint,
    signed_reasoning_sent,
    step_texts,
    step_tokens,
    steps_text,
    task_text,
)
from .result_summaries import (
    CHUNK_SHARE,
    MIN_RESULT_TOKENS,
    RESULT_MARKER,
    ResultCandidate,
    expected_saving,
    reduced_result_text,
    result_candidate_sets,
    result_candidates,
    result_chunks,
    result_messages,
    result_summary_cap,
    results_needed,
)
from .turn_shape import TurnShape, frame_stack, turn_shape, unit_of

#: Bumped whenever a rule here changes what a reduced request looks like.
REDUCTION_POLICY_VERSION = 1
#: Limits per request build (SPEC §8).
MAX_SUMMARY_CALLS = 32
MAX_SECONDS = 60.0
#: Summaries run at most this many at once.
CONCURRENT_CALLS = 4
#: The summarizer's input is cut into segments of at most this share of the window.
SEGMENT_SHARE = 0.5

_OVERFLOW = re.compile(
    r"context[ _-]?(length|window|limit|overflow)|too (long|large|many tokens)|maximum context|"
    r"exceeds? the (model'?s? )?(context|maximum)|prompt is too long|context_length_exceeded",
    re.IGNORECASE,
)


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


def summary_key(kind: str, content: str | Sequence[str | bytes], config: Mapping[str, Any]) -> str:
    """The cache key of a summary: its kind, the exact content and the model configuration.

    ``content`` may come in parts — texts, or texts already encoded (UTF-8,
    ``surrogatepass``) — whose concatenation it is: the same key, without joining a
    checkpoint segment of tens of kilobytes only to hash it (each character encodes
    alone, so the encoding of a concatenation is the concatenation of the encodings)."""
    items = tuple(sorted(config.items()))
    try:
        h = _key_hasher(kind, items).copy()
    except TypeError:  # a configuration value that cannot be a cache key itself
        h = _key_hasher.__wrapped__(kind, items)
    for part in (content,) if isinstance(content, str) else content:
        h.update(part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:40]


@lru_cache(maxsize=64)
def _key_hasher(kind: str, items: tuple[tuple[str, Any], ...]) -> Any:
    """A hasher fed with what precedes the content in every key of this kind and
    configuration (asked for every result and segment of a build)."""
    h = hashlib.sha256()
    h.update(json.dumps([REDUCTION_POLICY_VERSION, kind, dict(items)], ensure_ascii=False).encode())
    h.update(b"\0")
    return h


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
    "SAFETY_MARGIN_MIN",
    "SAFETY_MARGIN_SHARE",
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
    "result_candidate_sets",
    "result_candidates",
    "result_chunks",
    "result_messages",
    "result_summary_cap",
    "results_needed",
    "safety_margin",
    "settled_checkpoint",
    "signed_reasoning_sent",
    "split_segments",
    "step_texts",
    "step_tokens",
    "steps_text",
    "summary_key",
    "task_text",
    "turn_shape",
    "unit_of",
]
