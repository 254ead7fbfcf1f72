"""``dagctx mcp``: the daemon's history as MCP tools, for any MCP-capable agent.

An agent whose own context was compacted (Claude Code, Codex, Gemini CLI, Cursor …)
can search every past session, read a node whole (a spilled tool output by character
range), expand a summary back into the turns it covers, verbatim, and see its budget.

Transport: MCP over stdio — newline-delimited JSON-RPC, as the MCP spec's stdio
transport requires, served by the official ``mcp`` SDK's low-level ``Server``. Behind
it this process is a client of the dagctx daemon like any editor (``DagctxClient.spawn``,
LSP framing, SPEC §1), so it follows whatever daemon the client's spawn default starts.

Why the low-level server and not a decorator framework: the tool list order, the
input schemas and the error texts are part of our contract, written out once (mcp_tools).
Every tool is read-only and none takes a filesystem path: an MCP client may be driven
by a model, and a model must not choose which database or file this process opens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import asynccontextmanager
from typing import Any

from dagctx.cli.mcp_tools import SESSION_URI, TOOLS, HistoryTools, ToolError

SERVER_NAME = "dagctx"


# ---------------------------------------------------------------- the MCP server


def build_server(tools: HistoryTools) -> Any:
    """The MCP server (official SDK, low-level API) exposing ``tools``."""
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.shared.exceptions import MCPError

    from dagctx.protocol.version import __version__

    listed = [types.Tool(name=name, description=desc, input_schema=schema,
                         annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
              for name, (desc, schema) in TOOLS.items()]

    async def list_tools(_ctx: Any, _params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(_ctx: Any, params: Any) -> Any:
        try:
            result = await tools.call(params.name, params.arguments)
        except ToolError as exc:
            body = {"error": {"kind": exc.kind, "message": exc.message}}
            return types.CallToolResult(content=[types.TextContent(text=exc.message)], structured_content=body,
                                        is_error=True)
        except (ConnectionError, OSError) as exc:
            msg = f"the dagctx daemon is not reachable ({exc}); the next call starts it again"
            return types.CallToolResult(content=[types.TextContent(text=msg)], is_error=True,
                                        structured_content={"error": {"kind": "InternalError", "message": msg}})
        text = json.dumps(result, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)

    async def list_resources(_ctx: Any, params: Any) -> Any:
        cursor = getattr(params, "cursor", None) if params is not None else None
        try:
            items, nxt = await tools.session_resources(cursor)
        except ToolError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        return types.ListResourcesResult(
            resources=[types.Resource(uri=i["uri"], name=i["name"], description=i["description"],
                                      mime_type="text/markdown") for i in items], next_cursor=nxt)

    async def list_templates(_ctx: Any, _params: Any) -> Any:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=SESSION_URI + "{sessionId}", name="session",
            description="a recorded session: the branch at HEAD as a transcript", mime_type="text/markdown")])

    async def read_resource(_ctx: Any, params: Any) -> Any:
        uri = str(params.uri)
        try:
            text = await tools.read_session(uri)
        except ToolError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="text/markdown",
                                                                            text=text)])

    @asynccontextmanager
    async def lifespan(_server: Any):
        try:
            yield None
        finally:
            await tools.close()

    return Server(SERVER_NAME, version=__version__, lifespan=lifespan,
                  instructions="Search and read this machine's recorded agent sessions (dagctx): "
                               "search_history, then read_node / expand_summary for the full text.",
                  on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                  on_list_resource_templates=list_templates, on_read_resource=read_resource)


async def serve_mcp(database: str | None) -> int:
    from mcp.server.stdio import stdio_server

    from dagctx.client import DagctxClient

    async def connect() -> Any:
        return await DagctxClient.spawn(database)

    tools = HistoryTools(connect)
    server = build_server(tools)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    import anyio

    database = getattr(args, "db", None) or os.environ.get("DAGCTX_DB") or None
    try:
        return anyio.run(serve_mcp, database)
    except KeyboardInterrupt:
        return 130


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="serve the recorded history as MCP tools on stdio (for Claude Code, Codex, …)",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--db", help="SQLite database file (default: $DAGCTX_DB or the user data dir)")
    p.set_defaults(func=cmd_mcp)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cmd_mcp(argparse.Namespace(db=None)))
