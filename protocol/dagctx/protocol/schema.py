"""The JSON Schema (2020-12) of the whole protocol, generated from the Structs.

``dagctx schema`` prints it; a copy is committed as ``protocol/dagctx/protocol/schema.json`` and a
test fails when the copy is stale. The TypeScript client's types are generated from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from . import codec
from .errors import ERROR_KINDS, ErrorData, ResponseError
from .context_messages import BudgetExceededDetails
from .methods import METHODS, PROTOCOL_VERSION
from .nodes import Call, NodeInput, ReasoningBlock

SCHEMA_PATH = Path(__file__).with_name("schema.json")


def build_schema() -> dict[str, Any]:
    specs = list(METHODS.values())
    types: list[Any] = [Call, NodeInput, ReasoningBlock, ErrorData, ResponseError, BudgetExceededDetails]
    for spec in specs:
        types.append(spec.params)
        if spec.result is not None:
            types.append(spec.result)
    refs, components = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    by_type = dict(zip(types, refs))
    methods: dict[str, Any] = {}
    for spec in specs:
        methods[spec.name] = {
            "direction": spec.direction,
            "kind": "notification" if spec.notification else "request",
            "description": spec.doc,
            "params": by_type[spec.params],
            "result": by_type[spec.result] if spec.result is not None else {"type": "null"},
        }
        if not spec.notification and spec.direction == "client-to-server":
            methods[spec.name].update({
                "background": spec.background,
                "offload": spec.offload,
                "writes": spec.writes,
                "errors": spec.errors,
                "keeps": spec.keeps,
            })
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "dagctx protocol",
        "description": "JSON-RPC 2.0 over stdio with LSP base-protocol framing (through the per-user "
        "daemon's Unix socket by default). See SPEC.md.",
        "version": PROTOCOL_VERSION,
        "methods": methods,
        "errorKinds": {kind: code for kind, code in ERROR_KINDS.items()},
        "$defs": dict(sorted(components.items())),
    }


def schema_json() -> str:
    return json.dumps(build_schema(), indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def main() -> None:  # pragma: no cover - used by `python -m dagctx.protocol.schema`
    SCHEMA_PATH.write_text(schema_json(), encoding="utf-8")


if __name__ == "__main__":
    main()

_ = codec  # the codec's envelopes are framing, not part of the per-method schema
