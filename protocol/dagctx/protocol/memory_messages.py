"""Memory: a workspace's memory files indexed in the ledger, searched and read (SPEC §5.1).

``MEMORY.md`` and every ``*.md`` below ``memory/`` of a workspace (plus configured extra
paths inside it) are chunked by tokens with overlap, each chunk keeping its file, line
range, source and the file's modification time; ``memory/index`` brings the index up to
date incrementally (by content hash), ``memory/search`` ranks chunks (and optionally
session nodes) by keyword, ``memory/get`` reads a chunk or a line range of a memory file.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .messages import Count, FilePath, Positive, Share, _Params, _Result

MemorySource = Literal["memory", "sessions"]

ChunkTokens = Annotated[int, msgspec.Meta(ge=16, le=8192)]
HalfLifeDays = Annotated[float, msgspec.Meta(gt=0, le=36_500)]
MaxResults = Annotated[int, msgspec.Meta(ge=1, le=200)]
MaxFileBytes = Annotated[int, msgspec.Meta(ge=1, le=1 << 30)]
#: an extra memory path: relative to the workspace, no NUL
ExtraPath = Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[^\u0000]*$",
                                        description="a path relative to the workspace (a .md file or a folder)")]


class MemoryIndexOptions(_Params):
    """How files are chunked and which files count; every field has a default."""

    #: extra workspace-relative files or folders (their ``*.md``) beside ``MEMORY.md`` and ``memory/``
    extra_paths: list[ExtraPath] = msgspec.field(default_factory=list)
    #: tokens per chunk (estimated, CJK-aware)
    chunk_tokens: ChunkTokens = 400
    #: tokens each chunk repeats from the end of the one before (less than ``chunkTokens``)
    overlap_tokens: Count = 80
    #: a larger file is skipped with a note, never read
    max_file_bytes: MaxFileBytes = 4 << 20


class MemoryEmbedding(_Params):
    """Which embedding provider makes the vectors (SPEC §5.1). ``local`` (the default): the
    static model whose weights ship in the ``wordllama`` package (``dagctx[embed]``), nothing
    downloaded; ``openai``: an OpenAI-compatible ``POST {baseUrl}/embeddings``; ``none``: no
    vectors (keyword search only). Vectors are stored per provider and model: a search with
    another model finds none of the old ones until ``memory/index`` embeds the chunks again."""

    provider: Literal["local", "openai", "none"] = "local"
    #: the endpoint's model (``openai``); the local model has one name
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    #: ``openai``: the API root, e.g. ``http://127.0.0.1:8080/v1``
    base_url: Annotated[str, msgspec.Meta(min_length=1, max_length=2000, pattern=r"^https?://")] | None = None
    #: ``openai``: the client environment variable holding the key (never the key itself)
    api_key_env: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    #: ``openai``: the dimension every answer must have (default: the first answer's)
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=65536)] | None = None


class MemoryIndexParams(_Params):
    """``memory/index``: bring the workspace's memory index up to date."""

    #: the workspace root; default: ``initializationOptions.workspace``
    workspace: FilePath | None = None
    options: MemoryIndexOptions | None = None
    #: re-chunk every file even when its content hash did not change
    force: bool = False
    #: the provider whose vectors the chunks get (default ``local`` when installed, else none)
    embedding: MemoryEmbedding | None = None


class MemorySkip(_Result):
    """A file that was found but not indexed, and why."""

    path: str
    kind: Literal["binary", "notUtf8", "tooLarge", "symlinkOutside", "unreadable", "notRegular"]
    note: str


class MemoryIndexResult(_Result):
    workspace: str
    #: files indexed now (their chunks are current)
    files: int
    #: files whose chunks were (re)written by this run
    reindexed: int
    #: files whose content hash had not changed
    unchanged: int
    #: files that were indexed before and are gone (their chunks removed)
    removed: int
    #: chunks in the index now
    chunks: int
    skipped: list[MemorySkip]
    #: false when any file was skipped or a chunk has no vector of the run's model: the index
    #: holds every other file, never part of one
    complete: bool
    #: ``provider:model`` of the vectors (null: none, keyword search only)
    embedding: str | None = None
    #: chunks embedded by this run (new or changed chunks, or all after a model change)
    embedded: int = 0
    #: chunks without a vector of ``embedding`` (the provider failed: ``embeddingError``)
    vectors_missing: int = 0
    embedding_error: str | None = None


class MemoryStatusParams(_Params):
    workspace: FilePath | None = None


class MemoryFileInfo(_Result):
    path: str
    source: Literal["memory", "extra"]
    #: sha-256 of the file's bytes (and the chunking options)
    hash: str
    mtime: float
    size: int
    chunks: int


class MemorySessionsStatus(_Result):
    """The session index (SPEC §5.1, sessions as a source): what it holds, what waits, and
    what this daemon's catch-ups of it did (counts since the daemon started)."""

    #: sessions indexed, and their chunks
    sessions: int = 0
    chunks: int = 0
    #: chunks with a vector of ``embedding`` (of ``MemoryStatusResult``), and without one yet
    #: (the next searches over sessions embed them)
    vectors: int = 0
    vectors_missing: int = 0
    #: sessions written since the index was last brought up to date (all of them when it
    #: never was): the next search over sessions reads them
    pending: int = 0
    #: the ledger's sessions are exactly what the index was last brought up to date with
    up_to_date: bool = False
    #: when the session index last changed (Unix seconds); null: never
    indexed_at: float | None = None
    #: this daemon's catch-ups: asked (one per search over sessions); found nothing changed
    #: (nothing else read); compared every session (a first index, a session deleted);
    #: sessions whose nodes were read
    checks: int = 0
    unchanged: int = 0
    listings: int = 0
    sessions_read: int = 0


class MemoryStatusResult(_Result):
    workspace: str
    files: list[MemoryFileInfo]
    chunks: int
    #: what the last ``memory/index`` of this workspace skipped
    skipped: list[MemorySkip]
    #: when the index last changed — its last ``memory/index`` or embedding batch (Unix
    #: seconds); null: never indexed
    indexed_at: float | None = None
    complete: bool = False
    #: ``provider:model`` of the default embedding (``local`` when installed; null: none)
    #: whose vectors ``vectors`` counts
    embedding: str | None = None
    #: the workspace's chunks with a vector of ``embedding``
    vectors: int = 0
    #: whether this daemon holds those vectors in memory, ready for search (read in the
    #: background when the database is opened and after each index run; a search asking
    #: before waits for that read)
    vectors_loaded: bool = False
    sessions: MemorySessionsStatus = msgspec.field(default_factory=MemorySessionsStatus)


class MemoryDecay(_Params):
    """Temporal decay: a hit's score times ``0.5 ** (ageDays / halfLifeDays)``; age from the
    file's modification time (a chunk) or the node's creation (a session hit)."""

    half_life_days: HalfLifeDays = 30.0


class MemoryMmr(_Params):
    """Maximal marginal relevance: pick greedily by ``λ·relevance − (1−λ)·max similarity to
    the hits already picked`` (similarity: Jaccard of the two texts' word sets)."""

    lambda_: Share = msgspec.field(default=0.7, name="lambda")


class MemorySearchParams(_Params):
    """``memory/search``: hybrid search over memory chunks and/or sessions' node chunks (the
    search brings the latter up to date first: SPEC §5.1).

    Candidates: the keyword search's best ``maxResults × candidateMultiplier`` and the
    vector search's as many; each scored ``vectorWeight·vector + textWeight·text``
    (weights normalised to sum 1; ``text`` is the keyword score times the hit's share of the
    query's keywords, squared). ``mode``: ``auto`` is hybrid when vectors of the
    embedding's model exist, keyword only otherwise (and vector only when the query has no
    keyword); ``fts``, ``vector`` and ``hybrid`` force one."""

    query: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    workspace: FilePath | None = None
    max_results: MaxResults = 6
    #: hits scoring below it (after decay) are dropped; scores lie in [0, 1)
    min_score: Share = 0.0
    sources: list[MemorySource] = msgspec.field(default_factory=lambda: ["memory"])
    #: with ``sessions`` among the sources: only this session's nodes
    session_id: str | None = None
    temporal_decay: MemoryDecay | None = None
    mmr: MemoryMmr | None = None
    mode: Literal["auto", "hybrid", "fts", "vector"] = "auto"
    vector_weight: Share = 0.7
    text_weight: Share = 0.3
    candidate_multiplier: Annotated[int, msgspec.Meta(ge=1, le=50)] = 4
    #: a chunk is a vector candidate only at this cosine similarity or more (unrelated text
    #: scores near 0 with the local model, a paraphrase 0.15–0.6: SPEC §5.1)
    min_vector_score: Share = 0.1
    embedding: MemoryEmbedding | None = None


class MemoryHit(_Result):
    source: MemorySource
    #: after decay; in [0, 1)
    score: float
    #: the keyword score before decay (0: found by vector only)
    text_score: float
    snippet: str
    #: the chunk's text (of a memory file or of a session node), capped
    text: str
    #: memory hits: the chunk id (for ``memory/get``), the file and its 1-based inclusive lines;
    #: session hits: the lines of the node's text the hit's chunk spans
    chunk_id: str | None = None
    path: str | None = None
    start_line: int | None = None
    end_line: int | None = None
    #: session hits
    session_id: str | None = None
    node_id: str | None = None
    #: the file's modification time or the node's creation time (Unix seconds)
    time: float | None = None
    #: cosine similarity of the query's vector and the hit's, clipped to [0, 1] (null: no vector)
    vector_score: float | None = None


class MemorySearchResult(_Result):
    hits: list[MemoryHit]
    #: how candidates were found
    mode: Literal["fts", "hybrid", "vector"]
    #: the full-text expression that ran
    expression: str
    #: the words taken from a conversational query (empty when the query was used as written)
    keywords: list[str]
    #: ``provider:model`` of the vectors compared (null: keyword only)
    embedding: str | None = None
    #: why the search is not hybrid, or what it could not compare
    notes: list[str] = msgspec.field(default_factory=list)


class MemoryGetParams(_Params):
    """``memory/get``: one chunk (``chunkId``) or lines of a memory file (``path``)."""

    workspace: FilePath | None = None
    chunk_id: str | None = None
    #: workspace-relative path of a memory file (MEMORY.md, memory/…, or an extra path)
    path: FilePath | None = None
    #: 1-based first line (default 1)
    from_line: Positive | None = None
    #: how many lines (default: to the end)
    lines: Positive | None = None


class MemoryGetResult(_Result):
    path: str
    text: str
    #: 1-based inclusive range of ``text``; ``endLine < startLine`` when it is empty
    start_line: int
    end_line: int
    #: lines in the file (a chunk: the file's lines when it was indexed)
    total_lines: int
    chunk_id: str | None = None
