"""The ``dagctx`` command line, run as a user runs it: subprocesses on a temporary database.

The commands share one daemon, as a user's do (``module_shared_daemon``: the first command
starts it, the others connect to it); the Ctrl-C test runs its commands standalone, each with
a private daemon. These tests only see exit codes, stdout and the files written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import corpus_dir

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """Every command of this module goes to the module's shared daemon."""


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


@pytest.mark.corpus
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


def _claude_code_file(path: Path) -> Path:
    rows = [
        {"parentUuid": None, "sessionId": "cli-1", "type": "user", "uuid": "u1", "timestamp": "2026-03-01T10:00:00Z",
         "message": {"role": "user", "content": "Rename parse_config"}},
        {"parentUuid": "u1", "sessionId": "cli-1", "type": "assistant", "uuid": "a1",
         "timestamp": "2026-03-01T10:00:05Z",
         "message": {"id": "m1", "role": "assistant", "model": "claude-sonnet-4-5",
                     "content": [{"type": "text", "text": "Renamed it. " + "details " * 40000}]}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_global_options_export_delete_show_and_sentences(tmp_path: Path) -> None:
    db = str(tmp_path / "g.db")
    out = ok("--version")
    assert re.fullmatch(r"dagctx \d+\.\d+\.\d+ \(protocol \d+\.\d+\)\n", out)
    src = _claude_code_file(tmp_path / "cli-1.jsonl")
    ok("--db", db, "--log-level", "INFO", "import", str(src))  # global options before the subcommand
    listed = ok("sessions", "--db", db)  # and after it
    sid = UUID.search(listed).group(0)  # type: ignore[union-attr]
    assert "claude-code" in ok("--db", db, "sessions", "--source", "claude-code")
    assert "0 sessions from codex" in ok("--db", db, "sessions", "--source", "codex")
    # export defaults its format; refuses to replace a file unless --force
    target = tmp_path / "out.jsonl"
    ok("--db", db, "export", sid[:8], "-o", str(target))
    first = json.loads(target.read_text(encoding="utf-8").splitlines()[0])
    assert first["dagctxSource"]["sessionId"] == sid
    again = dagctx("--db", db, "export", sid[:8], "-o", str(target))
    assert again.returncode == 1 and "already exists" in again.stdout and "--force" in again.stdout
    ok("--db", db, "export", sid[:8], "-o", str(target), "--force", "--all-branches")
    assert "already present" in ok("--db", db, "import", str(target))
    # show prints one node in full (the whole output of a spilled node)
    shown = ok("--db", db, "show", "a1")
    assert "Renamed it." in shown and shown.count("details") == 40000
    assert "role" in ok("--db", db, "show", "u", "--session", sid[:6])
    missing = dagctx("--db", db, "show", "zz-none")
    assert missing.returncode == 1 and missing.stdout.startswith("error: Node 'zz-none': no node id starts with it")
    assert missing.stdout.rstrip().endswith("(NodeNotFound)")
    # a wrong format writes nothing and exits non-zero
    bad = dagctx("--db", db, "import", "--format", "sharegpt", str(src))
    assert bad.returncode == 1 and "not imported" in bad.stdout and "No conversation found" in bad.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = dagctx("--db", db, "import", str(empty))
    assert nothing.returncode == 1 and "No transcripts found in" in nothing.stdout
    assert "1 sessions in" in ok("--db", db, "sessions")
    deleted = ok("--db", db, "delete", sid[:8])
    assert deleted.startswith(f"Deleted session {sid}") and "(3 nodes)" in deleted
    assert "0 sessions in" in ok("--db", db, "sessions")


def test_ctrl_c_during_import_says_what_was_written_and_a_rerun_resumes(tmp_path: Path) -> None:
    import signal
    import sqlite3
    import time

    folder = tmp_path / "many"
    folder.mkdir()
    for f in range(16):
        with (folder / f"f{f:02d}.jsonl").open("w", encoding="utf-8") as fh:
            for i in range(150):
                fh.write(json.dumps({"conversations": [{"from": "human", "value": f"file {f} question {i}"},
                                                       {"from": "gpt", "value": "answer " * 50}]}) + "\n")
    db = tmp_path / "c.db"
    # standalone: the interrupted command's own daemon writes the import (in shared mode the
    # daemon is another process group's, and Ctrl-C reaches the command alone)
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8", "DAGCTX_STANDALONE": "1"}
    proc = subprocess.Popen([sys.executable, "-P", "-m", "dagctx.cli", "--db", str(db), "import", str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    count = 0
    while time.time() < deadline and count < 50:
        time.sleep(0.05)
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                count = con.execute("SELECT count(*) FROM sessions").fetchone()[0]
        except sqlite3.Error:
            continue
    assert proc.poll() is None, "the import finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    m = re.search(r"Interrupted: ([\d,]+) sessions were written before the interrupt", out)
    assert m and "Run the same command again to resume" in out, out[-2000:]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        kept = con.execute("SELECT count(*) FROM sessions").fetchone()[0]
    assert kept >= 50 and kept < 16 * 150
    rerun = ok("--db", str(db), "import", str(folder), "--standalone")
    totals = re.search(r"created (\d+), already present (\d+)", rerun)
    assert totals and int(totals.group(1)) + int(totals.group(2)) == 16 * 150
    assert int(totals.group(2)) >= kept - 1  # at most the session being written when interrupted differs


def test_json_on_every_command_that_prints_data(tmp_path: Path) -> None:
    """``--json``, as gh has it: stdout is one JSON document (camelCase, the protocol's
    names), words and progress go to stderr; the exit codes stay those of the command."""
    db = str(tmp_path / "j.db")
    ok("demo", "--db", db, "--keep", "--turns", "2")

    def js(*args: str, code: int = 0) -> Any:
        p = dagctx(*args, "--json", "--db", db)
        assert p.returncode == code, (args, p.stdout[-2000:], p.stderr[-2000:])
        return json.loads(p.stdout)  # nothing but the document on stdout

    listing = js("sessions")
    assert listing["total"] == 1 and listing["sessions"][0]["title"]
    sid = listing["sessions"][0]["sessionId"]
    hist = js("history", sid[:8])
    assert hist["head"] and [n["role"] for n in hist["nodes"]][:2] == ["user", "llm"]
    node = js("show", hist["nodes"][0]["id"][:10])
    assert node["id"] == hist["nodes"][0]["id"] and node["role"] == "user"
    hits = js("search", "迁移", "--session", sid)
    assert hits["hits"] and all(h["sessionId"] == sid for h in hits["hits"])
    stats = js("stats", sid, "--model", "gpt-4o")
    assert stats["budget"]["contextWindow"] == 128000 and stats["decisionPath"] and stats["summaryId"]
    assert js("render", sid, "--format", "openai")["messages"]
    compact = js("compact", sid, "--fallback", "structural", "--model", "gpt-4o", code=0)
    assert compact["ok"] is True and "tokensBefore" in compact
    out = tmp_path / "s.jsonl"
    exported = js("export", sid, "-o", str(out))
    assert exported["path"] == str(out) and exported["lines"] > 0 and out.exists()
    other = str(tmp_path / "other.db")
    p = dagctx("import", str(out), "--json", "--db", other)
    assert p.returncode == 0, p.stderr
    imported = json.loads(p.stdout)
    assert len(imported["sessions"]) == 1 and imported["sessions"][0]["path"] == str(out)
    assert imported["failed"] == [] and "skipped" in imported
    copy = str(tmp_path / "copy.db")
    p = dagctx("migrate", "--from", db, "--to", copy, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["sessions"] == 1
    deleted = js("delete", sid, "--yes")
    assert deleted == {"sessionId": sid, "title": listing["sessions"][0]["title"],
                       "nodesRemoved": deleted["nodesRemoved"]} and deleted["nodesRemoved"] > 0
    assert js("sessions")["total"] == 0
    # an error: words on stderr, nothing on stdout, the command's exit code
    p = dagctx("history", "no-such-session", "--json", "--db", db)
    assert p.returncode == 1 and p.stdout == "" and "SessionNotFound" in p.stderr
