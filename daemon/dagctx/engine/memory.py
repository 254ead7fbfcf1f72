"""``memory/index``, ``memory/status``, ``memory/get`` (SPEC §5.1); ``memory/search`` is in
``memory_search.py``.

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
import hashlib
import os
import stat
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.context import memory_text as mt
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
#: chunks embedded per batch (each batch one write)
EMBED_BATCH = 256


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


def preload(engine: Host, only: tuple[str, str] | None = None) -> None:
    """The vectors read in the daemon's work pool (``memory_vectors.preload``): when the
    database is first opened, or ``only`` one workspace's new generation after an index run.
    Nothing in process (no server, no ``background_runner``)."""
    submit = getattr(engine, "background_runner", None)
    if submit is not None:
        mv.preload(submit, str(engine.database_key), MemoryIndex(engine.store), only)


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
