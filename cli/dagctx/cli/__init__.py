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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dagctx", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="run the daemon on stdio (JSON-RPC 2.0, LSP framing)")
    s.add_argument("--db", help="database: a SQLite file path or a postgresql:// URL (default: $DAGCTX_DB or the user data dir)")
    s.add_argument("--max-frame-bytes", type=int, default=64 * 1024 * 1024)
    s.add_argument("--log-level", default="WARNING")
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
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        args = parser.parse_args(["serve", *(argv or [])])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
