"""``dagctx mcp``: the daemon's history as MCP tools, for any MCP-capable agent.

An agent whose own context was compacted (Claude Code, Codex, Gemini CLI, Cursor …)
can search every past session, read a node whole (a spilled tool output by character
range), expand a summary back into the turns it covers, verbatim, and see its budget.

Transport: MCP over stdio — newline-delimited JSON-RPC, as the MCP spec's stdio
transport requires, served by the official ``mcp`` SDK's low-level ``Server``. Behind
it this process is a client of the dagctx daemon like any editor (``DagctxClient.spawn``,
LSP framing, SPEC §1). Which daemon and which database it serves is decided once, at
start, from its own arguments first (``--db``, ``--socket``, ``--standalone``), then its
environment (``DAGCTX_DB``, ``DAGCTX_STANDALONE``, ``XDG_RUNTIME_DIR``), then the defaults,
and said in ``initialize``'s instructions, on stderr and in every error: an MCP host may
start it with a minimal environment, and a silent fallback would serve another database.

Both SDK generations are served: ``mcp`` 2.x (the ``mcp_types`` package, constructor
handlers) and 1.26 (``mcp.types``, decorator handlers — what ``hermes-agent[mcp]`` pins),
so ``dagctx[mcp]`` installs beside either.

Why the low-level server and not a decorator framework: the tool list order, the
input schemas and the error texts are part of our contract, written out once (mcp_tools).
Every tool is read-only and none chooses a database or a folder: an MCP client may be
driven by a model, and a model must not choose which database or file this process
opens. The memory tools serve one workspace, chosen at start like the database
(``--workspace``, then ``DAGCTX_WORKSPACE``, then the folder the host started us in);
``memory_get``'s path is relative to it and confined to it by the daemon (SPEC §5.1).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from dagctx.cli.mcp_tools import SESSION_URI, TOOLS, HistoryTools, ToolError

SERVER_NAME = "dagctx"
NEEDS_SDK = "dagctx mcp needs the MCP SDK: pip install 'dagctx[mcp]' (mcp 1.26 or 2.x)"


# ---------------------------------------------------------------- which daemon, which database


@dataclass
class Target:
    """The daemon and database this server serves, and where each choice came from."""

    database: str | None  # as asked (None: the daemon's default)
    database_from: str
    standalone: bool
    socket: str | None  # the shared daemon's socket (None when standalone)
    socket_from: str
    workspace: str | None = None  # the memory tools' workspace (absolute)
    workspace_from: str = ""
    served_database: str | None = None  # what the daemon said it opened (initialize)
    daemon: str | None = None  # the daemon's name and version, and its pid when known
    unreachable: str | None = None

    def describe(self) -> str:
        """One paragraph: the database, the daemon, and how each was chosen."""
        db = self.served_database or self.database or "the daemon's default database"
        if self.standalone:
            daemon = f"a private daemon this server started ({self.daemon or 'dagctx'}), not the shared one"
        else:
            daemon = f"the shared per-user daemon on socket {self.socket} ({self.socket_from}" + (
                f"; {self.daemon}" if self.daemon else "") + ")"
        text = f"Database: {db} ({self.database_from}). Daemon: {daemon}."
        if self.workspace:
            text += f" Memory workspace: {self.workspace} ({self.workspace_from})."
        if self.unreachable:
            text += f" The daemon is NOT reachable: {self.unreachable}; every tool call tries again."
        return text


def choose_target(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Target:
    """The daemon and database, from the arguments, then the environment, then the defaults."""
    from dagctx.cli.options import standalone_requested
    from dagctx.protocol import transport

    env = os.environ if environ is None else environ
    if getattr(args, "db", None):
        database, source = args.db, "from --db"
    elif env.get("DAGCTX_DB"):
        database, source = env["DAGCTX_DB"], "from DAGCTX_DB"
    else:
        database, source = None, ("the default: neither --db nor DAGCTX_DB reached this server — an MCP host "
                                  "may start it with a minimal environment; put --db PATH in the server's args "
                                  "to choose")
    if getattr(args, "workspace", None):
        ws, ws_from = os.path.abspath(args.workspace), "from --workspace"
    elif env.get("DAGCTX_WORKSPACE"):
        ws, ws_from = os.path.abspath(env["DAGCTX_WORKSPACE"]), "from DAGCTX_WORKSPACE"
    else:
        ws, ws_from = os.getcwd(), "the folder this server was started in; --workspace chooses"
    standalone = bool(getattr(args, "standalone", False)) or standalone_requested()
    if standalone:
        return Target(database, source, True, None, "", workspace=ws, workspace_from=ws_from)
    if getattr(args, "socket", None):
        return Target(database, source, False, args.socket, "from --socket", workspace=ws, workspace_from=ws_from)
    sock = transport.socket_path()
    why = ("under XDG_RUNTIME_DIR" if env.get("XDG_RUNTIME_DIR") and os.path.isdir(env["XDG_RUNTIME_DIR"])
           else "in the temp folder: XDG_RUNTIME_DIR is not set here, so a daemon started by a shell with "
                "it set is not this one; --socket or --standalone choose")
    return Target(database, source, False, sock, why, workspace=ws, workspace_from=ws_from)


async def connect_target(target: Target) -> Any:
    """A daemon connection as ``target`` says; records what the daemon reports."""
    from dagctx.client import DagctxClient

    if target.standalone:
        client = await DagctxClient.spawn(target.database, standalone=True)
    else:
        client = await DagctxClient.connect(target.database, socket_path=target.socket)
    init = client.initialize_result
    target.served_database = init.database
    info = init.server_info
    if target.standalone:
        pid = getattr(client.process, "pid", None)
    else:
        from dagctx.protocol import transport

        try:
            with open(transport.pid_path(target.socket or transport.socket_path())) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
    target.daemon = f"{info.name} {info.version}" + (f", pid {pid}" if pid else "")
    target.unreachable = None
    return client


# ---------------------------------------------------------------- answers, whatever the SDK


async def answer(tools: HistoryTools, target: Target | None, name: str, args: Any) -> tuple[str, dict[str, Any], bool]:
    """A tool call's (text, structured content, is_error); errors say what this server serves."""
    served = f"\n\n(dagctx mcp: {target.describe()})" if target is not None else ""
    try:
        result = await tools.call(name, args)
    except ToolError as exc:
        return exc.message + served, {"error": {"kind": exc.kind, "message": exc.message}}, True
    except (ConnectionError, OSError) as exc:
        msg = f"the dagctx daemon is not reachable ({exc}); the next call starts it again"
        if target is not None:
            target.unreachable = str(exc)
        return msg + served, {"error": {"kind": "DaemonUnavailable", "message": msg}}, True
    return result.text, result.data, False


def _instructions(target: Target | None) -> str:
    text = ("Search and read this machine's recorded agent sessions (dagctx): search_history, then "
            "read_node / expand_summary for the full text; the workspace's memory files: memory_search, "
            "then memory_get. Answers are plain text with headers, paged "
            "(a cursor at the end when there is more).")
    return text + (f" {target.describe()}" if target is not None else "")


def sdk_generation() -> int:
    """2 for ``mcp`` 2.x (``mcp_types``), 1 for 1.x; ImportError without the SDK."""
    try:
        import mcp_types  # noqa: F401
        return 2
    except ImportError:
        import mcp.types  # noqa: F401  (raises ImportError without the SDK)
        return 1


def build_server(tools: HistoryTools, target: Target | None = None) -> Any:
    """The MCP server (official SDK, low-level API) exposing ``tools``, for either SDK generation."""
    return _server_v2(tools, target) if sdk_generation() == 2 else _server_v1(tools, target)


@asynccontextmanager
async def _closing(tools: HistoryTools):
    try:
        yield None
    finally:
        await tools.close()


def _server_v2(tools: HistoryTools, target: Target | None) -> Any:
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
        text, data, err = await answer(tools, target, params.name, params.arguments)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=data, is_error=err)

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

    return Server(SERVER_NAME, version=__version__, lifespan=lambda _s: _closing(tools),
                  instructions=_instructions(target),
                  on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                  on_list_resource_templates=list_templates, on_read_resource=read_resource)


def _server_v1(tools: HistoryTools, target: Target | None) -> Any:
    """The same server on the 1.x SDK: camelCase fields, decorator-registered handlers."""
    import mcp.types as types
    from mcp.server.lowlevel import Server
    from mcp.server.lowlevel.helper_types import ReadResourceContents
    from mcp.shared.exceptions import McpError

    from dagctx.protocol.version import __version__

    server = Server(SERVER_NAME, version=__version__, instructions=_instructions(target),
                    lifespan=lambda _s: _closing(tools))
    listed = [types.Tool(name=name, description=desc, inputSchema=schema,
                         annotations=types.ToolAnnotations(readOnlyHint=True, openWorldHint=False))
              for name, (desc, schema) in TOOLS.items()]

    async def list_tools() -> Any:
        return listed

    async def call_tool(name: str, arguments: Any) -> Any:
        text, data, err = await answer(tools, target, name, arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structuredContent=data,
                                    isError=err)

    async def list_resources(req: Any) -> Any:
        cursor = req.params.cursor if req is not None and req.params is not None else None
        try:
            items, nxt = await tools.session_resources(cursor)
        except ToolError as exc:
            raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=exc.message)) from None
        return types.ListResourcesResult(
            resources=[types.Resource(uri=i["uri"], name=i["name"], description=i["description"],
                                      mimeType="text/markdown") for i in items], nextCursor=nxt)

    # the SDK passes the request only to a handler whose parameter is annotated with its class
    list_resources.__annotations__ = {"req": types.ListResourcesRequest, "return": Any}

    async def list_templates() -> Any:
        return [types.ResourceTemplate(uriTemplate=SESSION_URI + "{sessionId}", name="session",
                                       description="a recorded session: the branch at HEAD as a transcript",
                                       mimeType="text/markdown")]

    async def read_resource(uri: Any) -> Any:
        try:
            text = await tools.read_session(str(uri))
        except ToolError as exc:
            raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=exc.message)) from None
        return [ReadResourceContents(content=text, mime_type="text/markdown")]

    server.list_tools()(list_tools)
    # our own argument checks (mcp_tools.check_arguments) say more than the SDK's
    server.call_tool(validate_input=False)(call_tool)
    server.list_resources()(list_resources)
    server.list_resource_templates()(list_templates)
    server.read_resource()(read_resource)
    return server


# ---------------------------------------------------------------- the command


async def serve_mcp(target: Target) -> int:
    from mcp.server.stdio import stdio_server

    async def connect() -> Any:
        return await connect_target(target)

    tools = HistoryTools(connect, workspace=target.workspace)
    try:  # connect first, so initialize's instructions name the database the daemon opened
        await tools.client()
    except Exception as exc:  # noqa: BLE001 - served anyway: each tool call tries again and says why
        target.unreachable = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    sys.stderr.write(f"dagctx mcp: {target.describe()}\n")
    sys.stderr.flush()
    server = build_server(tools, target)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        sdk_generation()
        import anyio
    except ImportError:
        sys.stderr.write(NEEDS_SDK + "\n")
        return 2
    target = choose_target(args)
    try:
        return anyio.run(serve_mcp, target)
    except KeyboardInterrupt:
        return 130


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="serve the recorded history as MCP tools on stdio (for Claude Code, Codex, …)",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    # SUPPRESS: `dagctx --db F mcp` keeps the global value (see dagctx.cli.build_parser)
    p.add_argument("--db", default=argparse.SUPPRESS,
                   help="database: a SQLite file or a postgresql:// URL (default: $DAGCTX_DB, else the user data "
                        "dir). MCP hosts often pass a minimal environment: give --db in the server's args")
    p.add_argument("--socket", help="the shared daemon's socket (default: the per-user path `dagctx daemon status` "
                                    "shows, which depends on XDG_RUNTIME_DIR)")
    p.add_argument("--workspace", help="the folder whose MEMORY.md and memory/ the memory tools search (default: "
                                       "$DAGCTX_WORKSPACE, else the folder the server is started in)")
    p.add_argument("--standalone", action="store_true",
                   help="a private daemon for this server instead of the shared one (also DAGCTX_STANDALONE=1)")
    p.set_defaults(func=cmd_mcp)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cmd_mcp(argparse.Namespace(db=None)))
