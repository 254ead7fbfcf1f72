"""``dagctx``: the command line — ``serve`` runs the daemon, everything else is a client.

``serve`` runs the daemon on stdio. Every other command is a client of a daemon it
spawns, talking the same protocol an editor does, so the CLI exercises what editors use.

Architecture Invariant: this floor sits above both the daemon and the clients; the
daemon never imports it, nor any client.
"""

from __future__ import annotations

import argparse
import logging
import sys


def _serve(args: argparse.Namespace) -> int:
    from dagctx.server import run_stdio

    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper(), logging.WARNING),
        format="dagctx %(levelname)s %(name)s: %(message)s",
    )
    return run_stdio(database=args.db, max_frame_bytes=args.max_frame_bytes, log_level=args.log_level)


def _schema(args: argparse.Namespace) -> int:
    from dagctx.protocol.schema import schema_json

    sys.stdout.write(schema_json())
    return 0


def _version() -> str:
    from dagctx.protocol import PROTOCOL_VERSION
    from dagctx.protocol.version import __version__

    return f"dagctx {__version__} (protocol {PROTOCOL_VERSION})"


def build_parser() -> argparse.ArgumentParser:
    """Global options (``--db``, ``--log-level``) work before or after the subcommand.

    A subcommand's copy of an option defaults to ``SUPPRESS``, so it never overwrites the
    value given before the subcommand.
    """
    p = argparse.ArgumentParser(prog="dagctx", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--db", help="SQLite database file (default: $DAGCTX_DB or the user data dir)")
    p.add_argument("--log-level", default="WARNING", help="daemon log level (DEBUG, INFO, WARNING, ERROR)")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="run the daemon on stdio (JSON-RPC 2.0, LSP framing)")
    s.add_argument("--db", default=argparse.SUPPRESS,
                   help="SQLite database file (default: $DAGCTX_DB or the user data dir)")
    s.add_argument("--max-frame-bytes", type=int, default=64 * 1024 * 1024)
    s.add_argument("--log-level", default=argparse.SUPPRESS)
    s.add_argument("--stdio", action="store_true", help="accepted for editor compatibility (stdio is the default)")
    s.set_defaults(func=_serve)
    sc = sub.add_parser("schema", help="print the JSON Schema of the protocol")
    sc.set_defaults(func=_schema)
    from dagctx.cli import commands

    commands.register(sub)
    from dagctx.cli import mcp_server  # registers `dagctx mcp`; the SDK is imported only when it runs

    mcp_server.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _command_names(parser)
    if not any(a in commands for a in argv) and not {"-h", "--help", "--version"} & set(argv):
        argv = ["serve", *argv]  # bare ``dagctx [--stdio] [--db F]`` is the daemon (what editors spawn)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return set(action.choices)
    return set()


if __name__ == "__main__":
    sys.exit(main())
