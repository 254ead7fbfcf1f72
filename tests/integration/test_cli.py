"""The ``dagctx`` command line, run as a user runs it: subprocesses on a temporary database.

Each command spawns its own daemon and talks the protocol to it; these tests only see
exit codes, stdout and the files written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import corpus_dir, corpus_missing_reason

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def dagctx(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    env.pop("DAGCTX_DB", None)
    return subprocess.run(
        [sys.executable, "-P", "-m", "dagctx.cli", *args], capture_output=True, text=True, encoding="utf-8",
        timeout=timeout, env=env,
    )


def ok(*args: str) -> str:
    p = dagctx(*args)
    assert p.returncode == 0, (args, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout


def test_demo_runs_on_a_temporary_database() -> None:
    out = ok("demo")
    for needle in (
        "node/didAppend", "node/didUpdate", "run_migration", "running",  # the live running function
        "session/branches", "error",  # the failed reply and its retry fork
        "render 2", "stable prefix",
        "budget of the next turn", "history", "reserve", "toolResultsAged=",
        "stand-in summarizer (no LLM configured)", "compacted:", "budget after compaction",
        "refund rounding", "迁移",
        "claude-code:", "done in",
    ):
        assert needle in out, needle
    db = re.search(r"database: (\S+)", out)
    assert db and not Path(db.group(1)).exists()  # temporary, removed without --keep
    m = re.search(r"done in ([\d.]+) s", out)
    assert m and float(m.group(1)) < 60


def test_commands_on_the_demo_database(tmp_path: Path) -> None:
    db = str(tmp_path / "demo.db")
    out = ok("demo", "--db", db, "--keep", "--turns", "3")
    assert f"database kept at {db}" in out

    listing = ok("sessions", "--db", db)
    assert "1 sessions" in listing and "DECIMAL migration" in listing
    sid = UUID.search(listing).group(0)  # type: ignore[union-attr]

    hist = ok("history", sid[:8], "--db", db)  # a unique id prefix is enough
    assert "user" in hist and "llm" in hist and "gpt-4o" in hist and "数据库迁移脚本" in hist

    raw = json.loads(ok("render", sid, "--json", "--format", "anthropic", "--model", "claude-sonnet-4-5", "--db", db))
    assert raw["messages"] and raw["tokens"]["total"] > 0 and raw["manifest"]["format"] == "anthropic"
    pretty = ok("render", sid, "--db", db)
    assert "messages," in pretty and "tokens" in pretty

    hits = ok("search", "迁移", "--session", sid, "--db", db)
    assert "迁移" in hits and "hits for" in hits
    assert "refund" in ok("search", "refund rounding", "--db", db)

    stats = ok("stats", sid, "--model", "gpt-4o", "--db", db)
    for cat in ("system", "tools", "history", "summary", "reserve", "input used", "aging:", "spilled:"):
        assert cat in stats, cat
    assert re.search(r"summary\s+│\s+[1-9]", stats)  # the demo compacted: the summary has its own bar

    p = dagctx("compact", sid, "--db", db)
    assert p.returncode == 2 and "needs an LLM" in p.stdout

    jsonl = tmp_path / "session.jsonl"
    out = ok("export", sid, "--format", "claude-code", "-o", str(jsonl), "--db", db)
    assert "wrote" in out and jsonl.exists()
    lines = [json.loads(x) for x in jsonl.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["type"] == "summary" and {x["type"] for x in lines[1:]} >= {"user", "assistant"}
    doc = json.loads(ok("export", sid, "--format", "openai", "--db", db))
    assert doc["model"] == "gpt-4o" and doc["messages"][0]["role"] == "user"

    # the exported transcript imports into another database as a Claude Code session
    other = str(tmp_path / "other.db")
    imp = ok("import", str(jsonl), "--db", other)
    assert "created" in imp and "1 sessions" in imp
    again = ok("import", str(jsonl), "--db", other)
    assert "already present" in again

    missing = dagctx("history", "no-such-session", "--db", db)
    assert missing.returncode == 1 and "SessionNotFound" in missing.stdout


@pytest.mark.skipif(corpus_dir() is None, reason=corpus_missing_reason())
def test_import_reports_sessions_and_skipped_lines(tmp_path: Path) -> None:
    corpus = corpus_dir()
    assert corpus is not None
    db = str(tmp_path / "c.db")
    files = [str(corpus / "claude-code" / "short.jsonl"), str(corpus / "claude-code" / "general-tool-calls.jsonl")]
    out = ok("import", *files, "--db", db)
    assert "2 sessions" in out and out.count("created") >= 2
    assert "mix phx.server doesnt seem to start" in out
    assert "2 skipped lines" in out and "not JSON" in out
    assert re.search(r"│\s+1 │ not JSON", out) and re.search(r"│\s+2 │ not JSON", out)
    again = ok("import", files[0], "--db", db)
    assert "already present" in again and "created 0" in again
    assert "2 sessions" in ok("sessions", "--db", db)
    assert "phx.server" in ok("search", "phx.server", "--db", db)
