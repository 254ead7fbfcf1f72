"""Params and results of the lifecycle, session, node and search methods.

Every Struct renames to camelCase on the wire (LSP convention). Optional fields
default so that clients may omit them; unknown fields are ignored, so newer
clients can talk to older daemons.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from .nodes import Call, NodeInput

# ---------------------------------------------------------------- bounded scalars (SPEC §3)
# Every integer the daemon stores or hands to SQLite must fit in 64 bits; a path must not
# hold NUL (no file system accepts it); a timeout is positive and at most a day.

INT64_MAX = 2**63 - 1
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=INT64_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
FilePath = Annotated[str, msgspec.Meta(pattern=r"^[^\u0000]*$", description="a file system path (no NUL characters)")]
HttpUrl = Annotated[str, msgspec.Meta(pattern=r"^[hH][tT][tT][pP][sS]?://[^\u0000]+$",
                                      description="an http:// or https:// URL")]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=86_400)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class _Params(msgspec.Struct, rename="camel", kw_only=True):
    """Base of every params Struct: camelCase, keyword-only, unknown fields ignored."""


class _Result(msgspec.Struct, rename="camel", kw_only=True):
    """Base of every result Struct."""


# ---------------------------------------------------------------- lifecycle


class ClientInfo(_Params):
    name: str = ""
    version: str | None = None


class ModelSpec(_Params, omit_defaults=True):
    """Settings for one model name (``initializationOptions.models``, the config file).

    A field left out keeps what the name resolved to before (a built-in row or the
    default), so an override may change only the window.
    """

    context_window: int | None = None
    max_output: int | None = None
    tokenizer: str | None = None


class SamplingEndpoint(_Params):
    """An OpenAI-compatible endpoint for headless summaries (no client sampling)."""

    base_url: HttpUrl
    model: str
    api_key_env: str | None = None
    timeout_seconds: Seconds = 120.0


#: Where a summary's completion may come from, in ``initializationOptions.summarySources``
#: (SPEC §2): the host's own completion function declared by the client, the client's
#: MCP-shaped sampling, a configured endpoint.
SummarySourceName = Literal["host", "client", "endpoint"]


class HostCompletion(_Params, forbid_unknown_fields=True):
    """``capabilities.sampling.completion``: the client answers ``sampling/createMessage``
    with its host's own completion function (OpenClaw's ``llm.complete``, Hermes'
    auxiliary client) rather than MCP sampling, and says which one (SPEC §2)."""

    #: names the host's model: summaries cached under one identity are reused only by it
    identity: Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[^\u0000]*$")]
    #: the host model's window: inputs are cut to fit it
    context_window: Positive | None = None
    #: the most a completion may write
    max_output_tokens: Positive | None = None


class SamplingCapability(_Params):
    """``capabilities.sampling`` of ``initialize``: the client answers ``sampling/createMessage``."""

    completion: HostCompletion | None = None


class AgingOptions(_Params, omit_defaults=True, forbid_unknown_fields=True):
    """Overrides of the tool-result aging policy (SPEC §8); a field left out keeps its default.

    Checked when ``initialize`` is answered, so a bad value is refused there, not at
    every later render. Unknown names are refused too (a typo must not pass silently).
    """

    keep_recent_turns: Count | None = None
    min_age_seconds: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None
    min_tokens: Count | None = None
    protect_first: Count | None = None
    exempt_tools: list[str] | None = None
    soft_trim_head_chars: Count | None = None
    soft_trim_tail_chars: Count | None = None
    hard_clear_after_turns: Count | None = None
    max_single_result_share: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    #: references of a result the citation gate checks; at most the 256 kept per result
    max_refs_per_result: Annotated[int, msgspec.Meta(ge=0, le=256)] | None = None
    turn_unit: Literal["user", "step"] | None = None
    #: a current user turn of at least this many steps also ages its older steps (0: off)
    long_turn_steps: Count | None = None
    #: ... its step boundary advancing only every this many steps
    step_quantum: Count | None = None


PromptChars = Annotated[int, msgspec.Meta(ge=0, le=100_000_000)]


class SkillsOptions(_Params):
    """Where skills are found and how many the prompt lists (SPEC §7). A field left out keeps
    the value ``initializationOptions.systemPrompt.skills`` gave, else the default.

    Roots, highest precedence first (a skill name found in several roots is taken from the
    highest): ``<workspace>/skills``, ``<workspace>/.agents/skills`` (project agent),
    ``personalDir``, ``managedDir``, ``bundledDir``, then ``extraDirs`` in order.
    """

    #: personal agent skills; default ``~/.agents/skills``; ``""`` turns the root off
    personal_dir: FilePath | None = None
    #: managed (host-installed) skills, e.g. an OpenClaw state folder's ``skills``; default none
    managed_dir: FilePath | None = None
    #: the skills shipped with the host; default none
    bundled_dir: FilePath | None = None
    #: more folders of skills, lowest precedence
    extra_dirs: list[FilePath] | None = None
    #: at most this many skills listed (default 150)
    max_skills_in_prompt: Annotated[int, msgspec.Meta(ge=0, le=100_000)] | None = None
    #: the whole skills block at most this many characters (default 30,000); the largest
    #: prefix of the sorted list that fits is found by binary search
    max_skills_prompt_chars: PromptChars | None = None
    #: a description longer than this is cut, with ``…`` (default 1,024)
    max_description_chars: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None
    #: a SKILL.md larger than this is skipped with a note (default 256,000 bytes)
    max_skill_file_bytes: Annotated[int, msgspec.Meta(ge=1, le=1 << 30)] | None = None
    #: skill folders looked at per root, in name order (default 300); the rest get a note
    max_candidates_per_root: Annotated[int, msgspec.Meta(ge=0, le=100_000)] | None = None


class SystemPromptOptions(_Params):
    """Caps of the bootstrap files and the skills of the assembled system prompt (SPEC §7),
    in ``initializationOptions.systemPrompt`` (the connection's defaults) and per
    ``context/prepare`` (``systemPrompt``, over those field by field)."""

    #: each bootstrap file (AGENTS.md … MEMORY.md) cut at this many characters (default 20,000)
    bootstrap_max_chars: PromptChars | None = None
    #: all bootstrap files together at most this many characters (default 150,000)
    bootstrap_total_max_chars: PromptChars | None = None
    skills: SkillsOptions | None = None


class InitializationOptions(_Params):
    """``initialize.params.initializationOptions``.

    ``database`` overrides ``DAGCTX_DB`` and the default under the user's data dir.
    """

    database: FilePath | None = None
    observe_nodes: bool = False
    log_messages: bool = False
    models: dict[str, ModelSpec] = msgspec.field(default_factory=dict)
    default_model: str | None = None
    context_engine: str | None = None
    sampling_endpoint: SamplingEndpoint | None = None
    workspace: FilePath | None = None
    config_file: FilePath | None = None
    #: aging policy overrides, e.g. ``{"turnUnit": "step", "keepRecentTurns": 4, "minAgeSeconds": 60}``
    aging: AgingOptions | None = None
    #: how long a request may wait for its database (SPEC §2.1; default 10 s); the first
    #: connection that opens a database in a daemon sets it there
    storage_timeout_seconds: Annotated[float, msgspec.Meta(ge=0.5, le=300)] | None = None
    #: where summaries come from, most preferred first (default ``["host", "client", "endpoint"]``)
    summary_sources: list[SummarySourceName] | None = None
    #: bootstrap-file caps and skill roots and limits for every prepare of this connection (SPEC §7)
    system_prompt: SystemPromptOptions | None = None
    #: the provider's prompt-cache lifetime in seconds (default 300): a request after a longer
    #: pause finds the cache cold, and compaction is recommended sooner then (SPEC §7)
    prompt_cache_ttl_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] | None = None


class AttachParams(_Params):
    """``$/dagctx/attach``: sent by the forwarder before the client's first byte.

    The per-user daemon's environment is not the client's, so the forwarder passes
    what the client's process would have used: its working directory and the database
    it names (``--db`` or ``DAGCTX_DB``); ``initializationOptions.database`` still wins.
    """

    cwd: str | None = None
    database: str | None = None
    pid: int | None = None
    #: ``dagctx serve --max-frame-bytes``: this connection's frame limit (the daemon caps it)
    max_frame_bytes: int | None = None
    #: the client's environment: what is read per request (an endpoint's ``apiKeyEnv``,
    #: ``DAGCTX_IMPORT_MAX_LINE_BYTES``) comes from here, never from the daemon's own
    env: dict[str, str] | None = None


class ClosingParams(_Params):
    """``$/dagctx/closing``: the daemon's last frame on a forwarded connection (SPEC §1.3)."""

    code: int = 0
    reason: str | None = None


class InitializeParams(_Params):
    process_id: Int64 | None = None
    client_info: ClientInfo | None = None
    root_uri: str | None = None
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    initialization_options: InitializationOptions | None = None


#: ``capabilities.storage`` of the ``initialize`` result: the backend the database name chose (SPEC §2.1)
StorageKind = Literal["sqlite", "postgresql"]


class ServerInfo(_Result):
    name: str
    version: str


class InitializeResult(_Result):
    server_info: ServerInfo
    protocol_version: str
    methods: list[str]
    notifications: list[str]
    database: str
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    #: this connection's id: notifications name it as their ``origin`` (SPEC §1.5)
    connection_id: str | None = None


class Empty(_Params):
    """Params of methods that take none (``shutdown``, ``exit``, ``initialized``)."""


class CancelParams(_Params):
    id: Int64 | str


class ProgressParams(_Params):
    token: Int64 | str
    value: dict[str, Any]


# ---------------------------------------------------------------- sessions


class SessionInfo(_Result):
    session_id: str
    title: str
    root_id: str
    head: str
    created_at: float
    updated_at: float
    node_count: int
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class SessionCreateParams(_Params):
    title: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class SessionCreateResult(_Result):
    session_id: str
    root_id: str
    head: str


class SessionListParams(_Params):
    limit: Count = 100
    offset: Count = 0


class SessionListResult(_Result):
    sessions: list[SessionInfo]
    total: int


class SessionRef(_Params):
    session_id: str


class IdResolveParams(_Params):
    """``id/resolve``: the sessions and nodes whose id starts with ``prefix`` (SPEC §2.4),
    found through an index on the id (a range scan, never a walk of every session).
    ``kinds``: which ids to look at; ``session_id``: only that session's nodes."""

    prefix: str
    kinds: Literal["any", "session", "node"] = "any"
    session_id: str | None = None
    limit: Count = 20


class IdMatch(_Result):
    """One id that starts with the prefix: a session (``node_id`` null) or a node of
    ``session_id``, with the session's title or the node's role to tell them apart."""

    kind: Literal["session", "node"]
    session_id: str
    node_id: str | None = None
    title: str | None = None
    role: str | None = None


class IdResolveResult(_Result):
    """Matches in id order, sessions first; ``truncated``: more than ``limit`` ids match."""

    matches: list[IdMatch]
    truncated: bool = False


class SessionRenameParams(_Params):
    session_id: str
    title: str


class SessionDeleteResult(_Result):
    deleted: bool
    nodes_removed: int


class SessionHistoryParams(_Params):
    """``session/history``; ``offset``/``limit`` page the branch (oldest first), for a
    branch whose nodes would not fit one answer (``ResponseTooLarge``)."""

    session_id: str
    head: str | None = None
    offset: Count = 0
    limit: Count | None = None


class SessionHistoryResult(_Result):
    nodes: list[Call]
    head: str
    #: the branch's length (ROOT excluded), whatever the page
    total: int = 0


class BranchInfo(_Result):
    head: str
    length: int
    main: bool
    current: bool
    spawn: bool
    name: str | None = None
    root: str | None = None


class SessionBranchesResult(_Result):
    branches: list[BranchInfo]
    head: str


class SessionCheckoutParams(_Params):
    session_id: str
    node_id: str


class SessionRewindParams(_Params):
    """Move HEAD back along the current branch: to ``nodeId`` or by ``steps`` nodes."""

    session_id: str
    node_id: str | None = None
    steps: Int64 | None = None


class HeadResult(_Result):
    head: str
    previous: str


class SessionSpawnParams(_Params):
    """Open a spawn branch: a clean context whose root hangs off ``callerId``."""

    session_id: str
    caller_id: str
    source: str = "spawn"
    name: str | None = None
    output: Any = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class SessionSpawnResult(_Result):
    node: Call
    head: str


class BranchNameParams(_Params):
    session_id: str
    head: str
    name: str | None


class SessionGraphParams(_Params):
    """``session/graph``: a session's nodes as a graph an editor can draw (SPEC §4.1).

    Paged by seq: a page holds the nodes with ``seq > afterSeq`` (ROOT is seq 0), at most
    ``limit`` of them; ``nextAfterSeq`` of the answer asks for the next page.
    """

    session_id: str
    after_seq: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] = -1
    limit: Annotated[int, msgspec.Meta(ge=1, le=20_000)] = 2_000
    #: leave out nodes inside turns (tool calls, inner calls): conversation nodes, summaries
    #: and system prompts only; ``callees`` still counts what each row called
    conversation_only: bool = False
    #: the heads whose active summary is stated (conversation nodes); default every branch
    #: tip and HEAD
    heads: list[str] | None = None


class GraphNode(_Result, omit_defaults=True):
    """One row of ``session/graph``: a node's edges and what the graph draws on it.

    Every statement about coverage restates stored data (SPEC §4.1): ``coversIds`` only on
    a summary active for one of the answer's heads (its ``metadata.covers_ids`` plus the
    caller subtrees of the covered nodes, ids that no longer exist left out),
    ``supersededSummary`` on a summary active for none of the branches whose chain holds
    its covered segment.
    """

    id: str
    seq: int
    role: str
    created_at: float
    name: str = ""
    status: str = "completed"
    caller: str | None = None
    predecessor: str | None = None
    #: the node's text, cut to 160 characters (whitespace folded)
    preview: str = ""
    #: a node that can be a HEAD (SPEC §4): on a predecessor chain
    conversation: bool = False
    #: how many nodes this one called directly (its tool calls, inner calls)
    callees: int = 0
    tool_call_id: str | None = None
    spawn_root: bool = False
    #: a spawn root: the conversation node whose turn made the spawning call (its ``caller``'s turn)
    spawned_from: str | None = None
    #: a ``context/summary`` node
    summary: bool = False
    #: a ``context/system_prompt`` node
    system_prompt: bool = False
    #: an active summary: what it folds
    covers_ids: list[str] | None = None
    #: an active summary: the heads (of the answer's ``heads``) it is active for
    active_for: list[str] | None = None
    superseded_summary: bool = False
    #: the output was spilled at write time: the whole output's length in characters
    spilled_chars: int | None = None
    #: a tool result some recorded request showed aged: the newest such llm node
    #: (its ``renderManifest.aged`` names this node)
    aged_by: str | None = None
    #: an llm node that recorded what it was sent (``renderManifest``): ``context/replay`` is exact
    replayable: bool = False
    #: nodes below this one by the caller edge (its tool calls, …) that are aged / spilled
    #: as above: how a folded turn shows them
    aged_calls: int = 0
    spilled_calls: int = 0


class GraphHead(_Result):
    """A head of ``session/graph`` and the summary its render uses (null: none)."""

    head: str
    summary_id: str | None = None


class SessionGraphResult(_Result):
    session_id: str
    root_id: str
    head: str
    nodes: list[GraphNode]
    #: nodes in the session (ROOT included), every page
    total: int
    #: pass as ``afterSeq`` for the next page; null on the last one
    next_after_seq: int | None = None
    branches: list[BranchInfo] = msgspec.field(default_factory=list)
    heads: list[GraphHead] = msgspec.field(default_factory=list)


# ---------------------------------------------------------------- nodes


class NodeAppendParams(_Params):
    session_id: str
    node: NodeInput
    move_head: bool | None = None
    render_id: str | None = None


class NodeResult(_Result):
    node: Call
    head: str


class NodeAppendBatchParams(_Params):
    """Several nodes of one session appended as one unit: all of them or none."""

    session_id: str
    nodes: list[NodeInput]
    #: as ``node/append``'s, for each conversation node of the batch (nested calls never move HEAD)
    move_head: bool | None = None
    #: the render the batch's ``llm`` nodes were sent (their reads and manifest)
    render_id: str | None = None


class NodeBatchResult(_Result):
    #: the nodes as stored, in the order given (consecutive seq)
    nodes: list[Call]
    head: str


class NodeUpdateParams(_Params):
    """Fill a ``running`` node on exit: the ledger's only mutation."""

    session_id: str
    node_id: str
    status: Literal["completed", "error", "cancelled"]
    output: Any = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class OutputRange(_Params):
    """A character range of a (spilled) output, for ``node/get``."""

    offset: Count = 0
    length: Count | None = None


class NodeGetParams(_Params):
    """``node/get``. ``include_callees``: also return every node below the given ones by the
    caller edge (their tool calls, inner llm calls, …) — a turn whole, e.g. the covered
    turns of a summary (SPEC §4)."""

    session_id: str
    ids: list[str]
    range: OutputRange | None = None
    include_callees: bool = False


class NodeGetResult(_Result):
    nodes: list[Call]
    #: with ``includeCallees``: the nodes below ``nodes`` by the caller edge, in seq order,
    #: each once and none of ``nodes`` itself (group them by ``caller``)
    callees: list[Call] = msgspec.field(default_factory=list)


# ---------------------------------------------------------------- search


class SearchParams(_Params):
    query: str
    session_id: str | None = None
    limit: Int64 = 20
    roles: list[Literal["user", "llm", "code"]] | None = None


class SearchHit(_Result):
    session_id: str
    node_id: str
    role: str
    name: str
    seq: int
    snippet: str
    score: float


class SearchResult(_Result):
    hits: list[SearchHit]


# ---------------------------------------------------------------- moving databases


class DatabaseMigrateParams(_Params):
    """Copy every session of the database ``source`` (a SQLite path or a ``postgresql://``
    URL, SPEC §2.1) into the database this daemon serves."""

    source: str
    work_done_token: int | str | None = None


class DatabaseMigrateResult(_Result):
    source: str
    target: str
    #: sessions found in the source
    sessions: int
    #: sessions written to the target (new, or grown at the source since the last copy)
    copied: int
    #: sessions the target already held exactly as the source has them
    unchanged: int
    nodes: int
    #: sessions not copied because the target's copy was written to after it was made
    conflicts: list[str] = msgspec.field(default_factory=list)


# ---------------------------------------------------------------- notifications


class NodeNotification(_Result):
    """``node/didAppend`` and ``node/didUpdate``: a live view of the ledger.

    ``origin`` names the connection whose request wrote the node (``initialize`` →
    ``connectionId``), so a client can skip its own; ``null`` when another process wrote
    it (SPEC §1.5).
    """

    session_id: str
    node: Call
    head: str
    origin: str | None = None


class SessionChange(_Result):
    """``session/didChange``: something about a subscribed session other than a node.

    ``change`` is ``head`` (HEAD moved), ``renamed``, ``deleted``, ``summary`` (a
    compaction summary was written) or ``replaced`` (the database file was replaced
    underneath the daemon and holds another session of this id, SPEC §2.1: read it
    again; ``head`` and ``title`` are the new file's, ``origin`` is null); ``origin`` as in
    ``NodeNotification``.
    """

    session_id: str
    change: Literal["head", "renamed", "deleted", "summary", "replaced"]
    head: str | None = None
    title: str | None = None
    node_id: str | None = None
    origin: str | None = None


# ---------------------------------------------------------------- live sessions and the daemon


class SubscribeResult(_Result):
    session_id: str
    subscribed: bool
    head: str | None = None


class ClientStatus(_Result):
    """One connection of the daemon, as ``daemon/status`` lists it."""

    connection_id: str
    name: str = ""
    version: str | None = None
    pid: int | None = None
    cwd: str | None = None
    database: str | None = None
    sessions: list[str] = msgspec.field(default_factory=list)
    connected_at: float = 0.0
    in_flight: int = 0


class MemoryStatus(_Result):
    """The daemon's memory (Linux ``/proc``; 0 where unknown)."""

    rss_bytes: int = 0
    peak_rss_bytes: int = 0
    #: RSS when the daemon had started and served nothing yet
    baseline_rss_bytes: int = 0
    #: the bound on the session graphs every open database caches (``DAGCTX_CACHE_BYTES``)
    cache_limit_bytes: int = 0


class QueueStatus(_Result):
    """The work pools (SPEC §1.4): jobs waiting, jobs running, threads."""

    queued: int = 0
    running: int = 0
    threads: int = 0
    #: requests answered on the event loop without a wait since the daemon started (the
    #: quick reads, §1.4)
    answered_on_loop: int = 0


class CacheStatus(_Result):
    """One open database and what its caches hold."""

    database: str
    #: connections using it now; at 0 it is closed (its caches freed) after ``idleSeconds``
    users: int = 0
    #: session graphs held in memory, and their nodes
    sessions: int = 0
    nodes: int = 0
    #: what those graphs were decoded from (stored bytes): what the cache bound weighs
    bytes: int = 0
    #: cached renders (their ``renderId``s) and render prefixes
    renders: int = 0
    idle_seconds: float | None = None


class DaemonStatus(_Result):
    pid: int
    version: str
    protocol_version: str
    mode: Literal["shared", "standalone"]
    socket: str | None
    log: str | None
    started_at: float
    uptime_seconds: float
    idle_timeout_seconds: float | None
    databases: list[str]
    clients: list[ClientStatus]
    memory: MemoryStatus = msgspec.field(default_factory=MemoryStatus)
    queue: QueueStatus = msgspec.field(default_factory=QueueStatus)
    caches: list[CacheStatus] = msgspec.field(default_factory=list)
    #: things the user should fix, e.g. an open database other users can read (SPEC §2.1)
    warnings: list[str] = msgspec.field(default_factory=list)


class DaemonStopResult(_Result):
    stopping: bool
    connections: int


class LogMessageParams(_Result):
    type: int
    message: str


class ShowMessageParams(_Result):
    """``window/showMessage`` (LSP): something the user should see; ``type`` is LSP's
    ``MessageType`` (1 error, 2 warning, 3 info, 4 log)."""

    type: int
    message: str
