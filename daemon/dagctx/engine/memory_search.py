"""``memory/search`` (SPEC §5.1): keyword and vector candidates merged over the vectors the
daemon holds for it — read in the background (``memory_vectors.preload``: when a database is
first opened and after each index run) so a search rarely pays for the read, and waited for
(not read twice) when a search needs a generation being read. Split from ``memory.py`` (which indexes,
answers status and get) by job.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import memory_text as mt
from dagctx.context.cancel import stop_if_cancelled
from dagctx.ledger.memory import MemoryIndex
from dagctx.protocol import memory_messages as mem
from dagctx.protocol.errors import DagctxError

from . import memory_sessions as ms
from . import memory_vectors as mv
from .memory import _embed_missing, embedder_for, model_key, workspace_of

if TYPE_CHECKING:
    from .ports import Host

#: a search hit's ``text`` is capped at this many characters
HIT_TEXT_CHARS = 4_000


def _vectors(engine: Host, index: MemoryIndex, ws: str, key: str) -> mv.VectorIndex:
    """The workspace's vectors of ``key`` (``memory_vectors.VectorIndex``), read from the ledger
    only when the index changed since they were last read: every index write moves the
    workspace's run stamp (``memory_runs.indexed_at``), one row read per query. While the
    daemon reads this generation in the background (``preload``), the search waits for that
    read — cancellable (SPEC §5.1) — instead of reading the rows a second time."""
    run = index.run(ws)
    stamp = run[0] if run else None
    cache_key = (str(getattr(engine, "database_key", "")), ws, key)
    got = mv.cached(cache_key, stamp)
    while got is None:
        job = mv.start_load(cache_key, stamp, lambda: index.vectors(ws, key))
        if job is not None:
            job()
        got = mv.wait_loading(cache_key, stamp, stop_if_cancelled) or mv.cached(cache_key, stamp)
        if got is None and job is not None:  # the read failed (logged): read here, errors answered
            got = mv.VectorIndex.build(stamp, index.vectors(ws, key))
            mv.keep(cache_key, got)
    return got


def memory_search(engine: Host, p: mem.MemorySearchParams) -> mem.MemorySearchResult | Awaitable[mem.MemorySearchResult]:
    """Runs off the event loop (``methods.py``: offload), the query's embedding too. With
    ``sessions`` among the sources, the session index is brought up to date first
    (``memory_sessions``: its write on the database's writer, then the search offloaded)."""
    from dagctx.ledger import search as fts

    if p.vector_weight + p.text_weight <= 0:
        raise DagctxError("InvalidParams", "vectorWeight and textWeight are both 0; give one a positive weight",
                          path="vectorWeight")
    expr, words = mt.expression(p.query)
    want = p.max_results * (p.candidate_multiplier if p.mmr is None else max(p.candidate_multiplier, 4))
    terms = words or fts.query_terms(p.query)
    notes: list[str] = []
    ws = workspace_of(engine, p.workspace) if "memory" in p.sources else None
    index = MemoryIndex(engine.store)
    embedder = None
    if p.mode != "fts":
        embedder = embedder_for(engine, p.embedding, "embedding")
        if embedder is None:
            if p.mode in ("hybrid", "vector"):
                raise DagctxError("EmbeddingUnavailable", f"mode {p.mode!r} needs an embedding provider; none is "
                                  "installed (pip install 'dagctx[embed]') or embedding.provider is 'none'",
                                  path="mode")
            notes.append("no embedding provider (pip install 'dagctx[embed]'): keyword search only")
    key = model_key(embedder) if embedder is not None else None
    sessions = "sessions" in p.sources
    if sessions and p.session_id is not None:
        engine.store.get_session(p.session_id)  # SessionNotFound
    vindex: mv.VectorIndex | None = None
    if embedder is not None and ws is not None:
        vindex = _vectors(engine, index, ws, key or "")
        if not len(vindex):
            notes.append(f"no vectors of {key} in this workspace's index: run memory/index")
            if p.mode == "auto" and not sessions:
                embedder = None
    use_text = p.mode in ("auto", "hybrid", "fts") and bool(expr)
    if embedder is None:
        mode = "fts"
    elif p.mode == "vector" or not use_text:
        mode = "vector"
    else:
        mode = "hybrid"
    wsum = p.vector_weight + p.text_weight
    vw, tw = (p.vector_weight / wsum, p.text_weight / wsum) if mode == "hybrid" else ((1.0, 0.0) if mode == "vector" else (0.0, 1.0))

    def keyword_candidates(wskey: str, under: str | None) -> dict[str, dict[str, Any]]:
        cands: dict[str, dict[str, Any]] = {}
        if use_text and mode != "vector":
            for row, raw in index.search(wskey, expr, want, under, words):
                cands[row.id] = {"row": row, "text": mt.keyword_score(raw, row.text, words)}
        return cands

    def add_vectors(cands: dict[str, dict[str, Any]], vi: mv.VectorIndex | None, qv: Any, under: str | None,
                    top: list[tuple[int, float]] | None = None) -> dict[str, dict[str, Any]]:
        """The vector side's candidates (``top``, when found already) added, and every
        candidate's similarity."""
        if qv is not None and vi is not None and len(vi):
            if top is None:
                top = vi.top(qv, want, p.min_vector_score, vi.rows_under(under) if under is not None else None)
            for i, sim in top:
                cands.setdefault(vi.ids[i], {"text": 0.0})["vec"] = max(0.0, sim)
            for cid, c in cands.items():
                if "vec" not in c:
                    sim = vi.similarity(cid, qv)
                    if sim is not None:
                        c["vec"] = max(0.0, sim)
        return cands

    def vector_side() -> tuple[Any, list[tuple[int, float]] | None]:
        """The query's vector, and the workspace's nearest rows."""
        assert embedder is not None
        qv = embedder.embed([p.query])[0]
        if ws is None or vindex is None or not len(vindex):
            return qv, None
        return qv, vindex.top(qv, want, p.min_vector_score)

    def finish() -> mem.MemorySearchResult:
        # the vector side in this thread, before the keyword side: run beside it in a thread of
        # its own it was slower through the daemon on this 2-core machine (ARCHITECTURE.md)
        qv, top = vector_side() if embedder is not None else (None, None)
        hits: list[mem.MemoryHit] = []
        if ws is not None:
            cands = add_vectors(keyword_candidates(ws, None), vindex, qv, None, top)
            fetched = index.chunks(ws, [cid for cid, c in cands.items() if "row" not in c])
            for cid, c in cands.items():
                row = c.get("row") or fetched.get(cid)
                if row is None:
                    continue
                ts, vs = c.get("text", 0.0), c.get("vec")
                hits.append(mem.MemoryHit(
                    source="memory", score=tw * ts + vw * (vs or 0.0), text_score=ts,
                    snippet="", text=row.text[:HIT_TEXT_CHARS], chunk_id=row.id,
                    path=row.path, start_line=row.start_line, end_line=row.end_line, time=row.mtime, vector_score=vs))
        if sessions:
            svi = _vectors(engine, index, ms.SESSIONS_KEY, key) if key is not None else None
            cands = add_vectors(keyword_candidates(ms.SESSIONS_KEY, p.session_id), svi, qv, p.session_id)
            fetched = index.chunks(ms.SESSIONS_KEY, [cid for cid, c in cands.items() if "row" not in c])
            for cid, c in cands.items():
                row = c.get("row") or fetched.get(cid)
                if row is None:
                    continue
                sid, nid = ms.split_path(row.path)
                ts, vs = c.get("text", 0.0), c.get("vec")
                hits.append(mem.MemoryHit(
                    source="sessions", score=tw * ts + vw * (vs or 0.0), text_score=ts,
                    snippet="", text=row.text[:HIT_TEXT_CHARS], session_id=sid,
                    node_id=nid, start_line=row.start_line, end_line=row.end_line, time=row.mtime, vector_score=vs))
        if p.temporal_decay is not None:
            now = time.time()
            hl = p.temporal_decay.half_life_days
            hits = [msgspec.structs.replace(h, score=mt.decay(h.score, now - (h.time if h.time is not None else now), hl))
                    for h in hits]
        hits = [h for h in hits if h.score >= p.min_score]
        hits.sort(key=lambda h: (-h.score, h.path or "", h.start_line or 0, h.session_id or "", h.node_id or ""))
        if p.mmr is not None:
            hits = mt.mmr(hits, lambda h: h.score, lambda h: h.text, p.mmr.lambda_, p.max_results)
        # snippets of the answered hits only (a candidate's costs a regex pass per term)
        hits = [msgspec.structs.replace(h, snippet=fts.snippet(h.text, terms)) for h in hits[: p.max_results]]
        return mem.MemorySearchResult(hits=hits, mode=mode, expression=expr, keywords=words,
                                      embedding=key if embedder is not None else None, notes=notes)

    if not sessions:
        return finish()
    plan = ms.plan(engine.store, index, ms.counters(str(getattr(engine, "database_key", ""))))

    async def bring_up_to_date() -> mem.MemorySearchResult:
        """The session index caught up (SPEC §5.1: sessions), then the search."""
        if plan:
            try:
                await engine.write(ms.apply, index, plan)
            except DagctxError as err:
                if err.kind != "StorageReadOnly":
                    raise
                notes.append("the database is read-only: sessions' new nodes are not indexed")
            else:
                nodes = sum(len(u.nodes) for u in plan.updates)
                if nodes or plan.gone:
                    notes.append(f"sessions indexed now: {nodes} node(s) of {len(plan.updates)} session(s)"
                                 + (f", {len(plan.gone)} deleted session(s) dropped" if plan.gone else ""))
        if embedder is not None and key is not None:
            done, error = await _embed_missing(engine, index, ms.SESSIONS_KEY, embedder, ms.EMBED_PER_SEARCH)
            if error:
                notes.append(f"session chunks not embedded ({error}): found by keywords only")
            elif done >= ms.EMBED_PER_SEARCH:
                left = index.chunk_count(ms.SESSIONS_KEY) - index.vector_count(ms.SESSIONS_KEY, key)
                if left > 0:
                    notes.append(f"{left} session chunk(s) not embedded yet (the next searches embed them, "
                                 f"{ms.EMBED_PER_SEARCH} each): found by keywords only until then")
        return await engine.offload(finish)

    return bring_up_to_date()
