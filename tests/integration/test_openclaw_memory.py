"""dagctx as OpenClaw's memory plugin (``plugins.slots.memory: "dagctx"``) inside a real
gateway (Node ≥ 24, the pinned `openclaw`, the plugin installed by `openclaw plugins
install`): OpenClaw offers dagctx's ``memory_search`` and ``memory_get`` as the agent's memory
tools, runs the model's calls through them, and hands the answers (chunks of the workspace's
memory files, from dagctx's index) back to the model; a path out of the workspace is refused.
Read from the requests the model received, the gateway's log and the dagctx database."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from conftest import short_tempdir
from openclaw_gateway import Gateway, ModelStub, SharedDaemon, installed_and_running, node_or_skip, text_of

from dagctx.client import DagctxClient

QUERY = "what did we decide about the quartz rollout window?"


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
    node = node_or_skip()
    root = tmp_path_factory.mktemp("openclaw-memory")
    daemon = SharedDaemon.make(root, short_tempdir("ocm-"))
    stub = ModelStub(script)
    gw = Gateway(root, node, stub, dagctx_command=[str(daemon.launcher)], env=daemon.env, daemon_env=daemon.env,
                 memory_slot="dagctx")
    (gw.workspace / "memory").mkdir(parents=True, exist_ok=True)
    (gw.workspace / "memory" / "decisions.md").write_text(
        "# Decisions\n\nThe quartz rollout window is Tuesday 10:00 UTC, after the freeze.\n")
    (root / "secret.md").write_text("top secret\n")
    with installed_and_running(gw, daemon):
        yield gw, stub, daemon.env


def test_openclaw_uses_dagctx_as_its_memory_tools(gateway) -> None:
    gw, stub, env = gateway
    out = gw.turn("What did we decide about the quartz rollout?")
    assert out["choices"][0]["message"]["content"] == "The quartz rollout window is Tuesday 10:00 UTC."
    log = gw.log_text()
    assert "plugin tool name conflict" not in log, [ln for ln in log.splitlines() if "conflict" in ln][:3]
    # the turn ran on dagctx: OpenClaw logs every turn it degraded to its legacy engine
    assert "degraded to" not in log, [ln for ln in log.splitlines() if "degraded to" in ln][:3]
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
