"""``dagctx eval`` (issue #23): the quality metrics, each checked on a small session written
here whose right answer is known, through the real daemon (a subprocess) and the real
client — the replay, the recovery searches (M1) and ``context/replay`` (M7) all go
through the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def dagctx(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    env.pop("DAGCTX_DB", None)
    return subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", *args], capture_output=True, text=True,
                          encoding="utf-8", timeout=timeout, env=env)


def claude_code_session(path: Path, turns: int, *, result_chars: int = 6000, gap: float = 10.0) -> dict[str, Any]:
    """A Claude Code JSONL of ``turns`` user turns; each turn reads one file (a large result
    holding identifiers of its own), edits it, and answers. Returns what was written."""
    lines: list[dict[str, Any]] = []
    parent = None
    t = 1_767_225_600.0  # 2026-01-01

    def stamp() -> str:
        nonlocal t
        t += gap
        import datetime

        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")

    def add(obj: dict[str, Any]) -> None:
        nonlocal parent
        uid = f"{len(lines):08d}-0000-4000-8000-000000000000"
        obj.update({"uuid": uid, "parentUuid": parent, "sessionId": "eval-test", "timestamp": stamp(),
                    "isSidechain": False})
        lines.append(obj)
        parent = uid

    files = []
    for i in range(turns):
        f = f"src/module_{i}/handler_{i}.py"
        files.append(f)
        add({"type": "user", "message": {"role": "user", "content": f"Turn {i}: fix the bug in {f}"}})
        add({"type": "assistant", "message": {"id": f"msg_{i:04d}a", "role": "assistant", "content": [
            {"type": "text", "text": f"Reading {f}."},
            {"type": "tool_use", "id": f"toolu_read{i:04d}", "name": "Read", "input": {"file_path": f}}]}})
        body = "\n".join(f"line {k}: value_{i}_{k} = compute_{i}({1000 * i + k})"
                         for k in range(result_chars // 40))
        add({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_read{i:04d}", "content": f"marker_{i}_start\n{body}"}]}})
        add({"type": "assistant", "message": {"id": f"msg_{i:04d}b", "role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_edit{i:04d}", "name": "Edit",
             "input": {"file_path": f, "old_string": "a", "new_string": "b"}}]}})
        add({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_edit{i:04d}", "content": "ok"}]}})
        add({"type": "assistant", "message": {"id": f"msg_{i:04d}c", "role": "assistant", "content": [
            {"type": "text", "text": f"Fixed {f}."}]}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return {"files": files, "calls": 3 * turns}


def run_eval(*args: str) -> dict[str, Any]:
    p = dagctx("eval", *args, "--json")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads(p.stdout)


def test_eval_cli_replays_a_transcript_and_reports_every_metric(tmp_path: Path) -> None:
    src = tmp_path / "session.jsonl"
    known = claude_code_session(src, turns=10)
    doc = run_eval(str(src), "--window", "8k", "--plots", str(tmp_path / "plots"))
    assert doc["summarizer"].startswith("stand-in")
    (s,) = doc["sessions"]
    assert s["modelCalls"] == known["calls"]
    (w,) = s["windows"]
    assert w["requests"] == known["calls"]
    # M4: nothing handed out over the window; the history (10 × 6,000 characters) needs management
    assert w["M4"]["maxOvershoot"] == 0 and w["M4"]["overshootRequests"] == 0
    assert w["M5"]["unmanaged"]["totals"]["served"] < known["calls"]
    # something was taken out of requests, and every identifier of it was found again
    assert w["M1"]["removed"] > 0
    assert w["M1"]["recall"] == 1.0, w["M1"]["lost"]
    # M7: every request handed out replays byte for byte
    assert w["M7"]["identical"] == w["M7"]["requests"] == w["requests"] - w["M4"]["refused"]
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "retention-by-class.svg" in plots and any(p.startswith("tokens-") for p in plots)
    svg = (tmp_path / "plots" / plots[-1]).read_text()
    assert svg.startswith("<svg") and "polyline" in svg


def test_eval_cli_refuses_bad_arguments(tmp_path: Path) -> None:
    p = dagctx("eval")
    assert p.returncode == 2 and "give transcript files" in p.stdout + p.stderr
    p = dagctx("eval", str(tmp_path / "missing.jsonl"))
    assert p.returncode == 2 and "no such file" in p.stdout + p.stderr
    src = tmp_path / "s.jsonl"
    claude_code_session(src, turns=1)
    p = dagctx("eval", str(src), "--window", "huge")
    assert p.returncode == 2 and "give tokens, e.g. 16k" in p.stdout + p.stderr
