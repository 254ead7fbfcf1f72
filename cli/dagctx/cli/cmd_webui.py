"""``dagctx ui``: serve the web view (``cli/dagctx/cli/webui``) until Ctrl-C."""

from __future__ import annotations

import argparse
import sys

from dagctx.cli.ui import escape

from dagctx.cli.ui import connect, console


async def cmd_ui(args: argparse.Namespace) -> int:
    from dagctx.cli.webui.server import run_ui

    if not 0 <= args.port <= 65535:
        console.print(f"[red]error[/red]: --port must be between 0 and 65535, not {args.port}.")
        return 2
    async with connect(args) as client:
        def announce(url: str) -> None:
            mode = "read-write (checkout and fork allowed)" if args.allow_writes else "read-only"
            console.print(f"dagctx ui ({mode}) on {url}", highlight=False, soft_wrap=True)
            console.print("Anyone with this URL can read the sessions: it holds the access token. Ctrl-C stops.",
                          highlight=False)
            sys.stdout.flush()

        try:
            await run_ui(client, port=args.port, open_browser=not args.no_open, allow_writes=args.allow_writes,
                         announce=announce)
        except OSError as exc:
            console.print(f"[red]error[/red]: cannot listen on 127.0.0.1:{args.port}: {escape(str(exc))}.")
            return 1
    return 0
