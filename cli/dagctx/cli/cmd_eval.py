"""``dagctx eval``: replay transcripts or stored sessions through a scratch daemon and print
M1–M7 (``dagctx.cli.quality``)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dagctx.cli.ui import escape

from dagctx.cli.ui import connect, console, print_json, resolve_session


async def cmd_eval(args: argparse.Namespace) -> int:
    from dagctx.cli.quality import evaluate as ev
    from dagctx.cli.quality import replay as rp
    from dagctx.cli.quality import report

    if not args.paths and not args.session:
        console.print("[red]error[/red]: give transcript files or folders, or --session ID "
                      "(e.g. dagctx eval \"$DAGCTX_CORPUS\" --window 32k)")
        return 2
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        console.print(f"[red]error[/red]: no such file or folder: {escape(', '.join(missing))}")
        return 2
    try:
        windows = [rp.parse_window(w) for arg in (args.window or ["16k,32k,128k"]) for w in arg.split(",") if w.strip()]
    except ValueError as exc:
        console.print(f"[red]error[/red]: {escape(str(exc))}")
        return 2
    windows = sorted({w.tokens: w for w in windows}.values(), key=lambda w: w.tokens)
    endpoint = None
    if args.endpoint:
        if not args.endpoint_model:
            console.print("[red]error[/red]: --endpoint needs --endpoint-model (the model name at that endpoint)")
            return 2
        endpoint = {"baseUrl": args.endpoint, "model": args.endpoint_model}
        if args.api_key_env:
            endpoint["apiKeyEnv"] = args.api_key_env
    if args.keep_recent_tokens is not None and args.keep_recent_tokens < 0:
        console.print("[red]error[/red]: --keep-recent-tokens must be 0 or more")
        return 2
    if not 1 <= args.jobs <= 16:
        console.print("[red]error[/red]: --jobs must be between 1 and 16")
        return 2
    if args.max_sessions is not None and args.max_sessions < 1:
        console.print("[red]error[/red]: --max-sessions must be at least 1")
        return 2
    if args.summarizer == "endpoint" and not endpoint:
        console.print("[red]error[/red]: --summarizer endpoint needs --endpoint URL and --endpoint-model NAME")
        return 2
    summarizer = "endpoint" if endpoint else args.summarizer
    cfg = ev.Config(paths=[os.path.abspath(p) for p in args.paths], windows=windows,
                    options=rp.Options(format=args.format, compaction=args.compaction,
                                       fallback="structural" if summarizer == "structural" else "none",
                                       keep_recent_tokens=args.keep_recent_tokens),
                    ttl=args.cache_ttl, endpoint=endpoint, summarizer=summarizer, recall=not args.no_recall,
                    max_sessions=args.max_sessions, jobs=args.jobs)

    stored: list[Any] = []
    if args.session:
        async with connect(args) as client:
            for ref in args.session:
                info = await resolve_session(client, ref)
                stored.append(await rp.load_source(client, info.session_id, origin=f"session {info.session_id}"))

    async def sources_from(_client: Any) -> list[Any]:
        return stored

    def progress(text: str) -> None:
        console.print(f"… {escape(text)}", style="dim", highlight=False)

    doc = await ev.evaluate(cfg, sources_from=sources_from, progress=progress)
    for note in doc["notes"]:
        console.print(f"[yellow]note[/yellow]: {escape(note)}")
    if not doc["sessions"]:
        console.print("[red]error[/red]: no session with a model call to replay (a transcript needs at least "
                      "one assistant reply; `dagctx import` shows what was read)")
        return 1
    if args.plots:
        written = report.write_plots(doc, args.plots)
        console.print(f"plots: {len(written)} SVG files in {escape(args.plots)}")
    if args.json:
        print_json(doc)
    else:
        report.print_tables(doc, console)
    return 0
