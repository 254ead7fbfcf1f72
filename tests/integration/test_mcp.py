"""``dagctx mcp`` driven by the official ``mcp`` SDK's own stdio client.

The MCP server is a real subprocess (newline-delimited JSON on stdio) that spawns a real
daemon on a real SQLite file; the session it serves is written first by a plain
``DagctxClient`` (another daemon on the same file, SPEC §4 "several processes").
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from dagctx.client import DagctxClient

TOOLS = ["search_history", "read_node", "expand_summary", "list_sessions", "session_history", "context_stats"]
SENTENCE = "我们明天开始数据库迁移脚本的评审，请先准备好回滚方案。"


@asynccontextmanager
async def mcp_session(db: Path):
    # The SDK hands the server only a minimal environment unless told otherwise; pass ours,
    # so the daemon choice (standalone, a private runtime dir) is this run's, not the user's.
    params = StdioServerParameters(command=sys.executable, args=["-P", "-m", "dagctx.cli", "mcp", "--db", str(db)],
                                    env=dict(os.environ))
    async with stdio_client(params) as streams, ClientSession(*streams) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> tuple[bool, Any, str]:
    res = await session.call_tool(name, args)
    text = res.content[0].text  # type: ignore[union-attr]
    return res.is_error, res.structured_content, text


async def build(db: Path) -> dict[str, Any]:
    """A session: a Chinese turn, a spilled tool output, and enough turns to compact."""
    c = await DagctxClient.spawn(db)
    try:
        s = await c.session_create("mcp test")
        sid, head = s.session_id, s.head
        u = await c.append(sid, "user", output=SENTENCE, predecessor=head)
        llm = await c.append(sid, "llm", name="gpt-4o", output="好的，我先看看迁移脚本。", predecessor=u.head)
        big = "".join(f"line {i:05d} migration step ok\n" for i in range(3000))  # > 32k chars, > 100 lines
        tool = await c.append(sid, "code", name="bash", input={"cmd": "cat migrate.log"}, output=big,
                              caller=llm.node.id, metadata={"toolCallId": "call_1"})
        head = llm.head
        for i in range(8):
            u = await c.append(sid, "user", output=f"Turn {i}: please refactor module_{i}.py " + "details " * 300,
                               predecessor=head)
            r = await c.append(sid, "llm", name="gpt-4o", output=f"Refactored module_{i}.py " + "done " * 300,
                               predecessor=u.head)
            head = r.head
        comp = await c.compact(sid, model="gpt-4o", keep_recent_tokens=900, fallback="structural")
        assert comp.ok and comp.summary_id, comp
        covered = (await c.get_nodes(sid, comp.covers_ids)).nodes
        return {"sid": sid, "tool": tool.node.id, "big": big, "summary": comp.summary_id,
                "covered": [(n.id, n.output) for n in covered], "nodes": (await c.session_get(sid)).node_count}
    finally:
        await c.close()


@pytest.fixture
async def world(tmp_path: Path) -> dict[str, Any]:
    db = tmp_path / "mcp.db"
    w = await build(db)
    w["db"] = db
    return w


async def test_mcp_tools_over_the_sdk_stdio_client(world: dict[str, Any]) -> None:
    sid = world["sid"]
    async with mcp_session(world["db"]) as s:
        listed = await s.list_tools()
        assert [t.name for t in listed.tools] == TOOLS
        for t in listed.tools:
            assert t.input_schema["type"] == "object" and t.input_schema["additionalProperties"] is False
            assert all(k[0].islower() and "_" not in k for k in t.input_schema["properties"]), "camelCase args"
            assert not any("path" in k.lower() or k in ("db", "database", "file")
                           for k in t.input_schema["properties"]), "no path-taking tool"

        # a Chinese word inside an unspaced sentence
        err, out, text = await call(s, "search_history", {"query": "迁移", "sessionId": sid})
        assert not err, text
        assert out["hits"] and out["hits"][0]["sessionId"] == sid
        assert any("迁移" in h["snippet"] for h in out["hits"])
        assert json.loads(text) == out, "the text block is the structured content serialized"
        # no hits: an empty result, not an error
        err, out, _ = await call(s, "search_history", {"query": "zzyzxnotthere"})
        assert not err and out["hits"] == []

        # a spilled output, by range over the whole output
        big = world["big"]
        err, out, text = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"],
                                                     "offset": 50000, "length": 1234})
        assert not err, text
        assert out["spilled"] is True and out["totalChars"] == len(big)
        assert out["text"] == big[50000:51234]
        assert out["nextOffset"] == 51234
        err, out, _ = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"],
                                                  "offset": len(big) - 10})
        assert out["text"] == big[-10:] and out["nextOffset"] is None

        # expand the summary: exactly the covered turns' text, paged
        got: list[tuple[str, Any]] = []
        calls: list[dict[str, Any]] = []
        cursor = None
        pages = 0
        while True:
            args: dict[str, Any] = {"sessionId": sid, "nodeId": world["summary"], "limit": 3}
            if cursor:
                args["cursor"] = cursor
            err, out, text = await call(s, "expand_summary", args)
            assert not err, text
            got += [(t["nodeId"], t["text"]) for t in out["turns"]]
            calls += [c for t in out["turns"] for c in t["calls"]]
            pages += 1
            cursor = out["nextCursor"]
            if cursor is None:
                break
        assert got == world["covered"]
        # the tool call of the first turn comes with it, input and output as recorded
        assert [c["nodeId"] for c in calls] == [world["tool"]]
        assert calls[0]["input"] == '{"cmd": "cat migrate.log"}' and calls[0]["spilled"] is True
        assert calls[0]["text"].startswith(world["big"][:6000])
        assert pages == -(-len(world["covered"]) // 3)

        # history and sessions, paged with nextCursor
        err, out, _ = await call(s, "session_history", {"sessionId": sid, "limit": 4})
        assert not err and len(out["nodes"]) == 4 and out["nextCursor"]
        assert out["nodes"][0]["text"] == SENTENCE
        err, out2, _ = await call(s, "session_history", {"sessionId": sid, "limit": 4, "cursor": out["nextCursor"]})
        assert out2["nodes"][0]["seq"] > out["nodes"][-1]["seq"]
        err, out, _ = await call(s, "list_sessions", {})
        assert not err and [x["sessionId"] for x in out["sessions"]] == [sid] and out["nextCursor"] is None

        err, out, text = await call(s, "context_stats", {"sessionId": sid, "model": "gpt-4o"})
        assert not err, text
        assert out["budget"]["contextWindow"] == 128000 and out["summaryId"] == world["summary"]
        assert 0 < out["budget"]["inputUsed"] < out["budget"]["inputBudget"]

        # bad arguments → tool errors with clear messages; the daemon stays up
        bad = [
            ("search_history", {}, "'query' is a required property"),
            ("search_history", {"query": "x", "limit": 0}, "limit"),
            ("search_history", {"query": "x", "path": "/etc"}, "the arguments are"),
            ("search_history", {"query": "AND AND ("}, "query"),
            ("read_node", {"sessionId": sid, "nodeId": "no-such-node"}, "no-such-node"),
            ("read_node", {"sessionId": "no-such-session", "nodeId": "x"}, "no-such-session"),
            ("expand_summary", {"sessionId": sid, "nodeId": world["tool"]}, "not a compaction summary"),
            ("session_history", {"sessionId": sid, "cursor": "garbage!"}, "nextCursor"),
            ("context_stats", {"sessionId": "gone"}, "gone"),
            ("list_sessions", {"limit": "ten"}, "not of type 'integer'"),
        ]
        for name, args, needle in bad:
            err, out, text = await call(s, name, args)
            assert err, (name, args, text)
            assert needle in text, (name, args, text)
            assert out["error"]["message"] == text and out["error"]["kind"]
        # sessions as resources
        res = await s.list_resources()
        assert [str(r.uri) for r in res.resources] == [f"dagctx://session/{sid}"]
        assert res.resources[0].name == "mcp test"
        templates = await s.list_resource_templates()
        assert templates.resource_templates[0].uri_template == "dagctx://session/{sessionId}"
        body = (await s.read_resource(f"dagctx://session/{sid}")).contents[0].text  # type: ignore[union-attr]
        assert body.startswith("# mcp test") and SENTENCE in body
        with pytest.raises(Exception, match="does not exist"):
            await s.read_resource("dagctx://session/nope")

        unknown = await s.call_tool("no_such_tool", {})
        assert unknown.is_error and "the tools are" in unknown.content[0].text  # type: ignore[union-attr]
        err, out, _ = await call(s, "search_history", {"query": "迁移"})
        assert not err and out["hits"], "the daemon is alive after the errors"

    # the tools wrote nothing
    c = await DagctxClient.spawn(world["db"])
    try:
        assert (await c.session_get(sid)).node_count == world["nodes"]
    finally:
        await c.close()
