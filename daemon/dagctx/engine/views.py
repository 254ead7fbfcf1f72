"""Render, prepare, replay and usage: the context methods, composed from pure parts.

``ContextService`` holds only caches that can be rebuilt from the ledger (recent
renders for prompt-cache prefixes and ``renderId`` lookups, per-node token counts).
Everything a past call saw is recoverable from its node: ``reads`` plus
``metadata.renderManifest``.

Architecture Invariant: no SQL and no JSON-RPC here; writes go through the store's
append API (system-prompt nodes only).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import sys
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import aging
from dagctx.context import budget as budget_mod
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.formats import reasoning_payload, to_messages
from dagctx.context.models import ModelInfo
from dagctx.context.render import RENDER_POLICY_VERSION, View, added_text, render_view
from dagctx.context.system_prompt import PromptOptions, assemble_system_prompt
from dagctx.context.turn_reduction import Checkpoint, apply_checkpoint, checkpoint_from_manifest
from dagctx.ledger import SessionGraph, UsageRow
from dagctx.ledger.graph import is_summary
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME, Call, NodeInput

from .shared import ViewCaches
from .render_cache import CachedAging, CachedRender, Snapshot, join_views, still_valid_prefix

log = logging.getLogger("dagctx.engine")

if TYPE_CHECKING:
    from .core import EngineCore

RECENT_RENDERS = 512
#: texts at least this long have their token counts remembered (``count_text``)
LONG_TEXT = 2_000
TEXTS_REMEMBERED = 2_048
RENDERS_PER_SESSION = 8
SESSIONS_REMEMBERED = 64
#: pending system-prompt nodes kept for requests not yet handed out
PENDING_PROMPTS = 64


@dataclass
class RenderRecord:
    render_id: str
    session_id: str
    head: str
    chain_ids: frozenset[str]
    format: str
    model: str | None
    reads: list[str]
    manifest: dict[str, Any]
    #: the messages themselves: an unchanged prefix shares its message objects with the
    #: previous render, so comparing lists is cheap (no hashing of every message)
    messages: list[Any]
    message_tokens: list[int]
    total: int
    created_at: float = field(default_factory=time.time)


@dataclass
class Rendering:
    """One render's full outcome, before it becomes a protocol result."""

    view: View
    system: str | None
    messages: list[Any]
    node_ids: list[list[str]]
    per_message: list[int]
    system_tokens: int
    total: int
    tokenizer: str
    model: ModelInfo
    manifest: dict[str, Any]
    record: RenderRecord
    stable: c.StablePrefix


class ContextService:
    def __init__(self, engine: EngineCore, caches: ViewCaches | None = None) -> None:
        self.e = engine
        self.use_caches(caches or ViewCaches())
        #: render id → the pending system-prompt node of a built request not yet handed out
        self._pending_system: OrderedDict[str, NodeInput] = OrderedDict()
        #: incremental renders served from the cache (observability and tests)
        self.cache_hits = 0

    def count_text(self, text: str, tokenizer: str) -> int:
        """Tokens of a derived text (an aged replacement), counted once: aging counts a
        capped result while cutting it, again as its replacement and the render counts
        it a third time — each a full tokenization of up to a quarter of the window."""
        if len(text) < LONG_TEXT:
            return self.e.counter.count(text, tokenizer)
        key = (tokenizer, text)
        n = self._text_tokens.get(key)
        if n is None:
            n = self.e.counter.count(text, tokenizer)
            self._text_tokens[key] = n
            while len(self._text_tokens) > TEXTS_REMEMBERED:
                self._text_tokens.popitem(last=False)
        return n

    def use_caches(self, caches: ViewCaches) -> None:
        """Share the caches of the connection's database with every other connection on it."""
        self._renders: OrderedDict[str, RenderRecord] = caches.renders
        self._by_session: dict[str, deque[RenderRecord]] = caches.by_session
        self._tokens: dict[tuple[str, str], dict[str, tuple[int, int]]] = caches.tokens
        self._cache: dict[tuple[Any, ...], CachedRender] = caches.prefixes
        self._updates_seen: dict[tuple[str, str], int] = caches.updates_seen
        self._refs: dict[str, dict[str, list[str]]] = caches.refs
        self._refs_seen: dict[str, tuple[int, int]] = caches.refs_seen
        self._aging_cache: dict[tuple[Any, ...], CachedAging] = caches.aging
        self._text_tokens: OrderedDict[tuple[str, str], int] = caches.texts

    # ------------------------------------------------------------ tokens

    def node_tokens(self, graph: SessionGraph, tokenizer: str) -> dict[str, tuple[int, int]]:
        """Stored (input, output) counts of every node, loaded once per session/tokenizer."""
        key = (graph.session_id, tokenizer)
        cache = self._tokens.get(key)
        seen = self._updates_seen.get(key, 0)
        if cache is None or len(graph.updates) < seen:
            cache = self.e.store.token_counts(graph.session_id, tokenizer)
            self._tokens[key] = cache
            seen = 0
        if len(graph.updates) > seen:
            # A running node finished (here or in another process): its output changed,
            # so its cached count is stale; it is recounted from the stored node.
            for nid in graph.updates[seen:]:
                cache.pop(nid, None)
        self._updates_seen[key] = len(graph.updates)
        return cache

    def refs_of(self, graph: SessionGraph, mined: dict[str, list[str]] | None = None) -> Callable[[str], list[str]]:
        """A code node's ranked references (SPEC §8): stored at write time, read once per
        session and then only for nodes appended or finished since (by any process); a node
        without them (written before schema version 2) is mined once, kept in memory and
        added to ``mined`` for ``keep_mined`` to store."""
        sid = graph.session_id
        store = self.e.store
        cache = self._refs.get(sid)
        upto, seen = self._refs_seen.get(sid, (-1, 0))
        newest = graph.by_seq[-1].seq if graph.by_seq else -1  # before reading: re-read, never skip
        if cache is None or len(graph.updates) < seen:  # first use, or the graph was reloaded
            cache = self._refs[sid] = _interned(store.reference_lists(sid))
        else:
            if newest > upto:
                cache.update(_interned(store.reference_lists(sid, after_seq=upto)))
            finished = graph.updates[seen:]
            if finished:  # a running node got its output: what is stored now is its list
                for nid in finished:
                    cache.pop(nid, None)
                cache.update(_interned(store.reference_lists(sid, ids=list(dict.fromkeys(finished)))))
        self._refs_seen[sid] = (newest, len(graph.updates))

        def refs_of(node_id: str) -> list[str]:
            got = cache.get(node_id)
            if got is None:
                got = cache[node_id] = [sys.intern(r) for r in aging.stored_references(graph.nodes[node_id].output)]
                if mined is not None:
                    mined[node_id] = got
            return got

        return refs_of

    def keep_mined(self, session_id: str, mined: dict[str, list[str]]) -> None:
        """Store references mined during a plan, so the next daemon does not mine them again.
        A derived write: a read-only or failing database only costs that next daemon the
        mining, never this render."""
        try:
            self.e.store.fill_references(session_id, mined)
        except DagctxError as err:
            log.info("references mined for %d nodes not stored (%s)", len(mined), err.kind)

    def counts_of(self, graph: SessionGraph, node_id: str, tokenizer: str,
                  cache: dict[str, tuple[int, int]] | None = None) -> tuple[int, int]:
        """(input, output) tokens of one node: stored at append, else counted once and kept
        (an import, a tokenizer added later, or a node another process finished)."""
        cache = self.node_tokens(graph, tokenizer) if cache is None else cache
        counts = cache.get(node_id)
        if counts is None:
            node = graph.nodes[node_id]
            cv = self.e.counter.count_value
            counts = (cv(node.input, tokenizer), cv(node.output, tokenizer))
            cache[node_id] = counts
        return counts

    def _part_tokens(self, graph: SessionGraph, node_id: str, assistant: bool, tokenizer: str,
                     cache: dict[str, tuple[int, int]], aged: dict[str, str],
                     synthetic: dict[str, str] | None = None) -> int:
        node = graph.nodes.get(node_id)
        if node is None:
            # a request checkpoint (SPEC §8) stands in a message under its own id
            return self.e.counter.count(synthetic[node_id], tokenizer) if synthetic and node_id in synthetic else 0
        tin, tout = self.counts_of(graph, node_id, tokenizer, cache)
        count = self.e.counter.count
        if node.role == "code":
            if assistant:
                return tin
            # Status markers and placeholders are text the model reads (SPEC §6).
            extra = count(added_text(node, "result", node_id in aged), tokenizer)
            if node_id in aged:
                return self.count_text(aged[node_id], tokenizer) + extra
            return tout + extra
        if node.role == "llm" and not assistant and graph.is_nested(node):
            return tin  # an inner llm call's prompt, shown as a user message
        own = tout if node.output is not None else tin
        if node.role == "llm" and is_summary(node):
            return own + count(added_text(node, "summary"), tokenizer)
        if node.role == "llm" and node.status in ("error", "cancelled"):
            return own + count(added_text(node, "reply"), tokenizer)
        return own

    def count_messages(self, graph: SessionGraph, messages: list[Any], node_ids: list[list[str]],
                       tokenizer: str, aged: dict[str, str], synthetic: dict[str, str] | None = None) -> list[int]:
        """Per-message tokens from stored per-node counts (no re-tokenizing) + framing."""
        cache = self.node_tokens(graph, tokenizer)
        overhead = self.e.counter.message_overhead(tokenizer)
        out = []
        for msg, ids in zip(messages, node_ids):
            assistant = isinstance(msg, dict) and msg.get("role") == "assistant"
            n = overhead
            for nid in ids:
                n += self._part_tokens(graph, nid, assistant, tokenizer, cache, aged, synthetic)
            if not ids and isinstance(msg, dict):
                n += self.e.counter.count(_message_text(msg), tokenizer)
            out.append(n)
        return out

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
    ) -> Rendering:
        # A render allocates ~15 containers per message, all acyclic and freed by
        # reference counting; letting the cyclic GC run in the middle of it rescans the
        # retained renders again and again (up to 40 % of a 10k-node render).
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._render(
                session_id, head=head, fmt=fmt, model=model, frame=frame, expose=expose,
                include_system=include_system, system_node_id=system_node_id, before_seq=before_seq,
                aged=aged, extra_manifest=extra_manifest, exclude_summaries=exclude_summaries,
                remember=remember, use_cache=use_cache, checkpoint=checkpoint, pending_system=pending_system,
                reasoning=reasoning,
            )
        finally:
            if enabled:
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
    ) -> Rendering:
        store = self.e.store
        graph = store.graph(session_id)
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
            view, system, messages, node_ids, per_message, repairs = hit
        else:
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
            rendered = to_messages(view, fmt, include_system=include_system,  # type: ignore[arg-type]
                                   reasoning=reasoning)
            stop_if_cancelled()
            system, messages, node_ids = rendered
            repairs = list(rendered.repairs)
            per_message = self.count_messages(graph, messages, node_ids, tokenizer, aged_map, synthetic)
            self._add_reasoning_tokens(messages, per_message, tokenizer)
        if cacheable:
            self._cache[key] = CachedRender(
                key, Snapshot.of(graph, view.chain), view, aged_map, system, messages, node_ids,
                list(per_message), repairs,
            )
        per_message = list(per_message)
        system_tokens = self.e.counter.count(system or "", tokenizer) if system else 0
        # OpenAI puts the system prompt in the messages; the others return it beside them.
        system_in_messages = bool(messages) and isinstance(messages[0], dict) and messages[0].get("role") == "system"
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
        new_chain = [n.id for n in graph.chain(head)]
        if not still_valid_prefix(graph, cached.snap, new_chain):
            return None
        self.cache_hits += 1
        if head == cached.view.head:
            return (cached.view, cached.system, cached.messages, cached.node_ids, cached.per_message,
                    cached.repairs)
        try:
            suffix = render_view(graph, head, expose_default=cached.view.expose_default,  # type: ignore[arg-type]
                                 aged=aged, system_node_id=system_node_id, start_after=cached.view.head)
        except DagctxError:
            return None
        if suffix.system_node != cached.view.system_node or suffix.summary_id != cached.view.summary_id:
            return None
        if reasoning != "none" and (any(it.reasoning for it in suffix.items)
                                    or any(it.reasoning for it in cached.view.items)):
            return None  # which reasoning is sent depends on the whole branch (the current tool loop)
        more = to_messages(suffix, fmt, include_system=False, reasoning=reasoning)  # type: ignore[arg-type]
        _, msgs, ids = more
        if msgs and cached.messages and fmt == "anthropic":
            # Anthropic merges same-role neighbours and may open with a placeholder:
            # only a clean assistant → user boundary can be stitched.
            if cached.messages[-1].get("role") != "assistant" or suffix.items[0].role != "user":
                return None
        per = self.count_messages(graph, msgs, ids, tokenizer, aged)
        view = join_views(cached.view, suffix, new_chain)
        return (view, cached.system, cached.messages + msgs, cached.node_ids + ids, cached.per_message + per,
                cached.repairs + list(more.repairs))

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

    # ------------------------------------------------------------ usage and calibration

    def calibrated(self, session_id: str, model: str, estimate: int, rec: RenderRecord | None) -> tuple[str, int]:
        """Provider figure when this is exactly the reported call's render, else the
        estimate scaled by the newest measured/estimated ratio of the same model."""
        rows = [u for u in self.e.store.usage(session_id) if u.estimated and (u.model or model) == model]
        if not rows:
            return "estimate", estimate
        last = rows[-1]
        node = self.e.store.graph(session_id).nodes.get(last.node_id)
        same = (
            rec is not None
            and node is not None
            and node.reads == rec.reads
            and (node.metadata.get("renderManifest") or {}).get("tokens") == rec.total
        )
        value, source = budget_mod.calibrate(estimate, last.prompt, last.estimated, same_messages=same)
        return source, value

    def usage_report(self, p: c.UsageReportParams) -> tuple[c.UsageReportResult, c.CompactionRecommended | None]:
        store = self.e.store
        node = _llm_node(store.graph(p.session_id), p.node_id, "usage belongs on an llm node")
        manifest = node.metadata.get("renderManifest") or {}
        model = p.model or manifest.get("model") or node.name or None
        estimated = manifest.get("tokens") if isinstance(manifest.get("tokens"), int) else None
        row = UsageRow(
            node_id=p.node_id,
            model=self.e.models.get(model).name if model else None,
            usage=p.usage,
            estimated=estimated,
            reported_at=time.time(),
        )
        store.put_usage(p.session_id, row)
        info = self.e.models.get(row.model)
        reserve = budget_mod.output_reserve(info, None)
        input_budget = max(1, info.context_window - reserve)
        percent = round(row.prompt / input_budget * 100, 1)
        ratio = (row.prompt / estimated) if estimated else None
        recommend = percent >= budget_mod.RECOMMEND_AT
        note = None
        if recommend:
            note = c.CompactionRecommended(
                session_id=p.session_id,
                head=store.head(p.session_id),
                percent_used=percent,
                input_used=row.prompt,
                context_window=info.context_window,
                model=info.name,
            )
        return (
            c.UsageReportResult(
                node_id=p.node_id,
                measured_prompt=row.prompt,
                estimated_prompt=estimated,
                calibration=None if ratio is None else round(ratio, 4),
                percent_used=percent,
                recommend_compaction=recommend,
            ),
            note,
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
                                  reads=list(r.view.reads), manifest=r.manifest, exact=False)
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
                              manifest=manifest, exact=exact)

    # ------------------------------------------------------------ aging

    def aging_for(self, session_id: str, head: str, model: ModelInfo, *, enabled: bool = True,
                  ager: Any = None, frame: str | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        """Which old tool results render shrunk on this branch, and why.

        Deterministic: "now" is the start of the head's turn (its newest user node), and
        the boundary is a function of the branch's committed turns, so within one turn
        every render shows the same aged prefix (prompt-cache stable) and replay can
        rebuild the same decisions from the data.
        """
        if not enabled or frame is not None:
            return {}, {}
        policy = self.e.aging_policy
        graph = self.e.store.graph(session_id)
        tokenizer = model.tokenizer or self.e.counter.tokenizer_for(model.name)
        cache = self.node_tokens(graph, tokenizer)
        key = (session_id, tokenizer, model.context_window, policy)
        reuse = self._reuse_aging(graph, head, key, policy, model, cache)
        if reuse is not None:
            return reuse
        view = render_view(graph, head)
        if not view.items:
            return {}, {}

        def token_of(node_id: str) -> int:
            return self.counts_of(graph, node_id, tokenizer, cache)[1]

        stop_if_cancelled()
        boundary = aging.boundary_after_commit(view, graph, policy)
        now = _turn_start(graph, view, policy.turn_unit)
        def count(text: str) -> int:
            return self.count_text(text, tokenizer)

        mined: dict[str, list[str]] = {}
        refs_of = self.refs_of(graph, mined)
        if ager is None:
            plan = aging.plan_aging(view, graph, now=now, boundary_seq=boundary or None, policy=policy,
                                    token_of=token_of, window=model.context_window, count=count,
                                    refs_of=refs_of)
        else:  # a context engine's own ager keeps the documented arguments
            plan = ager(view, graph, now=now, boundary_seq=boundary or None, policy=policy, token_of=token_of,
                        window=model.context_window, count=count)
        long = aging.long_turn_cap(graph, head, policy) if ager is None else None
        long_manifest = None
        if long is not None:
            long_manifest = self._age_long_turn(graph, view, plan, policy, long, model, token_of, count,
                                                refs_of)
        if mined:
            self.keep_mined(session_id, mined)
        stats: dict[str, Any] = dict(plan.stats.as_dict())
        stats["manifest"] = plan.manifest()
        stats["longTurnCap"] = long[1] if long is not None else None
        if long_manifest is not None:
            stats["manifest"]["agingLongTurn"] = long_manifest
        self._aging_cache[key] = CachedAging(key, Snapshot.of(graph, view.chain), _turn_node(graph, view.chain),
                                             dict(plan.aged), stats)
        return dict(plan.aged), stats

    @staticmethod
    def _age_long_turn(graph: SessionGraph, view: View, plan: Any, policy: Any, long: tuple[int, int, str],
                       model: ModelInfo, token_of: Any, count: Any, refs_of: Any) -> dict[str, Any]:
        """Aging within a long user turn (SPEC §8): the turn's own older steps age in step
        units, the step boundary held at the start of the current quantum of
        ``stepQuantum`` steps, so the aged prefix changes only every ``stepQuantum`` steps."""
        steps, cap, step_id = long
        step_policy = replace(policy, turn_unit="step")
        boundary = aging.boundary_after_commit(view, graph, step_policy, current_cap=cap)
        now = graph.nodes[step_id].created_at
        splan = aging.plan_aging(view, graph, now=now, boundary_seq=boundary or None, policy=step_policy,
                                 token_of=token_of, window=model.context_window, count=count, current_cap=cap,
                                 refs_of=refs_of)
        current = {it.node_id for it in view.items if it.turn == view.turn_count}
        added = 0
        for nid, text in splan.aged.items():
            if nid not in current or nid in plan.aged:
                continue
            kind = splan.kinds[nid]
            plan.aged[nid] = text
            plan.kinds[nid] = kind
            plan.decisions[nid] = kind
            added += 1
            st = plan.stats
            st.tool_results_aged += 1
            st.tokens_freed_by_aging += max(0, token_of(nid) - count(text))
            if kind == aging.SOFT_TRIM:
                st.soft_trimmed += 1
            elif kind == aging.HARD_CLEAR:
                st.hard_cleared += 1
            else:
                st.capped += 1
        return {"steps": steps, "stepCap": cap, "stepQuantum": policy.step_quantum, "stepBoundary": boundary,
                "aged": added}

    def _reuse_aging(self, graph: SessionGraph, head: str, key: tuple[Any, ...], policy: Any, model: ModelInfo,
                     cache: dict[str, tuple[int, int]]) -> tuple[dict[str, str], dict[str, Any]] | None:
        """The same decisions as the last plan of this branch when still in the same user turn.

        With user turns as the unit, nothing added within the current turn can pass the
        turn-distance gate, so the plan only changes at a new user turn — unless a new
        result is so large that the single-result cap applies to it.
        """
        cached = self._aging_cache.get(key)
        if cached is None or policy.turn_unit != "user":
            return None
        chain = [n.id for n in graph.chain(head)]
        if _turn_node(graph, chain) != cached.turn_start or not still_valid_prefix(graph, cached.snap, chain):
            return None
        long = aging.long_turn_cap(graph, head, policy)
        if (long[1] if long is not None else None) != cached.stats.get("longTurnCap"):
            return None  # a long turn crossed into its next quantum of steps
        cap = model.context_window * policy.max_single_result_share
        seqs_start = cached.snap.max_seq
        for node in reversed(graph.by_seq):
            if node.seq <= seqs_start:
                break
            if node.role == "code" and (cache.get(node.id) or (0, 0))[1] > cap:
                return None
        return dict(cached.aged), cached.stats

    # ------------------------------------------------------------ system prompt

    def ensure_system_prompt(self, session_id: str, graph: SessionGraph, options: PromptOptions,
                             workspace: str | None, *, assembler: Any = None) -> SystemPrompt:
        """Assemble the prompt and decide its node: the newest ``context/system_prompt``
        node when its hash is the same, else a *pending* node, written only when a request
        that uses it is handed out (``commit_system_prompt``; SPEC §7: a refused request
        writes nothing). The pending id is a function of the session, the hash and the
        node it follows, so every build of one request — and a retry — names the same id."""
        assembled = (assembler or assemble_system_prompt)(workspace, options)
        if not assembled.text:
            return SystemPrompt("", None, list(assembled.notes), list(assembled.sections))
        newest: Call | None = None
        for nid in reversed(graph.system_prompts):
            newest = graph.nodes[nid]
            break
        if newest is not None and newest.metadata.get("hash") == assembled.hash:
            return SystemPrompt(assembled.text, newest.id, list(assembled.notes), list(assembled.sections))
        after = newest.id if newest is not None else ""
        node_id = "sp-" + hashlib.sha256(f"{session_id}\x00{assembled.hash}\x00{after}".encode()).hexdigest()[:32]
        if node_id in graph.nodes:  # written meanwhile (another connection handed it out)
            return SystemPrompt(assembled.text, node_id, list(assembled.notes), list(assembled.sections))
        pending = NodeInput(
            role="code",
            id=node_id,
            name=SYSTEM_PROMPT_NAME,
            caller=graph.root_id,
            output=assembled.text,
            metadata={
                "hash": assembled.hash,
                "files": list(assembled.files),
                "sections": [msgspec.to_builtins(s) for s in assembled.sections],
            },
        )
        return SystemPrompt(assembled.text, node_id, list(assembled.notes), list(assembled.sections), pending)

    def hold_system_prompt(self, render_id: str, pending: NodeInput) -> None:
        """Keep a pending prompt node until the request rendered with it is handed out."""
        self._pending_system[render_id] = pending
        while len(self._pending_system) > PENDING_PROMPTS:
            self._pending_system.popitem(last=False)

    def commit_system_prompt(self, session_id: str, render_id: str) -> None:
        """The request ``render_id`` is handed out: write the prompt node it was rendered
        with, if that node is new (SPEC §7). A node another request wrote meanwhile (the
        id is deterministic) is not written twice."""
        pending = self._pending_system.pop(render_id, None)
        if pending is None:
            return
        graph = self.e.store.graph(session_id)
        if pending.id in graph.nodes:
            return
        try:
            self.e.write_node(session_id, pending)
        except DagctxError as err:
            if err.kind != "DuplicateNode":
                raise


@dataclass
class SystemPrompt:
    """The prompt a request is built with (``ContextService.ensure_system_prompt``)."""

    text: str
    #: the node the render names: stored, or ``pending`` (written when handed out)
    node_id: str | None
    notes: list[str]
    #: the assembler's sections (layers), for ``BudgetExceeded``
    sections: list[Any]
    pending: NodeInput | None = None


def _interned(lists: dict[str, list[str]]) -> dict[str, list[str]]:
    """Reference lists with each string interned: the same paths and names recur across a
    session's results, so a session of 10,000 results keeps one copy of its vocabulary
    (about a third of the memory of separate strings, measured on bench_aging_huge)."""
    intern = sys.intern
    return {nid: [intern(r) for r in refs] for nid, refs in lists.items()}


def _llm_node(graph: SessionGraph, node_id: str, why: str) -> Call:
    node = graph.get(node_id)
    if node.role != "llm":
        raise DagctxError(
            "InvalidParams", f"{why}; {node_id!r} is a {node.role} node", node_id=node_id, path="nodeId"
        )
    return node


def _turn_node(graph: SessionGraph, chain: list[str]) -> str | None:
    """The newest real user node on a chain: the start of the current turn."""
    for nid in reversed(chain):
        node = graph.nodes[nid]
        if node.role == "user" and not node.metadata.get("spawn_branch_root"):
            return nid
    return None


def _turn_start(graph: SessionGraph, view: View, unit: str = "user") -> float:
    """Creation time of the current turn's start: the newest real user node rendered.

    With ``turn_unit="step"`` a turn is one top-level model call, so the current step
    starts at the newest top-level user or llm node rendered (a summary is never a
    step, a summary is not a turn, SPEC §8). Otherwise the results of earlier steps of one long user
    turn would be younger than "now" and could never age in step mode.
    """
    for nid in reversed(view.reads):
        node = graph.nodes.get(nid)
        if node is None or graph.is_nested(node):
            continue
        if node.role == "user" or (unit == "step" and node.role == "llm" and not is_summary(node)):
            return node.created_at
    return graph.nodes[view.head].created_at if view.head in graph.nodes else 0.0


def _message_text(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def apply_turn_hooks(messages: list[Any], hooks: dict[str, Any], fmt: str) -> list[Any]:
    """Put ``prependContext`` / ``memoryPrefetch`` at the start of the newest user message.

    Recorded in the manifest (``turnHooks``) so replay re-applies exactly what was sent.
    """
    prefix_parts = [hooks.get("memoryPrefetch"), hooks.get("prependContext")]
    prefix = "\n\n".join(p for p in prefix_parts if p)
    if not prefix:
        return messages
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        msg = out[i]
        if isinstance(msg, dict) and msg.get("role") == "user":
            msg = dict(msg)
            content = msg.get("content")
            if isinstance(content, str):
                msg["content"] = prefix + "\n\n" + content
            elif isinstance(content, list):
                msg["content"] = [{"type": "text", "text": prefix}, *content]
            out[i] = msg
            break
    return out
