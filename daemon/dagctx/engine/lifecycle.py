"""Context engines: one explicit turn lifecycle, assembled from replaceable parts.

The lifecycle (SPEC §7, context engines): ``session_start`` → ``ingest`` (each
append) → ``prepare`` (before a model call) → ``compact`` → ``after_turn`` (usage
report) → ``session_end``. ``ContextEngine`` is the default engine; each component
is an attribute a subclass may replace on its own, and each is read by the turn:
``token_counter``, ``budget_allocator``, ``ager``, ``system_prompt_assembler`` (where
summaries come from is the connection's summary sources, ``summary_sources.py``).

``context/prepare`` runs the engine's one turn template, ``turn``: ``setup`` (the model,
the turn hooks and the token counts of hooks and tools, once per request) → ``prepare``
(one build) → ``compact`` (automatic compaction, then a build again) and ``reduce``
(reduction within the turn) only when needed → ``hand_out``. Each step is a method a
subclass may replace; ``turn`` itself is the order.

Engines are registered by name: the built-ins below, plus Python entry points in
group ``dagctx.engines`` (``name = "package.module:EngineClass"``). The engine of a
turn is the agent profile's ``contextEngine`` (``context/prepare`` params), else the
daemon config's, else ``default``. An engine that fails to load or raises is
reported in the decision path and the turn falls back to the default engine.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import budget as budget_mod
from dagctx.context import cache_economy, compaction_plan
from dagctx.context import turn_reduction as tr
from dagctx.context.system_prompt import assemble_system_prompt, prompt_layers
from dagctx.context.turn_reduction import Reductions
from dagctx.protocol import context_messages as c

from . import compaction_pipeline, sampling, turn_reduction
from .heads import check_head
from .prompt_config import prompt_options
from .turn_reduction import Built, protected_of
from .views import recorded_tools
from dagctx.context.formats import apply_turn_hooks

if TYPE_CHECKING:
    from dagctx.context.models import ModelInfo

    from .ports import Host

log = logging.getLogger("dagctx.engine")

ENTRY_POINT_GROUP = "dagctx.engines"


@dataclass
class TurnSetup:
    """What stays the same within one ``context/prepare`` request, made once by
    ``ContextEngine.setup`` and shared by every build of it (the first, the one after an
    automatic compaction, each attempt of reduction within the turn): the model, the turn
    hooks, and the token counts of the hooks and the tools schema per tokenizer."""

    info: ModelInfo
    hooks: dict[str, str]
    _tools: dict[str, int] = field(default_factory=dict)
    _hooks: dict[str, int] = field(default_factory=dict)

    def tools_tokens(self, tools: Any, counter: Any, budget: Any, tokenizer: str) -> int:
        if tokenizer not in self._tools:
            self._tools[tokenizer] = budget.tools_schema_tokens(tools, counter, tokenizer)
        return self._tools[tokenizer]

    def hook_tokens(self, counter: Any, tokenizer: str) -> int:
        if tokenizer not in self._hooks:
            self._hooks[tokenizer] = sum(counter.count(v, tokenizer) for v in self.hooks.values())
        return self._hooks[tokenizer]


class ContextEngine:
    """The default engine. Subclass it and replace a component, or override a step."""

    name = "default"
    #: whether old tool results are aged (the reduction layer)
    aging = True
    #: whether a request over its limit is reduced within the turn (SPEC §8)
    turn_reduction = True

    def __init__(self, host: Host) -> None:
        self.host = host
        self.token_counter = host.counter
        self.budget_allocator = budget_mod
        self.system_prompt_assembler = assemble_system_prompt
        self.ager: Any = None
        #: the setups of the requests this engine is preparing, by request (``setup``)
        self._setups: dict[int, tuple[c.PrepareParams, TurnSetup]] = {}

    # ------------------------------------------------------------ lifecycle steps

    def session_start(self, session_id: str) -> None:
        """A session was created or imported."""

    def ingest(self, session_id: str, node: Any) -> None:
        """A node was appended."""

    def after_turn(self, session_id: str, node_id: str, usage: c.UsageReportParams) -> None:
        """The provider reported usage for a call."""

    def session_end(self, session_id: str) -> None:
        """The session was deleted."""

    # ------------------------------------------------------------ the turn template (SPEC §7, §8)

    def turn(self, p: c.PrepareParams) -> c.PrepareResult | Awaitable[c.PrepareResult]:
        """One turn's request: handed out at once when it fits and needs no compaction,
        else an awaitable that compacts (at ≥ 80 % with ``allowCompaction``) and/or
        reduces within the turn first, or refuses it (``BudgetExceeded``)."""
        self._setups[id(p)] = (p, self.setup(p))
        try:
            first = self.prepare(p)
            first.engine = self.name
            compact = first.needs_compaction and p.allow_compaction and not self._auto_paused(p, first)
            if not compact and tr.fits(first.budget):
                self._setups.pop(id(p), None)
                return self.hand_out(p, first)
        except BaseException:
            self._setups.pop(id(p), None)
            raise
        return self._finish(p, first, compact)

    async def _finish(self, p: c.PrepareParams, first: c.PrepareResult, compact: bool) -> c.PrepareResult:
        try:
            if compact:
                first = await self.compact(p, first)
                if tr.fits(first.budget):
                    return self.hand_out(p, first)
            return self.hand_out(p, await self.reduce(p, first))
        finally:
            self._setups.pop(id(p), None)

    def setup(self, p: c.PrepareParams) -> TurnSetup:
        """What every build of this request shares (``TurnSetup``); within ``turn`` it is
        made once, and ``build`` finds it by the request."""
        held = self._setups.get(id(p))
        if held is not None and held[0] is p:
            return held[1]
        host = self.host
        info = host.models.get(p.model or host.options.default_model)
        hooks = {k: v for k, v in (("prependContext", p.prepend_context), ("memoryPrefetch", p.memory_prefetch)) if v}
        return TurnSetup(info, hooks)

    def prepare(self, p: c.PrepareParams) -> c.PrepareResult:
        """The turn's request, unreduced (SPEC §7, §8). A request over its limit is
        returned as built; ``turn`` then reduces it within the turn (``reduce``) or
        refuses it."""
        built = self.build(p, Reductions())
        self.host.turn_reducer.stash(built)
        return built.result

    def _auto_paused(self, p: c.PrepareParams, result: c.PrepareResult) -> bool:
        state = self.host.compaction_state
        paused = state.auto_paused(p.session_id)
        if paused:
            st = state.auto[p.session_id]
            result.decision_path.append(
                f"auto-compaction paused for {paused:.0f} s after {st.failures} consecutive failures "
                f"(last: {st.last_error})"
            )
        return bool(paused)

    async def compact(self, p: c.PrepareParams, first: c.PrepareResult) -> c.PrepareResult:
        """Compact the branch automatically (SPEC §8), then build the request again."""
        res = await compaction_pipeline.compact(
            self.host,
            c.CompactParams(session_id=p.session_id, head=p.head, model=p.model, trigger="auto", format=p.format),
        )
        again = self.prepare(p)
        again.engine = self.name
        again.compaction = msgspec.to_builtins(res)
        verdict = (f"auto-compaction wrote {res.summary_id} ({res.tokens_before:,} → {res.tokens_after:,} tokens)"
                   if res.ok and res.summary_id else f"auto-compaction wrote nothing ({res.reason}: {res.error or ''})")
        again.decision_path = first.decision_path + [verdict] + again.decision_path
        return again

    async def reduce(self, p: c.PrepareParams, first: c.PrepareResult) -> c.PrepareResult:
        """Bring a request over its limit under it within the turn (SPEC §8), or refuse it."""
        host = self.host
        head = p.head or host.store.head(p.session_id)
        info = self.setup(p).info
        start = host.turn_reducer.take(first.render_id)
        if not self.turn_reduction:
            host.views.forget(first.render_id)
            parts = start.parts if start is not None else tr.ProtectedParts(
                first.budget.system_prompt, first.budget.tools_schema, 0, 0)
            raise tr.budget_exceeded(first.budget, parts, input_used=first.budget.input_used, model=info.name,
                                     failures=[f"engine {first.engine!r} does not reduce within a turn"])
        if start is None:
            host.views.forget(first.render_id)
        built, rep = await turn_reduction.reduce(
            host, lambda red: self.build(p, red), session_id=p.session_id, head=head, info=info,
            token=p.work_done_token,
            seconds=turn_reduction.time_limit(p.reduction_timeout_seconds, "params.reductionTimeoutSeconds"),
            first=start,
        )
        result: c.PrepareResult = built.result
        result.engine = first.engine
        result.compaction = first.compaction
        result.reduction = rep
        # the signals describe the session, not this one reduced request: the earlier
        # turns still need compacting (SPEC §7 thresholds on the unreduced request)
        result.recommend_compaction = result.recommend_compaction or first.recommend_compaction
        result.needs_compaction = result.needs_compaction or first.needs_compaction
        extra = [line for line in first.decision_path if line not in result.decision_path]
        result.decision_path = extra + result.decision_path + [
            f"reduction within the turn: {rep.tokens_before:,} → {rep.tokens_after:,} tokens (limit {rep.limit:,}); "
            f"{len(rep.results)} results summarized, checkpoint {rep.checkpoint.id if rep.checkpoint else 'none'}; "
            f"{rep.summary_calls} summary calls, {rep.cache_hits} cached, {rep.reused} reused from stored summaries"
        ]
        return result

    def hand_out(self, p: c.PrepareParams, result: c.PrepareResult) -> c.PrepareResult:
        """The request is handed out: only now is its new system-prompt node written
        (SPEC §7: a refused request writes nothing)."""
        self.host.views.commit_system_prompt(p.session_id, result.render_id)
        # what the engine decided, as it said it: the call appended with this request records
        # it (SPEC §6); not in the manifest, which is the same from any daemon (SPEC §8)
        self.host.views.note_decision_path(result.render_id, result.decision_path)
        return result

    # ------------------------------------------------------------ one build

    def build(self, p: c.PrepareParams, reductions: Reductions, *, remember: bool = True,
              force_aging: bool = False) -> Built:
        """Build the request of ``p`` with ``reductions`` applied; check the protected part.

        Aging changes that do not pay for their cache break wait (SPEC §8, aging and the
        prompt cache) unless ``force_aging``: a request that does not fit its limit, or
        reaches the 70 % of compaction, with aging held back is built again with it."""
        setup = self.setup(p)
        host = self.host
        store = host.store
        views = host.views
        counter = self.token_counter
        budget = self.budget_allocator
        path: list[str] = []
        graph = store.graph(p.session_id)
        check_head(graph, p.head)
        head = p.head or store.head(p.session_id)
        graph.get(head)
        info = setup.info
        path.append(
            f"model {info.name}: window {info.context_window:,}, max output {info.max_output:,}"
            + ("" if info.known else " (unknown model: default limits)")
        )
        workspace = p.workspace or host.options.workspace
        if workspace:  # the client's folder, not the daemon's
            workspace = host.client_path(workspace, "workspace" if p.workspace else "initializationOptions.workspace")
        options = prompt_options(
            host, p.system_prompt,
            mode=p.prompt_mode,
            identity=p.identity,
            agent_prompt=p.agent_prompt,
            prepend=p.prepend_system_context,
            append=p.append_system_context,
        )
        prompt = views.ensure_system_prompt(
            p.session_id, graph, options, workspace, assembler=self.system_prompt_assembler
        )
        system_text, system_node, notes = prompt.text, prompt.node_id, prompt.notes
        if not info.known:
            named = p.model or host.options.default_model
            what = f"model {named!r} is not in the model table" if named else "no model was named"
            notes.append(
                f"{what}: budgeted with the default window {info.context_window:,}, max output "
                f"{info.max_output:,} and tokenizer {info.tokenizer}; name a known model, or give its "
                "limits in initializationOptions.models or the model config file"
            )
        graph = store.graph(p.session_id)
        where = (f"node {system_node}" + (" (new: written when the request is handed out)" if prompt.pending else "")
                 if system_node else "not stored (nothing to store)")
        path.append(f"system prompt ({p.prompt_mode}): {len(system_text):,} chars, {where}")
        hooks = setup.hooks
        ttl = host.options.prompt_cache_ttl_seconds
        ttl = DEFAULT_CACHE_TTL if ttl is None else ttl
        aged, aging_stats = views.aging_for(p.session_id, head, info, enabled=self.aging, ager=self.ager,
                                            frame=p.frame, defer=not (force_aging or reductions),
                                            cold=cache_cold(graph, head, p.prompt_cache, time.time(), ttl),
                                            graph=graph)
        deferred = aging_stats.get("deferred")
        if deferred:
            path.append(
                f"aging held back: changing {deferred['results']} old tool results would free "
                f"{deferred['freed']:,} tokens, which the {deferred['requests']} requests since the last cache "
                f"break read for {deferred['carried']:,.0f} base-input tokens; the break costs "
                f"{deferred['cost']:,.0f} (rewriting {deferred['rewrite']:,})")
        if aging_stats.get("toolResultsAged"):
            path.append(
                f"aging: {aging_stats['toolResultsAged']} old tool results shrunk, "
                f"{aging_stats.get('tokensFreedByAging', 0):,} tokens freed"
            )
        extra = {**aging_stats.get("manifest", {}), **({"turnHooks": hooks} if hooks else {})}
        if reductions:
            extra["turnReduction"] = reductions.manifest()
        r = views.render(
            p.session_id,
            head=head,
            fmt=p.format,
            model=p.model,
            frame=p.frame,
            system_node_id=system_node,
            aged=reductions.aged_overlay(aged) if reductions else aged,
            extra_manifest=extra,
            remember=remember,
            checkpoint=reductions.checkpoint,
            pending_system=prompt.pending,
            reasoning=p.reasoning,
            graph=graph,  # read after the system prompt's node (above): nothing is written between
        )
        messages = apply_turn_hooks(r.messages, hooks, p.format)
        hook_tokens = setup.hook_tokens(counter, r.tokenizer)
        if r.view.summary_id:
            path.append(f"summary {r.view.summary_id} replaces {len(r.view.covered)} nodes")
        raw_tools = setup.tools_tokens(p.tools, counter, budget, r.tokenizer)
        # The whole prompt as the provider will measure it: system + messages + hooks +
        # tools. The call records this one figure (manifest ``tokens``), calibration
        # scales this one figure, and each part is scaled once — the provider's count
        # already includes the system prompt and tools, so nothing is added twice
        # (SPEC §7: system prompt and tools counted once).
        estimate = r.total + hook_tokens + raw_tools
        r.manifest["tokens"] = estimate
        r.manifest["toolsTokens"] = raw_tools
        r.manifest["toolsHash"] = tools_hash(p.tools)
        if p.tools and (p.frame is not None or recorded_tools(graph, head, r.manifest["toolsHash"]) is None):
            # recorded once per branch while it stays the same (replay finds it, SPEC §6)
            r.manifest["tools"] = p.tools
        r.record.total = estimate
        cache_break = views.cache_break(r, estimate, raw_tools)
        if cache_break is not None:
            path.append(
                f"prompt cache break at message {cache_break.at_message} ({', '.join(cache_break.causes)}): "
                f"{cache_break.invalidated_tokens:,} cached tokens invalidated, {cache_break.rewritten_tokens:,} "
                f"written again, estimated cost {cache_break.estimated_cost:+,.0f} base-input tokens"
            )
        source, total = views.calibrated(p.session_id, info.name, estimate, r.record)
        system_tokens, history_tokens, tools_tokens = budget.distribute(
            total, r.system_tokens, estimate - r.system_tokens - raw_tools, raw_tools
        )
        b = budget.compute_budget(
            info, system_tokens, history_tokens, tools_tokens, requested_output=p.max_output_tokens, source=source
        )
        b = msgspec.structs.replace(b, safety_margin=tr.safety_margin(info.context_window))
        path.append(
            f"budget: {b.input_used:,} of {b.input_budget:,} input tokens ({b.percent_used}%), "
            f"reserve {b.output_reserve:,}, safety margin {b.safety_margin:,}, source {source}"
        )
        parts = protected_of(graph, r, system_tokens, tools_tokens, hook_tokens)
        if parts.total > tr.input_limit(b):
            views.forget(r.record.render_id)  # refused: its prompt node is never written
            layers = prompt_layers(system_text, prompt.sections, lambda t: counter.count(t, r.tokenizer))
            raise tr.budget_exceeded(b, parts, input_used=b.input_used, model=info.name, system_layers=layers)
        # The compaction signals describe the session, not this reduced request: they
        # count what the reductions within the turn took out (SPEC §7, §8).
        saved = reductions.tokens_saved(aged) if reductions else 0
        scale = (b.input_used / estimate) if estimate > 0 else 1.0
        unreduced = msgspec.structs.replace(b, input_used=b.input_used + round(saved * scale))
        full, needs = budget.thresholds(unreduced)
        if deferred and (full or not tr.fits(b)):
            # the budget needs the aging held back: build the request with it
            views.forget(r.record.render_id)
            return self.build(p, reductions, remember=remember, force_aging=True)
        economy = compaction_economy_of(graph, head, r, info, unreduced.input_used,
                                        fixed=system_tokens + tools_tokens + hook_tokens,
                                        now=time.time(), ttl=ttl, cache=p.prompt_cache)
        # SPEC §7, compaction signals: at 70 % the budget leaves no choice; below it, a
        # compaction is recommended once it pays for the cache rewrite it causes
        recommend = full or economy.pays
        if needs:
            path.append("≥ 80 %: compaction needed" + ("" if p.allow_compaction else " (not allowed by the client)"))
        elif full:
            path.append("≥ 70 %: compaction recommended")
        elif economy.pays:
            path.append(
                f"compaction recommended: it pays for its cache rewrite (the {economy.requests + 1} requests since "
                f"the last compaction read {economy.carried:,.0f} base-input tokens beyond the ~{economy.after:,} "
                f"left after one; it costs {economy.cost:,.0f}"
                + ("; the prompt cache has gone cold, nothing to rewrite)" if economy.cold else ")"))
        if not tr.fits(b):
            path.append(f"over the limit of {tr.input_limit(b):,} input tokens: reduction within the turn needed")
        result = c.PrepareResult(
            system=system_text,
            messages=messages,
            reads=list(r.view.reads),
            budget=b,
            manifest=r.manifest,
            render_id=r.record.render_id,
            decision_path=path,
            recommend_compaction=recommend,
            needs_compaction=needs,
            stable_prefix=r.stable,
            summary_id=r.view.summary_id,
            notes=notes,
            engine=self.name,
            tool_results_aged=int(aging_stats.get("toolResultsAged", 0)),
            tokens_freed_by_aging=int(aging_stats.get("tokensFreedByAging", 0)),
            references_protected=int(aging_stats.get("referencesProtected", 0)),
            max_output_tokens=b.output_reserve,
            cache_break=cache_break,
        )
        return Built(rendering=r, result=result, budget=b, estimate=estimate, parts=parts, aged=aged)


#: the provider's prompt-cache lifetime when the connection names none (Anthropic's default)
DEFAULT_CACHE_TTL = 300.0


def requests_since_compaction(graph: Any, head: str, summary_id: str | None) -> tuple[list[int], float | None]:
    """Prompt sizes (``renderManifest.tokens``) of the requests handed out on the branch of
    ``head`` since its active summary ``summary_id`` was first used, oldest first, and when
    the newest request of the branch was answered (its llm node's ``createdAt``)."""
    out: list[int] = []
    last: float | None = None
    for node in reversed(graph.chain(head)):
        man = cache_economy.request_manifest(node)
        if man is None:
            continue
        if last is None:
            last = node.created_at
        if man.get("summaryId") != summary_id:
            break
        tokens = man.get("tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            out.append(tokens)
    out.reverse()
    return out, last


def cache_cold(graph: Any, head: str, said: str | None, now: float, ttl: float) -> bool:
    """Whether the provider's prompt cache has expired for the branch of ``head`` (SPEC §7):
    the client's word (``promptCache``) when it gives one, else the branch's previous
    request answered longer ago than ``ttl``."""
    last = None
    for node in reversed(graph.chain(head)):
        if node.role == "llm" and node.caller is None:
            last = node.created_at
            break
    if last is None:
        return False
    if said is not None:
        return said == "cold"
    return now - last > ttl


def compaction_economy_of(graph: Any, head: str, r: Any, info: Any, tokens: int, *,
                          fixed: int, now: float, ttl: float, cache: str | None = None) -> cache_economy.CompactionEconomy:
    """Whether compacting the branch before this request pays (SPEC §7): what is left after
    a compaction is the fixed part, a summary (half the summarizer's answer cap, or the
    active summary's size) and the kept tail (the keep-tail target, or the current user
    turn when larger: it always stays verbatim). ``cache``: the client's word on its
    prompt cache (``context/prepare``'s ``promptCache``), over the daemon's clock."""
    view = r.view
    summary_tokens = sampling.summary_limits(info.context_window, info.max_output)[0] // 2
    turn_nodes = {it.node_id for it in view.items if it.turn == view.turn_count and it.kind != "summary"}
    turn_tokens = 0
    for ids, n in zip(r.node_ids, r.per_message):
        if view.summary_id is not None and view.summary_id in ids:
            summary_tokens = n
        elif any(i in turn_nodes for i in ids):
            turn_tokens += n
    after = fixed + summary_tokens + max(compaction_plan.keep_target(info.context_window), turn_tokens)
    previous, last = ([], None) if view.frame is not None else requests_since_compaction(graph, head, view.summary_id)
    cold = last is not None and now - last > ttl
    if cache is not None and last is not None:
        cold = cache == "cold"
    return cache_economy.compaction_economy(previous, tokens, after, cold=cold)


def tools_hash(tools: Any) -> str | None:
    """A short hash of the tools schema a request carries (its manifest's ``toolsHash``):
    a changed schema breaks the whole prompt cache (SPEC §7)."""
    if not tools:
        return None
    data = msgspec.json.encode(tools, order="deterministic")
    return hashlib.sha256(data).hexdigest()[:16]


class NoReductionEngine(ContextEngine):
    """Built-in ablation engine: the same lifecycle with aging and reduction within the
    turn switched off (a request over its limit is refused, never reduced)."""

    name = "no-reduction"
    aging = False
    turn_reduction = False


BUILTIN_ENGINES: dict[str, type[ContextEngine]] = {
    ContextEngine.name: ContextEngine,
    NoReductionEngine.name: NoReductionEngine,
}


class EngineRegistry:
    """Engines by name: built-ins and ``dagctx.engines`` entry points, created lazily."""

    def __init__(self) -> None:
        self._classes: dict[str, Any] = dict(BUILTIN_ENGINES)
        self._entry_points: dict[str, importlib.metadata.EntryPoint] = {}
        try:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                if ep.name not in self._classes:
                    self._entry_points[ep.name] = ep
        except Exception as exc:  # broken metadata must not stop the daemon
            log.error("cannot read %s entry points: %s", ENTRY_POINT_GROUP, exc)
        self._instances: dict[str, ContextEngine] = {}

    def names(self) -> list[str]:
        return sorted({*self._classes, *self._entry_points})

    def get(self, name: str, host: Host) -> tuple[ContextEngine, str | None]:
        """The engine called ``name``, or the default one and a note saying why not."""
        inst = self._instances.get(name)
        if inst is not None:
            return inst, None
        try:
            cls = self._classes.get(name)
            if cls is None:
                ep = self._entry_points.get(name)
                if ep is None:
                    raise LookupError(f"no engine named {name!r} (known: {', '.join(self.names())})")
                cls = ep.load()
                self._classes[name] = cls
            inst = cls(host)
            if not isinstance(inst, ContextEngine):
                raise TypeError(f"{name!r} is not a dagctx ContextEngine subclass")
            if not getattr(inst, "name", None) or inst.name == "default" and name != "default":
                inst.name = name
        except Exception as exc:
            log.error("context engine %r unavailable: %s", name, exc)
            default, _ = self.get("default", host) if name != "default" else (ContextEngine(host), None)
            return default, f"engine {name!r} unavailable ({type(exc).__name__}: {exc}); used the default engine"
        self._instances[name] = inst
        return inst, None
