"""``context/compact``: one pipeline for manual, auto and overflow compaction (SPEC §8).

1. Fix the input view: the branch rendered with its aging decisions.
2. Choose the cut (``context.compaction_plan.cut_decision``); below the target → no LLM
   call, no write, ``ok`` with reason ``belowThreshold``.
3. Summarize the whole covered prefix — old summary + every covered turn — in one
   call or in stages, through the client's ``sampling/createMessage`` or the
   configured endpoint. Everything the summary covers was in its input (defect 1).
4. Validate before writing: non-empty, within length, the candidate render (the
   summary applied, same aging) strictly smaller, identifier retention ≥ the minimum
   (one retry listing the missing identifiers), and the branch unchanged while the
   summarizer ran.
5. Write exactly one node (``role=llm``, ``name=context/summary``); HEAD stays.
   ``tokensAfter`` is measured on a fresh render of the result (defect 3).

Any failure, timeout or cancellation writes nothing and says why.

Architecture Invariant: the only write is the final ``engine.write_node`` of the summary.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dagctx.context import artifact_trail, compaction_plan, summarizer_input, summary_check
from dagctx.context.content import covers_of
from dagctx.context.render import render_view
from dagctx.context.summary_choice import summary_applies
from dagctx.context.view import Item
from dagctx.context.tokens import ESTIMATE, estimate_tokens
from dagctx.ledger.graph import is_summary
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import NodeInput

from .heads import check_head
from .shared import AutoState, CompactionState
from .sampling import check_fits, summary_limits
from .summary_sources import create_message, summarizer_model

if TYPE_CHECKING:
    from .ports import Host

#: After this many consecutive failed auto compactions of a session, auto pauses.
AUTO_FAILURE_LIMIT = 3
AUTO_COOLDOWN_SECONDS = 300.0
RETRY_BACKOFF_SECONDS = (0.5, 2.0)
#: The summarizer's input budget is this share of the model's window.
STAGE_INPUT_SHARE = 0.5
#: A summarizer that leaves less than this for the transcript of one stage is too small.
MIN_STAGE_TOKENS = 256


@contextmanager
def _collector_held() -> Iterator[None]:
    """No cyclic collection while a step of the compaction walks the prefix: the
    transcript's entries, counts and stage texts are thousands of acyclic containers,
    freed by reference counting, and a collection in the middle rescans them (and the
    graph) again and again. What the step allocated is frozen before the collector comes
    back, as a render does (``ContextService.render``); the daemon unfreezes and
    collects when idle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()


def _item_tokens(engine: Host, graph: Any, tokenizer: str, aged: dict[str, str]) -> Any:
    cache = engine.views.node_tokens(graph, tokenizer)
    counter = engine.counter
    counts_of = engine.views.counts_of
    nodes = graph.nodes
    stored = cache.get

    # called once per item of the branch (thousands): one lookup of the node and of its
    # stored counts, the rest on locals
    def token_of_item(item: Item) -> int:
        nid = item.node_id
        node = nodes.get(nid)
        if node is None:
            return counter.count(item.text or "", tokenizer)
        got = stored(nid)
        tin, tout = counts_of(graph, nid, tokenizer, cache) if got is None else got
        kind = item.kind
        if kind == "tool_call" or (kind == "text_pair" and item.part == "call"):
            return tin
        if (kind == "tool_result" or kind == "text_pair") and nid in aged:
            return counter.count(aged[nid], tokenizer)
        if kind == "user" and node.role == "llm":
            return tin
        return tout if node.output is not None else tin

    def many(items: list[Item]) -> list[int]:
        """``[max(0, token_of_item(it)) for it in items]`` in one loop (the cut asks for
        every item of the branch; a call per item was most of its time)."""
        out: list[int] = []
        put = out.append
        for item in items:
            nid = item.node_id
            node = nodes.get(nid)
            if node is None:
                n = counter.count(item.text or "", tokenizer)
            else:
                got = stored(nid)
                tin, tout = counts_of(graph, nid, tokenizer, cache) if got is None else got
                kind = item.kind
                if kind == "tool_call" or (kind == "text_pair" and item.part == "call"):
                    n = tin
                elif (kind == "tool_result" or kind == "text_pair") and nid in aged:
                    n = counter.count(aged[nid], tokenizer)
                elif kind == "user" and node.role == "llm":
                    n = tin
                else:
                    n = tout if node.output is not None else tin
            put(n if n > 0 else 0)
        return out

    token_of_item.many = many  # type: ignore[attr-defined]
    return token_of_item


async def compact(engine: Host, p: c.CompactParams) -> c.CompactResult:
    started = time.monotonic()
    state: CompactionState = engine.compaction_state
    result = await _compact(engine, p, started)
    if p.trigger == "auto":
        st = state.auto.setdefault(p.session_id, AutoState())
        if result.ok:
            st.failures = 0
            st.last_error = None
        elif result.reason not in ("belowThreshold", "nothingToCompact"):
            st.failures += 1
            st.last_error = result.error or result.reason
            if st.failures >= AUTO_FAILURE_LIMIT:
                st.paused_until = time.time() + AUTO_COOLDOWN_SECONDS
    return result


async def _compact(engine: Host, p: c.CompactParams, started: float) -> c.CompactResult:
    store = engine.store
    views = engine.views
    sid = p.session_id
    token = p.work_done_token
    head = p.head or store.head(sid)
    with _collector_held():  # a first read of the session loads every node (as a render's would)
        graph = store.graph(sid)
    check_head(graph, p.head)
    graph.get(head)
    info = engine.models.get(p.model or engine.options.default_model)
    tokenizer = info.tokenizer or engine.counter.tokenizer_for(info.name)
    head_before = store.head(sid)

    def done(ok: bool, reason: str, tokens_before: int, tokens_after: int, **kw: Any) -> c.CompactResult:
        engine.peer.progress(token, {"kind": "end", "message": reason})
        return c.CompactResult(
            ok=ok, reason=reason, tokens_before=tokens_before, tokens_after=tokens_after, format=p.format,
            duration_ms=round((time.monotonic() - started) * 1000, 1), **kw,
        )

    engine.peer.progress(token, {"kind": "begin", "title": "Compacting", "cancellable": True, "percentage": 0})
    # 1. the fixed input view (the branch as the model sees it, aged), and 2. the cut:
    # local work that can take seconds on a big branch, so it runs where the server
    # runs heavy views (off its event loop, SPEC §1.4)
    @_collector_held()
    def prefix() -> tuple[Any, ...]:
        aged, aging_stats = views.aging_for(sid, head, info)
        before = views.render(sid, head=head, fmt="neutral", model=info.name, aged=aged, remember=False)
        plan, why = compaction_plan.cut_decision(
            before.view, graph, _item_tokens(engine, graph, tokenizer, aged), window=info.context_window,
            keep_recent_tokens=p.keep_recent_tokens,
        )
        return aged, aging_stats, before, plan, why

    aged, aging_stats, before, plan, why = await engine.offload(prefix)
    tokens_before = before.total  # the local estimate validation compares against
    # reported as context/render reports the same render in the caller's format
    # (calibrated after a usage report); validation stays on the neutral render
    if p.format == before.record.format:
        shown = before
    else:
        shown = await engine.offload(lambda: views.render(
            sid, head=head, fmt=p.format, model=info.name, aged=aged, remember=False))
    shown_before = views.calibrated(sid, info.name, shown.total, shown.record)[1]
    if plan is None:
        return done(True, why, shown_before, shown_before)
    # what must not change while the summarizer runs: the covered nodes and everything
    # under them by the caller edge (SPEC §8: any change is a conflict), and the kept node
    with _collector_held():
        snapshot = _watch(graph, set(plan.covered_ids), also={plan.kept_from})
        known = set(graph.nodes)
        # every item's body and transcript entry, built and measured once for the fidelity
        # terms, the stages, each request's size check and the coverage check
        # (the bodies that are whole texts of their nodes with counts kept at write, SPEC §6,
        # are not classified again)
        transcript = summarizer_input.Transcript(known=views.body_classes(graph))
        # the files the covered part changed (the summary's last line, SPEC §8): one
        # reading for every validation, from the same bodies
        trail = artifact_trail.trail_files(plan.input_items, transcript.bodies(plan.input_items))
    # what the fidelity gate checks (SPEC §8): found by the first validation while the
    # summary is counted beside it, then kept for a retry's
    identifiers = _Once(lambda: summary_check.fidelity_terms(plan, transcript=transcript))
    max_chars = max(2000, int(plan.tokens_covered * 4 * 0.6))
    # 3. summarize (in stages when the prefix is too large for one call)
    # Stage sizes only need to be about right (each stage is half a window): the fast
    # estimate sizes them instead of tokenizing the whole prefix exactly.
    count = estimate_tokens
    # every request must fit the summarizing model (SPEC §8): its answer cap and the
    # stage size come from its window, after the prompt around the transcript and room
    # for the summary so far (staged requests carry it)
    sinfo = summarizer_model(engine, info)
    max_tokens, input_limit = summary_limits(sinfo.context_window, sinfo.max_output)
    overhead = _prompt_overhead(plan, p.instructions, max_chars)
    stage_budget = min(int(sinfo.context_window * STAGE_INPUT_SHARE), input_limit - overhead - max_tokens)
    if stage_budget < MIN_STAGE_TOKENS:
        return done(False, "failed", shown_before, shown_before, error=(
            f"SamplingFailed: the summarizer {sinfo.name} (window {sinfo.context_window:,} tokens) is too small for "
            f"one chunk of the conversation: its {max_tokens:,}-token answer and the {overhead:,}-token summary "
            "prompt leave no room for the transcript; nothing was sent or written. Configure a summarizer with a "
            "larger window"))
    with _collector_held():
        stages = summarizer_input.split_stages(plan, stage_budget, count, transcript)
    sent: list[Any] = []
    text: str | None = None
    retention: float | None = None
    used_previous = plan.previous_summary_id is not None
    try:
        summary_so_far: str | None = None
        sub = plan
        # each stage's groups read off the plan's (a stage is a run of its items)
        groups = summarizer_input.stage_groups(plan, stages) if len(stages) > 1 else None
        for i, items in enumerate(stages, start=1):
            sub = plan if groups is None else summarizer_input.stage_plan(
                plan, items, index=i, total=len(stages), previous_text=summary_so_far, groups=groups[i - 1]
            )
            system, messages = summarizer_input.summarizer_messages(
                sub, instructions=p.instructions, max_chars=max_chars, transcript=transcript)
            sent.append(messages)
            size = summarizer_input.request_estimate(sub, transcript, instructions=p.instructions,
                                                     max_chars=max_chars)
            summary_so_far = await _sample(engine, p, system, messages, sinfo, max_tokens, size)
            engine.peer.progress(token, {"kind": "report", "message": f"stage {i}/{len(stages)}",
                                         "percentage": int(i * 80 / len(stages))})
        text = summary_so_far
        # covered ⊆ summarized (defect 1), checked beside the validation (the summary is
        # counted meanwhile); not checked when the structural fallback may stand in
        coverage = None if p.fallback == "structural" else (
            lambda: summarizer_input.covered_in_input(plan, sent, transcript))
        # 4. validate against a candidate render with the summary applied
        validation, node_input, counted, covered = await engine.offload(lambda: _validate(
            engine, graph, plan, text, head, aged, info, tokens_before, identifiers, max_chars,
            p.min_identifier_retention, coverage, trail))
        if not validation.ok and validation.reason == summary_check.LOW_FIDELITY:
            # the retry repeats the last request (the whole prefix, or the last stage on
            # top of the summary so far), so it fits the summarizer as that one did
            system, messages = summarizer_input.summarizer_messages(
                sub, instructions=p.instructions, max_chars=max_chars, transcript=transcript)
            retry = summarizer_input.retry_messages(messages, validation.missing)
            sent.append(retry)
            text = await _sample(engine, p, system, retry, sinfo, max_tokens)
            # ``sent`` holds the retry now: coverage is checked again on all of it
            validation, node_input, counted, covered = await engine.offload(lambda: _validate(
                engine, graph, plan, text, head, aged, info, tokens_before, identifiers, max_chars,
                p.min_identifier_retention, coverage, trail))
        retention = validation.retention
        if not validation.ok:
            return done(False, validation.reason or "failed", shown_before, shown_before,
                        identifier_retention=retention, error=_why(validation))
    except DagctxError as err:
        if p.fallback != "structural":
            return done(False, "failed", shown_before, shown_before, error=err.message)
        text = summary_check.structural_summary(plan)
        validation, node_input, counted, covered = await engine.offload(lambda: _validate(
            engine, graph, plan, text, head, aged, info, tokens_before, [], None, 0.0, trail=trail))
        if not validation.ok:
            return done(False, validation.reason or "failed", shown_before, shown_before, error=_why(validation))
    except asyncio.CancelledError:
        raise  # the server answers -32800; nothing was written
    # covered ⊆ summarized: refuse to write a summary of turns it never saw (defect 1)
    if not covered:
        return done(False, "failed", shown_before, shown_before,
                    error="internal check failed: a covered turn was not in the summarizer input")
    # 5. write exactly one node
    node = NodeInput(
        id=f"summary-{uuid.uuid4().hex[:20]}",
        role="llm",
        name=node_input["name"],
        output=node_input["output"],
        status="completed",
        predecessor=node_input["predecessor"],
        reads=list(node_input["reads"]),
        metadata={**node_input["metadata"], "trigger": p.trigger, "identifierRetention": retention,
                  "agingManifest": aging_stats.get("manifest")},
    )
    # the validation counted this very text under the model's tokenizer: not again
    taken = {tokenizer: counted} if counted is not None and node.output is node_input["output"] else None
    derived = await engine.offload(lambda: engine.derive_node(node.role, node.input, node.output, known=taken))

    def check_and_append() -> Any:
        # In the writer thread: the branch must not have changed while the summarizer ran,
        # and nothing can change it between this check and the append.
        graph_now = store.graph(sid)
        if store.head(sid) != head_before or _touched(graph_now, snapshot, known, head):
            return None
        return store.append(sid, node, move_head=False, derived=derived)

    out = await engine.write(check_and_append)
    if out is None:
        return done(False, "conflict", shown_before, shown_before, identifier_retention=retention,
                    error="the session changed while the summary was written; nothing was saved — retry")
    engine.announce(sid, [out.node], out.head)

    @_collector_held()
    def after_render() -> Any:
        if derived.tokens and tokenizer in derived.tokens:
            # what the store keeps for the summary: the render below needs not count it
            views.node_tokens(store.graph(sid), tokenizer).setdefault(out.node.id, derived.tokens[tokenizer])
        aged_after, _ = views.aging_for(sid, head, info)
        return views.render(sid, head=head, fmt=p.format, model=info.name, aged=aged_after, remember=False)

    after = await engine.offload(after_render)
    return done(
        True, p.trigger, shown_before, views.calibrated(sid, info.name, after.total, after.record)[1],
        summary_id=out.node.id,
        covers_ids=list(plan.covered_ids),
        summarised_count=len(plan.covered_ids),
        used_previous_summary=used_previous,
        superseded_summary=plan.previous_summary_id,
        identifier_retention=retention,
    )


def _prompt_overhead(plan: Any, instructions: str | None, max_chars: int) -> int:
    """Tokens of a summary request besides the transcript: the system prompt, the task,
    the instructions and the stage note (estimated on an empty request in update mode)."""
    empty = replace(plan, input_items=[], input_groups=[], previous_summary_text="", stage=(2, 2))
    system, messages = summarizer_input.summarizer_messages(empty, instructions=instructions, max_chars=max_chars)
    return estimate_tokens(system) + sum(estimate_tokens(m["content"]["text"]) for m in messages) + 64


async def _sample(engine: Host, p: c.CompactParams, system: str, messages: list[dict[str, Any]], info: Any,
                  max_tokens: int, size: int | None = None) -> str:
    """One completion with retries and backoff on transport failures; a request the
    summarizer ``info`` cannot take is refused before it is sent (``size``: the estimate
    of its one message's text, when the caller measured it already)."""
    check_fits(system, [m["content"]["text"] for m in messages], max_tokens, info.context_window, info.name,
               estimates=None if size is None else [size])
    params = c.CreateMessageParams(
        messages=[c.SamplingMessage(role=m["role"], content=c.SamplingContent(text=m["content"]["text"]))
                  for m in messages],
        system_prompt=system,
        max_tokens=max_tokens,
        metadata={"purpose": "dagctx/compaction", "sessionId": p.session_id},
    )
    attempts = (0.0, *RETRY_BACKOFF_SECONDS)
    last: DagctxError | None = None
    for delay in attempts:
        if delay:
            await asyncio.sleep(delay)
        try:
            text, _model = await create_message(engine, params, timeout=p.timeout_seconds)
            return text
        except DagctxError as err:
            last = err
            # Only transport failures (a dropped connection, HTTP 429/5xx) are retried:
            # a timeout or a refusal would only repeat, multiplying the wait.
            if not (err.details or {}).get("retryable"):
                break
    assert last is not None
    raise last


class _Once:
    """``fn()``, found the first time it is asked for and kept."""

    __slots__ = ("_fn", "_value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn: Callable[[], Any] | None = fn
        self._value: Any = None

    def __call__(self) -> Any:
        if self._fn is not None:
            self._value = self._fn()
            self._fn = None
        return self._value


#: A summary at least this long is counted beside the validation's other work (``_Count``).
COUNT_BESIDE_CHARS = 8192


#: The threads that count summaries beside the validation (``_Count``): kept between
#: compactions, each started on first need (one per compaction validating at once, up
#: to this many; a count past them waits for one to be free).
COUNT_THREADS = 16
_COUNTERS: ThreadPoolExecutor | None = None
_COUNTERS_LOCK = threading.Lock()


def _counters() -> ThreadPoolExecutor:
    global _COUNTERS
    with _COUNTERS_LOCK:
        if _COUNTERS is None:
            _COUNTERS = ThreadPoolExecutor(max_workers=COUNT_THREADS, thread_name_prefix="dagctx-summary-count")
        return _COUNTERS


class _Count:
    """``counter.count(text, tokenizer)`` in another thread. The validation must count
    the summary under the model's tokenizer (SPEC §8: the candidate render's
    ``tokensAfter``), and tiktoken leaves the interpreter lock while it encodes; a long
    summary's count (16 ms for 95 KB) then runs while this thread checks the coverage and
    renders the candidate, instead of after them. The count is handed to a thread kept
    for it (``_counters``): starting a thread of its own held this one about 0.7 ms,
    waiting for the new thread to run. This thread waits only until the count has begun:
    a woken thread needs the interpreter lock to reach tiktoken, and would otherwise wait
    for it up to a switch interval (5 ms) while this one validates."""

    __slots__ = ("_job", "_future")

    def __init__(self, counter: Any, text: str, tokenizer: str) -> None:
        self._job = (counter, text, tokenizer)
        self._future: Future[int] | None = None
        self.start()

    def start(self) -> None:
        counter, text, tokenizer = self._job
        begun = threading.Event()

        def count() -> int:
            begun.set()
            return counter.count(text, tokenizer)

        self._future = _counters().submit(count)
        begun.wait()

    def result(self) -> int:
        assert self._future is not None
        return self._future.result()  # the count's error, when it failed


@_collector_held()
def _validate(engine: Host, graph: Any, plan: Any, text: str | None, head: str, aged: dict[str, str],
              info: Any, tokens_before: int, identifiers: list[str] | Callable[[], list[str]],
              max_chars: int | None,
              min_retention: float, coverage: Callable[[], bool] | None = None,
              trail: list[str] | None = None,
              ) -> tuple[Any, dict[str, Any], tuple[int, int] | None, bool]:
    """The verdict on ``text``, the summary node's fields, the (input, output) tokens
    the candidate render counted of that node under the model's tokenizer, and
    ``coverage()`` (True without it), computed while the summary is counted. ``trail``:
    the plan's artifact trail, read once for every validation; ``identifiers``: the
    fidelity terms, or what finds them (called while the summary is counted)."""
    node_input = compaction_plan.summary_node_input(plan, text or "", model=info.name, trail=trail)
    tokenizer = info.tokenizer or engine.counter.tokenizer_for(info.name)
    output = node_input["output"]
    # the count the candidate render would take of the summary (``counts_of``: its output
    # is a text), started first when tiktoken counts it and it is long
    counting = (_Count(engine.counter, output, tokenizer)
                if len(output) >= COUNT_BESIDE_CHARS and engine.counter.resolve(tokenizer) != ESTIMATE else None)
    covered = True if coverage is None else coverage()
    candidate = compaction_plan.with_candidate(graph, node_input)
    view = render_view(candidate, head, aged=aged)
    from dagctx.context.formats import to_messages

    _, messages, node_ids = to_messages(view, "neutral")
    terms = identifiers() if callable(identifiers) else identifiers
    cand_id = "summary_candidate"
    if counting is not None:
        got = counting.result()
        if any(cand_id in ids for ids in node_ids):  # what ``count_messages`` would count of it
            cand = candidate.nodes[cand_id]
            engine.views.node_tokens(candidate, tokenizer).setdefault(
                cand_id, (engine.counter.count_value(cand.input, tokenizer), got))
    per = engine.views.count_messages(candidate, messages, node_ids, tokenizer, aged)
    # the candidate node has no stored count: its text was counted, and is not kept here
    counted = engine.views.node_tokens(candidate, tokenizer).pop(cand_id, None)
    after = sum(per)
    validation = summary_check.validate_summary(
        text, plan, tokens_before=tokens_before, candidate_tokens_after=after, max_chars=max_chars,
        identifiers=terms, min_retention=min_retention,
    )
    # what the gate measured rides on the node (SPEC §8), so a viewer can show it later:
    # both token figures are the same estimate (neutral format, same aging)
    node_input["metadata"]["stats"] = {
        "tokensBefore": tokens_before, "tokensAfter": after,
        "identifiersChecked": list(terms), "identifiersMissing": list(validation.missing),
    }
    return validation, node_input, counted, covered


class _Watched:
    """What a compaction watches while the summarizer runs (``_watch``): the graph it read,
    how many node replacements that graph had seen (``SessionGraph.updates``), the
    watched ids and each one's node as it was — the node object itself, in ``ids``'
    order. A graph never changes a node in place: ``node/update`` (the one mutation,
    SPEC §8) puts a new node object in its place and records its id in ``updates``, so
    the same graph with no replacement since has every watched node unchanged, and a
    node still the same object is unchanged."""

    __slots__ = ("graph", "updates", "ids", "order", "nodes")

    def __init__(self, graph: Any, ids: set[str], order: list[str], nodes: list[Any]) -> None:
        self.graph = graph
        self.updates = len(graph.updates)
        self.ids = ids
        self.order = order
        self.nodes = nodes

    def __contains__(self, nid: object) -> bool:
        return nid in self.ids

    def items(self) -> Iterator[tuple[str, Any]]:
        """``(id, node as it was)`` of each watched node."""
        return zip(self.order, self.nodes)


def _watch(graph: Any, ids: set[str], also: set[str]) -> _Watched:
    """``ids``, every node below them (caller edge) and ``also`` → each one's node, as
    the one mutation (``node/update``) may replace it."""
    watched = set(ids) | also | graph.below(ids)
    nodes = graph.nodes
    if not watched <= nodes.keys():  # ``also`` may name no node: only the graph's are watched
        watched &= nodes.keys()
    order = list(watched)
    return _Watched(graph, watched, order, list(map(nodes.__getitem__, order)))


def _touched(now: Any, snapshot: _Watched, known: set[str], head: str) -> bool:
    """True when a covered or kept node, or any node under one (a tool call completed by
    ``node/update``), changed, or a node was attached to any of them, or a summary that
    applies to this branch was written (a concurrent compaction), meanwhile."""
    # the graph read before with no node replaced since: every watched node is the one
    # watched (the usual case), else each is compared
    if now is not snapshot.graph or len(now.updates) != snapshot.updates:
        nodes = now.nodes
        for nid, was in snapshot.items():
            node = nodes.get(nid)
            if node is None:
                return True
            if node is was:
                continue
            # the same objects are equal without comparing their contents (the metadata of
            # a node is most of the comparison)
            if node.metadata is was.metadata and node.output is was.output and node.status is was.status:
                continue
            if node.status != was.status or node.output != was.output or node.metadata != was.metadata:
                return True
    # a graph only gains nodes: the same graph with as many as were known has no new one
    new = ([] if now is snapshot.graph and len(now.nodes) == len(known)
           else [n for n in now.by_seq if n.id not in known])
    watched = snapshot.ids
    if any(n.predecessor in watched or n.caller in watched for n in new):
        return True
    summaries = [n for n in new if is_summary(n) and covers_of(n)]
    if summaries:
        chain = now.chain(head)
        return any(summary_applies(now, n, chain) for n in summaries)
    return False


def _why(v: Any) -> str:
    if v.reason == summary_check.LOW_FIDELITY:
        return (f"the summary kept {v.retention:.0%} of the session's identifiers; missing: "
                + ", ".join(v.missing[:10]))
    return {
        summary_check.EMPTY: "the summarizer returned an empty summary",
        summary_check.TOO_LONG: "the summary is longer than allowed",
        summary_check.NOT_SMALLER: "the summary would not make the context smaller",
    }.get(v.reason, str(v.reason))
