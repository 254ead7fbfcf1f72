"""The agent-loop examples (examples/python, examples/typescript) against a loopback stub of
the OpenAI chat completions API that returns scripted tool calls, on a real daemon.

Two tasks in one session with a 24k window (``--context-window``); the stub reports
the prompt's real size. The examples compact only when ``context/prepare`` recommends it,
and not again in a turn where a compaction found nothing to fold: task one's 35k-character
file makes prepare recommend it once (nothing to fold yet: one turn), task two's folds
task one into a summary (written by the same stub, called by the daemon).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_stub import ChatStub

from dagctx.client import DagctxClient

REPO = Path(__file__).resolve().parents[2]
TS_EXAMPLE = REPO / "examples" / "typescript"
BIG = "".join(f"def function_{i}(value):\n    return value * {i}  # step {i}\n" for i in range(700))


def script() -> list[dict[str, Any]]:
    return [
        {"content": "Writing the module.", "tool_calls": [("write_file", {"path": "src/calc.py", "content": BIG})]},
        {"content": None, "tool_calls": [("read_file", {"path": "src/calc.py"}), ("read_file", {"path": "nope.py"})]},
        {"content": "Task one done: src/calc.py has 700 functions."},
        {"content": None, "tool_calls": [("list_files", {})]},
        {"content": "Task two done: the workspace holds src/calc.py."},
    ]


def command(lang: str) -> list[str]:
    if lang == "python":
        return [sys.executable, "-P", str(REPO / "examples" / "python" / "agent.py")]
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("npm is required in CI (scripts/test.sh installs the Node packages)")
        pytest.skip("npm is not installed")
    ts_client = REPO / "clients" / "typescript"
    if not (ts_client / "dist" / "index.js").exists():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=ts_client, check=True, capture_output=True, timeout=300)
    if not (TS_EXAMPLE / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS_EXAMPLE, check=True, capture_output=True,
                       timeout=300)
    subprocess.run(["npm", "run", "--silent", "build"], cwd=TS_EXAMPLE, check=True, capture_output=True, timeout=300)
    return ["node", str(TS_EXAMPLE / "dist" / "agent.js")]


@pytest.mark.parametrize("lang", ["python", "typescript"])
def test_example_agent_loop(lang: str, tmp_path: Path) -> None:
    argv = command(lang)
    db, ws = tmp_path / "agent.db", tmp_path / "ws"
    stub = ChatStub(script())  # usage: the prompt's size
    env = {**os.environ, "EXAMPLE_KEY": "test-key",
           "DAGCTX_COMMAND": json.dumps([sys.executable, "-P", "-m", "dagctx.cli", "serve"])}
    common = ["--base-url", stub.base_url, "--model", "gpt-4o", "--api-key-env", "EXAMPLE_KEY",
              "--workspace", str(ws), "--db", str(db), "--keep-recent-tokens", "600",
              "--context-window", "24000"]
    try:
        one = subprocess.run(argv + common + ["Create src/calc.py"], env=env, capture_output=True, text=True,
                             timeout=180)
        assert one.returncode == 0, one.stdout + one.stderr
        sid = one.stdout.split()[1]
        two = subprocess.run(argv + common + ["--session", sid, "List the workspace"], env=env,
                             capture_output=True, text=True, timeout=180)
        assert two.returncode == 0, two.stdout + two.stderr
    finally:
        stub.close()

    assert "Task one done" in one.stdout and "Task two done" in two.stdout
    assert (ws / "src" / "calc.py").read_text() == BIG
    assert len(stub.agent_requests) == 5 and not stub.script
    assert all(a == "Bearer test-key" for a in stub.auth)
    # the second call saw the first call's tool result, paired with its call
    second = stub.agent_requests[1]["messages"]
    assert second[0]["role"] == "system"
    assert any(m["role"] == "tool" and m["tool_call_id"] == "call_1" and "wrote" in m["content"] for m in second)
    assert stub.agent_requests[1]["tools"][0]["function"]["name"] == "read_file"
    # the second task's compaction folded the first: a summary from the stub, a smaller prompt
    assert "compaction: summary" in two.stdout, two.stdout
    # compaction only when prepare recommends it, and a compaction that found nothing to fold
    # is not tried again that turn: every task compacts at most once for nothing
    for out in (one.stdout, two.stdout):
        attempts = [ln for ln in out.splitlines() if ln.strip().startswith("compaction:")]
        assert len([a for a in attempts if "summary" not in a]) <= 1, out
    assert two.stdout.count("compaction: summary") == 1, two.stdout
    assert stub.summary_requests
    last = stub.agent_requests[-1]["messages"]
    assert "[Previous conversation summary]" in json.dumps(last)
    assert BIG not in json.dumps(last)

    async def check() -> None:
        c = await DagctxClient.spawn(db)
        try:
            hist = (await c.history(sid)).nodes
            assert [n.output for n in hist if n.role == "user"] == ["Create src/calc.py", "List the workspace"]
            llms = [n for n in hist if n.role == "llm"]
            assert len(llms) == 5 and all(n.metadata.get("renderManifest") and n.reads for n in llms)
            hits = (await c.search("read_file OR write_file OR list_files", session_id=sid, roles=["code"])).hits
            codes = (await c.get_nodes(sid, [h.node_id for h in hits])).nodes
            assert sorted(n.status for n in codes) == ["completed", "completed", "completed", "error"]
            assert all(n.metadata.get("toolCallId", "").startswith("call_") for n in codes)
            prep = await c.prepare(sid, model="gpt-4o", prompt_mode="none")
            assert prep.summary_id is not None
        finally:
            await c.close()

    asyncio.run(check())
