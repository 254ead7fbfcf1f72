"""Every importer on a small transcript written by hand for this test (tests/fixtures/
transcripts/, never copied from the corpus), so the importers are tested without the
shared corpus: detection, the ledger's rules, tool pairs, compactions, branches and
spawned subagents. The corpus tests (``test_importers.py``) check real sessions besides."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagctx.protocol.nodes import SUMMARY_NAME, SYSTEM_PROMPT_NAME
from dagctx.transcripts import Transcript, check_transcript, detect_format, parse_file, parse_path
from dagctx.transcripts.readers import readers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"

#: file → (format, transcripts, tool pairs of each, compactions of each, HEAD of the first)
EXPECTED = {
    "claude-code/fx-cc.jsonl": ("claude-code", 1, [3], [1], "a4"),
    "codex/rollout-fx.jsonl": ("codex", 1, [1], [1], "codex-11"),
    "openclaw/fx-openclaw.jsonl": ("openclaw", 1, [1], [1], "e8"),
    "openhands/output.jsonl": ("openhands", 2, [1, 1], [0, 0], "oh-1-llm"),
    "openhands/fx-events.json": ("openhands", 1, [1], [0], "oh-4"),
    "sharegpt/fx.jsonl": ("sharegpt", 2, [1, 0], [0, 0], "sg1-4"),
    "sharegpt/fx-array.json": ("sharegpt", 2, [1, 0], [0, 0], "sg1-3"),
    "swe-agent/fx.traj": ("swe-agent", 1, [2], [0], "swe-4"),
}


def test_every_reader_has_a_fixture() -> None:
    assert {fmt for fmt, *_ in EXPECTED.values()} == set(readers())


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_a_fixture_is_detected_and_parsed_within_the_ledger_rules(rel: str) -> None:
    fmt, n, pairs, compactions, head = EXPECTED[rel]
    path = FIXTURES / rel
    assert detect_format(path) == fmt
    got = parse_file(path)
    assert parse_file(path, format=fmt) == got  # naming the format changes nothing
    assert len(got) == n
    for t, p, k in zip(got, pairs, compactions, strict=True):
        assert t.format == fmt and check_transcript(t) == [], check_transcript(t)
        assert (t.counts["toolPairs"], t.counts["compactions"], t.counts["skipped"]) == (p, k, 0)
        assert t.source_path == str(path)
    assert got[0].head == head
    assert parse_file(path) == got  # deterministic: same bytes, same nodes and ids


def _by_name(t: Transcript, name: str) -> list:
    return [n for n in t.nodes if n.name == name]


def test_claude_code_brings_its_subagent_and_its_compaction() -> None:
    [t] = parse_file(FIXTURES / "claude-code/fx-cc.jsonl")
    assert t.counts["spawnBranches"] == 1
    [root] = [n for n in t.nodes if n.metadata.get("spawn_branch_root")]
    assert t.node(root.caller).name == "Task"  # the subagent hangs off the call that spawned it
    assert "sa-a2" in {n.id for n in t.nodes}
    [summary] = _by_name(t, SUMMARY_NAME)
    assert "setup.py names the package demo" in summary.output
    assert set(summary.metadata["covers_ids"]) >= {"u1", "a3"}


def test_a_folder_walk_folds_subagent_files_into_their_session() -> None:
    errors: list[tuple[str, str]] = []
    got = parse_path(FIXTURES, errors=errors)
    assert errors == []
    assert sorted(t.format for t in got) == sorted(
        fmt for fmt, n, *_ in EXPECTED.values() for _ in range(n))  # the subagent file is not a session of its own


def test_codex_keeps_instructions_usage_and_the_call_output() -> None:
    [t] = parse_file(FIXTURES / "codex/rollout-fx.jsonl")
    [prompt] = _by_name(t, SYSTEM_PROMPT_NAME)
    assert prompt.output == "You are Codex, a coding agent."
    [call] = [n for n in t.nodes if n.metadata.get("toolCallId") == "call_fx_1"]
    assert call.name == "shell" and "3 passed" in str(call.output)
    [usage] = t.usage.values()
    assert (usage.input, usage.output, usage.cache_read) == (600, 40, 300)


def test_openclaw_keeps_the_abandoned_branch_and_the_newest_is_head() -> None:
    [t] = parse_file(FIXTURES / "openclaw/fx-openclaw.jsonl")
    ids = {n.id for n in t.nodes}
    assert {"e7", "e8"} <= ids and t.head == "e8"  # two branches from e4; the newer one is HEAD
    [summary] = _by_name(t, SUMMARY_NAME)
    assert summary.output.startswith("The user asked about notes.txt")


def test_sharegpt_pairs_a_function_call_with_its_observation() -> None:
    first, second = parse_file(FIXTURES / "sharegpt/fx.jsonl")
    [call] = [n for n in first.nodes if n.role == "code" and n.name == "weather"]
    assert call.input == {"city": "北京"} and "晴" in str(call.output)
    assert [n.output for n in second.nodes if n.role == "llm"] == ["Hi!"]


def _spilled(path: Path, over: int) -> list[Transcript]:
    """``parse_file`` as ``session/import`` runs it: node bodies and held message contents
    over ``over`` bytes kept aside in a temporary file (SPEC §9 import), each read back as
    it would be written; ``counts["_kept"]`` of the first says which node ids were kept."""
    from dagctx.transcripts.base import SpilledOutput, loaded
    from dagctx.transcripts.builder import SPILL_OVER

    token = SPILL_OVER.set(over)
    try:
        got = parse_file(path)
    finally:
        SPILL_OVER.reset(token)
    kept = [n.id for t in got for n in t.nodes if isinstance(n.output, SpilledOutput)]
    kept_inputs = [n.id for t in got for n in t.nodes if isinstance(n.input, SpilledOutput)]
    kept_thinking = [n.id for t in got for n in t.nodes if isinstance(n.metadata.get("thinking"), SpilledOutput)]
    for t in got:
        t.nodes = [loaded(n) for n in t.nodes]
    got[0].counts["_kept"] = kept  # type: ignore[assignment]  # for the caller's check
    got[0].counts["_kept_inputs"] = kept_inputs  # type: ignore[assignment]
    got[0].counts["_kept_thinking"] = kept_thinking  # type: ignore[assignment]
    return got


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_keeping_bodies_aside_changes_no_transcript(rel: str) -> None:
    """An import keeps every large node body (tool results, user and model texts joined
    from their parts, summaries, tool call inputs, thinking texts) on disk while it reads (its memory is bounded by the
    largest node): read back, every transcript is the one read in memory, and every body
    over the limit was kept aside, whatever its role."""
    import msgspec

    whole = parse_file(FIXTURES / rel)
    aside = _spilled(FIXTURES / rel, over=8)  # every body longer than 8 bytes is kept aside
    kept = aside[0].counts.pop("_kept")
    big = [n.id for t in whole for n in t.nodes if n.output is not None and len(msgspec.json.encode(n.output)) > 8]
    assert kept == big
    # tool call inputs and thinking texts too
    assert aside[0].counts.pop("_kept_inputs") == [
        n.id for t in whole for n in t.nodes if n.input is not None and len(msgspec.json.encode(n.input)) > 8]
    assert aside[0].counts.pop("_kept_thinking") == [
        n.id for t in whole for n in t.nodes if len(msgspec.json.encode(n.metadata.get("thinking"))) > 8]
    roles = {n.role for t in whole for n in t.nodes if n.id in set(kept)}
    assert {"user", "llm", "code"} <= roles, roles  # every fixture has each kind of body
    assert aside == whole


#: the fixtures that are one JSON document (not JSON Lines): read a piece at a time
WHOLE_JSON = sorted(rel for rel in EXPECTED if not rel.endswith(".jsonl"))


def parse_streamed(path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int = 61) -> list[Transcript]:
    """``parse_file`` with every JSON document streamed (``jsonstream.WHOLE_BELOW`` 0: no
    conversation or file decoded whole, each element on its own) through a window of
    ``chunk`` bytes, so strings, escapes and numbers are cut at every kind of place."""
    from dagctx.transcripts import jsonstream

    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 0)
        m.setattr(jsonstream, "_CHUNK", chunk)
        assert detect_format(path) == detect_format_whole(path)
        return parse_file(path)


def detect_format_whole(path: Path) -> str:
    from dagctx.transcripts import jsonstream

    old = jsonstream.WHOLE_BELOW
    jsonstream.WHOLE_BELOW = 1 << 62
    try:
        return detect_format(path)
    finally:
        jsonstream.WHOLE_BELOW = old


def parse_whole(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Transcript]:
    """``parse_file`` with every JSON document decoded in one piece (as before streaming)."""
    from dagctx.transcripts import jsonstream

    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 1 << 62)
        return parse_file(path)


@pytest.mark.parametrize("chunk", [1, 2, 61, 1 << 20])
@pytest.mark.parametrize("rel", WHOLE_JSON)
def test_a_json_document_streamed_is_parsed_as_decoded_whole(rel: str, chunk: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §9 import: a ShareGPT array, an OpenHands event list and a SWE-agent trajectory
    are read an element at a time (memory bounded by the largest node); what they parse into
    is exactly what the whole document decoded in one piece parses into, ids, texts, keys
    (a ShareGPT conversation's is the digest of its re-encoding) and counts alike — and with
    the bodies kept aside as an import keeps them."""
    whole = parse_whole(FIXTURES / rel, monkeypatch)
    assert whole and all(t.nodes for t in whole)
    assert parse_streamed(FIXTURES / rel, monkeypatch, chunk) == whole
    from dagctx.transcripts import jsonstream

    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 0)
        m.setattr(jsonstream, "_CHUNK", chunk)
        aside = _spilled(FIXTURES / rel, over=8)
    for key in ("_kept", "_kept_inputs", "_kept_thinking"):
        aside[0].counts.pop(key)
    assert aside == whole


def test_a_streamed_document_reports_what_it_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed, an element over the record cap (``DAGCTX_IMPORT_MAX_LINE_BYTES``) is
    skipped with its size and the rest is read; a document that breaks off, or has anything
    after its value, is refused before anything of it is parsed, as when decoded whole."""
    import json

    from dagctx.transcripts import jsonstream

    monkeypatch.setattr(jsonstream, "WHOLE_BELOW", 0)
    monkeypatch.setenv("DAGCTX_IMPORT_MAX_LINE_BYTES", "4000")
    big = "x" * 5000
    conv = {"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": big},
                              {"from": "gpt", "value": "short"}]}
    f = tmp_path / "chats.json"
    f.write_text(json.dumps([conv, {"conversations": [{"from": "human", "value": "second"}]}]))
    first, second = parse_file(f)
    assert [n.output for n in first.nodes] == ["hello", "short"]
    assert [s.reason for s in first.skipped] == [
        "turn 1 of 5,028 bytes is over the 4,000-byte limit (DAGCTX_IMPORT_MAX_LINE_BYTES); not read"]
    assert [n.output for n in second.nodes] == ["second"]
    traj = tmp_path / "t.traj"
    traj.write_text(json.dumps({"history": [{"role": "user", "content": "fix it"},
                                            {"role": "assistant", "content": big}], "replay_config": "{}"}))
    [t] = parse_file(traj)
    assert [n.output for n in t.nodes] == ["fix it"] and "history[1] of 5," in t.skipped[0].reason
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"id": 0, "source": "user", "action": "message", "args": {"content": "hi"}},
                                  {"id": 1, "source": "user", "action": "message", "args": {"content": big}}]))
    [t] = parse_file(events)
    assert [n.output for n in t.nodes] == ["hi"] and "event #1 of 5," in t.skipped[0].reason
    for broken in (json.dumps([conv])[:-3], json.dumps([conv]) + " []"):
        f.write_text(broken)
        [t] = parse_file(f, format="sharegpt")
        assert t.nodes == [] and len(t.skipped) == 1 and t.skipped[0].reason.startswith("not JSON: JSON is malformed")
