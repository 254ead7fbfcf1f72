"""Reduction within a turn: bring one request under its budget (SPEC §8).

``context/prepare`` and ``context/render`` with ``budget`` build a request, check it
against ``input budget − safety margin`` and, when it is over, call ``reduce``:

1. carry over what the previous request of the branch reduced (``TurnReducer``), so
   consecutive requests of a turn share their reduced prefix (prompt cache);
2. summarize fully returned plain-text tool results, oldest first, until the request
   is ``TARGET_SHARE`` of its limit (``context.turn_reduction`` decides which);
3. if that is not enough, replace the turn's earlier steps by a request checkpoint
   (a task summary, rolling over a smaller checkpoint the branch already had);
4. hand the request out only when it fits; otherwise answer ``BudgetExceeded`` with
   the numbers.

Summaries come through ``sampling.create_message`` — the client's
``sampling/createMessage`` or the configured endpoint, the same path compaction uses —
at most ``MAX_SUMMARY_CALLS`` calls and ``MAX_SECONDS`` per build, never through a
prepare (no recursion), metered in the report apart from the request. Each summary is
kept in the ledger's derived table ``reduction_summaries`` under a hash of its content
and the model configuration, so a later request (or another daemon) reuses it without
a call. The ledger's nodes are never touched; the manifest names what was reduced.

Architecture Invariant: no SQL and no JSON-RPC here; the only write is the derived
summary cache, through the store's API.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import budget as budget_mod
from dagctx.context import turn_reduction as tr
from dagctx.context.tokens import estimate_tokens
from dagctx.context.turn_reduction import Checkpoint, ReducedText, Reductions
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError

from .render_cache import Snapshot, still_valid_prefix
from .sampling import create_message

if TYPE_CHECKING:
    from dagctx.context.models import ModelInfo

    from .core import EngineCore
    from .views import Rendering


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


@dataclass
class _Carried:
    snap: Snapshot
    reductions: Reductions


class TurnReducer:
    """Per-connection memory of the reductions each branch's last request carried.

    Only a cache: a fresh daemon rebuilds the same reductions from the ledger and the
    derived summary table, without new summary calls.
    """

    SESSIONS = 64

    def __init__(self, engine: EngineCore) -> None:
        self.e = engine
        self._carried: dict[tuple[Any, ...], _Carried] = {}

    @staticmethod
    def _key(session_id: str, info: ModelInfo) -> tuple[Any, ...]:
        return (session_id, info.name, info.context_window)

    def carried(self, session_id: str, head: str, info: ModelInfo) -> Reductions | None:
        """The previous request's reductions while the branch still extends it unchanged."""
        st = self._carried.get(self._key(session_id, info))
        if st is None:
            return None
        graph = self.e.store.graph(session_id)
        if head not in graph.nodes:
            return None
        chain = [n.id for n in graph.chain(head)]
        if not still_valid_prefix(graph, st.snap, chain):
            return None
        return Reductions(results=dict(st.reductions.results), checkpoint=st.reductions.checkpoint)

    def stash(self, built: Built) -> None:
        """Keep the request just built, so a reduction that follows starts from it."""
        self._last = built

    def take(self, render_id: str) -> Built | None:
        built, self._last = getattr(self, "_last", None), None
        return built if built is not None and built.rendering.record.render_id == render_id else None

    def remember(self, session_id: str, head: str, info: ModelInfo, reductions: Reductions) -> None:
        key = self._key(session_id, info)
        if not reductions:
            self._carried.pop(key, None)
            return
        graph = self.e.store.graph(session_id)
        chain = [n.id for n in graph.chain(head)]
        pos = {nid: i for i, nid in enumerate(chain)}
        last = -1
        for nid in reductions.results:
            if nid in graph.nodes:
                last = max(last, pos.get(graph.owner(nid), -1))
        if reductions.checkpoint is not None:
            last = max([last, *(pos.get(s, -1) for s in reductions.checkpoint.covers)])
        # the reductions depend on the chain up to the newest step they touch
        self._carried.pop(key, None)
        self._carried[key] = _Carried(Snapshot.of(graph, chain[: last + 1]), reductions)
        while len(self._carried) > self.SESSIONS:
            self._carried.pop(next(iter(self._carried)))


# ---------------------------------------------------------------- one run


#: Seconds before the one retry of a summary call after a transport failure.
RETRY_DELAY = 0.5


class _Stop(Exception):
    """A per-build limit was reached (``callLimit`` / ``timeLimit``)."""


class _Overflow(Exception):
    """The summarizer said its input was too large."""


@dataclass
class _Run:
    engine: EngineCore
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

    #: per built request (render id): its turn shape and its result candidates with keys
    _memo: dict[tuple[str, str], Any] = field(default_factory=dict)

    def shape(self, built: Built, graph: Any) -> tr.TurnShape:
        key = ("shape", built.rendering.record.render_id)
        if key not in self._memo:
            self._memo[key] = tr.turn_shape(built.rendering.view, graph)
        return self._memo[key]

    def count(self, text: str) -> int:
        return self.engine.counter.count(text, self.tokenizer)

    async def call(self, system: str, user: str, max_tokens: int, purpose: str) -> str:
        """One summarizer call within the per-build limits."""
        if self.stopped:
            raise _Stop(self.stopped)
        if not self.engine.peer.can_sample and self.engine.options.sampling_endpoint is None:
            self.stopped = ("no summarizer: the client did not declare capabilities.sampling and no "
                            "initializationOptions.samplingEndpoint is configured")
            raise _Stop(self.stopped)
        if self.report.summary_calls >= tr.MAX_SUMMARY_CALLS:
            self.stopped = "callLimit"
            raise _Stop(self.stopped)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.stopped = "timeLimit"
            raise _Stop(self.stopped)
        self.report.summary_calls += 1
        self.report.summary_input_tokens += estimate_tokens(system) + estimate_tokens(user)
        params = c.CreateMessageParams(
            messages=[c.SamplingMessage(role="user", content=c.SamplingContent(text=user))],
            system_prompt=system,
            max_tokens=max(64, min(max_tokens, self.info.max_output)),
            metadata={"purpose": purpose, "sessionId": self.session_id},
        )
        for retry in (False, True):
            try:
                text, _model = await create_message(self.engine, params, timeout=remaining)
                break
            except DagctxError as err:
                if tr.is_context_overflow(err.message):
                    raise _Overflow(err.message) from err
                if time.monotonic() >= self.deadline:
                    self.stopped = "timeLimit"
                    raise _Stop(self.stopped) from err
                # a transport failure (dropped connection, HTTP 429/5xx) gets one more try
                if retry or not (err.details or {}).get("retryable"):
                    raise
                await asyncio.sleep(min(RETRY_DELAY, max(0.0, self.deadline - time.monotonic())))
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    self.stopped = "timeLimit"
                    raise _Stop(self.stopped) from err
        self.report.summary_output_tokens += estimate_tokens(text or "")
        return text or ""

    async def summarize(self, text: str, make: Callable[[str, str | None], tuple[str, str]], max_tokens: int,
                        purpose: str) -> tuple[str, int]:
        """``text`` summarized in budget-sized segments (rolling); smaller segments after
        the summarizer reports a context overflow. Returns (summary, segments)."""
        seg_budget = max(256, int(self.info.context_window * tr.SEGMENT_SHARE) - max_tokens - 600)
        for _attempt in range(4):
            segments = tr.split_segments(text, seg_budget, estimate_tokens)
            summary: str | None = None
            try:
                for seg in segments:
                    system, user = make(seg, summary)
                    summary = await self.call(system, user, max_tokens, purpose)
                    if not summary.strip():
                        break
                return summary or "", len(segments)
            except _Overflow:
                seg_budget = max(128, seg_budget // 2)
        raise DagctxError("SamplingFailed", "the summarizer overflowed even on small segments")

    def progress(self, message: str) -> None:
        pct = int(self.done * 100 / self.planned) if self.planned else 0
        self.engine.peer.progress(self.token, {"kind": "report", "message": message, "percentage": min(pct, 99)})


def _config(engine: EngineCore, info: ModelInfo) -> dict[str, Any]:
    """The model configuration a cached summary belongs to."""
    ep = engine.options.sampling_endpoint
    summarizer = "client" if engine.peer.can_sample else (f"endpoint:{ep.model}" if ep is not None else "none")
    return {"summarizer": summarizer, "model": info.name, "window": info.context_window}


def _need(built: Built, share: float = tr.TARGET_SHARE) -> int:
    """Local-estimate tokens to free so the request lands at ``share`` of its limit."""
    b = built.budget
    ratio = b.input_used / built.estimate if built.estimate > 0 else 1.0
    ratio = ratio if ratio > 0 else 1.0
    target = tr.input_limit(b) * share
    return max(0, math.ceil((b.input_used - target) / ratio))


def _candidates(run: _Run, built: Built, red: Reductions) -> tuple[list[tr.ResultCandidate], dict[str, str],
                                                                  dict[str, tuple[str, int, int]]]:
    """The results that may still be summarized, their cache keys and the cached summaries."""
    e = run.engine
    graph = e.store.graph(run.session_id)
    memo_key = ("candidates", built.rendering.record.render_id)
    if memo_key not in run._memo:
        view = built.rendering.view
        shape = run.shape(built, graph)
        cache = e.views.node_tokens(graph, run.tokenizer)

        def token_of(nid: str) -> int:
            return e.views.counts_of(graph, nid, run.tokenizer, cache)[1]

        every = tr.result_candidates(view, graph, shape, token_of, aged=built.aged)
        keys = {x.node_id: tr.summary_key("result", "\0".join((x.tool, x.arguments, x.status, x.text)), run.config)
                for x in every}
        owners = {x.node_id: graph.owner(x.node_id) for x in every}
        run._memo[memo_key] = (every, keys, owners, e.store.reduction_summaries(list(keys.values())))
    every, keys, owners, cached = run._memo[memo_key]
    covered = set(red.checkpoint.covers) if red.checkpoint else set()
    cands = [x for x in every
             if x.node_id not in red.results and x.node_id not in run.failed and owners[x.node_id] not in covered]
    return cands, keys, cached


def _results_can_cover(run: _Run, built: Built, red: Reductions, reserve_calls: int) -> bool:
    """Whether summarizing results alone (within the calls left after ``reserve_calls``) can
    free what the request needs; otherwise the checkpoint goes first."""
    cands, keys, cached = _candidates(run, built, red)
    calls = max(0, tr.MAX_SUMMARY_CALLS - run.report.summary_calls - reserve_calls)
    need = _need(built)
    saving = 0
    for x in cands:
        if saving >= need:
            return True
        if keys[x.node_id] not in cached:
            if calls <= 0:
                continue
            calls -= 1
        saving += tr.expected_saving(x)
    return saving >= need


def _checkpoint_calls(run: _Run, built: Built) -> int:
    """About how many calls a checkpoint of the whole turn would take (its segments)."""
    seg = max(256, int(run.info.context_window * tr.SEGMENT_SHARE) - tr.checkpoint_summary_cap(run.info.context_window))
    return max(1, math.ceil(built.estimate / seg))


async def _reduce_results(run: _Run, built: Built, red: Reductions) -> int:
    """Summarize results until the expected saving covers the need; returns how many were added."""
    e = run.engine
    cands, keys, cached = _candidates(run, built, red)
    need = _need(built)
    chosen: list[tr.ResultCandidate] = []
    saving = 0
    calls = max(0, tr.MAX_SUMMARY_CALLS - run.report.summary_calls)
    capped = False
    for x in cands:
        if saving >= need:
            break
        hit = cached.get(keys[x.node_id])
        if hit is None:
            if calls <= 0:
                capped = True
                continue
            calls -= 1
        chosen.append(x)
        saving += (x.tokens - run.count(tr.reduced_result_text(x, hit[0]))) if hit else tr.expected_saving(x)
    if capped and saving < need:
        run.failures.append("callLimit")
    run.planned += sum(1 for x in chosen if keys[x.node_id] not in cached)
    sem = asyncio.Semaphore(tr.CONCURRENT_CALLS)

    async def one(x: tr.ResultCandidate) -> tuple[str, bool] | None:
        key = keys[x.node_id]
        if key in cached:
            run.report.cache_hits += 1
            return cached[key][0], True
        async with sem:
            try:
                summary, _ = await run.summarize(
                    x.text, lambda seg, prev: tr.result_messages(x, seg, previous=prev),
                    tr.result_summary_cap(x.tokens), "dagctx/turn-reduction",
                )
            except _Stop as stop:
                run.failures.append(str(stop))
                return None
            except DagctxError as err:
                run.failures.append(f"failed: {err.message}")
                return None
            finally:
                run.done += 1
            run.progress(f"summarized {run.done}/{run.planned} tool results")
        if not summary.strip():
            run.failures.append("empty")
            return None
        if run.count(tr.reduced_result_text(x, summary)) >= x.tokens:
            run.failures.append("notSmaller")
            return None
        fresh.append((key, "result", summary, estimate_tokens(x.text), estimate_tokens(summary)))
        return summary, False

    fresh: list[tuple[str, str, str, int, int]] = []
    try:
        outcomes = await asyncio.gather(*(one(x) for x in chosen))
    finally:
        e.store.put_reduction_summaries(fresh)  # what succeeded is kept, even when cancelled
    added = 0
    for x, out in zip(chosen, outcomes):
        if out is None:
            run.failed.add(x.node_id)
            continue
        summary, was_cached = out
        text = tr.reduced_result_text(x, summary)
        red.results[x.node_id] = ReducedText(x.node_id, x.tool_call_id, text, keys[x.node_id], x.tokens,
                                             run.count(text), was_cached)
        added += 1
    return added


async def _checkpoint(run: _Run, built: Built, red: Reductions) -> bool:
    """Replace (more of) the turn's earlier steps by a checkpoint; True when one was made."""
    e = run.engine
    graph = e.store.graph(run.session_id)
    r = built.rendering
    view = r.view
    shape = run.shape(built, graph)
    eligible, blocked = tr.checkpoint_steps(graph, view, shape)
    prev = red.checkpoint
    already = 0
    if prev is not None and tuple(eligible[: len(prev.covers)]) == prev.covers:
        already = len(prev.covers)
    elif prev is not None:
        prev = None
    tokens = tr.step_tokens(shape, graph, r.node_ids, r.per_message)
    cap = tr.checkpoint_summary_cap(run.info.context_window)
    old = run.count(prev.text) if prev is not None else 0
    k = tr.choose_checkpoint(eligible, tokens, _need(built), cap - old, already=already)
    if k <= already:
        run.failures.append("checkpoint: no earlier step may be covered" + (f" ({blocked})" if blocked else ""))
        return False
    covers = tuple(eligible[:k])
    new_steps = eligible[already:k]
    body = tr.steps_text(view, shape, new_steps)
    task = tr.task_text(view, shape)
    key = tr.summary_key("checkpoint", "\0".join((prev.key if prev else "", task, body)), run.config)
    hit = e.store.reduction_summaries([key]).get(key)
    segments = 1
    words = int(cap * 0.7)
    before = sum(tokens.get(s, 0) for s in covers) + old
    if hit is not None:
        summary = hit[0]
        run.report.cache_hits += 1
    else:
        run.planned += 1
        base = prev.summary if prev is not None else None
        try:
            summary, segments = await run.summarize(
                body, lambda seg, p: tr.checkpoint_messages(task, seg, previous=p if p is not None else base,
                                                            words=words),
                cap, "dagctx/turn-checkpoint",
            )
        except _Stop as stop:
            run.failures.append(f"checkpoint: {stop}")
            return False
        except DagctxError as err:
            run.failures.append(f"checkpoint failed: {err.message}")
            return False
        run.done += 1
        run.progress("checkpoint written")
        if not summary.strip():
            run.failures.append("checkpoint: empty")
            return False
        if run.count(summary) >= max(1, before):
            run.failures.append("checkpoint: notSmaller")
            return False
        e.store.put_reduction_summaries([(key, "checkpoint", summary, estimate_tokens(body), estimate_tokens(summary))])
    cp = Checkpoint(id=f"checkpoint-{key[:16]}", covers=covers, summary=summary, key=key, tokens_before=before,
                    segments=segments, cached=hit is not None)
    red.checkpoint = replace(cp, tokens_after=run.count(cp.text))
    covered = set(covers)
    for nid in [n for n in red.results if graph.owner(n) in covered]:
        del red.results[nid]
    return True


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


async def reduce(engine: EngineCore, build: Callable[[Reductions], Built], *, session_id: str, head: str,
                 info: ModelInfo, token: int | str | None, seconds: float = tr.MAX_SECONDS,
                 first: Built | None = None) -> tuple[Built, c.TurnReduction]:
    """Build the request, reducing it within the turn until it fits, or raise ``BudgetExceeded``.

    ``first`` is the request already built with the carried reductions, if any.
    """
    started = time.monotonic()
    carried = engine.turn_reducer.carried(session_id, head, info) or Reductions()
    reused = len(carried.results) + (carried.checkpoint is not None)
    built = first if first is not None else build(carried)
    before = built.budget.input_used
    if built.fits:
        rep = report_of(carried, built, before=before)
        rep.reused = reused
        return built, rep
    tokenizer = built.rendering.tokenizer
    rep = c.TurnReduction(tokens_before=before, tokens_after=before, limit=tr.input_limit(built.budget), reused=reused)
    run = _Run(engine, info, tokenizer, session_id, token, started + seconds, rep, _config(engine, info))
    engine.peer.progress(token, {"kind": "begin", "title": "Reducing the request", "cancellable": True,
                                 "percentage": 0})
    red = Reductions(results=dict(carried.results), checkpoint=carried.checkpoint)
    outcome = "over budget"
    try:
        # A branch that already carries a checkpoint grows it (one rolling call for the
        # new steps) rather than summarizing the results after it one by one; otherwise
        # results go first unless they cannot be enough within the calls left.
        checkpoint_first = red.checkpoint is not None or not _results_can_cover(
            run, built, red, _checkpoint_calls(run, built))
        if checkpoint_first and await _checkpoint(run, built, red):
            engine.views.forget(built.rendering.record.render_id)
            built = build(red)
        for _round in range(2):
            if built.fits or run.stopped or not await _reduce_results(run, built, red):
                break
            engine.views.forget(built.rendering.record.render_id)
            built = build(red)
        if not built.fits and not run.stopped and not checkpoint_first and await _checkpoint(run, built, red):
            engine.views.forget(built.rendering.record.render_id)
            built = build(red)
            if not built.fits and not run.stopped and await _reduce_results(run, built, red):
                engine.views.forget(built.rendering.record.render_id)
                built = build(red)
        outcome = "within budget" if built.fits else "over budget"
    finally:
        engine.peer.progress(token, {"kind": "end", "message": outcome})
    rep.failures = list(dict.fromkeys(run.failures))
    rep.duration_ms = round((time.monotonic() - started) * 1000, 1)
    report_of(red, built, before=before, rep=rep)
    if not built.fits:
        engine.views.forget(built.rendering.record.render_id)
        raise tr.budget_exceeded(built.budget, built.parts, input_used=built.budget.input_used, model=info.name,
                                 summary_calls=rep.summary_calls, failures=rep.failures)
    engine.turn_reducer.remember(session_id, head, info, red)
    return built, rep


# ---------------------------------------------------------------- context/render with a budget


def build_render(engine: EngineCore, p: c.RenderParams, reductions: Reductions) -> Built:
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
    from .lifecycle import protected_of

    parts = protected_of(graph, r, system_tokens, tools_tokens, 0)
    if parts.total > tr.input_limit(b):
        views.forget(r.record.render_id)
        raise tr.budget_exceeded(b, parts, input_used=b.input_used, model=info.name)
    result = views.render_result(r)
    result.budget = b
    return Built(rendering=r, result=result, budget=b, estimate=estimate, parts=parts, aged=aged)


__all__ = ["Built", "TurnReducer", "build_render", "reduce", "report_of", "time_limit"]
