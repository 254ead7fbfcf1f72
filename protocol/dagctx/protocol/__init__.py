"""dagctx's wire contract: typed messages, the method table, errors and codec.

API Boundary: everything here is shared by the daemon and every client. It imports
nothing else of ours.

The names below are loaded on first use (PEP 562): ``dagctx.protocol.version`` and
``dagctx.protocol.transport`` are imported by the forwarder, which must start close to
a bare Python start, so importing this package must not import msgspec.
"""

from __future__ import annotations

_EXPORTS = {
    "DagctxError": "errors",
    "ErrorData": "errors",
    "ResponseError": "errors",
    "METHODS": "methods",
    "MethodSpec": "methods",
    "PROTOCOL_VERSION": "version",
    "Call": "nodes",
    "NodeInput": "nodes",
    "ROOT_SENTINEL": "nodes",
    "SUMMARY_NAME": "nodes",
    "SYSTEM_PROMPT_NAME": "nodes",
    "TERMINAL_STATUSES": "nodes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagctx.protocol' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
