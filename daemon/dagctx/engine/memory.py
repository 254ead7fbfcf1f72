"""``memory/index``, ``memory/status``, ``memory/search``, ``memory/get`` (SPEC §5.1).

Files are read here, under the workspace's confinement (``open_beneath``: no symlink
followed out of it, no hard-linked file), chunked by ``context.memory_text`` and written
through the ledger's memory index in one transaction per run, by the database's writer;
then every chunk without a vector of the run's embedding model gets one (``embeddings``),
in batches, each batch its own transaction. A search compares the query's vector with the
workspace's vectors held as one float32 matrix per index generation (``memory_vectors``),
merged with the keyword candidates.
"""

from __future__ import annotations

import codecs
import contextvars
import hashlib
import os
import stat
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import memory_text as mt
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.workspace_files import open_beneath, read_capped, resolve_inside
from dagctx.ledger.memory import FileUpdate, MemoryChunkRow, MemoryFileRow, MemoryIndex
from dagctx.protocol import memory_messages as mem
from dagctx.protocol.errors import DagctxError

from . import embeddings as emb
from . import memory_sessions as ms
from . import memory_vectors as mv

if TYPE_CHECKING:
    from .ports import Host

_skips_enc = msgspec.msgpack.Encoder()
_skips_dec = msgspec.msgpack.Decoder(list[mem.MemorySkip])

#: files found below memory/ and extra folders beyond this many are not indexed (a note says so)
MAX_FILES = 10_000
#: a search hit's ``text`` is capped at this many characters
HIT_TEXT_CHARS = 4_000
#: chunks embedded per batch (each batch one write)
EMBED_BATCH = 256
#: where a hybrid search's vector side runs while its keyword side runs in the request's thread
_SIDE = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dagctx-memory-vectors")


def embedder_for(engine: Host, spec: mem.MemoryEmbedding | None, field: str) -> emb.Embedder | None:
    """The provider ``spec`` names; None for ``none`` and for the default when the local
    model is not installed (keyword search then). A provider named but not usable is an error."""
    if spec is None:
        return emb.local_embedder()
    if spec.provider == "none":
        return None
    if spec.provider == "local":
        e = emb.local_embedder()
        if e is None:
            raise DagctxError("EmbeddingUnavailable", "the local embedding model is not installed: pip install "
                              "'dagctx[embed]' (its weights ship in the wordllama package), or use provider "
                              "'openai' or 'none'", path=f"{field}.provider")
        return e
    if not spec.base_url or not spec.model:
        raise DagctxError("InvalidParams", f"{field}: provider 'openai' needs baseUrl (the API root, e.g. "
                          "http://127.0.0.1:8080/v1) and model", path=f"{field}.baseUrl")
    key = None
    if spec.api_key_env:
        key = engine.environ.get(spec.api_key_env)
        if not key:
            raise DagctxError("InvalidParams", f"{field}.apiKeyEnv: the variable {spec.api_key_env} is not set in "
                              "the client's environment", path=f"{field}.apiKeyEnv")
    return emb.Endpoint(base_url=spec.base_url, model=spec.model, api_key=key, dim=spec.dimensions or 0)


def model_key(e: emb.Embedder) -> str:
    return f"{e.provider}:{e.model}" if e.provider == "local" else f"{e.provider}:{e.model}@{getattr(e, 'base_url', '')}"


async def _embed_missing(engine: Host, index: MemoryIndex, ws: str, e: emb.Embedder,
                         limit: int | None = None) -> tuple[int, str | None]:
    """Give every chunk without a vector of ``e``'s model one (at most ``limit``); (embedded, error)."""
    import numpy as np

    key = model_key(e)
    done = 0
    after = ""
    while limit is None or done < limit:
        todo = index.missing_vectors(ws, key, EMBED_BATCH if limit is None else min(EMBED_BATCH, limit - done), after)
        if not todo:
            return done, None
        after = todo[-1][0]
        try:
            vecs = await engine.offload(lambda: e.embed([t for _, t in todo]))
        except DagctxError as err:
            return done, err.message
        rows = [(cid, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for (cid, _), v in zip(todo, vecs)]
        await engine.write(index.put_vectors, ws, key, int(vecs.shape[1]), rows)
        done += len(rows)
    return done, None


def workspace_of(engine: Host, given: str | None) -> str:
    """The workspace's real path: the request's, else ``initializationOptions.workspace``."""
    raw = given or engine.options.workspace
    field = "workspace" if given else "initializationOptions.workspace"
    if not raw:
        raise DagctxError("InvalidParams", "no workspace: pass `workspace` (the folder holding MEMORY.md and "
                          "memory/) or set initializationOptions.workspace", path="workspace")
    path = engine.client_path(raw, field)
    if not os.path.isdir(path):
        raise DagctxError("InvalidParams", f"the workspace {raw!r} is not a folder; name the folder holding "
                          "MEMORY.md and memory/", path=field)
    return os.path.realpath(path)


# ---------------------------------------------------------------- reading files


@dataclass
class _Read:
    text: str | None = None
    data: bytes = b""
    mtime: float = 0.0
    size: int = 0
    skip: mem.MemorySkip | None = None


def _read(root: str, rel: str, max_bytes: int) -> _Read:
    """``root/rel`` as UTF-8 text, or the reason it is skipped (never raises for the file)."""
    def skip(kind: Any, note: str) -> _Read:
        return _Read(skip=mem.MemorySkip(path=rel, kind=kind, note=f"{rel}: {note}"))

    try:
        fd = open_beneath(root, rel)
    except DagctxError as err:
        return skip("symlinkOutside", f"not indexed: {err.message}")
    except FileNotFoundError:
        return skip("unreadable", "vanished while indexing; not indexed")
    except OSError as err:
        return skip("unreadable", f"cannot open ({err.strerror or type(err).__name__}); not indexed")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return skip("notRegular", "not a regular file; not indexed")
        if info.st_nlink > 1:
            return skip("symlinkOutside", f"has {info.st_nlink} hard links (one may be outside the workspace); "
                        "not indexed — copy it instead")
        if info.st_size > max_bytes:
            return skip("tooLarge", f"{info.st_size:,} bytes, over the limit of {max_bytes:,} "
                        "(options.maxFileBytes); not indexed — split it into smaller files")
        data = read_capped(fd, max_bytes)
    except OSError as err:
        return skip("unreadable", f"read failed ({err.strerror or type(err).__name__}); not indexed")
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        return skip("tooLarge", f"grew past the limit of {max_bytes:,} bytes while read; not indexed")
    if b"\x00" in data:
        return skip("binary", "holds NUL bytes (a binary file); not indexed")
    try:
        text = codecs.decode(data, "utf-8-sig")
    except UnicodeDecodeError as err:
        return skip("notUtf8", f"not valid UTF-8 (byte {err.start}); not indexed — save it as UTF-8")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _Read(text=text, data=data, mtime=info.st_mtime, size=len(data))


def _walk_md(root: str, rel_dir: str, found: list[str], skipped: list[mem.MemorySkip]) -> None:
    """Every ``*.md`` below ``root/rel_dir`` (sorted; symlinked folders are not entered)."""
    stack = [rel_dir]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(os.scandir(os.path.join(root, d)), key=lambda e: e.name)
        except OSError as err:
            skipped.append(mem.MemorySkip(path=d, kind="unreadable",
                                          note=f"{d}: cannot list ({err.strerror or type(err).__name__})"))
            continue
        subdirs = []
        for e in entries:
            rel = os.path.join(d, e.name)
            try:
                e.name.encode("utf-8")
            except UnicodeEncodeError:
                skipped.append(mem.MemorySkip(path=rel.encode("utf-8", "replace").decode(), kind="unreadable",
                                              note="a file name that is not valid UTF-8; not indexed — rename it"))
                continue
            if e.is_dir(follow_symlinks=False):
                subdirs.append(rel)
            elif e.is_symlink() and e.is_dir():
                skipped.append(_linked_folder(root, rel))
            elif e.name.lower().endswith(".md") and (e.is_file(follow_symlinks=False) or e.is_symlink()):
                found.append(rel)
        stack.extend(reversed(subdirs))


def _linked_folder(root: str, rel: str) -> mem.MemorySkip:
    """The note of a symlinked folder: never entered (SPEC §5.1)."""
    real = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([real, root]) != root:
        return mem.MemorySkip(path=rel, kind="symlinkOutside",
                              note=f"{rel}: a symlink to a folder outside the workspace; not entered")
    return mem.MemorySkip(path=rel, kind="notRegular", note=f"{rel}: a symlinked folder; not entered — "
                          "name the folder it points to (options.extraPaths) instead")


def _candidates(root: str, opts: mem.MemoryIndexOptions) -> tuple[list[tuple[str, str]], list[mem.MemorySkip]]:
    """(relative path, source) of every memory file, and what was skipped while looking.
    An extra path outside the workspace refuses the whole run (``WorkspaceEscape``)."""
    extras: list[str] = []
    for i, extra in enumerate(opts.extra_paths):
        try:
            resolve_inside(root, extra)
        except DagctxError as err:
            raise DagctxError("WorkspaceEscape", f"options.extraPaths[{i}]: {err.message}",
                              path=f"options.extraPaths[{i}]") from err
        extras.append(os.path.normpath(extra))
    skipped: list[mem.MemorySkip] = []
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(rel: str, source: str) -> None:
        if rel not in seen:
            seen.add(rel)
            out.append((rel, source))

    if os.path.lexists(os.path.join(root, "MEMORY.md")):
        add("MEMORY.md", "memory")
    found: list[str] = []
    if os.path.islink(os.path.join(root, "memory")) and os.path.isdir(os.path.join(root, "memory")):
        skipped.append(_linked_folder(root, "memory"))
    elif os.path.isdir(os.path.join(root, "memory")):
        _walk_md(root, "memory", found, skipped)
    for rel in found:
        add(rel, "memory")
    for extra in extras:
        full = os.path.join(root, extra)
        if os.path.isdir(full):
            more: list[str] = []
            _walk_md(root, extra, more, skipped)
            for rel in more:
                add(rel, "extra")
        elif os.path.lexists(full):
            add(extra, "extra")
        else:
            skipped.append(mem.MemorySkip(path=extra, kind="unreadable",
                                          note=f"{extra}: no such file or folder (options.extraPaths); nothing indexed from it"))
    if len(out) > MAX_FILES:
        for rel, _ in out[MAX_FILES:]:
            skipped.append(mem.MemorySkip(path=rel, kind="tooLarge",
                                          note=f"{rel}: more than {MAX_FILES:,} memory files; not indexed"))
        out = out[:MAX_FILES]
    return out, skipped


def _chunk_id(workspace: str, path: str, c: mt.Chunk) -> str:
    key = f"{workspace}\x00{path}\x00{c.start_line}\x00{c.end_line}\x00{c.text}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


# ---------------------------------------------------------------- the methods


def memory_index(engine: Host, p: mem.MemoryIndexParams) -> Awaitable[mem.MemoryIndexResult]:
    opts = p.options or mem.MemoryIndexOptions()
    if opts.overlap_tokens >= opts.chunk_tokens:
        raise DagctxError("InvalidParams", f"options.overlapTokens ({opts.overlap_tokens}) must be below "
                          f"options.chunkTokens ({opts.chunk_tokens})", path="options.overlapTokens")
    ws = workspace_of(engine, p.workspace)
    index = MemoryIndex(engine.store)
    stored = {f.path: f for f in index.files(ws)}
    files, skipped = _candidates(ws, opts)
    settings = f"\x00chunk={opts.chunk_tokens}/{opts.overlap_tokens}".encode()
    put: list[FileUpdate] = []
    kept: set[str] = set()
    reindexed = unchanged = 0
    for rel, source in files:
        got = _read(ws, rel, opts.max_file_bytes)
        if got.skip is not None:
            skipped.append(got.skip)
            continue
        assert got.text is not None
        digest = hashlib.sha256(got.data + settings).hexdigest()
        lines = got.text.count("\n") + (0 if got.text.endswith("\n") or not got.text else 1)
        old = stored.get(rel)
        kept.add(rel)
        if old is not None and old.hash == digest and not p.force:
            unchanged += 1
            if old.mtime != got.mtime or old.source != source:
                put.append(FileUpdate(MemoryFileRow(rel, source, digest, got.mtime, got.size, lines, old.chunks), None))
            continue
        chunks = mt.chunk_text(got.text, opts.chunk_tokens, opts.overlap_tokens)
        rows = [MemoryChunkRow(_chunk_id(ws, rel, c), rel, source, c.start_line, c.end_line, c.hash, got.mtime, c.text)
                for c in chunks]
        put.append(FileUpdate(MemoryFileRow(rel, source, digest, got.mtime, got.size, lines, len(rows)), rows))
        reindexed += 1
    drop = [path for path in stored if path not in kept]
    now = time.time()
    skips = _skips_enc.encode(skipped)

    embedder = embedder_for(engine, p.embedding, "embedding")

    async def finish() -> mem.MemoryIndexResult:
        await engine.write(_apply, index, ws, drop, put, now, skips)
        chunks = index.chunk_count(ws)
        embedded, error, key, missing = 0, None, None, 0
        if embedder is not None:
            key = model_key(embedder)
            embedded, error = await _embed_missing(engine, index, ws, embedder)
            missing = chunks - index.vector_count(ws, key)
            preload(engine, (ws, key))  # this generation's matrix, before the next search needs it
        return mem.MemoryIndexResult(
            workspace=ws, files=len(kept), reindexed=reindexed, unchanged=unchanged, removed=len(drop), chunks=chunks,
            skipped=skipped, complete=not skipped and missing == 0, embedding=key, embedded=embedded,
            vectors_missing=missing, embedding_error=error)

    return finish()


def _apply(index: MemoryIndex, ws: str, drop: list[str], put: list[FileUpdate], now: float, skips: bytes) -> None:
    index.apply(ws, drop=drop, put=put, indexed_at=now, skipped=skips)


#: (database key, workspace) → (index generation, its files as ``memory/status`` answers them,
#: its skips): the last few workspaces' status reads one row when nothing was written since
_STATUS_FILES: dict[tuple[str, str], tuple[float, list[mem.MemoryFileInfo], list[mem.MemorySkip]]] = {}
_STATUS_LOCK = threading.Lock()


def memory_status(engine: Host, p: mem.MemoryStatusParams) -> mem.MemoryStatusResult:
    """Reads the run row (the generation), the kept counts (SPEC §5.1: no row counted) and the
    files — those only when the generation moved since this daemon last listed them."""
    ws = workspace_of(engine, p.workspace)
    index = MemoryIndex(engine.store)
    run = index.run(ws)
    cache_key = (str(getattr(engine, "database_key", "")), ws)
    with _STATUS_LOCK:
        got = _STATUS_FILES.get(cache_key)
    if run is not None and got is not None and got[0] == run[0]:
        files, skipped = got[1], got[2]
    else:
        files = [mem.MemoryFileInfo(path=f.path, source=f.source, hash=f.hash, mtime=f.mtime, size=f.size,  # type: ignore[arg-type]
                                    chunks=f.chunks) for f in index.files(ws)]
        skipped = _skips_dec.decode(run[1]) if run else []
        if run is not None:
            with _STATUS_LOCK:
                _STATUS_FILES.pop(cache_key, None)
                _STATUS_FILES[cache_key] = (run[0], files, skipped)
                while len(_STATUS_FILES) > 16:
                    _STATUS_FILES.pop(next(iter(_STATUS_FILES)))
    embedder = emb.local_embedder()
    key = model_key(embedder) if embedder is not None else None
    return mem.MemoryStatusResult(
        workspace=ws,
        files=files,
        chunks=index.chunk_count(ws), skipped=skipped, indexed_at=run[0] if run else None,
        complete=run is not None and not skipped, embedding=key,
        vectors=index.vector_count(ws, key) if key is not None else 0,
        vectors_loaded=key is not None and run is not None and mv.cached(cache_key + (key,), run[0]) is not None,
        sessions=_sessions_status(engine, index, key))


def _sessions_status(engine: Host, index: MemoryIndex, key: str | None) -> mem.MemorySessionsStatus:
    """The session index as ``memory/status`` shows it (reads only: it brings nothing up to date)."""
    run = index.run(ms.SESSIONS_KEY)
    last = ms.marker_of(run)
    now = index.sessions_marker()
    fresh = last == now or (last is None and now[0] == 0)
    if fresh:
        pending = 0
    elif last is None:
        pending = now[0]
    else:
        pending = index.sessions_after(last[1])
    chunks = index.chunk_count(ms.SESSIONS_KEY)
    vectors = index.vector_count(ms.SESSIONS_KEY, key) if key is not None else 0
    c = ms.counters(str(getattr(engine, "database_key", "")))
    return mem.MemorySessionsStatus(
        sessions=index.file_count(ms.SESSIONS_KEY), chunks=chunks, vectors=vectors,
        vectors_missing=chunks - vectors if key is not None else 0, pending=pending, up_to_date=fresh,
        indexed_at=run[0] if run else None, checks=c.checks, unchanged=c.unchanged, listings=c.listings,
        sessions_read=c.sessions_read)


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


def preload(engine: Host, only: tuple[str, str] | None = None) -> None:
    """Read vectors into the daemon's matrices in the background (the work pool, never the
    loop; SPEC §5.1), so a search does not pay for it: when a database is first opened, the
    ``MAX_INDEXES`` most recently indexed (workspace, model) sets that have vectors; after
    an index run, ``only`` that workspace's new generation. Nothing without a server's
    ``background_runner`` (in process)."""
    submit = getattr(engine, "background_runner", None)
    if submit is None:
        return
    db = str(engine.database_key)
    if only is None and not mv.first_open(db):
        return
    index = MemoryIndex(engine.store)

    def job() -> None:
        try:
            if only is not None:
                run = index.run(only[0])
                sets = [(only[0], only[1], run[0] if run else None)]
            else:
                sets = index.vector_sets()[: mv.MAX_INDEXES]
            jobs = [mv.start_load((db, ws, model), stamp, lambda ws=ws, model=model: index.vectors(ws, model))
                    for ws, model, stamp in sets]
        except DagctxError:  # the database cannot be read now: searches read when they need them
            return
        if any(model.startswith("local:") for _, model, _ in sets):
            emb.local_embedder()  # the local model's weights too: a query's embedding needs them
        for load in jobs:
            if load is not None:
                load()

    submit(job)


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
        qv, top, side = None, None, None
        if embedder is not None:
            if mode == "hybrid" and ws is not None:
                # the vector side beside the keyword side: both spend their time where the GIL
                # is released (numpy's kernels, SQLite's steps), so they overlap (ARCHITECTURE.md)
                side = _SIDE.submit(contextvars.copy_context().run, vector_side)
            else:
                qv, top = vector_side()
        hits: list[mem.MemoryHit] = []
        if ws is not None:
            try:
                cands = keyword_candidates(ws, None)
            finally:
                if side is not None:
                    qv, top = side.result()
            add_vectors(cands, vindex, qv, None, top)
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


def memory_get(engine: Host, p: mem.MemoryGetParams) -> mem.MemoryGetResult:
    if (p.chunk_id is None) == (p.path is None):
        raise DagctxError("InvalidParams", "give exactly one of chunkId (a chunk from memory/search) and path "
                          "(a memory file, relative to the workspace)", path="chunkId")
    ws = workspace_of(engine, p.workspace)
    index = MemoryIndex(engine.store)
    if p.chunk_id is not None:
        row = index.chunk(ws, p.chunk_id)
        if row is None:
            raise DagctxError("ChunkNotFound", f"no chunk {p.chunk_id!r} in the memory index of {ws}: the file "
                              "changed and was re-indexed, or the id is wrong; search again", path="chunkId")
        total = next((f.lines for f in index.files(ws) if f.path == row.path), row.end_line)
        lines = row.text.split("\n")
        start = row.start_line + max(0, (p.from_line or 1) - 1)
        take = lines[(p.from_line or 1) - 1:][: p.lines] if p.lines else lines[(p.from_line or 1) - 1:]
        return mem.MemoryGetResult(path=row.path, text="\n".join(take), start_line=start,
                                   end_line=start + len(take) - 1, total_lines=total, chunk_id=row.id)
    assert p.path is not None
    rel = os.path.normpath(p.path)
    resolve_inside(ws, rel)  # WorkspaceEscape: absolute, '..', or through a symlink out of the workspace
    indexed = {f.path for f in index.files(ws)}
    is_memory = rel == "MEMORY.md" or (rel.startswith("memory" + os.sep) and rel.lower().endswith(".md"))
    if not is_memory and rel not in indexed:
        raise DagctxError("InvalidParams", f"{p.path!r} is not a memory file: name MEMORY.md, a file below "
                          "memory/, or an indexed extra path", path="path")
    got = _read(ws, rel, mem.MemoryIndexOptions().max_file_bytes)
    if got.skip is not None:
        if got.skip.kind == "symlinkOutside":
            raise DagctxError("WorkspaceEscape", got.skip.note, path="path")
        if got.skip.kind == "unreadable" and not os.path.lexists(os.path.join(ws, rel)):
            raise DagctxError("InvalidParams", f"{p.path!r}: no such file in the workspace", path="path")
        raise DagctxError("InvalidParams", got.skip.note, path="path")
    assert got.text is not None
    lines = got.text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first = p.from_line or 1
    if first > max(1, len(lines)):
        raise DagctxError("InvalidParams", f"fromLine {first} is past the end of {p.path} ({len(lines)} lines)",
                          path="fromLine")
    take = lines[first - 1:][: p.lines] if p.lines else lines[first - 1:]
    return mem.MemoryGetResult(path=rel, text="\n".join(take), start_line=first, end_line=first + len(take) - 1,
                               total_lines=len(lines))
