"""``dagctx``: the command line — ``serve`` connects a client to the engine, everything else is a client.

``serve`` forwards stdio to the per-user daemon (starting it when needed);
``serve --standalone`` (or ``DAGCTX_STANDALONE=1``) runs the daemon in-process on stdio.
Every other command is a client of the shared daemon (or of a standalone one it spawns
with ``--standalone``), talking the same protocol an editor does.

Import-light: ``dagctx serve`` takes a fast path that parses its few flags by hand and
imports only the forwarder, so it starts close to a bare Python start.

Architecture Invariant: this floor sits above both the daemon and the clients; the
daemon never imports it, nor any client.
"""

from __future__ import annotations

import os
import sys

from dagctx.cli.options import standalone_requested


def _fast_serve(argv: list[str]) -> int | None:
    """``dagctx serve [--db X] [--stdio] …`` → the forwarder, without argparse; None when
    the arguments need the full parser (help, standalone, anything unknown)."""
    if not argv or argv[0] != "serve" or standalone_requested(argv[1:]):
        return None
    database = None
    max_frame: int | None = None
    rest = argv[1:]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--db" and i + 1 < len(rest):
            database = rest[i + 1]
            i += 2
        elif a.startswith("--db="):
            database = a[5:]
            i += 1
        elif a == "--stdio":
            i += 1
        elif a == "--max-frame-bytes" and i + 1 < len(rest) and rest[i + 1].isdigit():
            max_frame = int(rest[i + 1])  # this connection's limit, passed on
            i += 2
        elif a == "--log-level" and i + 1 < len(rest):
            i += 2  # the daemon's own setting; a forwarder logs nothing
        else:
            return None
    from dagctx.protocol import transport

    if not transport.supported():
        sys.stderr.write("dagctx serve: this platform has no Unix sockets; running standalone on stdio\n")
        return None
    from dagctx.server import run_forwarder

    return run_forwarder(database=database or os.environ.get("DAGCTX_DB") or None, max_frame_bytes=max_frame)


def _logging(level: str) -> None:
    import logging

    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.WARNING),
        format="dagctx %(levelname)s %(name)s: %(message)s",
    )


def _serve(args) -> int:  # noqa: ANN001 - argparse.Namespace, argparse imported lazily
    from dagctx.protocol import transport

    if not standalone_requested() and not args.standalone and transport.supported():
        from dagctx.server import run_forwarder

        return run_forwarder(database=args.db or os.environ.get("DAGCTX_DB") or None,
                             max_frame_bytes=args.max_frame_bytes)
    from dagctx.server import run_stdio

    level = args.log_level or "WARNING"
    _logging(level)
    return run_stdio(database=args.db, max_frame_bytes=args.max_frame_bytes, log_level=level)


def _schema(args) -> int:  # noqa: ANN001
    from dagctx.protocol.schema import schema_json

    sys.stdout.write(schema_json())
    return 0


def _version() -> str:
    from dagctx.protocol import PROTOCOL_VERSION
    from dagctx.protocol.version import __version__

    return f"dagctx {__version__} (protocol {PROTOCOL_VERSION})"


def build_parser():  # noqa: ANN201 - argparse.ArgumentParser
    """Global options (``--db``, ``--log-level``) work before or after the subcommand.

    A subcommand's copy of an option defaults to ``SUPPRESS``, so it never overwrites the
    value given before the subcommand.
    """
    import argparse

    p = argparse.ArgumentParser(prog="dagctx", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--db", help="SQLite database file (default: $DAGCTX_DB or the user data dir)")
    p.add_argument("--log-level", default=None,
                   help="log level of a daemon this command runs (DEBUG, INFO, WARNING, ERROR; default WARNING)")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="connect stdio to the shared per-user daemon (JSON-RPC 2.0, LSP framing)")
    s.add_argument("--db", default=argparse.SUPPRESS,
                   help="database: a SQLite file path or a postgresql:// URL (default: $DAGCTX_DB or the user data dir)")
    s.add_argument("--standalone", action="store_true",
                   help="run the daemon in this process on stdio instead (also DAGCTX_STANDALONE=1)")
    s.add_argument("--max-frame-bytes", type=int, default=64 * 1024 * 1024,
                   help="largest frame accepted (per connection)")
    s.add_argument("--log-level", default=argparse.SUPPRESS)
    s.add_argument("--stdio", action="store_true", help="accepted for editor compatibility (stdio is the default)")
    s.set_defaults(func=_serve)
    sc = sub.add_parser("schema", help="print the JSON Schema of the protocol")
    sc.set_defaults(func=_schema)
    from dagctx.cli import commands, daemon_cmd

    commands.register(sub)
    daemon_cmd.register(sub)
    # `dagctx mcp` is declared here, its module (tool table, SDK) imported only when it runs:
    # every other command starts without it (the options are those of mcp_server.register)
    mc = sub.add_parser("mcp", help="serve the recorded history as MCP tools on stdio (for Claude Code, Codex, …)",
                        description="``dagctx mcp``: the daemon's history as MCP tools, for any MCP-capable agent.")
    mc.add_argument("--db", default=argparse.SUPPRESS,
                    help="database: a SQLite file or a postgresql:// URL (default: $DAGCTX_DB, else the user data "
                         "dir). MCP hosts often pass a minimal environment: give --db in the server's args")
    mc.add_argument("--socket", help="the shared daemon's socket (default: the per-user path `dagctx daemon status` "
                                     "shows, which depends on XDG_RUNTIME_DIR)")
    mc.add_argument("--workspace", help="the folder whose MEMORY.md and memory/ the memory tools search (default: "
                                        "$DAGCTX_WORKSPACE, else the folder the server is started in)")
    mc.add_argument("--standalone", action="store_true",
                    help="a private daemon for this server instead of the shared one (also DAGCTX_STANDALONE=1)")
    mc.set_defaults(func=_mcp)
    from dagctx.cli import completion

    completion.register(sub, p)
    return p


def _mcp(args) -> int:  # noqa: ANN001 - argparse.Namespace
    from dagctx.cli.mcp_server import cmd_mcp

    return cmd_mcp(args)


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    fast = _fast_serve(args_list if args_list else ["serve"])
    if fast is not None:
        return fast
    if ("sessions" in args_list or "show" in args_list) and not standalone_requested(args_list):
        from dagctx.cli import quick  # stdlib only: the most typed command without the full CLI's imports

        answered = quick.run(args_list)
        if answered is not None:
            return answered
    parser = build_parser()
    commands = _command_names(parser)
    if not any(a in commands for a in args_list) and not {"-h", "--help", "--version"} & set(args_list):
        args_list = ["serve", *args_list]  # bare ``dagctx [--stdio] [--db F]`` is the daemon (what editors spawn)
    args = parser.parse_args(args_list)
    return int(args.func(args) or 0)


def _command_names(parser) -> set[str]:  # noqa: ANN001 - argparse.ArgumentParser
    import argparse

    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return set(action.choices)
    return set()


if __name__ == "__main__":
    sys.exit(main())
