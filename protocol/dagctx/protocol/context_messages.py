"""Params and results of the context methods: render, prepare, compact, replay,
usage, import/export, and the server→client sampling request.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .messages import Count, FilePath, Int64, Positive, Seconds, Share, SystemPromptOptions, _Params, _Result

#: The provider shapes a render can take (SPEC §6).
Format = Literal["openai", "anthropic", "neutral"]
#: Transcript formats ``session/import`` reads; ``auto`` detects the format per file.
ImportFormat = Literal["auto", "claude-code", "codex", "openclaw", "swe-agent", "openhands", "sharegpt"]
#: Transcript formats ``session/export`` writes.
ExportFormat = Literal["claude-code", "openai"]
Expose = Literal["io", "full"]
#: Which reasoning blocks of llm nodes (``metadata.reasoning``, SPEC §6) a render sends:
#: ``provider`` the format's documented rule, ``all`` every block the format can carry,
#: ``none`` none.
ReasoningMode = Literal["provider", "all", "none"]
TokenSource = Literal["provider", "calibrated", "estimate"]


# ---------------------------------------------------------------- render


class MessageRange(_Params):
    """A slice of a render's messages (SPEC §6, paging a render too large for one answer):
    ``messages[offset : offset + limit]``; no ``limit``: to the end."""

    offset: Count = 0
    limit: Positive | None = None


class RenderParams(_Params):
    """``context/render``: the messages a head's branch shows a model.

    ``frame`` is a running code node's id: render as seen from inside that function
    (SPEC §4). ``expose`` is the default for functions that do not set
    ``metadata.expose`` themselves.
    """

    session_id: str
    head: str | None = None
    format: Format = "neutral"
    model: str | None = None
    frame: str | None = None
    expose: Expose = "io"
    include_system: bool = True
    aging: bool = True
    #: reasoning blocks sent (SPEC §6): ``provider`` (Anthropic and neutral: the blocks of
    #: the current tool loop's assistant turns, unchanged, first in their message; OpenAI
    #: Chat Completions: none), ``all``, ``none``; their tokens are counted
    reasoning: ReasoningMode = "provider"
    #: check the render against the model's input budget (SPEC §8, reduction within a
    #: turn): over the budget, tool results of the turn are summarized for this request
    #: (and, if that is not enough, a request checkpoint replaces the turn's earlier
    #: steps); a render that still cannot fit answers ``BudgetExceeded``
    budget: bool = False
    #: with ``budget``: the tool definitions the request will carry (counted)
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: with ``budget``: the output cap; default ``min(model max output, 16384, window / 4)``
    max_output_tokens: Positive | None = None
    #: with ``budget``: seconds the reduction may take in all (at most 60, SPEC §8)
    reduction_timeout_seconds: float = 60.0
    work_done_token: Int64 | str | None = None
    #: answer only these messages of the render (``messageCount`` says how many it has);
    #: pass the same explicit ``head`` for every page, so every page is of one render
    range: MessageRange | None = None


class TokenCounts(_Result):
    total: int
    per_message: list[int]
    system: int = 0
    tokenizer: str = ""
    exact: bool = False
    source: TokenSource = "estimate"


class StablePrefix(_Result):
    """How much of this render is byte-identical to the previous render of the branch."""

    messages: int
    tokens: int
    previous_render_id: str | None = None


CacheBreakCause = Literal["systemPrompt", "tools", "compaction", "checkpoint", "reduction", "aging", "reasoning",
                          "other"]


class CacheBreak(_Result):
    """Where a request stops matching the previous request of its branch — a prompt-cache
    break — why, and what it costs (SPEC §7, cache breaks)."""

    #: the previous request of the branch (``stablePrefix.previousRenderId``)
    previous_render_id: str
    #: the first message that differs; 0 when the tools or the system prompt changed
    at_message: int
    #: why, from the two requests' manifests, the most decisive first
    causes: list[CacheBreakCause]
    #: tokens of the previous request after the break: cached, no longer usable
    invalidated_tokens: int
    #: tokens of this request after the break: written to the cache again
    rewritten_tokens: int
    #: this request's cost with the break minus its cost had it read the whole previous
    #: request from the cache, in base-input-token units (write 1.25×, read 0.1×, warm
    #: cache); negative when the request shrank by more than it rewrote
    estimated_cost: float


class ReducedResult(_Result):
    """One tool result summarized for this request (SPEC §8, reduction within a turn)."""

    node_id: str
    tool_call_id: str | None
    tokens_before: int
    tokens_after: int
    #: the derived-cache key of the summary (content hash + model configuration)
    summary_key: str
    cached: bool = False


class RequestCheckpoint(_Result):
    """The turn's earlier steps replaced by one task summary for this request."""

    id: str
    #: the chain llm nodes (steps) whose execution the checkpoint replaces
    covers_ids: list[str]
    tokens_before: int
    tokens_after: int
    summary_key: str
    segments: int = 1
    cached: bool = False


class TurnReduction(_Result):
    """What reduction within a turn did for one request (SPEC §8)."""

    tokens_before: int
    tokens_after: int
    #: the input limit the request was held to: input budget − safety margin
    limit: int
    results: list[ReducedResult] = msgspec.field(default_factory=list)
    checkpoint: RequestCheckpoint | None = None
    #: summarizer calls made for this request (cache hits excluded); at most 32
    summary_calls: int = 0
    cache_hits: int = 0
    #: the summarizer's own traffic, metered apart from the request (estimates)
    summary_input_tokens: int = 0
    summary_output_tokens: int = 0
    duration_ms: float = 0.0
    #: reductions applied whose summaries were all found in the stored summary table (no call)
    reused: int = 0
    #: why a summary was not used: ``empty``, ``notSmaller``, ``failed: …``, ``callLimit``, ``timeLimit``
    failures: list[str] = msgspec.field(default_factory=list)


class RenderResult(_Result):
    messages: list[Any]
    reads: list[str]
    tokens: TokenCounts
    manifest: dict[str, Any]
    render_id: str
    stable_prefix: StablePrefix
    system: str | None = None
    #: with ``budget``: the budget of this request
    budget: Budget | None = None
    reduction: TurnReduction | None = None
    #: how many messages the whole render has (with ``range``, ``messages`` and
    #: ``tokens.perMessage`` hold only the asked slice; ``tokens.total`` is the whole render's)
    message_count: int = 0


# ---------------------------------------------------------------- prepare


class PrepareParams(_Params):
    """``context/prepare``: the next request of a turn, checked against the budget.

    ``frame`` is a running code node's id, as in ``context/render``: the request of a
    model call made inside that function (SPEC §6); reduction within the turn then
    reduces the function's finished inner calls like a turn's steps (SPEC §8).
    """

    session_id: str
    head: str | None = None
    model: str | None = None
    format: Format = "neutral"
    frame: str | None = None
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    max_output_tokens: Positive | None = None
    allow_compaction: bool = False
    prompt_mode: Literal["full", "minimal", "none"] = "full"
    workspace: FilePath | None = None
    identity: str | None = None
    agent_prompt: str | None = None
    context_engine: str | None = None
    prepend_system_context: str | None = None
    append_system_context: str | None = None
    #: bootstrap-file caps, skill roots and limits, over ``initializationOptions.systemPrompt`` (SPEC §7)
    system_prompt: SystemPromptOptions | None = None
    prepend_context: str | None = None
    memory_prefetch: str | None = None
    #: reasoning blocks sent, as in ``context/render`` (SPEC §6)
    reasoning: ReasoningMode = "provider"
    #: seconds reduction within the turn may take in all (at most 60, SPEC §8)
    reduction_timeout_seconds: float = 60.0
    #: what the client knows of its provider's prompt cache for this request (SPEC §7,
    #: compaction signals): ``cold`` (expired: e.g. the previous call's usage read nothing
    #: from the cache, or a replay of recorded times), ``warm``; null: the daemon judges
    #: by its clock and ``promptCacheTtlSeconds``
    prompt_cache: Literal["warm", "cold"] | None = None
    work_done_token: Int64 | str | None = None


class Budget(_Result):
    context_window: int
    system_prompt: int
    history: int
    tools_schema: int
    output_reserve: int
    input_used: int
    input_budget: int
    percent_used: float
    headroom: int
    source: TokenSource = "estimate"
    #: tokens kept free below the input budget for estimate error (SPEC §8)
    safety_margin: int = 0


class PromptLayer(_Result):
    """One layer of the assembled system prompt (SPEC §7): a section of its text."""

    #: ``prepend``, ``identity``, ``AGENTS.md`` …, ``agent_prompt``, ``skills``, ``memory``, ``append``
    name: str
    chars: int
    tokens: int
    #: the workspace-relative file it came from (``skills`` for the index), null for inline text
    source: str | None = None
    #: cut by the assembler's per-file or total cap
    truncated: bool = False


class BudgetExceededDetails(_Result):
    """``error.data.details`` of ``BudgetExceeded`` (SPEC §7, §8): the numbers."""

    context_window: int
    output_reserve: int
    input_budget: int
    safety_margin: int
    #: what the request may use: input budget − safety margin
    limit: int
    #: system prompt + tools + the user's messages of the turn + the newest step
    protected_tokens: int
    system_prompt: int
    tools_schema: int
    user_messages: int
    newest_step: int
    #: the request after every reduction that succeeded
    input_used: int
    over_by: int
    model: str | None = None
    #: legacy name of ``user_messages``
    newest_user_turn: int = 0
    source: TokenSource = "estimate"
    summary_calls: int = 0
    failures: list[str] = msgspec.field(default_factory=list)
    #: the system prompt's layers and their sizes (``context/prepare``, and a render with
    #: ``budget`` whose prompt node records them), largest problem first in the message
    system_prompt_layers: list[PromptLayer] = msgspec.field(default_factory=list)


class PrepareResult(_Result):
    system: str
    messages: list[Any]
    reads: list[str]
    budget: Budget
    manifest: dict[str, Any]
    render_id: str
    decision_path: list[str]
    recommend_compaction: bool
    needs_compaction: bool
    stable_prefix: StablePrefix | None = None
    engine: str = "default"
    tool_results_aged: int = 0
    tokens_freed_by_aging: int = 0
    references_protected: int = 0
    summary_id: str | None = None
    compaction: dict[str, Any] | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    #: the output cap the client must send (the same one the budget counted)
    max_output_tokens: int | None = None
    reduction: TurnReduction | None = None
    #: this request breaks the prompt cache of the previous request of its branch: where,
    #: why and at what cost (SPEC §7); null when it extends it (or there was none)
    cache_break: CacheBreak | None = None


# ---------------------------------------------------------------- compact


class CompactParams(_Params):
    session_id: str
    head: str | None = None
    model: str | None = None
    keep_recent_tokens: Count | None = None
    instructions: str | None = None
    trigger: Literal["manual", "auto", "overflow"] = "manual"
    fallback: Literal["none", "structural"] = "none"
    min_identifier_retention: Share = 0.5
    timeout_seconds: Seconds = 120.0
    work_done_token: Int64 | str | None = None
    #: the provider format ``tokensBefore``/``tokensAfter`` are measured in (SPEC §8)
    format: Format = "neutral"


class CompactResult(_Result):
    ok: bool
    tokens_before: int
    tokens_after: int
    #: the format the two token figures were measured in
    format: str = "neutral"
    summary_id: str | None = None
    covers_ids: list[str] = msgspec.field(default_factory=list)
    summarised_count: int = 0
    duration_ms: float = 0.0
    used_previous_summary: bool = False
    superseded_summary: str | None = None
    identifier_retention: float | None = None
    reason: str | None = None
    error: str | None = None


# ---------------------------------------------------------------- replay


class ReplayParams(_Params):
    session_id: str
    node_id: str
    format: Format | None = None


class ReplayResult(_Result):
    node_id: str
    system: str | None
    messages: list[Any]
    reads: list[str]
    manifest: dict[str, Any]
    exact: bool
    #: the replayed messages' token counts (as ``context/render`` counts them)
    tokens: TokenCounts | None = None
    #: per message, the ids of the nodes it was rendered from (parallel to ``messages``)
    message_nodes: list[list[str]] = msgspec.field(default_factory=list)
    #: the recorded model's context window and default output reserve (SPEC §7)
    context_window: int | None = None
    output_reserve: int | None = None
    #: provider usage reported for this node (``usage/report``), when there is one
    usage: Usage | None = None
    #: the tools schema the request carried (``context/prepare``'s ``tools``), exactly as
    #: sent; null when its manifest recorded none (a render, or a call recorded before)
    tools: list[dict[str, Any]] | None = None


# ---------------------------------------------------------------- usage


class Usage(_Params):
    """Provider-reported token usage of one llm call (SPEC §7).

    The prompt the provider measured is ``input + cache_read + cache_write``.
    """

    input: Count = 0
    output: Count = 0
    cache_read: Count = 0
    cache_write: Count = 0

    @property
    def prompt(self) -> int:
        """The prompt size the provider measured: input + cache read + cache write."""
        return self.input + self.cache_read + self.cache_write


class UsageReportParams(_Params):
    session_id: str
    node_id: str
    usage: Usage
    model: str | None = None


class UsageReportResult(_Result):
    node_id: str
    measured_prompt: int
    estimated_prompt: int | None
    calibration: float | None
    percent_used: float | None
    recommend_compaction: bool


class CompactionRecommended(_Result):
    """Notification ``context/compactionRecommended``."""

    session_id: str
    head: str
    percent_used: float
    input_used: int
    context_window: int
    model: str | None = None


# ---------------------------------------------------------------- import / export


class ImportParams(_Params):
    path: FilePath
    format: ImportFormat = "auto"
    title: str | None = None
    work_done_token: Int64 | str | None = None


class ImportedSession(_Result):
    session_id: str
    title: str
    nodes: int
    tool_pairs: int
    compactions: int
    spawn_branches: int
    created: bool
    #: the file the session was read from
    source_file: str | None = None
    #: what the source lacked or what was folded away, in sentences (SPEC §9 import)
    notes: list[str] = msgspec.field(default_factory=list)


class Skipped(msgspec.Struct, rename="camel", omit_defaults=True):
    """Something an import did not take, and why: a source line (1-based), or a whole
    file when ``line`` is null. Positional ``(line, reason)`` so parsers stay terse."""

    line: int | None
    reason: str
    file: str | None = None


class ImportResult(_Result):
    sessions: list[ImportedSession]
    #: line-level entries, capped per file and in all; an entry whose ``line`` is null is a
    #: file that was not imported (SPEC §1 importing)
    skipped: list[Skipped] = msgspec.field(default_factory=list)
    #: skipped lines not listed (the list is capped per file and in all)
    skipped_more: int = 0


class ExportParams(_Params):
    session_id: str
    head: str | None = None
    format: ExportFormat = "claude-code"
    path: FilePath | None = None
    #: replace an existing file at ``path`` (refused otherwise)
    overwrite: bool = False
    #: ``claude-code`` only: ``"head"`` = HEAD's (or ``head``'s) branch, ``"all"`` = every branch
    branches: Literal["head", "all"] = "head"


class ExportResult(_Result):
    format: str
    lines: int
    path: str | None = None
    content: str | None = None


# ---------------------------------------------------------------- sampling (server → client)


class SamplingContent(_Params):
    type: Literal["text"] = "text"
    text: str = ""


class SamplingMessage(_Params):
    role: Literal["user", "assistant"]
    content: SamplingContent


class CreateMessageParams(_Params):
    """Shaped like MCP's ``sampling/createMessage`` request."""

    messages: list[SamplingMessage]
    max_tokens: Positive
    system_prompt: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class CreateMessageResult(_Params):
    role: Literal["assistant", "user"] = "assistant"
    content: SamplingContent = msgspec.field(default_factory=SamplingContent)
    model: str = ""
    stop_reason: str | None = None
