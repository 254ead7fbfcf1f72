"""Error codes and the stable ``data.kind`` vocabulary of application errors.

JSON-RPC reserves -32768..-32000; LSP adds -32002 (not initialized) and -32800
(request cancelled). Application errors use -32001 with a ``kind`` a client can
branch on, and a message written for a person: what was wrong and how to fix it.
"""

from __future__ import annotations

from typing import Any

import msgspec

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002
REQUEST_CANCELLED = -32800
APPLICATION_ERROR = -32001

#: Every ``data.kind`` the daemon may answer with, and the JSON-RPC code it uses.
ERROR_KINDS: dict[str, int] = {
    "ParseError": PARSE_ERROR,
    "InvalidRequest": INVALID_REQUEST,
    "MethodNotFound": METHOD_NOT_FOUND,
    "InvalidParams": INVALID_PARAMS,
    "InternalError": INTERNAL_ERROR,
    "ServerNotInitialized": SERVER_NOT_INITIALIZED,
    "ShutdownInProgress": INVALID_REQUEST,
    "RequestCancelled": REQUEST_CANCELLED,
    "FrameTooLarge": INVALID_REQUEST,
    # an answer bigger than the connection's frame limit: nothing was sent; page it (SPEC §1.4)
    "ResponseTooLarge": APPLICATION_ERROR,
    "SessionNotFound": APPLICATION_ERROR,
    "NodeNotFound": APPLICATION_ERROR,
    "DuplicateNode": APPLICATION_ERROR,
    "PredecessorMissing": APPLICATION_ERROR,
    "BrokenPredecessorChain": APPLICATION_ERROR,
    "InvalidEdge": APPLICATION_ERROR,
    "NotRunning": APPLICATION_ERROR,
    "Conflict": APPLICATION_ERROR,
    "BudgetExceeded": APPLICATION_ERROR,
    "SamplingFailed": APPLICATION_ERROR,
    "UnknownModel": APPLICATION_ERROR,
    "WorkspaceEscape": APPLICATION_ERROR,
    "ImportFailed": APPLICATION_ERROR,
    "InvalidQuery": INVALID_PARAMS,
    # memory/get of a chunk id the index does not hold (re-indexed or never there, SPEC §5.1)
    "ChunkNotFound": APPLICATION_ERROR,
    # memory search's embedding provider (SPEC §5.1): not installed, not reachable, or a wrong answer
    "EmbeddingUnavailable": APPLICATION_ERROR,
    "EmbeddingFailed": APPLICATION_ERROR,
    # storage faults (SPEC §3): nothing of the request was written; reads keep working
    "StorageUnavailable": APPLICATION_ERROR,
    "StorageFull": APPLICATION_ERROR,
    "StorageReadOnly": APPLICATION_ERROR,
    "StorageCorrupt": APPLICATION_ERROR,
    "StorageBusy": APPLICATION_ERROR,
}


class ErrorData(msgspec.Struct, rename="camel", omit_defaults=True):
    """``error.data`` of every error the daemon sends. Never a traceback."""

    kind: str
    node_id: str | None = None
    session_id: str | None = None
    path: str | None = None
    details: dict[str, Any] | None = None


class ResponseError(msgspec.Struct, omit_defaults=True):
    code: int
    message: str
    data: ErrorData | None = None


class DagctxError(Exception):
    """An error with a stable kind, raised anywhere below the server.

    The server turns it into a JSON-RPC error; nothing else needs to know JSON-RPC.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        node_id: str | None = None,
        session_id: str | None = None,
        path: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.kind = kind
        self.message = message
        self.node_id = node_id
        self.session_id = session_id
        self.path = path
        self.details = details

    @property
    def code(self) -> int:
        return ERROR_KINDS[self.kind]

    def to_response_error(self) -> ResponseError:
        return ResponseError(
            code=self.code,
            message=self.message,
            data=ErrorData(
                kind=self.kind,
                node_id=self.node_id,
                session_id=self.session_id,
                path=self.path,
                details=self.details,
            ),
        )
