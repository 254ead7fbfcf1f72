"""The method table is the one declaration of the surface: the server dispatches from it."""

from __future__ import annotations

from dagctx.engine.config import DaemonConfig
from dagctx.ledger.schema import SCHEMA_VERSION
from dagctx.protocol import version
from dagctx.protocol.methods import CLIENT_REQUESTS, METHODS, PRE_INITIALIZE
from dagctx.server.jsonrpc_server import DagctxServer
from dagctx.server.requests import BACKGROUND_METHODS


def _protocol():
    return DagctxServer(DaemonConfig()).protocol


def test_every_request_in_the_table_has_a_handler_and_every_handler_an_entry() -> None:
    proto = _protocol()
    try:
        missing = sorted(set(CLIENT_REQUESTS) - set(proto.handlers))
        assert not missing, f"requests declared in protocol/methods.py without a handler: {missing}"
        undeclared = sorted(set(proto.handlers) - set(CLIENT_REQUESTS))
        assert not undeclared, f"handlers for methods the table does not declare: {undeclared}"
    finally:
        proto.hub.pool.shutdown()


def test_dispatch_flags_come_from_the_table() -> None:
    assert BACKGROUND_METHODS == {n for n, s in METHODS.items() if s.background}
    for name, spec in METHODS.items():
        if spec.offload:
            assert spec.background, f"{name}: an offloaded view never holds back later requests"
        if not spec.notification and spec.direction == "client-to-server":
            assert spec.errors and spec.keeps, f"{name}: declare its errors and what it keeps"
    assert {"context/render", "context/prepare", "search/query"} <= {n for n, s in METHODS.items() if s.offload}
    assert PRE_INITIALIZE <= set(CLIENT_REQUESTS)


def test_a_declared_request_without_a_handler_answers_method_not_found() -> None:
    """A table entry the server cannot serve is an error answer, never a silent drop."""
    proto = _protocol()
    sent: list[bytes] = []

    class Out:
        def write(self, data: bytes) -> None:
            sent.append(data)

    proto.set_writer(Out())
    proto.initialized = True
    del proto.handlers["session/list"]
    try:
        proto.handle_body(b'{"jsonrpc":"2.0","id":7,"method":"session/list","params":{}}')
        assert sent and b'"MethodNotFound"' in sent[0] and b'"id":7' in sent[0]
    finally:
        proto.hub.pool.shutdown()


def test_the_version_module_agrees_with_the_ledger() -> None:
    from dagctx.ledger import pg_schema

    # both backends move together: the shared daemon's socket name carries this one number
    assert version.LEDGER_SCHEMA_VERSION == SCHEMA_VERSION == pg_schema.SCHEMA_VERSION
    assert sorted(pg_schema.MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))
