"""The request a reduction checks (SPEC §8): one build with its budget, its estimate
and its protected part; ``context/render`` with ``budget`` built as such a request;
the ``TurnReduction`` report of a finished build and the request's time limit.

Kept apart from the reduction itself (``turn_reduction.py``) because the lifecycle's
turn template builds requests too (``lifecycle.py``): both hand a ``Built`` to
``reduce``, which never needs to know how it was built.

Architecture Invariant: no SQL and no JSON-RPC here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import budget as budget_mod
from dagctx.context import formats
from dagctx.context import turn_reduction as tr
from dagctx.context.turn_reduction import Reductions
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError

if TYPE_CHECKING:
    from .ports import Host
    from .records import Rendering


@dataclass
class Built:
    """One built request and what its check needs."""

    rendering: Rendering
    #: the protocol result (``PrepareResult`` or ``RenderResult``)
    result: Any
    budget: c.Budget
    #: the local estimate of the whole prompt (system + messages + hooks + tools)
    estimate: int
    parts: tr.ProtectedParts
    #: the aging decisions alone (reductions are never applied to an aged result)
    aged: dict[str, str]

    @property
    def fits(self) -> bool:
        return tr.fits(self.budget)


class TurnReducer:
    """Hands the request a prepare just built to the reduction that follows it (one
    request, one connection). Nothing of an earlier request is kept: what a request
    reuses is found in the ledger's derived summary table (SPEC §8)."""

    def __init__(self, engine: Host) -> None:
        self.e = engine
        self._last: Built | None = None

    def stash(self, built: Built) -> None:
        """Keep the request just built, so a reduction that follows starts from it."""
        self._last = built

    def take(self, render_id: str) -> Built | None:
        built, self._last = self._last, None
        return built if built is not None and built.rendering.record.render_id == render_id else None


def report_of(red: Reductions, built: Built, *, before: int, rep: c.TurnReduction | None = None) -> c.TurnReduction:
    """The ``TurnReduction`` of a finished build."""
    rep = rep or c.TurnReduction(tokens_before=before, tokens_after=0, limit=0)
    rep.tokens_before = before
    rep.tokens_after = built.budget.input_used
    rep.limit = tr.input_limit(built.budget)
    rep.results = [
        c.ReducedResult(node_id=x.node_id, tool_call_id=x.tool_call_id, tokens_before=x.tokens_before,
                        tokens_after=x.tokens_after, summary_key=x.key, cached=x.cached)
        for x in sorted(red.results.values(), key=lambda x: x.node_id)
    ]
    cp = red.checkpoint
    rep.checkpoint = None if cp is None else c.RequestCheckpoint(
        id=cp.id, covers_ids=list(cp.covers), tokens_before=cp.tokens_before, tokens_after=cp.tokens_after,
        summary_key=cp.key, segments=cp.segments, cached=cp.cached,
    )
    return rep


def time_limit(seconds: float, path: str) -> float:
    """The reduction's time limit: the request's, never above ``MAX_SECONDS``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise DagctxError("InvalidParams", f"reductionTimeoutSeconds must be a positive number of seconds, "
                          f"got {seconds!r}", path=path)
    return min(float(seconds), tr.MAX_SECONDS)


# ---------------------------------------------------------------- context/render with a budget


def build_render(engine: Host, p: c.RenderParams, reductions: Reductions) -> Built:
    """``context/render`` with ``budget``: the render checked as a whole request (SPEC §8)."""
    views = engine.views
    store = engine.store
    graph = store.graph(p.session_id)
    head = p.head or store.head(p.session_id)
    graph.get(head)
    info = engine.models.get(p.model or engine.options.default_model)
    aged, stats = views.aging_for(p.session_id, head, info, enabled=p.aging, frame=p.frame)
    extra = dict(stats.get("manifest") or {})
    if reductions:
        extra["turnReduction"] = reductions.manifest()
    r = views.render(
        p.session_id, head=head, fmt=p.format, model=p.model, frame=p.frame, expose=p.expose,
        include_system=p.include_system, aged=reductions.aged_overlay(aged) if reductions else aged,
        extra_manifest=extra, checkpoint=reductions.checkpoint, reasoning=p.reasoning,
    )
    tools = budget_mod.tools_schema_tokens(p.tools, engine.counter, r.tokenizer)
    estimate = r.total + tools
    r.manifest["tokens"] = estimate
    r.manifest["toolsTokens"] = tools
    r.record.total = estimate
    source, total = views.calibrated(p.session_id, info.name, estimate, r.record)
    system_tokens, history_tokens, tools_tokens = budget_mod.distribute(
        total, r.system_tokens, estimate - r.system_tokens - tools, tools
    )
    b = budget_mod.compute_budget(info, system_tokens, history_tokens, tools_tokens,
                                  requested_output=p.max_output_tokens, source=source)
    b = msgspec.structs.replace(b, safety_margin=tr.safety_margin(info.context_window))
    parts = protected_of(graph, r, system_tokens, tools_tokens, 0)
    if parts.total > tr.input_limit(b):
        views.forget(r.record.render_id)
        raise tr.budget_exceeded(b, parts, input_used=b.input_used, model=info.name)
    result = views.render_result(r)
    result.budget = b
    return Built(rendering=r, result=result, budget=b, estimate=estimate, parts=parts, aged=aged)


def protected_of(graph: Any, r: Any, system_tokens: int, tools_tokens: int, hook_tokens: int) -> tr.ProtectedParts:
    """The protected part of a built request (SPEC §8): system, tools, the turn's user
    messages, the newest step and the turn hooks."""
    shape = tr.turn_shape(r.view, graph)
    in_messages = formats.get(r.record.format).leads_with_system(r.messages)
    return tr.protected_parts(graph, shape, r.node_ids, r.per_message, system=system_tokens, tools=tools_tokens,
                              hooks=hook_tokens, system_in_messages=in_messages)


__all__ = ["Built", "TurnReducer", "build_render", "protected_of", "report_of", "time_limit"]
