"""Render and replay: the context methods, composed from pure parts.

``ContextService`` holds only caches that can be rebuilt from the ledger (recent
renders for prompt-cache prefixes and ``renderId`` lookups, per-node token counts).
Everything a past call saw is recoverable from its node: ``reads`` plus
``metadata.renderManifest``.

Architecture Invariant: no SQL and no JSON-RPC here; writes go through the store's
append API (system-prompt nodes only).
"""

from __future__ import annotations

import gc
import uuid
from collections import OrderedDict, deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dagctx.context import budget as budget_mod
from dagctx.context import cache_breaks
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context import formats
from dagctx.context.formats import apply_turn_hooks, reasoning_payload, to_messages
from dagctx.context.render import render_view
from dagctx.context.summary_choice import select_system_node
from dagctx.context.view import RENDER_POLICY_VERSION
from dagctx.context.turn_reduction import Checkpoint, apply_checkpoint, checkpoint_from_manifest
from dagctx.ledger import SessionGraph
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import NodeInput

from .records import RenderRecord, Rendering
from .shared import ViewCaches
from .render_cache import CachedAging, CachedRender, Snapshot, join_views, still_valid_prefix
from .view_aging import AgingPlans
from .view_prompt import SystemPromptNode
from .view_tokens import StoredChars
from .view_usage import UsageCalibration, _llm_node

if TYPE_CHECKING:
    from dagctx.protocol.nodes import Call

    from .ports import ViewHost

RECENT_RENDERS = 512
RENDERS_PER_SESSION = 8
SESSIONS_REMEMBERED = 64


class ContextService(AgingPlans, UsageCalibration, SystemPromptNode):
    """One connection's views: render (and its incremental cache), replay; token counts
    (``view_tokens.py``), aging (``view_aging.py``), usage (``view_usage.py``) and the
    system-prompt node (``view_prompt.py``) are its other rooms."""

    def __init__(self, engine: ViewHost, caches: ViewCaches | None = None) -> None:
        self.e = engine
        self.use_caches(caches or ViewCaches())
        #: render id → the pending system-prompt node of a built request not yet handed out
        self._pending_system: OrderedDict[str, NodeInput] = OrderedDict()
        #: incremental renders served from the cache (observability and tests)
        self.cache_hits = 0

    def use_caches(self, caches: ViewCaches) -> None:
        """Share the caches of the connection's database with every other connection on it."""
        self._renders: OrderedDict[str, RenderRecord] = caches.renders
        self._by_session: dict[str, deque[RenderRecord]] = caches.by_session
        self._tokens: dict[tuple[str, str], dict[str, tuple[int, int]]] = caches.tokens
        self._cache: dict[tuple[Any, ...], CachedRender] = caches.prefixes
        self._updates_seen: dict[tuple[str, str], tuple[object, int]] = caches.updates_seen
        self._refs: dict[str, dict[str, list[str]]] = caches.refs
        self._refs_seen: dict[str, tuple[int, int, object]] = caches.refs_seen
        self._aging_cache: dict[tuple[Any, ...], CachedAging] = caches.aging
        self._text_tokens: OrderedDict[tuple[str, str], int] = caches.texts
        self._chars: dict[str, StoredChars] = caches.chars

    # ------------------------------------------------------------ render

    def render(
        self,
        session_id: str,
        *,
        head: str | None = None,
        fmt: str = "neutral",
        model: str | None = None,
        frame: str | None = None,
        expose: str = "io",
        include_system: bool = True,
        system_node_id: str | None = None,
        before_seq: int | None = None,
        aged: dict[str, str] | None = None,
        extra_manifest: dict[str, Any] | None = None,
        exclude_summaries: frozenset[str] = frozenset(),
        remember: bool = True,
        use_cache: bool = True,
        checkpoint: Checkpoint | None = None,
        pending_system: NodeInput | None = None,
        reasoning: str = "provider",
        graph: SessionGraph | None = None,
    ) -> Rendering:
        """``graph``: the session's graph as the caller just brought it up to date (one
        request's steps read the ledger once), else read here."""
        # A render allocates ~15 containers per message, all acyclic and freed by
        # reference counting; letting the cyclic GC run in the middle of it rescans the
        # retained renders again and again (up to 40 % of a 10k-node render). What it
        # allocated is frozen before the GC comes back: otherwise the first collection
        # after it walks every one of them at once, holding the GIL for as long as a
        # tenth of the render (half a second on a loaded machine), stalling every other
        # connection and a cancel's answer. The daemon unfreezes and collects when idle.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._render(
                session_id, head=head, fmt=fmt, model=model, frame=frame, expose=expose,
                include_system=include_system, system_node_id=system_node_id, before_seq=before_seq,
                aged=aged, extra_manifest=extra_manifest, exclude_summaries=exclude_summaries,
                remember=remember, use_cache=use_cache, checkpoint=checkpoint, pending_system=pending_system,
                reasoning=reasoning, graph=graph,
            )
        finally:
            if enabled:
                gc.freeze()
                gc.enable()

    def _render(
        self,
        session_id: str,
        *,
        head: str | None,
        fmt: str,
        model: str | None,
        frame: str | None,
        expose: str,
        include_system: bool,
        system_node_id: str | None,
        before_seq: int | None,
        aged: dict[str, str] | None,
        extra_manifest: dict[str, Any] | None,
        exclude_summaries: frozenset[str],
        remember: bool,
        use_cache: bool,
        checkpoint: Checkpoint | None = None,
        pending_system: NodeInput | None = None,
        reasoning: str = "provider",
        graph: SessionGraph | None = None,
    ) -> Rendering:
        store = self.e.store
        graph = store.graph(session_id) if graph is None else graph
        h = head or store.head(session_id)
        info = self.e.models.get(model or self.e.options.default_model)
        tokenizer = info.tokenizer or self.e.counter.tokenizer_for(info.name)
        aged_map = dict(aged or {})
        cacheable = (use_cache and frame is None and before_seq is None and not exclude_summaries
                     and checkpoint is None and pending_system is None)
        key = (session_id, fmt, tokenizer, expose, include_system, reasoning)
        hit = (self._extend_cached(graph, h, key, aged_map, system_node_id, fmt, tokenizer, reasoning)
               if cacheable else None)
        if hit is not None:
            view, system, messages, node_ids, per_message, repairs, call_ids, built_at = hit
        else:
            view = None
            if frame is None and expose == "io" and before_seq is None and not exclude_summaries:
                # a branch view: walked once unaged, then aged and given its system prompt
                # (render.age_view); the builds of one request reuse the walk
                pending = None if pending_system is None else (pending_system.id, pending_system.output)
                view = self.planned_view(graph, h, aged_map, system_node_id, pending)
                if view is None:
                    self.keep_unaged(graph, h, render_view(graph, h))
                    view = self.planned_view(graph, h, aged_map, system_node_id, pending)
            if view is None:
                view = render_view(
                    graph,
                    h,
                    frame=frame,
                    expose_default=expose,  # type: ignore[arg-type]
                    aged=aged,
                    system_node_id=system_node_id,
                    before_seq=before_seq,
                    exclude_summaries=exclude_summaries,
                    pending_system=None if pending_system is None else (pending_system.id, pending_system.output),
                )
            stop_if_cancelled()
            synthetic = None
            if checkpoint is not None:
                view = apply_checkpoint(view, graph, checkpoint)
                synthetic = {checkpoint.id: checkpoint.text}
            rendered = to_messages(view, fmt, include_system=include_system, reasoning=reasoning)
            stop_if_cancelled()
            system, messages, node_ids = rendered
            repairs = list(rendered.repairs)
            call_ids = rendered.call_ids
            built_at = rendered.built_at
            per_message = self.count_messages(graph, messages, node_ids, tokenizer, aged_map, synthetic, fmt=fmt)
            self._add_reasoning_tokens(messages, per_message, tokenizer)
        if cacheable:
            self._cache[key] = CachedRender(
                key, Snapshot.of(graph, view.chain), view, aged_map, system, messages, node_ids,
                list(per_message), repairs, call_ids, built_at,
            )
        per_message = list(per_message)
        system_tokens = self.count_text(system, tokenizer) if system else 0  # long ones counted once
        # a format either puts the system prompt in the messages or returns it beside them
        system_in_messages = formats.get(fmt).leads_with_system(messages)
        if system_in_messages:
            per_message[0] = system_tokens + self.e.counter.message_overhead(tokenizer)
        total = sum(per_message) + (0 if system_in_messages or not system else system_tokens)
        render_id = uuid.uuid4().hex
        manifest = {
            **view.manifest(),
            "renderId": render_id,
            "format": fmt,
            "model": info.name,
            "tokenizer": tokenizer,
            "includeSystem": include_system,
            "reasoning": reasoning,
            "repairs": list(repairs),
            "agedText": {k: aged_map[k] for k in sorted(aged_map)},
            "tokens": total,
            "policyVersion": RENDER_POLICY_VERSION,
        }
        if extra_manifest:
            manifest.update(extra_manifest)
        chain_ids = frozenset(view.chain) if frame is None else frozenset()
        record = RenderRecord(
            render_id, session_id, view.head, chain_ids, fmt, info.name, list(view.reads), manifest,
            messages, per_message, total,
        )
        stable = self._stable_prefix(record)
        if remember:
            self._remember(record)
        if pending_system is not None:
            self.hold_system_prompt(render_id, pending_system)
        return Rendering(view, system, messages, node_ids, per_message, system_tokens, total, tokenizer,
                         info, manifest, record, stable)

    def _add_reasoning_tokens(self, messages: list[Any], per_message: list[int], tokenizer: str) -> None:
        """Reasoning blocks a render sends are counted (SPEC §6): they are not part of any
        node's stored counts, so their text is counted here (long texts once, cached)."""
        for k, msg in enumerate(messages):
            stop_if_cancelled()
            if isinstance(msg, dict) and msg.get("role") == "assistant":
                for text in reasoning_payload(msg):
                    per_message[k] += self.count_text(text, tokenizer)

    def _extend_cached(self, graph: SessionGraph, head: str, key: tuple[Any, ...], aged: dict[str, str],
                       system_node_id: str | None, fmt: str, tokenizer: str,
                       reasoning: str = "provider") -> tuple[Any, ...] | None:
        """Render only what follows the cached render of this branch, or None (render fully)."""
        cached = self._cache.get(key)
        if cached is None or cached.aged != aged:
            return None
        if system_node_id is not None and system_node_id != cached.view.system_node:
            return None
        if system_node_id is None and _in_force(graph, head) != cached.view.system_node:
            # cached by a request that named its system prompt node (``context/prepare``'s
            # new one, written after the head): a render that names none shows the one in
            # force at its head (SPEC §6), as a cold render does
            return None
        new_chain = [n.id for n in graph.chain(head)]
        if not still_valid_prefix(graph, cached.snap, new_chain):
            return None
        self.cache_hits += 1
        if head == cached.view.head:
            return (cached.view, cached.system, cached.messages, cached.node_ids, cached.per_message,
                    cached.repairs, cached.call_ids, cached.built_at)
        try:
            suffix = render_view(graph, head, expose_default=cached.view.expose_default,  # type: ignore[arg-type]
                                 aged=aged, system_node_id=system_node_id, start_after=cached.view.head)
        except DagctxError:
            return None
        if (suffix.system_node != cached.view.system_node or suffix.summary_id != cached.view.summary_id
                or suffix.superseded != cached.view.superseded):
            return None  # (a summary the cached head did not reach applies here too, superseded)
        if reasoning != "none" and (any(it.reasoning for it in suffix.items)
                                    or any(it.reasoning for it in cached.view.items)):
            return None  # which reasoning is sent depends on the whole branch (the current tool loop)
        more = to_messages(suffix, fmt, include_system=False, reasoning=reasoning, used_call_ids=cached.call_ids)
        _, msgs, ids = more
        if msgs and cached.messages and not formats.get(fmt).can_stitch(cached.messages, suffix.items[0].role):
            return None
        per = self.count_messages(graph, msgs, ids, tokenizer, aged, fmt=fmt)
        # the repairs where a full render has them: the walk's, then the assembly's, then
        # the format's last pass (``Rendered``)
        walked, now = len(cached.view.repairs), len(suffix.repairs)
        repairs = [*cached.repairs[:walked], *more.repairs[:now], *cached.repairs[walked:cached.built_at],
                   *more.repairs[now:more.built_at]]
        built_at = len(repairs)
        repairs += [*cached.repairs[cached.built_at:], *more.repairs[more.built_at:]]
        view = join_views(cached.view, suffix, new_chain)
        return (view, cached.system, cached.messages + msgs, cached.node_ids + ids, cached.per_message + per,
                repairs, more.call_ids, built_at)

    def _stable_prefix(self, rec: RenderRecord) -> c.StablePrefix:
        """Leading messages byte-identical to the previous render of this branch."""
        prev = None
        for old in reversed(self._by_session.get(rec.session_id, ())):
            if old.format == rec.format and old.model == rec.model and (
                old.head == rec.head or old.head in rec.chain_ids
            ):
                prev = old
                break
        if prev is None:
            return c.StablePrefix(messages=0, tokens=0, previous_render_id=None)
        n = 0
        tokens = 0
        for a, b, t in zip(prev.messages, rec.messages, rec.message_tokens):
            if a is not b and a != b:  # an unchanged prefix is the very same objects
                break
            n += 1
            tokens += t
        return c.StablePrefix(messages=n, tokens=tokens, previous_render_id=prev.render_id)

    def cache_break(self, r: Rendering, total: int, tools_tokens: int) -> c.CacheBreak | None:
        """Whether the request ``r`` (``total`` tokens with ``tools_tokens`` of tools) breaks
        the prompt cache of the previous request of its branch: where, why, at what cost
        (SPEC §7, cache breaks); None when it extends it or there is none to compare."""
        st = r.stable
        if st.previous_render_id is None:
            return None
        prev = next((old for old in self._by_session.get(r.record.session_id, ())
                     if old.render_id == st.previous_render_id), None)
        if prev is None:
            return None
        whole = ("systemPrompt" if prev.manifest.get("systemNode") != r.manifest.get("systemNode") else
                 "tools" if prev.manifest.get("toolsHash") != r.manifest.get("toolsHash") else None)
        if whole is None and st.messages >= len(prev.message_tokens):
            return None
        at = 0 if whole else st.messages
        system_in = formats.get(r.record.format).leads_with_system(r.messages)
        stable = 0 if whole else tools_tokens + (0 if system_in or not r.system else r.system_tokens) + st.tokens
        why = cache_breaks.causes(prev.manifest, r.manifest,
                                  prev.messages[at] if at < len(prev.messages) else None,
                                  r.messages[at] if at < len(r.messages) else None)
        b = cache_breaks.measure(prev_total=prev.total, total=total, stable_tokens=stable, at_message=at, why=why)
        return c.CacheBreak(previous_render_id=prev.render_id, at_message=b.at_message, causes=b.causes,  # type: ignore[arg-type]
                            invalidated_tokens=b.invalidated_tokens, rewritten_tokens=b.rewritten_tokens,
                            estimated_cost=b.estimated_cost)

    def _remember(self, rec: RenderRecord) -> None:
        # renderId lookups need the manifest and reads, not the messages
        self._renders[rec.render_id] = replace(rec, messages=[])
        while len(self._renders) > RECENT_RENDERS:
            self._renders.popitem(last=False)
        q = self._by_session.pop(rec.session_id, None) or deque(maxlen=RENDERS_PER_SESSION)
        q.append(rec)
        self._by_session[rec.session_id] = q  # most recently used last
        while len(self._by_session) > SESSIONS_REMEMBERED:
            self._by_session.pop(next(iter(self._by_session)))

    def note_decision_path(self, render_id: str, path: list[str]) -> None:
        """The request ``render_id`` was handed out with this decision path."""
        rec = self._renders.get(render_id)
        if rec is not None:
            rec.decision_path = list(path)

    def forget(self, render_id: str) -> None:
        """Drop a render that was built but not handed out (a reduction attempt), so it is
        neither a ``renderId`` nor the previous render ``stablePrefix`` compares with."""
        self._pending_system.pop(render_id, None)
        rec = self._renders.pop(render_id, None)
        if rec is None:
            return
        q = self._by_session.get(rec.session_id)
        if q is not None:
            for old in list(q):
                if old.render_id == render_id:
                    q.remove(old)

    def lookup_render(self, render_id: str) -> RenderRecord:
        rec = self._renders.get(render_id)
        if rec is None:
            raise DagctxError(
                "InvalidParams",
                f"renderId {render_id!r} is unknown to this daemon (renders are kept in memory for "
                "the last few hundred calls); pass reads and metadata.renderManifest explicitly",
                path="renderId",
            )
        return rec

    def render_result(self, r: Rendering) -> c.RenderResult:
        exact = bool(r.model.exact) if hasattr(r.model, "exact") else False
        source, total = self.calibrated(r.record.session_id, r.model.name, r.total, r.record)
        return c.RenderResult(
            messages=r.messages,
            reads=list(r.view.reads),
            tokens=c.TokenCounts(
                total=total,
                per_message=r.per_message,
                system=r.system_tokens,
                tokenizer=r.tokenizer,
                exact=exact and source != "calibrated",
                source=source,  # type: ignore[arg-type]
            ),
            manifest=r.manifest,
            render_id=r.record.render_id,
            stable_prefix=r.stable,
            system=r.system,
        )

    # ------------------------------------------------------------ replay

    def replay(self, p: c.ReplayParams) -> c.ReplayResult:
        graph = self.e.store.graph(p.session_id)
        node = _llm_node(graph, p.node_id, "replay is for llm nodes (what a model was sent)")
        manifest = node.metadata.get("renderManifest")
        if not isinstance(manifest, dict) or not manifest.get("head"):
            # No manifest: the best reconstruction is the branch before this call.
            head = node.predecessor if node.predecessor in graph.nodes else graph.root_id
            r = self.render(p.session_id, head=head, fmt=p.format or "neutral", model=node.name or None,
                            before_seq=node.seq, remember=False)
            return c.ReplayResult(node_id=node.id, system=r.system, messages=r.messages,
                                  reads=list(r.view.reads), manifest=r.manifest, exact=False,
                                  **self._replay_extras(p.session_id, node, r))
        excluded = frozenset(manifest.get("excludedSummaries") or ())
        r = self.render(
            p.session_id,
            head=manifest["head"],
            fmt=p.format or manifest.get("format") or "neutral",
            model=manifest.get("model"),
            frame=manifest.get("frame"),
            expose=manifest.get("exposeDefault") or "io",
            include_system=manifest.get("includeSystem", True),
            system_node_id=manifest.get("systemNode"),
            before_seq=node.seq,
            aged=manifest.get("agedText") or {},
            exclude_summaries=excluded,
            remember=False,
            checkpoint=checkpoint_from_manifest(manifest),
            # renders made before reasoning was kept sent none
            reasoning=manifest.get("reasoning") or "none",
        )
        messages = apply_turn_hooks(r.messages, manifest.get("turnHooks") or {}, r.manifest["format"])
        exact = list(r.view.reads) == list(node.reads or manifest.get("reads") or r.view.reads) and (
            r.view.summary_id == manifest.get("summaryId")
        )
        return c.ReplayResult(node_id=node.id, system=r.system, messages=messages, reads=list(r.view.reads),
                              manifest=manifest, exact=exact, tools=self._replay_tools(graph, node, manifest),
                              **self._replay_extras(p.session_id, node, r))

    def _replay_tools(self, graph: SessionGraph, node: Call, manifest: dict[str, Any]) -> list[Any] | None:
        """The tools schema a recorded request carried (SPEC §6, ``manifest.tools``): its
        own, or — recorded once per branch while it stays the same — the nearest earlier
        request's with the same ``toolsHash``; None for a manifest that recorded none."""
        if "toolsHash" not in manifest:
            return None
        if not manifest.get("toolsHash"):
            return []
        if isinstance(manifest.get("tools"), list):
            return manifest["tools"]
        return recorded_tools(graph, node.predecessor or node.caller, manifest["toolsHash"])

    def _replay_extras(self, session_id: str, node: Call, r: Rendering) -> dict[str, Any]:
        """What a viewer of a replay needs beside the request: its token counts, which nodes
        each message came from, the model's window and the provider usage reported."""
        usage = next((u.usage for u in self.e.store.usage(session_id) if u.node_id == node.id), None)
        return {
            "tokens": c.TokenCounts(total=r.total, per_message=list(r.per_message), system=r.system_tokens,
                                    tokenizer=r.tokenizer, exact=r.model.exact),
            "message_nodes": [list(ids) for ids in r.node_ids],
            "context_window": r.model.context_window,
            "output_reserve": budget_mod.output_reserve(r.model, None),
            "usage": usage,
        }


#: how many earlier requests of a branch the tools schema is looked for in
TOOLS_LOOKBACK = 256


def recorded_tools(graph: SessionGraph, start: str | None, tools_hash: str) -> list[Any] | None:
    """The tools schema with hash ``tools_hash`` as the nearest request at or before
    ``start`` recorded it (walking predecessors, else callers, over at most
    ``TOOLS_LOOKBACK`` recorded requests), or None. ``context/prepare`` records a schema
    only when this finds none, so a replay always finds the one its request carried."""
    seen = 0
    cur = start
    visited: set[str] = set()
    while cur is not None and cur in graph.nodes and cur not in visited and seen < TOOLS_LOOKBACK:
        visited.add(cur)
        n = graph.nodes[cur]
        man = n.metadata.get("renderManifest") if n.role == "llm" else None
        if isinstance(man, dict):
            seen += 1
            if man.get("toolsHash") == tools_hash and isinstance(man.get("tools"), list):
                return man["tools"]
        cur = n.predecessor or (n.caller if n.caller != graph.root_id else None)
    return None


def _in_force(graph: SessionGraph, head: str) -> str | None:
    """The id of the system prompt node a render of ``head`` that names none shows: the
    newest with ``seq <= head.seq`` (SPEC §6; ``render._system_prompt``)."""
    node = select_system_node(graph, graph.get(head).seq)
    return None if node is None else node.id
