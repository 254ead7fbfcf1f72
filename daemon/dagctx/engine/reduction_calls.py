"""The summarizer calls of one reduction build (SPEC §8): within its limits, sized to
the summarizing model, retried once after a transport failure.

``ReductionRun`` is one build's state — the calls made, the deadline, the report's
counters, what failed — and its two ways to ask: ``call`` (one request, refused past
``MAX_SUMMARY_CALLS`` or the deadline, never larger than the summarizer's window) and
``summarize`` (a long text in rolling segments, halved after the summarizer says its
input was too large). Kept apart from the reduction's plan (``turn_reduction.py``):
this part knows summary sources and time, the plan knows only the request.

Architecture Invariant: no SQL and no JSON-RPC here; nothing is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dagctx.context import turn_reduction as tr
from dagctx.context.char_classes import CharClasses, add_classes, char_classes, estimate_of_classes
from dagctx.context.tokens import ESTIMATE, estimate_tokens
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError

from . import summary_sources
from .sampling import summary_limits
from .summary_sources import create_message, summarizer_model

if TYPE_CHECKING:
    from dagctx.context.models import ModelInfo

    from .ports import Host

#: Seconds before the one retry of a summary call after a transport failure.
RETRY_DELAY = 0.5


class Stop(Exception):
    """A per-build limit was reached (``callLimit`` / ``timeLimit``)."""


class Overflow(Exception):
    """The summarizer said its input was too large."""


@dataclass
class ReductionRun:
    """One build's summarizer calls: its limits, counters and failures (one request)."""

    engine: Host
    info: ModelInfo
    tokenizer: str
    session_id: str
    token: int | str | None
    deadline: float
    report: c.TurnReduction
    config: dict[str, Any]
    stopped: str | None = None
    #: results whose summary failed in this build (not asked again)
    failed: set[str] = field(default_factory=set)
    done: int = 0
    planned: int = 0
    failures: list[str] = field(default_factory=list)
    #: the segment size after the summarizer reported a context overflow (kept for the build)
    seg_limit: int | None = None
    #: the model that writes the summaries (the session's unless another is configured)
    summarizer: Any = None
    #: stored summaries by key as this build knows them (None: none stored), and the rows
    #: it wrote and keeps in memory until its end (``turn_reduction``: one read of each
    #: key, one write for the build)
    known: dict[str, tuple[str, int, int] | None] = field(default_factory=dict)
    unwritten: list[tuple[str, str, str, int, int]] = field(default_factory=list)
    #: the session's graph as the reduction's plan read it (counts of the request's
    #: messages, ``turn_reduction._estimate_with``); None: read from the store
    graph: Any = None
    #: whether ``count`` is the character estimate (``estimate_tokens``) for this tokenizer
    estimates: bool = False

    def __post_init__(self) -> None:
        if self.summarizer is None:
            self.summarizer = summarizer_model(self.engine, self.info)
        try:
            self.estimates = self.engine.counter.resolve(self.tokenizer) == ESTIMATE
        except ValueError:
            self.estimates = False  # an unknown tokenizer: ``count`` says so itself

    def segment_budget(self, max_tokens: int) -> int:
        """Tokens of summarized text one request carries: half the summarizer's window,
        never more than its input limit leaves after the answer and the prompt."""
        cap, input_limit = summary_limits(self.summarizer.context_window, self.summarizer.max_output)
        budget = min(int(self.summarizer.context_window * tr.SEGMENT_SHARE) - min(max_tokens, cap) - 600,
                     input_limit - 2 * min(max_tokens, cap) - 600)
        budget = max(64, budget)
        return budget if self.seg_limit is None else min(budget, self.seg_limit)

    def count(self, text: str) -> int:
        return self.engine.counter.count(text, self.tokenizer)

    async def call(self, system: str, user: str, max_tokens: int, purpose: str, *,
                   user_tokens: int | None = None) -> str:
        """One summarizer call within the per-build limits. ``user_tokens``: the
        estimate of ``user`` when the caller has it from counted parts (``estimate_of_classes``)."""
        if self.stopped:
            raise Stop(self.stopped)
        if summary_sources.choose(self.engine) is None:
            self.stopped = summary_sources.unavailable(self.engine)
            raise Stop(self.stopped)
        if self.report.summary_calls >= tr.MAX_SUMMARY_CALLS:
            self.stopped = "callLimit"
            raise Stop(self.stopped)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.stopped = "timeLimit"
            raise Stop(self.stopped)
        # the request must fit the summarizing model (SPEC §8): a larger one is never
        # sent, it is cut into smaller segments like a context-overflow answer
        cap, input_limit = summary_limits(self.summarizer.context_window, self.summarizer.max_output)
        max_tokens = max(64, min(max_tokens, cap))
        size = estimate_tokens(system) + (estimate_tokens(user) if user_tokens is None else user_tokens)
        if size + 8 > input_limit + (cap - max_tokens):
            raise Overflow(f"the request does not fit the summarizer's window of "
                            f"{self.summarizer.context_window:,} tokens")
        self.report.summary_calls += 1
        self.report.summary_input_tokens += size
        params = c.CreateMessageParams(
            messages=[c.SamplingMessage(role="user", content=c.SamplingContent(text=user))],
            system_prompt=system,
            max_tokens=max_tokens,
            metadata={"purpose": purpose, "sessionId": self.session_id},
        )
        for retry in (False, True):
            try:
                text, _model = await create_message(self.engine, params, timeout=remaining)
                break
            except DagctxError as err:
                if tr.is_context_overflow(err.message):
                    raise Overflow(err.message) from err
                if time.monotonic() >= self.deadline:
                    self.stopped = "timeLimit"
                    raise Stop(self.stopped) from err
                # a transport failure (dropped connection, HTTP 429/5xx) gets one more try
                if retry or not (err.details or {}).get("retryable"):
                    raise
                await asyncio.sleep(min(RETRY_DELAY, max(0.0, self.deadline - time.monotonic())))
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    self.stopped = "timeLimit"
                    raise Stop(self.stopped) from err
        self.report.summary_output_tokens += estimate_tokens(text or "")
        return text or ""

    async def summarize(self, text: str, make: Callable[[str, str | None], tuple[str, str]], max_tokens: int,
                        purpose: str, counts: CharClasses | None = None) -> tuple[str, int]:
        """``text`` summarized in budget-sized segments (rolling); smaller segments after
        the summarizer reports a context overflow. Returns (summary, segments).

        ``counts``: ``text``'s ``char_classes``, when known: a text that is one segment
        is then not read again to size it, nor its request to check it — ``make``
        puts the segment once, as it is, into the user message, so that message's
        estimate is its shell's (``make("", previous)``) plus the text's."""
        seg_budget = self.segment_budget(max_tokens)
        for _attempt in range(4):
            whole = counts is not None and estimate_of_classes(counts) <= max(64, seg_budget)
            segments = [text] if whole else tr.split_segments(text, seg_budget, estimate_tokens)
            summary: str | None = None
            try:
                for seg in segments:
                    system, user = make(seg, summary)
                    known = None
                    if whole and counts is not None:
                        known = estimate_of_classes(add_classes(char_classes(make("", summary)[1]), counts))
                    summary = await self.call(system, user, max_tokens, purpose, user_tokens=known)
                    if not summary.strip():
                        break
                return summary or "", len(segments)
            except Overflow:
                seg_budget = max(64, seg_budget // 2)
                self.seg_limit = seg_budget
        raise DagctxError("SamplingFailed", f"the summarizer {self.summarizer.name} (window "
                          f"{self.summarizer.context_window:,} tokens) overflowed even on small segments")

    def progress(self, message: str) -> None:
        pct = int(self.done * 100 / self.planned) if self.planned else 0
        self.engine.peer.progress(self.token, {"kind": "report", "message": message, "percentage": min(pct, 99)})


def cache_config(engine: Host, info: ModelInfo) -> dict[str, Any]:
    """The model configuration a cached summary belongs to (one cache identity per
    summary source, ``summary_sources.identity``)."""
    return {"summarizer": summary_sources.identity(engine), "model": info.name, "window": info.context_window}


__all__ = ["RETRY_DELAY", "Overflow", "ReductionRun", "Stop", "cache_config"]
