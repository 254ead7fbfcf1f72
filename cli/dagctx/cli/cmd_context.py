"""``dagctx render|stats|compact|export``: what a model would see, its budget, compaction
and export.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import msgspec
from dagctx.cli.ui import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import context_messages as c
from dagctx.protocol import errors

from .ui import connect, console, follow_progress, message_text, print_json, real_console, resolve_session, sentence


# ---------------------------------------------------------------- render


async def cmd_render(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        res = await client.render(info.session_id, head=args.head, format=args.format, model=args.model)
    if args.json:
        print_json(res)
        return 0
    print_render(res, title=f"{escape(info.title)} — {args.format}")
    return 0


def print_render(res: c.RenderResult, title: str = "render", limit: int | None = None) -> None:
    t = res.tokens
    table = Table(title=title)
    table.add_column("#", justify="right")
    table.add_column("role")
    table.add_column("tokens", justify="right")
    table.add_column("content", overflow="fold", max_width=110)
    msgs = res.messages
    rows = list(enumerate(msgs))
    if limit is not None and len(rows) > limit:
        rows = rows[: limit // 2] + [(-1, None)] + rows[-(limit - limit // 2):]
    for i, msg in rows:
        if msg is None:
            table.add_row("…", "", "", f"[dim]{len(msgs) - limit} more messages[/dim]")  # type: ignore[operator]
            continue
        tokens = t.per_message[i] if i < len(t.per_message) else 0
        table.add_row(str(i), str(msg.get("role")), f"{tokens:,}", escape(message_text(msg)))
    console.print(table)
    sp = res.stable_prefix
    console.print(
        f"{len(msgs)} messages, {t.total:,} tokens (tokenizer {t.tokenizer}, {'exact' if t.exact else t.source}); "
        f"stable prefix {sp.messages} messages / {sp.tokens:,} tokens"
        + (f"; summary {res.manifest.get('summaryId')}" if res.manifest.get("summaryId") else "")
    )


# ---------------------------------------------------------------- stats (budget)


CATEGORY_STYLE = {
    "system": "magenta",
    "tools": "cyan",
    "history": "green",
    "summary": "yellow",
    "reserve": "blue",
    "free": "grey37",
}


def _starts_with_summary(msg: Any) -> bool:
    from dagctx.protocol.nodes import SUMMARY_MARKER

    content = msg.get("content") if isinstance(msg, dict) else None
    if isinstance(content, list):
        content = next((b.get("text") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)), "")
    return isinstance(content, str) and content.lstrip().startswith(SUMMARY_MARKER)


async def gather_stats(client: DagctxClient, session_id: str, model: str | None, head: str | None = None,
                       fmt: str = "openai") -> dict[str, Any]:
    """``context/prepare`` (promptMode none) plus what it implies: summary tokens, spills."""
    prep = await client.prepare(session_id, model=model, head=head, prompt_mode="none", format=fmt)
    summary_tokens = 0
    if prep.summary_id:
        # prepare has no per-message counts; the same render has them (the summary message
        # starts with the daemon's marker).
        r = await client.render(session_id, model=model, head=head, format=fmt)
        summary_tokens = sum(n for msg, n in zip(r.messages, r.tokens.per_message) if _starts_with_summary(msg))
    spilled = 0
    spilled_chars = 0
    if prep.reads:
        nodes = (await client.get_nodes(session_id, prep.reads)).nodes
        for n in nodes:
            sp = n.metadata.get("spill")
            if isinstance(sp, dict):
                spilled += 1
                spilled_chars += int(sp.get("omitted", 0))
    return {"prepare": prep, "summary": summary_tokens, "spilled": spilled, "spilledChars": spilled_chars}


def print_budget(stats: dict[str, Any], title: str = "budget") -> None:
    prep: c.PrepareResult = stats["prepare"]
    b = prep.budget
    window = max(1, b.context_window)
    summary = stats["summary"]
    cats = [
        ("system", b.system_prompt),
        ("tools", b.tools_schema),
        ("history", max(0, b.history - summary)),
        ("summary", summary),
        ("reserve", b.output_reserve),
    ]
    used = sum(v for _, v in cats)
    width = 60
    bar = Text()
    for name, v in cats + [("free", max(0, window - used))]:
        cells = round(v / window * width)
        if v and not cells:
            cells = 1
        bar.append("█" * cells, style=CATEGORY_STYLE[name])
    table = Table(title=title, show_header=True)
    table.add_column("category")
    table.add_column("tokens", justify="right")
    table.add_column("% window", justify="right")
    table.add_column("", min_width=40)
    for name, v in cats:
        cells = max(1 if v else 0, round(v / window * 40))
        table.add_row(Text(name, style=CATEGORY_STYLE[name]), f"{v:,}", f"{v / window * 100:.1f}",
                      Text("█" * cells + "·" * (40 - cells), style=CATEGORY_STYLE[name]))
    console.print(table)
    console.print(Text("window  ") + bar + Text(f"  {window:,}"))
    console.print(
        f"input used {b.input_used:,} of {b.input_budget:,} ({b.percent_used}%), headroom {b.headroom:,}, "
        f"source {b.source}; "
        + ("[red]compaction needed[/red]" if prep.needs_compaction
           else "[yellow]compaction recommended[/yellow]" if prep.recommend_compaction else "no compaction needed")
    )
    console.print(
        f"aging: {prep.tool_results_aged} tool results aged, {prep.tokens_freed_by_aging:,} tokens freed, "
        f"{prep.references_protected} protected by later references; "
        f"spilled: {stats['spilled']} output(s), {stats['spilledChars']:,} characters kept out of context "
        "(read them with node/get and a range)"
    )


async def cmd_stats(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        stats = await gather_stats(client, info.session_id, args.model, args.head)
    prep: c.PrepareResult = stats["prepare"]
    if args.json:
        print_json({"sessionId": info.session_id, "title": info.title, "model": prep.manifest.get("model"),
                    "budget": prep.budget, "summaryTokens": stats["summary"], "summaryId": prep.summary_id,
                    "spilled": stats["spilled"], "spilledChars": stats["spilledChars"],
                    "messages": len(prep.messages), "recommendCompaction": prep.recommend_compaction,
                    "needsCompaction": prep.needs_compaction, "decisionPath": prep.decision_path})
        return 0
    print_budget(stats, title=f"{escape(info.title)} — {len(prep.messages)} messages")
    for line in prep.decision_path:
        console.print(f"  · {escape(line)}", style="dim")
    return 0


# ---------------------------------------------------------------- compact


async def cmd_compact(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.endpoint:
        if not args.endpoint_model:
            console.print("[red]error[/red]: --endpoint needs --endpoint-model")
            return 2
        endpoint: dict[str, Any] = {"baseUrl": args.endpoint, "model": args.endpoint_model}
        if args.api_key_env:
            endpoint["apiKeyEnv"] = args.api_key_env
        options["samplingEndpoint"] = endpoint
    elif args.fallback != "structural":
        console.print(
            "compaction needs an LLM to write the summary: pass --endpoint URL --endpoint-model MODEL "
            "[--api-key-env VAR] (an OpenAI-compatible endpoint the daemon calls), or --fallback structural "
            "for a deterministic structural summary. Nothing was changed."
        )
        return 2
    async with connect(args, initialization_options=options) as client:
        info = await resolve_session(client, args.session)
        res = await run_compaction(client, info.session_id, model=args.model, head=args.head,
                                   keep_recent_tokens=args.keep_recent_tokens, instructions=args.instructions,
                                   fallback=args.fallback)
    if res is None:
        return 3
    if args.json:
        print_json(res)
    return 0 if res.ok else 1


async def run_compaction(client: DagctxClient, session_id: str, **kw: Any) -> c.CompactResult | None:
    """``context/compact`` with a progress bar; ``None`` when the daemon lacks the method."""
    kw = {k: v for k, v in kw.items() if v is not None}
    token = f"compact-{session_id[:8]}"
    with Progress(TextColumn("[bold]compacting"), BarColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=real_console(), transient=True) as progress:
        task = progress.add_task("compact", total=100, note="")

        client.on_notification("$/progress", follow_progress(progress, task, token))
        try:
            res = await client.compact(session_id, work_done_token=token, **kw)
        except RpcError as exc:
            if exc.code == errors.METHOD_NOT_FOUND:
                console.print("[yellow]context/compact is not available in this daemon yet; skipped.[/yellow]")
                return None
            raise
    print_compaction(res)
    return res


def print_compaction(res: c.CompactResult) -> None:
    if res.ok and not res.summary_id:
        console.print(f"nothing to compact ({escape(res.reason or 'no reason given')}): "
                      f"{res.tokens_before:,} tokens; nothing was written")
    elif res.ok:
        retention = "" if res.identifier_retention is None else f", identifiers kept {res.identifier_retention:.0%}"
        console.print(
            f"[green]compacted[/green]: summary {res.summary_id} covers {len(res.covers_ids)} conversation nodes; "
            f"{res.tokens_before:,} → {res.tokens_after:,} tokens in {res.duration_ms:.0f} ms{retention}"
            + (f"; absorbed the previous summary {res.superseded_summary}" if res.used_previous_summary else "")
            + (f" ({escape(res.reason)})" if res.reason else "")
        )
    else:
        why = REASONS.get(res.reason or "", res.reason or "it failed")
        detail = f": {escape(sentence(res.error))}" if res.error else "."
        console.print(
            f"[yellow]Not compacted[/yellow] ({why}){detail} The branch has {res.tokens_before:,} tokens; "
            "nothing was written."
        )


#: ``CompactResult.reason`` in words (SPEC §8).
REASONS = {
    "belowThreshold": "below the threshold",
    "failed": "the summarizer failed",
    "empty": "the summary was empty",
    "tooLong": "the summary was too long",
    "notSmaller": "the summary did not make the context smaller",
    "lowFidelity": "the summary lost too many identifiers",
    "conflict": "the branch changed meanwhile",
}


# ---------------------------------------------------------------- export


async def cmd_export(args: argparse.Namespace) -> int:
    path = os.path.abspath(os.path.expanduser(args.output)) if args.output else None
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        res = await client.export(info.session_id, head=args.head, format=args.format, path=path,
                                  overwrite=args.force, branches="all" if args.all_branches else "head")
    if path is None:
        sys.stdout.write(res.content or "")
        sys.stdout.flush()
    elif args.json:
        print_json({"sessionId": info.session_id, "format": args.format, "path": res.path or path,
                    "lines": res.lines})
    else:
        unit = "lines" if args.format == "claude-code" else "messages"
        console.print(f"wrote {res.lines:,} {unit} ({args.format}) to {escape(res.path or path)}")
    return 0
