"""The LSP base-protocol messages dagctx sends and accepts, as ``lsprotocol`` types.

dagctx's own payloads travel on the msgspec fast path (``dagctx.protocol``): pygls's
cattrs structuring of a request is several times slower (ARCHITECTURE.md, "The card's
packages"; ``bench/bench_pygls.py``). The messages that belong to LSP itself are built
and read here through ``lsprotocol``'s types and its cattrs converter, so their shape
is LSP's by construction: ``initialize``'s LSP part (``InitializeParams`` with the client's
``ClientCapabilities``; ``InitializeResult`` with ``ServerCapabilities`` and ``ServerInfo``),
work-done progress (``$/progress`` with ``WorkDoneProgressBegin``/``Report``/``End``),
cancellation (``$/cancelRequest``, both directions), ``window/logMessage``,
``window/showMessage`` and the error codes; pygls's server is constructed with the same
converter (``cattrs`` through ``lsprotocol``).
"""

from __future__ import annotations

from typing import Any

import cattrs
import msgspec
from lsprotocol import types as lsp
from lsprotocol.converters import get_converter

from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError

CONVERTER = get_converter()

#: JSON-RPC and LSP error codes dagctx answers with (``dagctx.protocol.errors`` names the
#: same numbers for clients; a test holds the two equal)
PARSE_ERROR = int(lsp.ErrorCodes.ParseError)
INVALID_REQUEST = int(lsp.ErrorCodes.InvalidRequest)
METHOD_NOT_FOUND = int(lsp.ErrorCodes.MethodNotFound)
INVALID_PARAMS = int(lsp.ErrorCodes.InvalidParams)
INTERNAL_ERROR = int(lsp.ErrorCodes.InternalError)
SERVER_NOT_INITIALIZED = int(lsp.ErrorCodes.ServerNotInitialized)
REQUEST_CANCELLED = int(lsp.LSPErrorCodes.RequestCancelled)

_PROGRESS = {"begin": lsp.WorkDoneProgressBegin, "report": lsp.WorkDoneProgressReport,
             "end": lsp.WorkDoneProgressEnd}
#: the fields LSP gives each kind (cattrs would drop another one silently)
_FIELDS = {"begin": {"kind", "title", "cancellable", "message", "percentage"},
           "report": {"kind", "cancellable", "message", "percentage"}, "end": {"kind", "message"}}


def progress(token: int | str, value: dict[str, Any]) -> dict[str, Any]:
    """``$/progress`` params: ``value`` (``{"kind": "begin"|"report"|"end", …}``, as the
    engine reports it) checked as LSP work-done progress. A field LSP does not know, or a
    wrong type, is a bug of ours: cattrs raises."""
    kind = value.get("kind")
    cls = _PROGRESS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"work-done progress kind {kind!r} is not begin, report or end")
    unknown = set(value) - _FIELDS[kind]  # type: ignore[index]
    if unknown:
        raise ValueError(f"work-done progress has fields LSP does not know: {sorted(unknown)}")
    typed = CONVERTER.structure(value, cls)
    return CONVERTER.unstructure(lsp.ProgressParams(token=token, value=typed))


def cancel(request_id: int | str) -> dict[str, Any]:
    """``$/cancelRequest`` params for a request we sent."""
    return CONVERTER.unstructure(lsp.CancelParams(id=request_id))


def cancelled_id(raw: Any) -> int | str | None:
    """The id a client's ``$/cancelRequest`` names, or None when its params are malformed."""
    try:
        return CONVERTER.structure(raw, lsp.CancelParams).id
    except Exception:  # noqa: BLE001 - a malformed notification is ignored (LSP)
        return None


#: Python log levels → LSP ``MessageType``
_LEVELS = {50: lsp.MessageType.Error, 40: lsp.MessageType.Error, 30: lsp.MessageType.Warning,
           20: lsp.MessageType.Info}


def log_message(levelno: int, text: str) -> dict[str, Any]:
    """``window/logMessage`` params for a log record of ``levelno``."""
    return CONVERTER.unstructure(lsp.LogMessageParams(type=_LEVELS.get(levelno, lsp.MessageType.Log), message=text))


def show_message(levelno: int, text: str) -> dict[str, Any]:
    """``window/showMessage`` params: something the user should see, at ``levelno``."""
    return CONVERTER.unstructure(lsp.ShowMessageParams(type=_LEVELS.get(levelno, lsp.MessageType.Log), message=text))


def _camel(path: str) -> str:
    return ".".join(part.split("_")[0] + "".join(w.title() for w in part.split("_")[1:]) for part in path.split("."))


#: the capabilities LSP defines, each an object of the named type
_CLIENT_CAPABILITIES = {"workspace": "WorkspaceClientCapabilities", "textDocument": "TextDocumentClientCapabilities",
                        "notebookDocument": "NotebookDocumentClientCapabilities",
                        "window": "WindowClientCapabilities", "general": "GeneralClientCapabilities"}


def client_params(p: m.InitializeParams) -> lsp.InitializeParams:
    """``initialize``'s LSP part typed by ``lsprotocol``: ``processId``, ``clientInfo``,
    ``rootUri`` and the client's capabilities as ``ClientCapabilities`` (``general``,
    ``window``, ``workspace``…; dagctx's own keys such as ``sampling`` are not LSP's and the
    engine reads them, SPEC §2). A capability LSP defines, sent in another shape, is
    ``InvalidParams`` naming its path (``capabilities.window``)."""
    for key, kind in _CLIENT_CAPABILITIES.items():
        value = p.capabilities.get(key)
        if value is not None and not isinstance(value, dict):
            raise DagctxError("InvalidParams", f"initialize: capabilities.{key} must be an object (LSP's {kind}), "
                              f"not {type(value).__name__}", path=f"capabilities.{key}")
    raw: dict[str, Any] = {"processId": p.process_id, "capabilities": p.capabilities}
    if p.client_info is not None:
        raw["clientInfo"] = msgspec.to_builtins(p.client_info)
    if p.root_uri is not None:
        raw["rootUri"] = p.root_uri
    try:
        return CONVERTER.structure(raw, lsp.InitializeParams)
    except Exception as exc:  # noqa: BLE001 - cattrs reports a wrong shape in many exception types
        problems = cattrs.transform_error(exc, path="params") if isinstance(exc, cattrs.BaseValidationError) \
            else [f"{exc} @ params"]
        paths = [_camel(pr.rpartition(" @ ")[2]).removeprefix("params").lstrip(".") for pr in problems]
        said = "; ".join(f"{pr.rpartition(' @ ')[0]} at {path or 'params'}" for pr, path in zip(problems, paths))
        raise DagctxError("InvalidParams", f"initialize params do not fit LSP's InitializeParams: {said} "
                          "(see the LSP specification's ClientCapabilities)", path=paths[0] if paths else None) from exc


def initialize_result(result: m.InitializeResult) -> dict[str, Any]:
    """``initialize``'s answer: dagctx's ``InitializeResult`` with its LSP part built by
    ``lsprotocol`` — ``serverInfo`` a ``ServerInfo``, ``capabilities`` a ``ServerCapabilities``
    whose ``experimental`` carries dagctx's capabilities (where LSP puts a server's own), with
    the same keys also at the top of ``capabilities`` (SPEC §2: what dagctx's clients read)."""
    typed = lsp.InitializeResult(
        capabilities=lsp.ServerCapabilities(experimental=dict(result.capabilities)),
        server_info=lsp.ServerInfo(name=result.server_info.name, version=result.server_info.version),
    )
    lsp_part = CONVERTER.unstructure(typed)
    out: dict[str, Any] = msgspec.to_builtins(result)
    out["serverInfo"] = lsp_part["serverInfo"]
    out["capabilities"] = {**lsp_part["capabilities"], **result.capabilities}
    return out

