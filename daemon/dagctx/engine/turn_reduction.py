"""Reduction within a turn: bring one request under its budget (SPEC §8).

``context/prepare`` and ``context/render`` with ``budget`` build a request, check it
against ``input budget − safety margin`` and, when it is over, call ``reduce``:

1. summarize fully returned plain-text tool results, oldest first, in chunks fixed by
   the results themselves, until the request fits (``context.turn_reduction`` decides
   which);
2. if that is not enough, replace the turn's earlier steps by a request checkpoint
   (a canonical rolling summary of fixed segments of the turn, in quanta of 8 steps);
3. hand the request out only when it fits; otherwise answer ``BudgetExceeded`` with
   the numbers.

What a request reduces is a pure function of the request (SPEC §8): nothing of an
earlier request is kept in memory; the stored summaries make it cheap.

Summaries come through ``summary_sources.create_message`` — the connection's preferred
summary source (host completion, client sampling, endpoint), the same path compaction uses —
at most ``MAX_SUMMARY_CALLS`` calls and ``MAX_SECONDS`` per build, never through a
prepare (no recursion), metered in the report apart from the request. Each summary is
kept in the ledger's derived table ``reduction_summaries`` under a hash of its content
and the model configuration, so a later request (or another daemon) reuses it without
a call; a build reads each key once and stores what it wrote at its end, in one
transaction. The ledger's nodes are never touched; the manifest names what was reduced.

Architecture Invariant: no SQL and no JSON-RPC here; the only write is the derived
summary cache, through the store's API.

The request being checked (``Built``, ``build_render``, the report) is
``reduction_build.py``; the summarizer calls of one build, within its limits,
``reduction_calls.py``; this module is the order of the steps and what each reuses.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dagctx.context import turn_reduction as tr
from dagctx.context.aging import owner_cache
from dagctx.context.char_classes import (CharClasses, add_classes, char_classes, char_classes_encoded,
                                         estimate_of_classes)
from dagctx.context.tokens import estimate_tokens
from dagctx.context.turn_reduction import Checkpoint, ReducedText, Reductions
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError

from .reduction_build import Built, TurnReducer, build_render, protected_of, report_of, time_limit
from .reduction_calls import Overflow, ReductionRun, Stop, cache_config

if TYPE_CHECKING:
    from dagctx.context.models import ModelInfo

    from .ports import Host


def _ratio(built: Built) -> float:
    """Budget tokens per local-estimate token of a built request (calibration)."""
    b = built.budget
    ratio = b.input_used / built.estimate if built.estimate > 0 else 1.0
    return ratio if ratio > 0 else 1.0


def _need(built: Built) -> int:
    """Local-estimate tokens to free so the request lands within its limit."""
    b = built.budget
    return max(0, math.ceil((b.input_used - tr.input_limit(b)) / _ratio(built)))


@dataclass
class _Plan:
    """What the unreduced request offers: its turn, its result candidates (with cache
    keys) and the steps a checkpoint may cover. A pure function of the request."""

    base: Built
    shape: tr.TurnShape
    candidates: list[tr.ResultCandidate]
    owners: dict[str, str]
    eligible: list[str]
    blocked: str | None
    step_texts: dict[str, str]
    task: str
    #: the newest step's finished results: summarized last, only when nothing else fits
    newest: list[tr.ResultCandidate] = field(default_factory=list)
    #: tokens of each step's messages in the unreduced request (``tr.step_tokens``)
    tokens: dict[str, int] = field(default_factory=dict)
    #: the summary model's configuration, part of every cache key (``cache_config``)
    config: dict[str, Any] = field(default_factory=dict)
    #: the cache keys of the results asked for so far (``key``)
    keys: dict[str, str] = field(default_factory=dict)
    #: ``char_classes`` of the step texts read so far (``counts``)
    step_counts: dict[str, CharClasses] = field(default_factory=dict)
    #: the step texts encoded so far (``encoded``)
    step_bytes: dict[str, bytes] = field(default_factory=dict)
    #: ``_region`` of each checkpoint tried, by its key
    regions: dict[str, tuple[int, int, int, int] | None] = field(default_factory=dict)
    #: the unreduced request's messages holding each node (``messages_of``), made on first use
    node_messages: dict[str, list[int]] | None = None

    def messages_of(self, node_id: str) -> list[int]:
        """The unreduced request's messages that hold ``node_id``."""
        if self.node_messages is None:
            self.node_messages = {}
            for k, ids in enumerate(self.base.rendering.node_ids):
                for i in ids:
                    self.node_messages.setdefault(i, []).append(k)
        return self.node_messages.get(node_id, [])

    def encoded(self, step: str) -> bytes:
        """A step's text as a checkpoint segment's cache key hashes it (``tr.summary_key``
        in parts), encoded once however many segments and checkpoints hash it."""
        got = self.step_bytes.get(step)
        if got is None:
            got = self.step_bytes[step] = self.step_texts[step].encode("utf-8", "surrogatepass")
        return got

    def counts(self, step: str) -> CharClasses:
        """``char_classes`` of a step's text, read once: a checkpoint's segments are sized
        by them and the estimate of each segment's request is their sum (``estimate_of_classes``)."""
        got = self.step_counts.get(step)
        if got is None:
            got = self.step_counts[step] = char_classes_encoded(self.step_texts[step], self.encoded(step))
        return got

    def step_estimate(self, step: str) -> int:
        """``estimate_tokens`` of a step's text (``tr.checkpoint_segments`` sizes steps by it)."""
        return estimate_of_classes(self.counts(step))

    def key(self, x: tr.ResultCandidate) -> str:
        """The cache key of a result's summary, made when the result is first chosen: a
        key hashes the whole result, and most candidates of a long turn are never
        chosen (SPEC §8: the chunks stop once the request fits)."""
        got = self.keys.get(x.node_id)
        if got is None:
            got = self.keys[x.node_id] = tr.summary_key(
                "result", "\0".join((x.tool, x.arguments, x.status, x.text)), self.config)
        return got


def _plan(run: ReductionRun, base: Built) -> _Plan:
    e = run.engine
    graph = e.store.graph(run.session_id)
    view = base.rendering.view
    shape = tr.turn_shape(view, graph)
    cache = e.views.node_tokens(graph, run.tokenizer)

    def token_of(nid: str) -> int:
        return e.views.counts_of(graph, nid, run.tokenizer, cache)[1]

    cands, newest = tr.result_candidate_sets(view, graph, shape, token_of, aged=base.aged)
    units: dict[str, str] = owner_cache(graph) if shape.frame is None else {}
    owners = {x.node_id: tr.unit_of(graph, shape, x.node_id, units) for x in cands + newest}
    # only signed reasoning this render sends binds a step (SPEC §6, §8): by format and mode
    manifest = base.rendering.manifest
    signed = tr.signed_reasoning_sent(view, str(manifest.get("format") or "neutral"),
                                      str(manifest.get("reasoning") or "provider"))
    eligible, blocked = tr.checkpoint_steps(graph, view, shape, signed)
    texts = tr.step_texts(view, shape, eligible)
    tokens = tr.step_tokens(shape, graph, base.rendering.node_ids, base.rendering.per_message)
    run.graph = graph
    return _Plan(base, shape, cands, owners, eligible, blocked, texts, tr.task_text(view, shape, graph), newest,
                 tokens, run.config)


def _stored(run: ReductionRun, keys: list[str]) -> dict[str, tuple[str, int, int]]:
    """The stored summaries of ``keys``: those this build wrote, else the ledger's — each
    key read from the ledger once per build (what a build wrote, it reads from memory)."""
    ask = [k for k in dict.fromkeys(keys) if k not in run.known]
    if ask:
        got = run.engine.store.reduction_summaries(ask)
        for k in ask:
            run.known[k] = got.get(k)
    return {k: hit for k in keys if (hit := run.known.get(k)) is not None}


def _keep(run: ReductionRun, rows: list[tuple[str, str, str, int, int]]) -> None:
    """Summaries this build wrote: read from memory by the rest of the build, stored at its
    end (``_flush``)."""
    for key, _kind, text, tin, tout in rows:
        run.known[key] = (text, tin, tout)
    run.unwritten.extend(rows)


def _flush(run: ReductionRun) -> None:
    """Store what the build wrote, in one transaction (also after a failure or a cancel)."""
    rows, run.unwritten = run.unwritten, []
    run.engine.store.put_reduction_summaries(rows)


async def _summarize_results(run: ReductionRun, plan: _Plan, chosen: list[tr.ResultCandidate], red: Reductions) -> None:
    """Summaries of ``chosen`` (stored ones reused, the others asked for and stored) into ``red``."""
    key = plan.key
    todo = [x for x in chosen if x.node_id not in red.results and x.node_id not in run.failed]
    cached = _stored(run, [key(x) for x in todo])
    run.planned += sum(1 for x in todo if key(x) not in cached)
    sem = asyncio.Semaphore(tr.CONCURRENT_CALLS)
    fresh: list[tuple[str, str, str, int, int]] = []

    async def one(x: tr.ResultCandidate) -> tuple[str, bool, str | None, int] | None:
        k = key(x)
        if k in cached:
            run.report.cache_hits += 1
            return cached[k][0], True, None, 0
        counts = char_classes(x.text)  # read once: to size it, its request and its stored row
        async with sem:
            try:
                summary, _ = await run.summarize(
                    x.text, lambda seg, prev: tr.result_messages(x, seg, previous=prev),
                    tr.result_summary_cap(x.tokens), "dagctx/turn-reduction", counts,
                )
            except Stop as stop:
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
        text = tr.reduced_result_text(x, summary)
        tokens = run.count(text)
        if tokens >= x.tokens:
            run.failures.append("notSmaller")
            return None
        fresh.append((k, "result", summary, estimate_of_classes(counts), estimate_tokens(summary)))
        return summary, False, text, tokens

    try:
        outcomes = await asyncio.gather(*(one(x) for x in todo))
    finally:
        _keep(run, fresh)  # what succeeded is kept, even when cancelled
    for x, out in zip(todo, outcomes):
        if out is None:
            run.failed.add(x.node_id)
            continue
        summary, was_cached, text, tokens = out
        if text is None:
            text = tr.reduced_result_text(x, summary)
            tokens = run.count(text)
        red.results[x.node_id] = ReducedText(x.node_id, x.tool_call_id, text, key(x), x.tokens, tokens, was_cached)


#: Whether a chunk that surely leaves the request over its limit is known from the
#: recounted messages it changes (``_estimate_with``) instead of a build; tests compare
#: both ways.
PREDICT_FIT = True


def _snapshot(red: Reductions) -> Reductions:
    return Reductions(results=dict(red.results), checkpoint=red.checkpoint)


def _estimate_with(run: ReductionRun, ref: Built, ref_red: Reductions, red: Reductions) -> int | None:
    """The local estimate of the request built with ``red``, from ``ref`` (built with
    ``ref_red``) when ``red`` only adds summarized results to it: the messages holding
    those results recounted with and without them (the counts a build takes), nothing
    else rebuilt. None when ``red`` differs otherwise."""
    if red.checkpoint is not ref_red.checkpoint or any(red.results.get(n) is not x
                                                        for n, x in ref_red.results.items()):
        return None
    added = {n for n in red.results if n not in ref_red.results}
    r = ref.rendering
    old, new = ref_red.aged_overlay(ref.aged), red.aged_overlay(ref.aged)
    cp = red.checkpoint
    synthetic = None if cp is None else {cp.id: cp.text}
    at = [k for k, ids in enumerate(r.node_ids) if not added.isdisjoint(ids)]
    msgs, ids = [r.messages[k] for k in at], [r.node_ids[k] for k in at]
    count = run.engine.views.count_messages
    graph = run.graph if run.graph is not None else run.engine.store.graph(run.session_id)
    after = count(graph, msgs, ids, r.tokenizer, new, synthetic, fmt=r.record.format)
    before = count(graph, msgs, ids, r.tokenizer, old, synthetic, fmt=r.record.format)
    return ref.estimate + sum(after) - sum(before)


def _surely_over(run: ReductionRun, ref: Built, ref_red: Reductions, red: Reductions) -> bool:
    """Whether the request built with ``red`` would surely be over its limit (a build
    spared): its estimate from ``ref``, scaled as ``ref`` was, above the limit by a
    margin that covers the calibration's rounding; never when ``ref``'s protected part
    is near the limit (a build checks it)."""
    if not PREDICT_FIT:
        return False
    limit = tr.input_limit(ref.budget)
    margin = 8 + limit // 100
    if ref.parts.total + margin > limit:
        return False
    estimate = _estimate_with(run, ref, ref_red, red)
    return estimate is not None and estimate * _ratio(ref) > limit + margin


def _checkpoint_bounds(run: ReductionRun, plan: _Plan, red: Reductions) -> tuple[int, int] | None:
    """Bounds of the request built with ``red`` — a checkpoint and summarized results —
    read from the unreduced request (``plan.base``) before any build with that checkpoint:
    (at most its local estimate, at least its protected part), or None.

    The checkpoint replaces the messages from the first to the last that hold a covered
    step's node (the region) by one message of its text; every other message renders as
    it did, but for the results ``red`` summarizes (recounted as ``_estimate_with``
    does) and the checkpoint's message merging with its neighbours (a format that joins
    same-role messages, SPEC §6), which saves at most one message's framing. Through
    that merge the turn's user message (protected) may take in the checkpoint, what the
    region keeps and the message after it."""
    cp = red.checkpoint
    if cp is None:
        return None
    base = plan.base
    r = base.rendering
    got = plan.regions.get(cp.key)
    if got is None and cp.key not in plan.regions:
        got = plan.regions[cp.key] = _region(run, plan, cp)
    if got is None:
        return None
    lo, hi, lower, upper = got
    at = sorted({k for n in red.results for k in plan.messages_of(n) if k < lo or k > hi})
    if at:
        msgs, ids = [r.messages[k] for k in at], [r.node_ids[k] for k in at]
        count = run.engine.views.count_messages
        graph = run.graph if run.graph is not None else run.engine.store.graph(run.session_id)
        after = count(graph, msgs, ids, r.tokenizer, red.aged_overlay(base.aged), None, fmt=r.record.format)
        before = count(graph, msgs, ids, r.tokenizer, dict(base.aged), None, fmt=r.record.format)
        lower += sum(after) - sum(before)
    return lower, upper


def _region(run: ReductionRun, plan: _Plan, cp: Checkpoint) -> tuple[int, int, int, int] | None:
    """What ``_checkpoint_bounds`` reads of a checkpoint, whatever results go with it: the
    region's first and last message, and both bounds without the results."""
    r = plan.base.rendering
    covered = set(cp.covers)
    nodes = {it.node_id for it, owner in zip(r.view.items, plan.shape.owners) if owner in covered}
    region = [k for k, ids in enumerate(r.node_ids) if not nodes.isdisjoint(ids)]
    if not region or region[0] == 0:
        return None
    lo, hi = region[0], region[-1]
    pm = r.per_message
    overhead = run.engine.counter.message_overhead(r.tokenizer)
    lower = plan.base.estimate - sum(pm[lo:hi + 1]) + cp.tokens_after - overhead
    kept = sum(pm[k] for k in range(lo, hi + 1) if not nodes.issuperset(r.node_ids[k]))
    upper = plan.base.parts.total + cp.tokens_after + kept + (pm[hi + 1] if hi + 1 < len(pm) else 0)
    return lo, hi, lower, upper


def _checkpoint_surely_over(run: ReductionRun, plan: _Plan, red: Reductions) -> bool:
    """``_surely_over`` for a request with a checkpoint not built yet (``_checkpoint_bounds``):
    its estimate surely above the limit, its protected part surely below it."""
    if not PREDICT_FIT:
        return False
    bounds = _checkpoint_bounds(run, plan, red)
    if bounds is None:
        return False
    lower, upper = bounds
    limit = tr.input_limit(plan.base.budget)
    margin = 8 + limit // 100
    return upper + margin <= limit and lower * _ratio(plan.base) > limit + margin


async def _reduce_results(run: ReductionRun, plan: _Plan, build: Callable[[Reductions], Built], red: Reductions,
                          covered: frozenset[str], ref: Built | None) -> Built | None:
    """Summarize results chunk by chunk (oldest first) until the request fits; the built
    request, or None when every chunk did not make it fit. ``ref``: the request built
    with ``red`` as it is now (over its limit), or None when its checkpoint was surely
    over unbuilt; a chunk after which the request is surely still over is not built
    (``_surely_over``, ``_checkpoint_surely_over``)."""
    cands = [x for x in plan.candidates if plan.owners[x.node_id] not in covered]
    chunk = max(1, math.ceil(tr.input_limit(plan.base.budget) * tr.CHUNK_SHARE / _ratio(plan.base)))
    ref_red = _snapshot(red)
    for group in tr.result_chunks(cands, chunk):
        if run.stopped:
            return None
        await _summarize_results(run, plan, group, red)
        if (_checkpoint_surely_over(run, plan, red) if ref is None else _surely_over(run, ref, ref_red, red)):
            continue
        built = build(red)
        if built.fits:
            return built
        run.engine.views.forget(built.rendering.record.render_id)
        ref, ref_red = built, _snapshot(red)
    return None


async def _checkpoint_segments(run: ReductionRun, plan: _Plan, steps: list[str], segments: list[tuple[int, int]],
                               cap: int, words: int) -> tuple[str, str, int] | None:
    """Summarize ``segments`` of ``steps`` rolling: (summary, key of the last, calls made),
    or None after a failure (recorded). A context overflow propagates (``Overflow``)."""
    key = ""
    summary: str | None = None
    calls = 0
    sizes: list[CharClasses] = []
    keys: list[str] = []
    for lo, hi in segments:  # each key names its segment and everything before it
        # the body's char_classes: its steps' and the (ASCII) line breaks between them
        sizes.append(add_classes((hi - lo - 1, 0, 0, 0), *(plan.counts(st) for st in steps[lo:hi])))
        # the key of "key \0 task \0 body", the body's steps hashed as encoded once
        parts: list[str | bytes] = [key, "\0", plan.task, "\0"]
        for j in range(lo, hi):
            parts += (b"\n", plan.encoded(steps[j])) if j > lo else (plan.encoded(steps[j]),)
        key = tr.summary_key("checkpoint", parts, run.config)
        keys.append(key)
    stored = _stored(run, keys)
    for (lo, hi), size, key in zip(segments, sizes, keys):
        hit = stored.get(key)
        if hit is not None:
            summary = hit[0]
            run.report.cache_hits += 1
            continue
        run.planned += 1
        texts = [plan.step_texts[st] for st in steps[lo:hi]]  # the body's lines, joined into the request
        prev = summary
        system, user = tr.checkpoint_messages(plan.task, texts, previous=prev, words=words)
        # the body goes into the request once, as it is: the request's estimate is its
        # shell's (the request of an empty body) plus the body's
        shell = char_classes(tr.checkpoint_messages(plan.task, "", previous=prev, words=words)[1])
        try:
            summary = await run.call(system, user, cap, "dagctx/turn-checkpoint",
                                     user_tokens=estimate_of_classes(add_classes(shell, size)))
        except Stop as stop:
            run.failures.append(f"checkpoint: {stop}")
            return None
        except DagctxError as err:
            run.failures.append(f"checkpoint failed: {err.message}")
            return None
        calls += 1
        run.done += 1
        run.progress("checkpoint segment written")
        if not summary.strip():
            run.failures.append("checkpoint: empty")
            return None
        body = estimate_of_classes(size) if run.estimates else run.count("\n".join(texts))
        if run.count(summary) >= max(1, body + (run.count(prev) if prev else 0)):
            run.failures.append("checkpoint: notSmaller")
            return None
        _keep(run, [(key, "checkpoint", summary, estimate_of_classes(size), estimate_tokens(summary))])
    if summary is None:
        return None
    return summary, key, calls


async def _checkpoint(run: ReductionRun, plan: _Plan, k: int) -> Checkpoint | None:
    """The canonical checkpoint of the turn's first ``k`` eligible steps (SPEC §8): the
    steps are cut into fixed segments from the start of the turn (each at most half the
    summarizer's window), summarized rolling, each segment's summary stored under a key
    of its content and everything before it. The same steps give the same checkpoint
    whichever requests were served before."""
    cap = tr.checkpoint_summary_cap(run.info.context_window)
    words = int(cap * 0.7)
    steps = plan.eligible[:k]
    covers = tuple(steps)
    for _attempt in range(4):
        seg_budget = run.segment_budget(cap)
        # sized by each step's text's estimate, read once per plan (``_Plan.counts``)
        segments = tr.checkpoint_segments(steps, seg_budget, plan.step_estimate)
        try:
            got = await _checkpoint_segments(run, plan, steps, segments, cap, words)
        except Overflow:
            # the summarizer is smaller than a segment: cut the turn into smaller ones
            run.seg_limit = max(64, seg_budget // 2)
            continue
        if got is None:
            return None
        summary, key, calls = got
        break
    else:
        run.failures.append(f"checkpoint failed: the summarizer {run.summarizer.name} (window "
                            f"{run.summarizer.context_window:,} tokens) overflowed even on small segments")
        return None
    before = sum(plan.tokens.get(st, 0) for st in covers)
    if run.count(summary) >= max(1, before):
        run.failures.append("checkpoint: notSmaller")
        return None
    cp = Checkpoint(id=f"checkpoint-{key[:16]}", covers=covers, summary=summary, key=key, tokens_before=before,
                    segments=len(segments), cached=calls == 0)
    return replace(cp, tokens_after=run.count(cp.text))



async def reduce(engine: Host, build: Callable[[Reductions], Built], *, session_id: str, head: str,
                 info: ModelInfo, token: int | str | None, seconds: float = tr.MAX_SECONDS,
                 first: Built | None = None) -> tuple[Built, c.TurnReduction]:
    """Build the request, reducing it within the turn until it fits, or raise ``BudgetExceeded``.

    ``first`` is the unreduced request, if already built. What is reduced is a pure
    function of the request (SPEC §8, reduction within a turn): no memory of earlier
    requests is consulted, only the stored summaries (keyed by content and model).
    """
    del head
    started = time.monotonic()
    built = first if first is not None else build(Reductions())
    before = built.budget.input_used
    if built.fits:
        return built, report_of(Reductions(), built, before=before)
    # the unreduced request is never handed out: not a renderId, nor what the next
    # render's stablePrefix compares with
    engine.views.forget(built.rendering.record.render_id)
    tokenizer = built.rendering.tokenizer
    rep = c.TurnReduction(tokens_before=before, tokens_after=before, limit=tr.input_limit(built.budget))
    run = ReductionRun(engine, info, tokenizer, session_id, token, started + seconds, rep, cache_config(engine, info))
    engine.peer.progress(token, {"kind": "begin", "title": "Reducing the request", "cancellable": True,
                                 "percentage": 0})
    plan = _plan(run, built)
    red = Reductions()
    outcome = "over budget"
    final: Built | None = None
    try:
        need = _need(built)
        saving = sum(max(0, tr.expected_saving(x)) for x in plan.candidates)
        tokens = plan.tokens
        cap = tr.checkpoint_summary_cap(info.context_window)
        # the checkpoint this turn has settled on, replayed from the request itself: it
        # moves only when the turn outgrows it, and then far enough to last (SPEC §8)
        base = built.estimate - sum(tokens.values())
        k_before, k_settled = tr.settled_checkpoint(
            plan.shape.steps, len(plan.eligible), tokens, base,
            math.floor(tr.input_limit(built.budget) / _ratio(built)), cap)
        # 1. results alone, when their expected saving covers the need within the calls
        #    and the turn's previous request had no checkpoint to keep, or whenever no
        #    step may be checkpointed (e.g. the loop's signed reasoning is sent: the
        #    results are condensed, the signed blocks go out unchanged)
        if not plan.eligible or (k_before == 0 and saving >= need
                                 and tr.results_needed(plan.candidates, need) <= tr.MAX_SUMMARY_CALLS):
            final = await _reduce_results(run, plan, build, red, frozenset(), built)
        # 2. else (or when they did not make it fit) a checkpoint of the turn's earlier
        #    steps — where the turn's growth settled it, at least the fewest quanta that
        #    free the need — then results after it
        if final is None and not run.stopped and plan.eligible:
            k = max(tr.choose_checkpoint(plan.eligible, tokens, need, cap), min(k_settled, len(plan.eligible)))
            while final is None and not run.stopped and k <= len(plan.eligible):
                cp = await _checkpoint(run, plan, k)
                if cp is None:
                    break
                covered = frozenset(cp.covers)
                red = Reductions(results={n: r for n, r in red.results.items() if plan.owners.get(n) not in covered},
                                 checkpoint=cp)
                if _checkpoint_surely_over(run, plan, red):
                    # the checkpoint alone surely leaves it over: no build of it (SPEC §8)
                    final = await _reduce_results(run, plan, build, red, covered, None)
                else:
                    attempt = build(red)
                    if attempt.fits:
                        final = attempt
                        break
                    engine.views.forget(attempt.rendering.record.render_id)
                    final = await _reduce_results(run, plan, build, red, covered, attempt)
                if final is None:
                    if k >= len(plan.eligible):
                        break
                    k = min(len(plan.eligible), k + tr.CHECKPOINT_QUANTUM)
        elif final is None and not plan.eligible:
            run.failures.append("checkpoint: no earlier step may be covered"
                                + (f" ({plan.blocked})" if plan.blocked else ""))
        # 3. last, only when nothing else made it fit: the newest step's own finished
        #    results (their call ids, arguments and errors stay as they are)
        if final is None and not run.stopped and plan.newest:
            await _summarize_results(run, plan, plan.newest, red)
            if any(x.node_id in red.results for x in plan.newest):
                attempt = build(red)
                if attempt.fits:
                    final = attempt
                else:
                    engine.views.forget(attempt.rendering.record.render_id)
        if final is not None and run.stopped:
            # a request built after a call or time limit depends on what happened to be
            # stored already: refused, the next build goes on from the stored summaries
            engine.views.forget(final.rendering.record.render_id)
            final = None
        outcome = "within budget" if final is not None else "over budget"
    finally:
        _flush(run)
        engine.peer.progress(token, {"kind": "end", "message": outcome})
    rep.failures = list(dict.fromkeys(run.failures))
    rep.duration_ms = round((time.monotonic() - started) * 1000, 1)
    if final is None:
        last = build(red)
        engine.views.forget(last.rendering.record.render_id)
        report_of(red, last, before=before, rep=rep)
        raise tr.budget_exceeded(last.budget, last.parts, input_used=last.budget.input_used, model=info.name,
                                 summary_calls=rep.summary_calls, failures=rep.failures)
    report_of(red, final, before=before, rep=rep)
    rep.reused = sum(1 for x in red.results.values() if x.cached) + (
        1 if red.checkpoint is not None and red.checkpoint.cached else 0)
    return final, rep


# ``Built``, ``TurnReducer``, ``build_render``, ``protected_of``, ``report_of`` and
# ``time_limit`` live in ``reduction_build.py``; they are named here too because the
# engine reads reduction within a turn by this module's name.
__all__ = ["Built", "TurnReducer", "build_render", "protected_of", "reduce", "report_of", "time_limit"]
