"""The LSP base-protocol messages are lsprotocol's types: the numbers and shapes dagctx
sends are LSP's by construction (server/lsp.py)."""

from __future__ import annotations

import logging

import pytest
from lsprotocol import types as t

from dagctx.protocol import errors
from dagctx.server import lsp


def test_error_codes_are_lsps() -> None:
    assert (errors.PARSE_ERROR, errors.INVALID_REQUEST, errors.METHOD_NOT_FOUND, errors.INVALID_PARAMS,
            errors.INTERNAL_ERROR, errors.SERVER_NOT_INITIALIZED, errors.REQUEST_CANCELLED) == (
        lsp.PARSE_ERROR, lsp.INVALID_REQUEST, lsp.METHOD_NOT_FOUND, lsp.INVALID_PARAMS, lsp.INTERNAL_ERROR,
        lsp.SERVER_NOT_INITIALIZED, lsp.REQUEST_CANCELLED)


def test_work_done_progress_is_checked_and_shaped_as_lsp() -> None:
    begin = lsp.progress("imp-1", {"kind": "begin", "title": "Importing a.jsonl", "cancellable": True, "percentage": 0})
    assert begin == {"token": "imp-1", "value": {"kind": "begin", "title": "Importing a.jsonl", "cancellable": True,
                                                 "percentage": 0}}
    report = lsp.progress(7, {"kind": "report", "message": "3/9 sessions", "percentage": 33})
    assert lsp.CONVERTER.structure(report, t.ProgressParams).token == 7
    assert lsp.progress(7, {"kind": "end", "message": "done"})["value"] == {"kind": "end", "message": "done"}
    with pytest.raises(ValueError, match="not begin, report or end"):
        lsp.progress(7, {"kind": "middle"})
    with pytest.raises(ValueError, match="LSP does not know"):
        lsp.progress(7, {"kind": "report", "title": "a report has no title"})


def test_cancellation_and_log_messages() -> None:
    assert lsp.cancel("dagctx-3") == {"id": "dagctx-3"}
    assert lsp.cancelled_id({"id": 12}) == 12 and lsp.cancelled_id({"id": "a"}) == "a"
    assert lsp.cancelled_id({"nope": 1}) is None and lsp.cancelled_id(None) is None
    assert lsp.log_message(logging.WARNING, "w") == {"type": int(t.MessageType.Warning), "message": "w"}
    assert lsp.log_message(logging.ERROR, "e")["type"] == int(t.MessageType.Error)
    assert lsp.log_message(logging.DEBUG, "d")["type"] == int(t.MessageType.Log)


def test_show_message_is_lsps() -> None:
    sent = lsp.show_message(logging.WARNING, "the database is readable by other users")
    assert lsp.CONVERTER.structure(sent, t.ShowMessageParams) == t.ShowMessageParams(
        type=t.MessageType.Warning, message="the database is readable by other users")


def test_initialize_params_are_typed_as_lsps() -> None:
    from dagctx.protocol import codec
    from dagctx.protocol.errors import DagctxError
    from dagctx.protocol.messages import InitializeParams

    p = codec.decode_params(InitializeParams, b'{"processId": 42, "clientInfo": {"name": "nvim", "version": "0.10"},'
                            b' "capabilities": {"window": {"workDoneProgress": true}, "sampling": {}}}')
    typed = lsp.client_params(p)
    assert isinstance(typed, t.InitializeParams) and typed.process_id == 42
    assert typed.client_info == t.ClientInfo(name="nvim", version="0.10")
    assert typed.capabilities.window == t.WindowClientCapabilities(work_done_progress=True)
    bad = codec.decode_params(InitializeParams, b'{"processId": null, "capabilities": {"window": 5}}')
    with pytest.raises(DagctxError) as err:
        lsp.client_params(bad)
    assert err.value.kind == "InvalidParams" and err.value.path == "capabilities.window"
    assert "WindowClientCapabilities" in err.value.message
    deeper = codec.decode_params(InitializeParams, b'{"capabilities": {"general": {"positionEncodings": 7}}}')
    with pytest.raises(DagctxError) as err:
        lsp.client_params(deeper)
    assert err.value.path == "capabilities.general.positionEncodings"


def test_initialize_result_carries_lsps_server_capabilities_and_info() -> None:
    from dagctx.protocol.messages import InitializeResult, ServerInfo

    caps = {"observeNodes": True, "storage": "sqlite"}
    result = InitializeResult(server_info=ServerInfo(name="dagctx", version="9.9"), protocol_version="1.0",
                              methods=["initialize"], notifications=["window/showMessage"], database="/x.db",
                              capabilities=caps, connection_id="c1")
    out = lsp.initialize_result(result)
    typed = lsp.CONVERTER.structure(out, t.InitializeResult)
    assert typed.server_info == t.ServerInfo(name="dagctx", version="9.9")
    assert typed.capabilities.experimental == caps
    # dagctx's own keys stay where its clients read them, and the rest of the answer is dagctx's
    assert out["capabilities"]["storage"] == "sqlite" and out["capabilities"]["observeNodes"] is True
    assert (out["protocolVersion"], out["database"], out["connectionId"]) == ("1.0", "/x.db", "c1")
