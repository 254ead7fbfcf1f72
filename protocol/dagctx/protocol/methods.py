"""The method table: every method, declared once.

Each entry names the params and result types, whether the request runs in the
background (later requests of the same connection need not wait for it), whether it
writes (subscribers hear about it), the errors it can answer and what it keeps. The
server dispatches from this table, the Python client decodes results with it, and the
JSON Schema (and from it the TypeScript types) and SPEC.md's method reference are
generated from it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from . import context_messages as c
from . import memory_messages as mem
from . import messages as m
from .version import PROTOCOL_VERSION

Direction = Literal["client-to-server", "server-to-client"]

__all__ = ["CLIENT_REQUESTS", "METHODS", "PRE_INITIALIZE", "PROTOCOL_VERSION", "SERVER_NOTIFICATIONS", "MethodSpec"]


class MethodSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    params: type
    result: Any  # a Struct type, or None for notifications / null results
    notification: bool = False
    direction: Direction = "client-to-server"
    doc: str = ""
    #: runs without holding back the connection's later requests (SPEC §1.4)
    background: bool = False
    #: may write the record: subscribers of the session named in params hear of it
    writes: bool = False
    #: heavy work: runs in the daemon's worker thread, off the event loop, and honours
    #: ``$/cancelRequest`` between bounded pieces (SPEC §1.4); implies ``background``
    offload: bool = False
    #: the error kinds it can answer, with when (prose for SPEC.md)
    errors: str = ""
    #: what it keeps (invariants, prose for SPEC.md)
    keeps: str = ""


def _req(name: str, params: type, result: Any, doc: str, errors: str = "—", keeps: str = "", *,
         background: bool = False, writes: bool = False, offload: bool = False) -> MethodSpec:
    return MethodSpec(name=name, params=params, result=result, doc=doc, errors=errors, keeps=keeps,
                      background=background or offload, writes=writes, offload=offload)


def _note(name: str, params: type, doc: str, direction: Direction = "client-to-server") -> MethodSpec:
    return MethodSpec(name=name, params=params, result=None, notification=True, direction=direction, doc=doc)


_ALL: list[MethodSpec] = [
    # lifecycle (LSP)
    _req("initialize", m.InitializeParams, m.InitializeResult, "Open the connection; choose the database.",
         "InvalidRequest (sent twice), InvalidParams (database cannot be opened; configFile not a small "
         "regular file; aging, models or samplingEndpoint out of range; a capability LSP defines sent in "
         "another shape — with the field's path)",
         "Opens the database; the only request served before it (besides `daemon/status`, `daemon/stop`)."),
    _note("initialized", m.Empty, "The client got the initialize result."),
    _req("shutdown", m.Empty, None, "Stop serving requests; `exit` follows.", "—",
         "After it every request answers -32600 ShutdownInProgress; `exit` then exits 0. "
         "Through the shared daemon it ends this connection only."),
    _note("exit", m.Empty, "Exit: code 0 after shutdown, 1 without (this connection only, when shared)."),
    _note("$/cancelRequest", m.CancelParams, "Cancel a request in flight; it answers -32800."),
    _note("$/progress", m.ProgressParams, "Work-done progress of a long request.", "server-to-client"),
    _note("$/dagctx/closing", m.ClosingParams,
          "The last frame of a connection that sent `$/dagctx/attach`: how it ended.", "server-to-client"),
    _note("$/dagctx/attach", m.AttachParams,
          "Sent by the forwarder before the client's first message: the client's cwd and database."),
    _note("$/dagctx/attached", m.Empty,
          "The daemon took over the client's stdin and stdout (hand-off): sent on the socket before it "
          "reads the client's first byte.", "server-to-client"),
    # sessions
    _req("session/create", m.SessionCreateParams, m.SessionCreateResult, "Create a session with its ROOT.", "—",
         "Creates the session's ROOT (seq 0); HEAD = ROOT.", writes=True),
    _req("session/list", m.SessionListParams, m.SessionListResult, "List sessions, newest first.",
         "InvalidParams", "Newest first (updatedAt)."),
    _req("session/get", m.SessionRef, m.SessionInfo, "One session's record.", "SessionNotFound", "Read-only."),
    _req("id/resolve", m.IdResolveParams, m.IdResolveResult,
         "The sessions and nodes whose id starts with a prefix (what `dagctx show PREFIX` names).",
         "InvalidParams (empty prefix, longer than 256 characters, limit not 1–1000), SessionNotFound (sessionId)",
         "Read-only; an index range scan on the id in both backends (SPEC §4.3), never a walk of every session; "
         "sessions first, then nodes, each in id order; at most `limit` matches, `truncated` when there are more."),
    _req("session/rename", m.SessionRenameParams, m.SessionInfo, "Change a session's title.",
         "SessionNotFound, InvalidParams (empty title)", "HEAD unchanged.", writes=True),
    _req("session/delete", m.SessionRef, m.SessionDeleteResult, "Delete a session and all its nodes.",
         "SessionNotFound", "Removes the session, its nodes, search rows, usage, spills.", writes=True),
    _req("session/history", m.SessionHistoryParams, m.SessionHistoryResult, "The linear branch ending at a head.",
         "SessionNotFound, NodeNotFound, InvalidParams (head is not a conversation node), BrokenPredecessorChain",
         "Edge walk only; oldest first; ROOT excluded; ends at the head."),
    _req("session/branches", m.SessionRef, m.SessionBranchesResult, "Every branch tip, the main lane, lengths.",
         "SessionNotFound, BrokenPredecessorChain",
         "Tips are conversation nodes without conversation children; `main` follows first children from ROOT."),
    _req("session/graph", m.SessionGraphParams, m.SessionGraphResult,
         "A session's nodes, edges, branches and active summaries, paged by seq, for drawing.",
         "SessionNotFound, NodeNotFound (a head), InvalidParams (a head that is not a conversation node), "
         "BrokenPredecessorChain",
         "Read-only. Every statement about coverage restates stored data: the summary each head's render uses "
         "(the render's own rule, SPEC §8), `metadata.covers_ids` with the covered nodes' caller subtrees, "
         "`renderManifest.aged` of recorded requests; no seq arithmetic. Runs off the event loop.",
         offload=True),
    _req("session/checkout", m.SessionCheckoutParams, m.HeadResult, "Move HEAD to a conversation node.",
         "SessionNotFound, NodeNotFound, InvalidEdge (not a conversation node), BrokenPredecessorChain",
         "The only effect is HEAD = nodeId.", writes=True),
    _req("session/rewind", m.SessionRewindParams, m.HeadResult, "Move HEAD back along the current branch.",
         "SessionNotFound, NodeNotFound, InvalidParams (steps out of range; not exactly one of nodeId and steps), "
         "InvalidEdge (not on HEAD's branch)",
         "Moves HEAD back along its own branch only.", writes=True),
    _req("session/spawn", m.SessionSpawnParams, m.SessionSpawnResult, "Open a spawn branch (HEAD stays).",
         "SessionNotFound, NodeNotFound",
         "The only way to create a spawn root (predecessor null, caller = callerId). HEAD does not move.",
         writes=True),
    _req("session/nameBranch", m.BranchNameParams, m.SessionBranchesResult, "Name (or unname) a branch tip.",
         "SessionNotFound, NodeNotFound, InvalidEdge", "A name follows its branch when the branch is extended.", writes=True),
    _req("session/import", c.ImportParams, c.ImportResult, "Import transcripts of other agents.",
         "InvalidParams (no such path), ImportFailed (a single file of no known format; a folder with no "
         "transcripts)",
         "One transaction per session, written off the event loop; idempotent by source session "
         "(created=false the second time), and a dagctx export whose source session is in this database is "
         "already present. A file without a conversation node creates nothing: it is a `skipped` entry whose "
         "`line` is null. Skipped lines are capped (10 per file, 100 in all; `skippedMore` counts the rest), "
         "reasons quote at most a short escaped prefix; records over the size cap are skipped with their size.",
         background=True, writes=True),
    _req("session/export", c.ExportParams, c.ExportResult, "Export a branch as a transcript.",
         "SessionNotFound, NodeNotFound (head), InvalidParams (head is not a conversation turn; an existing file "
         "without `overwrite`, a folder, a missing folder, a non-regular file)",
         "Writes nothing to the ledger. `claude-code`: HEAD's branch (or every branch with `branches: \"all\"`) "
         "with its tool calls, spawned subagent branches and summaries; import → export → import gives the same "
         "ids, edges and contents (a node id that differs from its tool_use id rides in the line's "
         "`dagctxToolNodeIds`); the first line's `dagctxSource` names the source session. `openai`: the "
         "rendered messages of the head (byte for byte the whole render's document). `path`: temp file + rename, "
         "never a partial file; both formats stream from the session's skeleton, `claude-code` line by line, "
         "`openai` a segment of turns at a time, each message written as it is made (memory bounded by the "
         "largest node or turn, not the session). Without `path` the text is the answer's `content`: it stops as "
         "soon as it passes what the connection's frame limit lets one answer carry (`ResponseTooLarge`: pass "
         "`path`). Runs off the event loop; `$/cancelRequest` stops it between lines or messages and leaves no "
         "file."),
    _req("session/subscribe", m.SessionRef, m.SubscribeResult, "Hear every change of a session, from any client.",
         "SessionNotFound",
         "From now on this connection gets node/didAppend, node/didUpdate and session/didChange for the session, "
         "whoever wrote (another connection, another process on the same database: within 250 ms)."),
    _req("session/unsubscribe", m.SessionRef, m.SubscribeResult, "Stop hearing a session's changes.", "—",
         "Idempotent: `subscribed` is false afterwards."),
    # nodes
    _req("node/append", m.NodeAppendParams, m.NodeResult, "Append one node; HEAD moves only when it extends HEAD.",
         "SessionNotFound, NodeNotFound, DuplicateNode, PredecessorMissing, InvalidEdge, InvalidParams",
         "Append-only; HEAD moves only when the node extends HEAD (or moveHead=true); a refused append writes nothing. "
         "A function/tool result of ≥ 32,000 characters is spilled (§4): the answer carries what the node keeps.",
         writes=True),
    _req("node/appendBatch", m.NodeAppendBatchParams, m.NodeBatchResult,
         "Append several nodes of one session at once (a whole turn, an importer's run): all or none.",
         "SessionNotFound, NodeNotFound, DuplicateNode, PredecessorMissing, InvalidEdge, InvalidParams (an "
         "empty batch; an error about one node names it by index: `nodes[2].predecessor`)",
         "Each node meets the rules of `node/append` after the nodes before it (a node may name an earlier "
         "node of the batch as its predecessor or caller); consecutive seq; HEAD follows each conversation node "
         "that extends it (or every one with moveHead=true; nested calls never move HEAD). One refused node: "
         "nothing of the batch is written. Committed in one group with other appends (SPEC §4.2).",
         writes=True),
    _req("node/update", m.NodeUpdateParams, m.NodeResult, "Finish a running node (the only mutation).",
         "SessionNotFound, NodeNotFound, NotRunning, InvalidParams",
         "The ledger's only mutation: a running node gets its output/status once.", writes=True),
    _req("node/get", m.NodeGetParams, m.NodeGetResult, "Nodes by id.", "SessionNotFound, NodeNotFound, InvalidParams",
         "With `range`, `output` is that slice of the whole (spilled) output. With `includeCallees`, "
         "`callees` holds every node below the named ones by the caller edge (seq order, each once)."),
    # context
    _req("context/render", c.RenderParams, c.RenderResult, "Messages for a head in a provider format.",
         "SessionNotFound, NodeNotFound, BrokenPredecessorChain, InvalidParams (also: head is not a conversation "
         "node); with `budget`: BudgetExceeded; "
         "RequestCancelled",
         "Never writes the ledger. Same data + same params → same bytes. With `budget` over the limit: reduction "
         "within the turn (§8), whose summaries go to the derived cache only. `range` answers a slice of the "
         "messages (`messageCount`: all of them). Runs off the event loop.", offload=True),
    _req("context/prepare", c.PrepareParams, c.PrepareResult, "Everything one turn needs.",
         "SessionNotFound, NodeNotFound (head, frame), BudgetExceeded, RequestCancelled, InvalidParams (head is not "
         "a conversation node), "
         "WorkspaceEscape never (refused files become notes)",
         "May append one context/system_prompt node, whole (when the prompt's hash changed), only with a request "
         "that is handed out: a refused prepare writes nothing; never moves HEAD; never hands "
         "out a request over its limit (§8). Runs off the event loop.", writes=True, offload=True),
    _req("context/compact", c.CompactParams, c.CompactResult, "Compact a branch into a rolling summary.",
         "SessionNotFound, NodeNotFound (head), InvalidParams (head is not a conversation node), "
         "SamplingFailed (as reason)",
         "Writes exactly one summary node or nothing; never moves HEAD. Sampling asks only the requesting client; "
         "the planning and validation run off the event loop.",
         background=True, writes=True),
    _req("context/replay", c.ReplayParams, c.ReplayResult, "Exactly what a past llm node was sent.",
         "SessionNotFound, NodeNotFound, InvalidParams (not an llm node)", "Rebuilds a past call from its reads and renderManifest. "
         "Runs off the event loop.", offload=True),
    _req("usage/report", c.UsageReportParams, c.UsageReportResult, "Provider usage of an llm node.",
         "SessionNotFound, NodeNotFound, InvalidParams (not an llm node)",
         "Stored beside the node (usage table); the node itself is not mutated."),
    _req("search/query", m.SearchParams, m.SearchResult, "Full-text search, one session or all.",
         "InvalidQuery (-32602), SessionNotFound, RequestCancelled",
         "Read-only; best match first (BM25 on SQLite, ts_rank on PostgreSQL), the same hits on both. "
         "Runs off the event loop.",
         offload=True),
    # memory (SPEC §5.1)
    _req("memory/index", mem.MemoryIndexParams, mem.MemoryIndexResult,
         "Index a workspace's memory files (MEMORY.md, memory/**/*.md, extra paths) incrementally.",
         "InvalidParams (no workspace; not a folder; overlapTokens not below chunkTokens; an openai embedding "
         "without baseUrl or model, or whose apiKeyEnv is not set), WorkspaceEscape (an extra path outside the "
         "workspace), EmbeddingUnavailable (provider local named but not installed), StorageReadOnly",
         "One transaction: the index afterwards holds every file found (unchanged ones by content hash, "
         "changed ones re-chunked) and no file that is gone; a file that cannot be indexed (binary, not UTF-8, "
         "too large, a symlink out of the workspace, unreadable) is a `skipped` entry with a note, its old "
         "chunks removed, and `complete` is false. Then every chunk without a vector of the embedding's model "
         "gets one, a batch per transaction; a provider that fails leaves `vectorsMissing` > 0, "
         "`embeddingError` set and `complete` false (the files stay indexed). Nothing is written when the run "
         "is refused. Runs off the event loop.", offload=True),
    _req("memory/status", mem.MemoryStatusParams, mem.MemoryStatusResult,
         "The indexed memory files of a workspace, and the session index (what it holds, what waits, what "
         "this daemon's catch-ups did).", "InvalidParams (no workspace)",
         "Read-only: it brings nothing up to date (the marker check and counts only)."),
    _req("memory/search", mem.MemorySearchParams, mem.MemorySearchResult,
         "Hybrid search over memory chunks (and session nodes): keyword and vector candidates, "
         "vectorWeight·vector + textWeight·text, with decay and MMR.",
         "InvalidQuery, InvalidParams (no workspace; both weights 0), SessionNotFound, EmbeddingUnavailable (mode "
         "hybrid/vector without a provider; an endpoint not reachable), EmbeddingFailed (an endpoint's answer "
         "of the wrong shape or dimension)",
         "Best first. A conversational query (no operators, quotes or parentheses) is reduced to "
         "its keywords, joined with OR; the vector side embeds the query as written. With sessions among the "
         "sources it first brings the session chunks up to date (nothing read when the ledger's sessions "
         "marker is unchanged; else the sessions written since; derived data: one transaction, then at most "
         "2,048 chunks embedded); otherwise read-only. Runs off the event loop.",
         offload=True),
    _req("memory/get", mem.MemoryGetParams, mem.MemoryGetResult,
         "A memory chunk by id, or a line range of a memory file.",
         "InvalidParams (neither or both of chunkId and path; a path that is not a memory file; a binary or "
         "non-UTF-8 file; a line past the end), ChunkNotFound (no such chunk: re-indexed or never there), WorkspaceEscape (a path "
         "outside the workspace or through a symlink out of it)",
         "Read-only; a file is read now from the workspace (confined, no symlink followed), a chunk from the index."),
    _req("database/migrate", m.DatabaseMigrateParams, m.DatabaseMigrateResult,
         "Copy every session of another database into this one (idempotent).",
         "InvalidParams (no such source, same database), StorageUnavailable (source unreachable)",
         "Copies rows exactly (ids, seq, revisions, HEAD, names, usage, spills), one session per transaction; "
         "idempotent; never overwrites a session changed on the target (a conflict)."),
    # the daemon
    _req("daemon/status", m.Empty, m.DaemonStatus, "The daemon: pid, uptime, socket, databases, clients.", "—",
         "Read-only; answered before `initialize` too."),
    _req("daemon/stop", m.Empty, m.DaemonStopResult, "Stop the daemon after in-flight writes finish.", "—",
         "Every connection's stream ends; the socket is removed. Answered before `initialize` too."),
    # server → client
    MethodSpec(
        name="sampling/createMessage",
        params=c.CreateMessageParams,
        result=c.CreateMessageResult,
        direction="server-to-client",
        doc="Ask the client's model for a completion (summaries); only the client whose request needs it.",
    ),
    _note("node/didAppend", m.NodeNotification, "A node was appended.", "server-to-client"),
    _note("node/didUpdate", m.NodeNotification, "A running node finished.", "server-to-client"),
    _note("session/didChange", m.SessionChange,
          "A subscribed session's HEAD moved, or it was renamed, deleted, summarized or replaced "
          "(its database file replaced underneath the daemon).", "server-to-client"),
    _note(
        "context/compactionRecommended",
        c.CompactionRecommended,
        "The branch passed 70 % of the window.",
        "server-to-client",
    ),
    _note("window/logMessage", m.LogMessageParams, "A log line for the client.", "server-to-client"),
    _note("window/showMessage", m.ShowMessageParams,
          "Something the user should see about the database (sent while initialize runs).", "server-to-client"),
]

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in _ALL}

#: Requests a client may send.
CLIENT_REQUESTS = [s.name for s in _ALL if s.direction == "client-to-server" and not s.notification]
#: Notifications the server may send.
SERVER_NOTIFICATIONS = [s.name for s in _ALL if s.direction == "server-to-client" and s.notification]
#: Requests answered before ``initialize``.
PRE_INITIALIZE = frozenset({"initialize", "daemon/status", "daemon/stop"})
