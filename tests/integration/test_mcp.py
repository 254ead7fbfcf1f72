"""``dagctx mcp`` driven by the official ``mcp`` SDK's own stdio client.

The MCP server is a real subprocess (newline-delimited JSON on stdio) that spawns a real
daemon on a real SQLite file; the session it serves is written first by a plain
``DagctxClient`` (another daemon on the same file, SPEC §4 "several processes").
The same checks run on ``mcp`` 1.26 inside the Hermes virtualenv (test_hermes.py), so
they read the SDK's results through ``field`` (``is_error`` in 2.x, ``isError`` in 1.x).
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

from dagctx.cli.mcp_tools import ANSWER_CHARS
from dagctx.client import DagctxClient

TOOLS = ["search_history", "read_node", "expand_summary", "list_sessions", "session_history", "context_stats",
         "memory_search", "memory_get"]
SENTENCE = "我们明天开始数据库迁移脚本的评审，请先准备好回滚方案。"


@asynccontextmanager
async def mcp_session(db: Path | None, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
    # The SDK hands the server only a minimal environment unless told otherwise; pass ours,
    # so the daemon choice (standalone, a private runtime dir) is this run's, not the user's.
    argv = ["-P", "-m", "dagctx.cli", "mcp", *(["--db", str(db)] if db is not None else []), *args]
    params = StdioServerParameters(command=sys.executable, args=argv, env=dict(os.environ) if env is None else env)
    async with stdio_client(params) as streams, ClientSession(*streams) as session:
        session.init_result = await session.initialize()  # type: ignore[attr-defined]
        yield session


def field(obj: Any, name: str) -> Any:
    """An SDK result's field: snake_case (mcp 2.x) or camelCase (mcp 1.x)."""
    if hasattr(obj, name):
        return getattr(obj, name)
    head, *rest = name.split("_")
    return getattr(obj, head + "".join(w.title() for w in rest))


#: one answer's text: the bound plus the few lines of headers and notes around a page
BOUND = ANSWER_CHARS + 1000


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> tuple[bool, Any, str]:
    res = await session.call_tool(name, args)
    text = res.content[0].text  # type: ignore[union-attr]
    assert len(text) <= BOUND, (name, args, len(text))
    return field(res, "is_error"), field(res, "structured_content"), text


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
        # two turns of 40k characters each (the two turns that once came to 88k in one answer)
        big_turns: dict[str, str] = {}  # node id → the whole text (a spilled node's get is a preview)
        head = llm.head
        for i in range(2):
            paste = f"Paste {i}:\n" + "".join(f"{i}-{k:05d} pasted log line\n" for k in range(1900))
            review = f"Reviewed paste {i}. " + "ok " * 13000
            u = await c.append(sid, "user", output=paste, predecessor=head)
            r = await c.append(sid, "llm", name="gpt-4o", output=review, predecessor=u.head)
            head = r.head
            big_turns.update({u.node.id: paste, r.node.id: review})
        for i in range(8):
            u = await c.append(sid, "user", output=f"Turn {i}: please refactor module_{i}.py " + "details " * 300,
                               predecessor=head)
            r = await c.append(sid, "llm", name="gpt-4o", output=f"Refactored module_{i}.py " + "done " * 300,
                               predecessor=u.head)
            head = r.head
        comp = await c.compact(sid, model="gpt-4o", keep_recent_tokens=900, fallback="structural")
        assert comp.ok and comp.summary_id, comp
        covered = (await c.get_nodes(sid, comp.covers_ids)).nodes
        assert set(big_turns) <= set(comp.covers_ids)
        return {"sid": sid, "tool": tool.node.id, "big": big, "summary": comp.summary_id, "big_turns": big_turns,
                "covered": [(n.id, big_turns.get(n.id, n.output)) for n in covered], "nodes": (await c.session_get(sid)).node_count}
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
        # initialize says which database and which daemon this server serves
        instructions = s.init_result.instructions  # type: ignore[attr-defined]
        assert f"Database: {world['db']} (from --db)." in instructions, instructions
        assert "Daemon: a private daemon this server started (dagctx " in instructions, instructions
        listed = await s.list_tools()
        assert [t.name for t in listed.tools] == TOOLS
        for t in listed.tools:
            schema = field(t, "input_schema")
            assert schema["type"] == "object" and schema["additionalProperties"] is False
            assert all(k[0].islower() and "_" not in k for k in schema["properties"]), "camelCase args"
            # no tool chooses a database or a folder; memory_get's path is a memory file relative to
            # the workspace chosen at start (checked below: anything else is refused)
            assert not any(("path" in k.lower() and t.name != "memory_get") or k in ("db", "database", "file",
                                                                                       "workspace")
                           for k in schema["properties"]), "no path-taking tool"

        # a Chinese word inside an unspaced sentence
        err, out, text = await call(s, "search_history", {"query": "迁移", "sessionId": sid})
        assert not err, text
        assert out["hits"] and out["hits"][0]["sessionId"] == sid
        assert any("迁移" in h["snippet"] for h in out["hits"])
        # the text is for a model: plain text with headers, not JSON; the structure is for programs
        assert text.startswith(f'# search_history "迁移" in session {sid}: hits 1–'), text[:200]
        assert all(f"node {h['nodeId']}" in text and h["snippet"] in text for h in out["hits"])
        with pytest.raises(ValueError):
            json.loads(text)
        assert "\\n" not in text and '\\"' not in text, "nothing escaped"
        # paged: one hit per page, the pages together are the hits of one big call
        all_hits = out["hits"]
        cursor, paged = None, []
        while True:
            err, page, text = await call(s, "search_history", {"query": "迁移", "sessionId": sid, "limit": 1,
                                                               **({"cursor": cursor} if cursor else {})})
            assert not err, text
            paged += page["hits"]
            cursor = page["nextCursor"]
            if cursor is None:
                break
            assert f'cursor "{cursor}"' in text
        assert [h["nodeId"] for h in paged] == [h["nodeId"] for h in all_hits]
        # no hits: an empty result, not an error
        err, out, text = await call(s, "search_history", {"query": "zzyzxnotthere"})
        assert not err and out["hits"] == [] and text.endswith("in every session: no hits")

        # a spilled output, by range over the whole output
        big = world["big"]
        err, out, text = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"],
                                                     "offset": 50000, "length": 1234})
        assert not err, text
        assert out["spilled"] is True and out["totalChars"] == len(big)
        assert out["text"] == big[50000:51234]
        assert out["nextOffset"] == 51234
        assert f"## output, characters 50000–51234 of {len(big)}" in text and big[50000:51234] in text
        assert "## input\n{\"cmd\": \"cat migrate.log\"}" in text and "More: call read_node again with offset 51234" in text
        # the whole output, page by page, each answer within the bound
        whole, offset = "", 0
        while offset is not None:
            err, page, text = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"], "offset": offset})
            assert not err, text
            whole += page["text"]
            offset = page["nextOffset"]
        assert whole == big
        err, _, text = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"], "length": 200000})
        assert err and "length" in text
        err, page, text = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"], "part": "input"})
        assert not err and page["text"] == '{"cmd": "cat migrate.log"}' and page["nextOffset"] is None
        err, out, _ = await call(s, "read_node", {"sessionId": sid, "nodeId": world["tool"],
                                                  "offset": len(big) - 10})
        assert out["text"] == big[-10:] and out["nextOffset"] is None

        # expand the summary: the covered turns in order, paged, every answer within the bound
        covered = dict(world["covered"])
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
            got += [(t["nodeId"], t["text"] if not t.get("truncated") else covered[t["nodeId"]])
                    for t in out["turns"]]
            for t in out["turns"]:
                if t.get("truncated"):  # cut: the start verbatim, read_node gives the rest
                    assert covered[t["nodeId"]].startswith(t["text"]) and t["textChars"] == len(covered[t["nodeId"]])
                    assert f"read_node sessionId {sid} nodeId {t['nodeId']} for the rest" in text
                    whole, offset = "", 0
                    while offset is not None:
                        _, part, _ = await call(s, "read_node", {"sessionId": sid, "nodeId": t["nodeId"],
                                                                 "offset": offset})
                        whole, offset = whole + part["text"], part["nextOffset"]
                    assert whole == covered[t["nodeId"]]
                assert f"node {t['nodeId']}" in text
            calls += [c for t in out["turns"] for c in t["calls"]]
            pages += 1
            cursor = out["nextCursor"]
            if cursor is None:
                break
        assert got == world["covered"]
        # the tool call of the first turn comes with it: input as recorded, output cut, its size said
        assert [c["nodeId"] for c in calls] == [world["tool"]]
        assert calls[0]["input"] == '{"cmd": "cat migrate.log"}' and calls[0]["spilled"] is True
        assert calls[0]["text"] == world["big"][:1500] and calls[0]["textChars"] == len(world["big"])
        assert pages >= -(-len(world["covered"]) // 3)
        # the two 40k turns (88k in one answer before) come cut, and at the default page size
        # every page stays within the bound
        assert set(world["big_turns"]) <= {nid for nid, _ in got}
        cursor, seen = None, []
        while True:
            err, out, text = await call(s, "expand_summary", {"sessionId": sid, "nodeId": world["summary"],
                                                              **({"cursor": cursor} if cursor else {})})
            assert not err, text
            seen += [t["nodeId"] for t in out["turns"]]
            cursor = out["nextCursor"]
            if cursor is None:
                break
        assert seen == [nid for nid, _ in world["covered"]]

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
            # the message, then which database and daemon this server serves
            assert text.startswith(out["error"]["message"]) and out["error"]["kind"]
            assert f"Database: {world['db']} (from --db)" in text, text
        # sessions as resources
        res = await s.list_resources()
        assert [str(r.uri) for r in res.resources] == [f"dagctx://session/{sid}"]
        assert res.resources[0].name == "mcp test"
        templates = field(await s.list_resource_templates(), "resource_templates")
        assert field(templates[0], "uri_template") == "dagctx://session/{sessionId}"
        body = (await s.read_resource(f"dagctx://session/{sid}")).contents[0].text  # type: ignore[union-attr]
        assert body.startswith("# mcp test") and SENTENCE in body
        with pytest.raises(Exception, match="does not exist"):
            await s.read_resource("dagctx://session/nope")

        unknown = await s.call_tool("no_such_tool", {})
        assert field(unknown, "is_error") and "the tools are" in unknown.content[0].text  # type: ignore[union-attr]
        err, out, _ = await call(s, "search_history", {"query": "迁移"})
        assert not err and out["hits"], "the daemon is alive after the errors"

    # the tools wrote nothing
    c = await DagctxClient.spawn(world["db"])
    try:
        assert (await c.session_get(sid)).node_count == world["nodes"]
    finally:
        await c.close()


async def test_a_minimal_environment_is_named_not_silently_followed(tmp_path: Path) -> None:
    """An MCP host that starts ``dagctx mcp`` with a bare environment (no DAGCTX_DB, no
    XDG_RUNTIME_DIR): initialize's instructions and every error say which database and which
    daemon that gave, and why; ``--db``/``--socket`` in the server's args choose explicitly."""
    import subprocess
    import tempfile

    home = tmp_path / "home"
    home.mkdir()
    short = Path(tempfile.mkdtemp(prefix="mcpenv", dir="/tmp"))  # socket paths must stay short
    # what a host passes: PATH and HOME (TMPDIR only keeps this test's daemon out of the real /tmp)
    bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(short)}
    db = tmp_path / "chosen.db"
    c = await DagctxClient.spawn(db, standalone=True)
    try:
        made = await c.session_create("the chosen database")
    finally:
        await c.close()
    sock = short / "explicit.sock"
    try:
        async with mcp_session(None, env=bare) as s:
            text = s.init_result.instructions  # type: ignore[attr-defined]
            default_db = home / ".local" / "share" / "dagctx" / "dagctx.db"
            assert f"Database: {default_db} (the default: neither --db nor DAGCTX_DB reached this server" in text
            assert f"socket {short}/dagctx-{os.getuid()}/" in text and "XDG_RUNTIME_DIR is not set here" in text
            err, out, msg = await call(s, "session_history", {"sessionId": made.session_id})
            assert err and made.session_id in msg and f"Database: {default_db} (the default" in msg, msg
        async with mcp_session(db, env=bare, args=("--socket", str(sock))) as s:
            text = s.init_result.instructions  # type: ignore[attr-defined]
            assert f"Database: {db} (from --db)" in text and f"socket {sock} (from --socket" in text, text
            err, out, msg = await call(s, "list_sessions", {})
            assert not err and [x["sessionId"] for x in out["sessions"]] == [made.session_id], msg
    finally:
        for path in [sock, *short.glob("dagctx-*/*.sock")]:
            subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop", "--socket", str(path)],
                           env=bare, capture_output=True, timeout=30)


async def test_memory_tools_over_the_sdk_stdio_client(tmp_path: Path) -> None:
    """memory_search / memory_get (SPEC §5.1) through the SDK's client: the workspace is chosen
    at start (--workspace), the index is brought up to date before each search (an edit is
    found at once), reads page by lines, and every way out of the workspace is refused."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe user prefers tabs over spaces.\n")
    (ws / "memory" / "2026-11-30.md").write_text(
        "# Cache\n\nWe decided the cache eviction policy is LRU with a 256 MiB bound.\n\n"
        "# Deploy\n\nDeploys go out on Tuesdays.\n")
    (ws / "memory" / "long.md").write_text("".join(f"line {i:05d} " + "x" * 90 + "\n" for i in range(1, 3001)))
    (tmp_path / "secret.md").write_text("top secret\n")
    (ws / "memory" / "escape.md").symlink_to(tmp_path / "secret.md")
    (ws / "memory" / "binary.md").write_bytes(b"\x00\x01garbage")
    db = tmp_path / "m.db"
    async with mcp_session(db, args=("--workspace", str(ws))) as s:
        instructions = s.init_result.instructions  # type: ignore[attr-defined]
        assert f"Memory workspace: {ws} (from --workspace)." in instructions, instructions

        err, out, text = await call(s, "memory_search", {"query": "what did we decide about the cache eviction policy?"})
        assert not err, text
        assert out["keywords"] and "cache" in out["keywords"] and "what" not in out["keywords"]
        top = out["hits"][0]
        assert top["path"] == "memory/2026-11-30.md" and top["startLine"] == 1 and "LRU" in top["text"]
        assert text.startswith('# memory_search "what did we decide about the cache eviction policy?"'), text[:200]
        assert f"memory/2026-11-30.md lines {top['startLine']}–{top['endLine']} · chunkId {top['chunkId']}" in text
        # what was not indexed is said, with why
        assert any("escape.md" in n for n in out["notIndexed"]) and any("binary.md" in n for n in out["notIndexed"])
        assert "Not indexed (2):" in text and "top secret" not in text

        # an edit is searchable at the next call (incremental re-index before each search)
        err, out, _ = await call(s, "memory_search", {"query": "kubernetes"})
        assert not err and out["hits"] == []
        (ws / "memory" / "infra.md").write_text("We run everything on kubernetes since March.\n")
        err, out, _ = await call(s, "memory_search", {"query": "kubernetes"})
        assert not err and [h["path"] for h in out["hits"]] == ["memory/infra.md"]

        # a chunk by id, then a file by lines
        err, got, text = await call(s, "memory_get", {"chunkId": top["chunkId"]})
        assert not err, text
        assert got["path"] == "memory/2026-11-30.md" and "LRU with a 256 MiB bound" in got["text"]
        assert got["nextFromLine"] is None and got["chunkId"] == top["chunkId"]
        err, got, text = await call(s, "memory_get", {"path": "MEMORY.md", "fromLine": 3, "lines": 1})
        assert not err and got["text"] == "The user prefers tabs over spaces." and got["startLine"] == 3
        assert text.startswith("# memory_get MEMORY.md lines 3–3 of 3"), text
        # a long file comes in pages within the bound; the pages together are the file
        pages, nxt, whole = 0, 1, []
        while nxt is not None:
            err, got, text = await call(s, "memory_get", {"path": "memory/long.md", "fromLine": nxt})
            assert not err, text
            whole.append(got["text"])
            nxt = got["nextFromLine"]
            pages += 1
            if nxt is not None:
                assert f'fromLine {nxt}.' in text
        assert "\n".join(whole) + "\n" == (ws / "memory" / "long.md").read_text() and pages > 3

        bad = [
            ("memory_get", {"path": "../secret.md"}, "WorkspaceEscape"),
            ("memory_get", {"path": str(tmp_path / "secret.md")}, "WorkspaceEscape"),
            ("memory_get", {"path": "memory/escape.md"}, "WorkspaceEscape"),
            ("memory_get", {"path": "pyproject.toml"}, "InvalidParams"),
            ("memory_get", {"chunkId": "nope"}, "ChunkNotFound"),
            ("memory_get", {}, "InvalidParams"),
            ("memory_get", {"chunkId": top["chunkId"], "path": "MEMORY.md"}, "InvalidParams"),
            ("memory_get", {"path": "MEMORY.md", "fromLine": 99}, "InvalidParams"),
            ("memory_search", {"query": ""}, "InvalidParams"),
            ("memory_search", {"query": "x", "sources": ["files"]}, "InvalidParams"),
            ("memory_search", {"query": "x", "workspace": "/"}, "InvalidParams"),
        ]
        for name, args, kind in bad:
            err, out, text = await call(s, name, args)
            assert err and out["error"]["kind"] == kind, (name, args, out, text)
            assert "top secret" not in text
        err, out, _ = await call(s, "memory_search", {"query": "tabs", "sources": ["memory", "sessions"]})
        assert not err and out["hits"][0]["path"] == "MEMORY.md", "the daemon is alive after the errors"
