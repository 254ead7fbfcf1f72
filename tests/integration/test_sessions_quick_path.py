"""``dagctx sessions`` through the quick path and through the full command, against the
real shared daemon: the same bytes on stdout, and the quick path really skips the heavy
imports (``python -X importtime`` lists every module a process imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dagctx.client import DagctxClient

from test_shared_daemon import shared_env  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.slow


def dagctx(*args: str, quick: bool = True, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "160", "PYTHONIOENCODING": "utf-8"}
    env.pop("DAGCTX_DB", None)
    env["DAGCTX_CLI_QUICK"] = "1" if quick else "0"
    cmd = [sys.executable, "-P", *(["-X", "importtime"] if importtime else []), "-m", "dagctx.cli", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", timeout=120, env=env)
    assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
    return p


def imported(p: subprocess.CompletedProcess[str]) -> set[str]:
    return {line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}


async def test_sessions_is_the_same_through_the_quick_path_and_skips_the_heavy_imports(shared_env, tmp_path: Path) -> None:
    db = str(tmp_path / "quick.db")
    client = await DagctxClient.connect(db)
    try:
        for i, title in enumerate(["parser work", "a title far longer than the title column can show in a table", ""]):
            s = await client.session_create(title)
            await client.append(s.session_id, "user", output=f"turn {i}", predecessor=s.head)
    finally:
        await client.close()

    for args in (["--db", db, "sessions"], ["sessions", "--db", db, "--limit", "2"], ["--db", db, "sessions", "--json"]):
        fast, full = dagctx(*args, importtime=True), dagctx(*args, quick=False)
        assert fast.stdout == full.stdout, args
        mods = imported(fast)
        assert "dagctx.cli.quick" in mods and not {"rich", "asyncio", "msgspec", "argparse"} & mods, sorted(mods)
    listing = json.loads(fast.stdout)
    assert listing["total"] == 3 and len(listing["sessions"]) == 3
    assert "… 1 more (--limit)" in dagctx("--db", db, "sessions", "--limit", "2").stdout


async def test_what_the_quick_path_cannot_answer_exactly_goes_to_the_full_command(shared_env, tmp_path: Path) -> None:
    db = str(tmp_path / "wide.db")
    client = await DagctxClient.connect(db)
    try:
        s = await client.session_create("缓存淘汰策略")  # wide characters: rich measures them
        await client.append(s.session_id, "user", output="x", predecessor=s.head)
    finally:
        await client.close()
    fast = dagctx("--db", db, "sessions", importtime=True)
    assert "缓存淘汰策略" in fast.stdout and "rich" in imported(fast)
    assert fast.stdout == dagctx("--db", db, "sessions", quick=False).stdout
    # an option of the full command only
    src = dagctx("--db", db, "sessions", "--source", "native", importtime=True)
    assert "1 sessions from native" in src.stdout and "rich" in imported(src)


async def test_show_is_the_same_through_the_quick_path_and_skips_the_heavy_imports(shared_env, tmp_path: Path) -> None:
    db = str(tmp_path / "show.db")
    client = await DagctxClient.connect(db)
    try:
        s = await client.session_create("show me")
        u = await client.append(s.session_id, "user", output="Read src/app.py and fix parse_config",
                                predecessor=s.head, id="u-4f2a9c")
        llm = await client.append(s.session_id, "llm", name="gpt-5", output="Reading it.", predecessor=u.node.id,
                                  id="l-7b31d0", metadata={"usage": {"input": 1200, "output": 40}, "latency": 0.25,
                                                           "signature": "Q" * 400})
        await client.append(s.session_id, "code", name="read_file", input={"path": "src/app.py", "lines": [1, 200]},
                            output="def parse_config(path):\n    return {}\n" * 40, caller=llm.node.id,
                            id="l-7b31d0-call", metadata={"toolCallId": "call_1"})
    finally:
        await client.close()

    # "l-7b31d0" is a whole id and the prefix of another: the exact one is shown
    for args in (["--db", db, "show", "u-4f2"], ["show", "l-7b31d0", "--db", db],
                 ["--db", db, "show", "l-7b31d0-c", "--json"], ["--db", db, "show", "l-7b31d0-call"]):
        fast, full = dagctx(*args, importtime=True), dagctx(*args, quick=False)
        assert fast.stdout == full.stdout, args
        mods = imported(fast)
        assert "dagctx.cli.quick" in mods and not {"rich", "asyncio", "msgspec", "argparse"} & mods, args
    assert json.loads(dagctx("--db", db, "show", "l-7b31d0-c", "--json").stdout)["input"]["path"] == "src/app.py"
    assert "parse_config" in dagctx("--db", db, "show", "l-7b31d0-c").stdout

    # what it cannot answer exactly goes to the full command: an ambiguous prefix (an error
    # in words, exit 1), a session named by --session
    amb = subprocess.run([sys.executable, "-P", "-X", "importtime", "-m", "dagctx.cli", "--db", db, "show", "l-7"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"}, timeout=120)
    assert amb.returncode == 1 and "ambiguous" in amb.stdout + amb.stderr and "rich" in imported(amb)
    scoped = dagctx("--db", db, "show", "u-4f2", "--session", s.session_id, importtime=True)
    assert "rich" in imported(scoped) and scoped.stdout == dagctx("--db", db, "show", "u-4f2").stdout
