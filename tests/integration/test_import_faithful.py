"""Real transcripts in, nothing lost; bad input out, nothing written — over a real daemon.

Every fixture here is written by the test in the documented format of its agent (no
corpus file is copied): Claude Code compactions whose pre-compaction lines were pruned,
the compaction summarizer's own transcript, OpenHands evaluation output, wrong formats,
non-transcripts, oversized records, export → import in the same database.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError


def _write(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cc(uuid: str, parent: str | None, typ: str, content: Any, ts: str, sid: str = "sess-1", **extra: Any) -> dict:
    row: dict[str, Any] = {"parentUuid": parent, "isSidechain": False, "userType": "external", "sessionId": sid,
                           "type": typ, "uuid": uuid, "timestamp": ts}
    if typ in ("user", "assistant"):
        msg: dict[str, Any] = {"role": typ, "content": content}
        if typ == "assistant":
            msg.update({"id": f"msg-{uuid}", "model": "claude-sonnet-4-5", "type": "message"})
        row["message"] = msg
    row.update(extra)
    return row


def _boundary(uuid: str, logical: str, ts: str, sid: str = "sess-1") -> dict:
    return {"parentUuid": None, "logicalParentUuid": logical, "isSidechain": False, "userType": "external",
            "sessionId": sid, "type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
            "isMeta": False, "level": "info", "compactMetadata": {"trigger": "auto", "preTokens": 151234},
            "uuid": uuid, "timestamp": ts}


SUMMARY = ("This session is being continued from a previous conversation that ran out of context. "
           "Summary:\n1. Primary Request: migrate the parser to msgspec.\n" + "Key detail: keep parse_config. " * 500)


def _pruned_session(tmp_path: Path, keep_before: bool = True) -> Path:
    rows: list[dict] = []
    if keep_before:
        # Lines u1/a1 are gone (pruned); u2 still names u1 as its parent.
        rows += [
            _cc("u2", "a1-gone", "user", "now run the tests", "2026-03-01T10:00:00.000Z"),
            _cc("a2", "u2", "assistant", [{"type": "text", "text": "All 41 tests pass."}], "2026-03-01T10:00:05.000Z"),
        ]
    rows += [
        _boundary("b1", "a-pre-compaction-gone", "2026-03-01T10:01:00.000Z"),
        _cc("s1", "b1", "user", SUMMARY, "2026-03-01T10:01:00.100Z", isCompactSummary=True,
            isVisibleInTranscriptOnly=True),
        _cc("u3", "s1", "user", "continue with the docs", "2026-03-01T10:02:00.000Z"),
        _cc("a3", "u3", "assistant", [{"type": "text", "text": "Docs updated."}], "2026-03-01T10:02:09.000Z"),
    ]
    return _write(tmp_path / "proj" / "sess-1.jsonl", rows)


async def test_compaction_with_a_pruned_logical_parent_keeps_its_summary(daemon: DagctxClient, tmp_path: Path) -> None:
    res = await daemon.import_path(str(_pruned_session(tmp_path)))
    [s] = res.sessions
    assert s.created and s.compactions == 1
    assert any("a-pre-compaction-gone" in n and "not in the file" in n for n in s.notes), s.notes
    info = await daemon.session_get(s.session_id)
    assert info.head == "a3"  # the continuation is HEAD, not re-rooted
    r = await daemon.render(s.session_id, format="neutral")
    texts = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in r.messages]
    # [summary, continuation…], as Claude Code showed it; no [conversation start] placeholder
    assert len(texts) == 3 and texts[0].startswith("[Previous conversation summary]") and SUMMARY[:200] in texts[0]
    assert texts[1:] == ["continue with the docs", "Docs updated."]
    summary = (await daemon.get_nodes(s.session_id, ["s1"])).nodes[0]
    assert summary.metadata["covers_ids"] == ["u2", "a2"] and len(summary.output) == len(SUMMARY)
    assert summary.metadata["missingLogicalParent"] == "a-pre-compaction-gone"


async def test_compaction_with_nothing_left_before_it_is_the_first_message(daemon: DagctxClient, tmp_path: Path) -> None:
    [s] = (await daemon.import_path(str(_pruned_session(tmp_path, keep_before=False)))).sessions
    assert s.created and s.nodes == 3 and any("no conversation is left" in n for n in s.notes)
    r = await daemon.render(s.session_id, format="neutral")
    first = r.messages[0]["content"]
    assert (first if isinstance(first, str) else first[0]["text"]) == SUMMARY
    assert (await daemon.session_get(s.session_id)).head == "a3"


async def test_compaction_summarizer_transcript_is_provenance_not_turns(daemon: DagctxClient, tmp_path: Path) -> None:
    reply = "Summary:\n1. Primary Request: migrate the parser to msgspec."
    main = _write(tmp_path / "proj" / "sess-2.jsonl", [
        _cc("u1", None, "user", "migrate the parser", "2026-03-01T09:00:00.000Z", sid="sess-2"),
        _cc("a1", "u1", "assistant", [{"type": "text", "text": "Migrated."}], "2026-03-01T09:00:10.000Z", sid="sess-2"),
        _boundary("b1", "a1", "2026-03-01T09:05:00.000Z", sid="sess-2"),
        _cc("s1", "b1", "user", "This session is being continued from a previous conversation. " + reply,
            "2026-03-01T09:05:00.100Z", sid="sess-2", isCompactSummary=True),
        _cc("u2", "s1", "user", "thanks", "2026-03-01T09:06:00.000Z", sid="sess-2"),
        _cc("a2", "u2", "assistant", [{"type": "text", "text": "You are welcome."}], "2026-03-01T09:06:03.000Z",
            sid="sess-2"),
    ])
    side = {"isSidechain": True, "agentId": "acompact-7f3a"}
    _write(tmp_path / "proj" / "sess-2" / "subagents" / "agent-acompact-7f3a.jsonl", [
        _cc("c1", None, "user", "Your task is to create a detailed summary of the conversation so far.",
            "2026-03-01T09:04:00.000Z", sid="sess-2", **side),
        _cc("c2", "c1", "assistant", [{"type": "text", "text": reply}], "2026-03-01T09:04:50.000Z", sid="sess-2",
            **side),
    ])
    for target in (main, tmp_path / "proj"):  # the file, and the folder holding it
        res = await daemon.import_path(str(target))
        [s] = res.sessions
        assert s.spawn_branches == 0 and s.nodes == 5, s
    branches = await daemon.branches(s.session_id)
    assert [b.head for b in branches.branches] == ["a2"]  # main ends in its own reply
    ids = {n.id for n in (await daemon.history(s.session_id)).nodes}
    assert not ids & {"c1", "c2"}
    summary = (await daemon.get_nodes(s.session_id, ["s1"])).nodes[0]
    assert summary.metadata["summarizer"] == {"file": "sess-2/subagents/agent-acompact-7f3a.jsonl",
                                              "model": "claude-sonnet-4-5", "lines": 2, "match": "text"}
    found = await daemon.search("detailed summary")
    assert found.hits == []  # the summarizer's prompt is not a turn anywhere


def _oh_events(task: str, with_error: bool) -> list[dict]:
    call = {"function_name": "execute_bash", "tool_call_id": "call_1",
            "model_response": {"id": f"resp-{task}", "model": "gpt-4o",
                               "choices": [{"message": {"content": "Let me look.", "tool_calls": [
                                   {"id": "call_1", "function": {"name": "execute_bash",
                                                                 "arguments": "{\"command\": \"ls\"}"}}]}}]}}
    events: list[dict] = [
        {"id": 0, "timestamp": "2026-02-01T10:00:00", "source": "user", "action": "message",
         "args": {"content": task}},
        {"id": 1, "timestamp": "2026-02-01T10:00:01", "source": "agent", "action": "run",
         "args": {"command": "ls"}, "tool_call_metadata": call},
        {"id": 2, "timestamp": "2026-02-01T10:00:02", "source": "agent", "observation": "run", "cause": 1,
         "content": "setup.py\nsrc", "extras": {"metadata": {"exit_code": 0}}, "tool_call_metadata": call},
    ]
    if with_error:
        events.append({"id": 3, "timestamp": "2026-02-01T10:00:03", "source": "user", "observation": "error",
                       "content": "Agent got stuck in a loop", "extras": {}})
    return events


async def test_openhands_output_jsonl_is_one_session_per_run(daemon: DagctxClient, tmp_path: Path) -> None:
    out = _write(tmp_path / "output.jsonl", [
        {"instance_id": "django__django-11099", "instruction": "fix it", "history": _oh_events("fix 11099", True),
         "metrics": {"accumulated_cost": 0.1}, "error": None},
        {"instance_id": "astropy__astropy-12907", "history": [[e, {}] for e in _oh_events("fix 12907", False)[:1]]
         + [_oh_events("fix 12907", False)[1:]], "test_result": {}},
    ])
    for fmt in ("auto", "openhands"):
        res = await daemon.import_path(str(out), format=fmt)
        assert [s.title for s in res.sessions] == ["django__django-11099", "astropy__astropy-12907"], fmt
        assert [s.tool_pairs for s in res.sessions] == [1, 1] and res.skipped == []
    first = res.sessions[0]
    hist = (await daemon.history(first.session_id)).nodes
    err = hist[-1]
    assert (err.role, err.output, err.metadata.get("observation")) == ("user", "Agent got stuck in a loop", "error")
    r = await daemon.render(first.session_id, format="openai", model="gpt-4o")
    assert r.messages[-1] == {"role": "user", "content": "Agent got stuck in a loop"}
    # a single {"history": [...]} object
    one = tmp_path / "run.json"
    one.write_text(json.dumps({"history": _oh_events("fix one", True)}), encoding="utf-8")
    [s] = (await daemon.import_path(str(one))).sessions
    assert s.created and s.nodes == 4


SWE_TRAJ = {"history": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "Fix the bug"},
                        {"role": "assistant", "content": "Looking", "tool_calls": [
                            {"id": "c1", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]},
                        {"role": "tool", "tool_call_ids": ["c1"], "content": "a.py"}],
            "info": {}, "replay_config": "{}"}


async def test_a_wrong_format_or_a_non_transcript_writes_nothing(daemon: DagctxClient, tmp_path: Path) -> None:
    traj = tmp_path / "x.traj"
    traj.write_text(json.dumps(SWE_TRAJ, indent=1), encoding="utf-8")
    cc = _pruned_session(tmp_path)
    secret = "root:$6$rounds=656000$SECRETSALTSECRETSALT$abcdefghijklmnopqrstuvwxyz0123456789:19000:0:99999:7:::"
    shadow = tmp_path / "shadow.jsonl"
    shadow.write_text("\n".join([secret] * 500) + "\n", encoding="utf-8")
    for path, fmt in ((traj, "codex"), (cc, "sharegpt"), (cc, "codex"), (shadow, "claude-code"), (shadow, "auto")):
        before = (await daemon.session_list()).total
        try:
            res = await daemon.import_path(str(path), format=fmt)
        except RpcError as exc:  # auto-detection of a non-transcript: a clear error
            assert exc.kind == "ImportFailed" and "cannot tell which transcript format" in exc.message
            assert secret[20:] not in exc.message
            continue
        assert res.sessions == [] and (await daemon.session_list()).total == before, (path, fmt)
        files = [e for e in res.skipped if e.line is None]
        assert len(files) == 1 and "no conversation found" in files[0].reason, (path, fmt, res.skipped)
        lines = [e for e in res.skipped if e.line is not None]
        assert len(lines) <= 10 and len(res.skipped) <= 11
        if path == shadow:
            assert res.skipped_more == 490
            # reasons quote a short escaped prefix at most, never the line
            assert all(secret[25:] not in e.reason and len(e.reason) <= 200 for e in res.skipped)
    with pytest.raises(RpcError) as e:
        await daemon.import_path(str(tmp_path / "empty"))
    assert e.value.kind == "InvalidParams"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a transcript")
    with pytest.raises(RpcError) as e:
        await daemon.import_path(str(tmp_path / "empty"))
    assert e.value.kind == "ImportFailed" and e.value.message.startswith("no transcripts found in ")
    assert (await daemon.session_list()).total == 0


async def test_export_then_import_is_idempotent_and_keeps_every_branch(daemon: DagctxClient, tmp_path: Path) -> None:
    s = await daemon.session_create("two branches")
    u = await daemon.append(s.session_id, "user", output="Rename parse_config", predecessor=s.head)
    a = await daemon.append(s.session_id, "llm", name="gpt-4o", output="Renamed.", predecessor=u.head)
    await daemon.append(s.session_id, "code", name="bash", input={"cmd": "rg parse_config"}, output="src/app.py:3",
                        caller=a.node.id, metadata={"toolCallId": "call_1"})
    side = await daemon.append(s.session_id, "llm", name="gpt-4o", output="Retried: renamed.", predecessor=u.node.id,
                               move_head=False)
    u2 = await daemon.append(s.session_id, "user", output="Now the docs", predecessor=a.node.id)
    await daemon.append(s.session_id, "llm", name="gpt-4o", output="Docs done.", predecessor=u2.node.id)
    info = await daemon.session_get(s.session_id)
    out = tmp_path / "all.jsonl"
    ex = await daemon.export(s.session_id, path=str(out), branches="all")
    assert ex.format == "claude-code" and json.loads(out.read_text().splitlines()[0])["dagctxSource"] == {
        "sessionId": s.session_id, "head": info.head, "branches": "all"}
    again = await daemon.import_path(str(out))
    [back] = again.sessions
    assert not back.created and back.session_id == s.session_id  # already present, no copy
    assert (await daemon.session_list()).total == 1
    fresh = await DagctxClient.spawn(tmp_path / "fresh.db")
    try:
        [copy] = (await fresh.import_path(str(out))).sessions
        assert copy.created and copy.nodes == info.node_count - 1  # every node but ROOT
        got = await fresh.session_get(copy.session_id)
        assert got.head == info.head
        tips = {b.head for b in (await fresh.branches(copy.session_id)).branches}
        assert side.node.id in tips and info.head in tips
    finally:
        await fresh.close()


def _rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read the daemon's peak RSS")
async def test_oversized_records_are_skipped_with_their_size_and_memory_stays_bounded(tmp_path: Path) -> None:
    cap = 64 * 1024
    env = {**os.environ, "DAGCTX_IMPORT_MAX_LINE_BYTES": str(cap)}
    client = await DagctxClient.spawn(tmp_path / "cap.db", env=env)
    try:
        assert client.process is not None
        rows = [
            _cc("u1", None, "user", "hello", "2026-03-01T10:00:00.000Z"),
            _cc("a1", "u1", "assistant", [{"type": "text", "text": "x" * (cap * 2)}], "2026-03-01T10:00:01.000Z"),
            _cc("a2", "u1", "assistant", [{"type": "text", "text": "short reply"}], "2026-03-01T10:00:02.000Z"),
        ]
        f = _write(tmp_path / "big.jsonl", rows)
        res = await client.import_path(str(f))
        [s] = res.sessions
        assert s.nodes == 2
        [skip] = res.skipped
        assert skip.line == 2 and "bytes is over the 65,536-byte limit" in skip.reason
        # 48 MiB without a single newline: skipped by size, read in chunks. The baseline is
        # taken after a first import (the parsers and the tokenizer are loaded by then).
        baseline = _rss_peak_kib(client.process.pid)
        blob = tmp_path / "blob.jsonl"
        with blob.open("wb") as fh:
            for _ in range(48):
                fh.write(b"{" * (1 << 20))
        res = await client.import_path(str(blob), format="claude-code")
        assert res.sessions == [] and res.skipped[0].line == 1 and "50,331,648 bytes" in res.skipped[0].reason
        grown_mib = (_rss_peak_kib(client.process.pid) - baseline) / 1024
        assert grown_mib < 16, f"import grew the daemon's peak RSS by {grown_mib:.0f} MiB"
    finally:
        await client.close()
