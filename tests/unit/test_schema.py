"""The committed JSON Schema matches the Structs, and the method table is whole."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dagctx.protocol import METHODS
from dagctx.protocol.schema import SCHEMA_PATH, build_schema, schema_json


def test_committed_schema_is_current() -> None:
    committed = SCHEMA_PATH.read_text(encoding="utf-8")
    assert committed == schema_json(), (
        "protocol/dagctx/protocol/schema.json is stale: run `python -m dagctx.protocol.schema` and commit it"
    )


@pytest.mark.slow
def test_cli_prints_the_same_schema() -> None:
    out = subprocess.run(
        [sys.executable, "-P", "-m", "dagctx.cli", "schema"], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == build_schema()


def test_every_method_has_typed_params_and_refs_resolve() -> None:
    schema = build_schema()
    defs = schema["$defs"]
    assert set(schema["methods"]) == set(METHODS)
    for name, entry in schema["methods"].items():
        ref = entry["params"]["$ref"].rsplit("/", 1)[-1]
        assert ref in defs, name
        if entry["kind"] == "request" and "$ref" in entry["result"]:
            assert entry["result"]["$ref"].rsplit("/", 1)[-1] in defs


def test_wire_names_are_camel_case() -> None:
    defs = build_schema()["$defs"]
    props = defs["NodeAppendParams"]["properties"]
    assert {"sessionId", "node", "moveHead"} <= set(props)
    assert "session_id" not in props
    call = defs["Call"]["properties"]
    assert {"id", "seq", "createdAt", "role", "caller", "predecessor", "reads", "metadata"} <= set(call)


@pytest.mark.slow
def test_spec_method_reference_is_current() -> None:
    """SPEC.md's generated method reference matches the Structs and a live run, byte for byte
    (examples included: ``gen_spec._scrub`` makes them the same on every run)."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gen_spec.py"
    proc = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
