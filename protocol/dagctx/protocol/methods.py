"""The method table: every method name → its params and result types.

Server and clients share this table (esbonio's ``sphinx_agent/types`` idea): the
server decodes params with it, the Python client decodes results with it, and the
JSON Schema (and from it the TypeScript types) is generated from it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from . import context_messages as c
from . import messages as m

PROTOCOL_VERSION = "1.0"

Direction = Literal["client-to-server", "server-to-client"]


class MethodSpec(msgspec.Struct, frozen=True):
    name: str
    params: type
    result: Any  # a Struct type, or None for notifications
    notification: bool = False
    direction: Direction = "client-to-server"
    doc: str = ""


def _req(name: str, params: type, result: Any, doc: str) -> MethodSpec:
    return MethodSpec(name, params, result, False, "client-to-server", doc)


def _note(name: str, params: type, doc: str, direction: Direction = "client-to-server") -> MethodSpec:
    return MethodSpec(name, params, None, True, direction, doc)


_ALL: list[MethodSpec] = [
    # lifecycle (LSP)
    _req("initialize", m.InitializeParams, m.InitializeResult, "Open the connection; choose the database."),
    _note("initialized", m.Empty, "The client got the initialize result."),
    _req("shutdown", m.Empty, None, "Stop serving requests; `exit` follows."),
    _note("exit", m.Empty, "Exit: code 0 after shutdown, 1 without."),
    _note("$/cancelRequest", m.CancelParams, "Cancel a request in flight; it answers -32800."),
    _note("$/progress", m.ProgressParams, "Work-done progress of a long request.", "server-to-client"),
    # sessions
    _req("session/create", m.SessionCreateParams, m.SessionCreateResult, "Create a session with its ROOT."),
    _req("session/list", m.SessionListParams, m.SessionListResult, "List sessions, newest first."),
    _req("session/get", m.SessionRef, m.SessionInfo, "One session's record."),
    _req("session/rename", m.SessionRenameParams, m.SessionInfo, "Change a session's title."),
    _req("session/delete", m.SessionRef, m.SessionDeleteResult, "Delete a session and all its nodes."),
    _req("session/history", m.SessionHistoryParams, m.SessionHistoryResult, "The linear branch ending at a head."),
    _req("session/branches", m.SessionRef, m.SessionBranchesResult, "Every branch tip, the main lane, lengths."),
    _req("session/checkout", m.SessionCheckoutParams, m.HeadResult, "Move HEAD to a conversation node."),
    _req("session/rewind", m.SessionRewindParams, m.HeadResult, "Move HEAD back along the current branch."),
    _req("session/spawn", m.SessionSpawnParams, m.SessionSpawnResult, "Open a spawn branch (HEAD stays)."),
    _req("session/nameBranch", m.BranchNameParams, m.SessionBranchesResult, "Name (or unname) a branch tip."),
    _req("session/import", c.ImportParams, c.ImportResult, "Import transcripts of other agents."),
    _req("session/export", c.ExportParams, c.ExportResult, "Export a branch as a transcript."),
    # nodes
    _req("node/append", m.NodeAppendParams, m.NodeResult, "Append one node; HEAD moves only when it extends HEAD."),
    _req("node/update", m.NodeUpdateParams, m.NodeResult, "Finish a running node (the only mutation)."),
    _req("node/get", m.NodeGetParams, m.NodeGetResult, "Nodes by id."),
    # context
    _req("context/render", c.RenderParams, c.RenderResult, "Messages for a head in a provider format."),
    _req("context/prepare", c.PrepareParams, c.PrepareResult, "Everything one turn needs."),
    _req("context/compact", c.CompactParams, c.CompactResult, "Compact a branch into a rolling summary."),
    _req("context/replay", c.ReplayParams, c.ReplayResult, "Exactly what a past llm node was sent."),
    _req("usage/report", c.UsageReportParams, c.UsageReportResult, "Provider usage of an llm node."),
    _req("search/query", m.SearchParams, m.SearchResult, "Full-text search, one session or all."),
    _req("database/migrate", m.DatabaseMigrateParams, m.DatabaseMigrateResult,
         "Copy every session of another database into this one (idempotent)."),
    # server → client
    MethodSpec(
        "sampling/createMessage",
        c.CreateMessageParams,
        c.CreateMessageResult,
        False,
        "server-to-client",
        "Ask the client's model for a completion (summaries).",
    ),
    _note("node/didAppend", m.NodeNotification, "A node was appended.", "server-to-client"),
    _note("node/didUpdate", m.NodeNotification, "A running node finished.", "server-to-client"),
    _note(
        "context/compactionRecommended",
        c.CompactionRecommended,
        "The branch passed 70 % of the window.",
        "server-to-client",
    ),
    _note("window/logMessage", m.LogMessageParams, "A log line for the client.", "server-to-client"),
]

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in _ALL}

#: Requests a client may send.
CLIENT_REQUESTS = [s.name for s in _ALL if s.direction == "client-to-server" and not s.notification]
#: Notifications the server may send.
SERVER_NOTIFICATIONS = [s.name for s in _ALL if s.direction == "server-to-client" and s.notification]
