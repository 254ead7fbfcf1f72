"""``dagctx import`` and ``dagctx migrate``: moving sessions into a database, with progress.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import msgspec
from dagctx.cli.ui import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m

from .ui import connect, console, follow_progress, print_json, real_console, sentence


# ---------------------------------------------------------------- import


#: Skipped lines the import table lists; the rest are counted.
SKIPPED_ROWS = 20


async def cmd_import(args: argparse.Namespace) -> int:
    paths = [os.path.abspath(os.path.expanduser(p)) for p in args.paths]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        console.print(f"[red]error[/red]: there is no file or folder at {', '.join(missing)}.")
        return 2
    sessions: list[tuple[str, c.ImportedSession]] = []
    skipped: list[c.Skipped] = []
    more = 0
    failed: list[tuple[str, str]] = []
    finished = 0
    written: dict[str, int] = {}  # progress token → sessions the daemon reported as written
    try:
        async with connect(args) as client:
            with Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=real_console(), transient=False,
            ) as progress:
                overall = progress.add_task("importing", total=len(paths), note="")
                current: dict[str, Any] = {}

                def on_progress(params: Any) -> None:
                    token = str(getattr(params, "token", None))
                    value = getattr(params, "value", None) or {}
                    task = current.get(token)
                    if task is None:
                        return
                    if value.get("percentage") is not None:
                        progress.update(task, completed=int(value["percentage"]))
                    message = value.get("message")
                    if message:
                        progress.update(task, note=str(message))
                        n = _sessions_written(str(message))
                        if n is not None:
                            written[token] = n

                client.on_notification("$/progress", on_progress)
                for i, path in enumerate(paths):
                    token = f"import-{i}"
                    current[token] = progress.add_task(os.path.basename(path.rstrip("/")) or path, total=100, note="")
                    params = c.ImportParams(path=path, format=args.format, title=args.title, work_done_token=token)
                    msg_id, fut = client.send_request("session/import", params)
                    try:
                        res = await asyncio.wait_for(asyncio.shield(fut), 3600)
                    except (asyncio.CancelledError, KeyboardInterrupt):
                        # Ctrl-C: ask the daemon to stop after the session it is writing, and
                        # wait for that, so the report below is true.
                        client.cancel(msg_id)
                        try:
                            await asyncio.wait_for(fut, 30)
                        except (RpcError, ConnectionError, asyncio.TimeoutError, asyncio.CancelledError):
                            pass
                        raise _Interrupted() from None
                    except RpcError as exc:
                        failed.append((path, exc.message))
                        progress.update(current[token], note="[red]failed")
                        progress.advance(overall)
                        finished += 1
                        continue
                    progress.update(current[token], completed=100, note=f"{len(res.sessions)} sessions")
                    sessions.extend((path, s) for s in res.sessions)
                    skipped.extend(s if s.file else msgspec.structs.replace(s, file=path) for s in res.skipped)
                    more += res.skipped_more
                    progress.advance(overall)
                    finished += 1
    except (_Interrupted, KeyboardInterrupt, asyncio.CancelledError):
        done = written.get(f"import-{finished}", 0)
        total = len(sessions) + done
        console.print(
            f"[yellow]Interrupted[/yellow]: {total:,} sessions were written before the interrupt ({finished} of "
            f"{len(paths)} paths finished). Each session is written in one transaction, so every one of them is "
            "complete. Run the same command again to resume: sessions already imported are reported as already "
            "present and not copied."
        )
        return 130
    not_imported = [s for s in skipped if s.line is None]
    if args.json:
        print_json({"sessions": [{"path": path, **msgspec.to_builtins(s)} for path, s in sessions],
                    "skipped": skipped, "skippedMore": more,
                    "failed": [{"path": path, "error": why} for path, why in failed]})
        return 1 if failed or not_imported else 0
    print_import_summary(sessions, skipped, more)
    for path, why in failed:
        console.print(f"[red]failed[/red] {escape(path)}: {escape(sentence(why))}")
    for s in not_imported:
        console.print(f"[red]not imported[/red] {escape(str(s.file))}: {escape(sentence(s.reason))}")
    return 1 if failed or not_imported else 0


class _Interrupted(Exception):
    """Ctrl-C during an import (the daemon was asked to stop)."""


def _sessions_written(message: str) -> int | None:
    """The count in a progress message ``… N sessions written`` (see engine/imports)."""
    words = message.replace(",", " ").split()
    for i in range(len(words) - 2):
        if words[i + 1] == "sessions" and words[i + 2] == "written" and words[i].isdigit():
            return int(words[i])
    return None


def print_import_summary(sessions: list[tuple[str, c.ImportedSession]], skipped: list[c.Skipped],
                         more: int = 0) -> None:
    table = Table(title=f"{len(sessions)} sessions", show_lines=False)
    for col, kw in (("session", {"min_width": 36}),
                    ("title", {"overflow": "ellipsis", "max_width": max(16, console.width - 101), "no_wrap": True}),
                    ("nodes", {"justify": "right"}), ("pairs", {"justify": "right"}),
                    ("compact.", {"justify": "right"}), ("spawns", {"justify": "right"}), ("status", {"min_width": 15})):
        table.add_column(col, **kw)
    created = 0
    for _, s in sessions:
        created += s.created
        table.add_row(
            s.session_id, escape(s.title), str(s.nodes), str(s.tool_pairs), str(s.compactions), str(s.spawn_branches),
            "[green]created[/green]" if s.created else "[yellow]already present[/yellow]",
        )
    if len(sessions) > 60:
        # A big folder: the table would scroll away; show totals and the first rows.
        table = _head_table(table, sessions)
    console.print(table)
    totals = (
        f"created {created}, already present {len(sessions) - created}; "
        f"{sum(s.nodes for _, s in sessions):,} nodes, {sum(s.tool_pairs for _, s in sessions):,} tool pairs, "
        f"{sum(s.compactions for _, s in sessions)} compactions, {sum(s.spawn_branches for _, s in sessions)} spawn branches"
    )
    console.print(totals)
    for _, s in sessions:
        for note in s.notes:
            console.print(f"[dim]note[/dim] {s.session_id[:8]}: {escape(sentence(note))}")
    lines = [s for s in skipped if s.line is not None]
    if lines:
        rest = more + max(0, len(lines) - SKIPPED_ROWS)
        st = Table(title=f"{len(lines) + more} skipped lines" + (f" (first {SKIPPED_ROWS})" if rest else ""))
        st.add_column("file", overflow="fold")
        st.add_column("line", justify="right")
        st.add_column("reason", overflow="fold")
        for s in lines[:SKIPPED_ROWS]:
            st.add_row(escape(str(s.file or "")), str(s.line), escape(s.reason))
        console.print(st)
        if rest:
            console.print(f"… and {rest:,} more skipped lines not listed.")


def _head_table(full: Table, sessions: list[tuple[str, c.ImportedSession]]) -> Table:
    table = Table(title=f"{len(sessions)} sessions (first 50)")
    for col in full.columns:
        table.add_column(str(col.header), justify=col.justify, overflow=col.overflow, max_width=col.max_width,
                         no_wrap=col.no_wrap, min_width=col.min_width)
    for _, s in sessions[:50]:
        table.add_row(
            s.session_id, escape(s.title), str(s.nodes), str(s.tool_pairs), str(s.compactions), str(s.spawn_branches),
            "[green]created[/green]" if s.created else "[yellow]already present[/yellow]",
        )
    return table


# ---------------------------------------------------------------- sessions, history, search


async def cmd_migrate(args: argparse.Namespace) -> int:
    """A daemon on the target copies from the source (``database/migrate``), with progress."""
    target = args.target
    if "://" not in target:
        target = os.path.abspath(os.path.expanduser(target))
        if not os.path.isdir(os.path.dirname(target)):
            console.print(f"[red]error[/red]: the folder of {escape(target)} does not exist")
            return 2
    source = args.source if "://" in args.source else os.path.abspath(os.path.expanduser(args.source))
    client = await DagctxClient.spawn(target, standalone=True)  # a one-off copy: a private daemon
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
                      TimeElapsedColumn(), console=real_console(), transient=False) as progress:
            task = progress.add_task("migrating", total=100, note="")

            client.on_notification("$/progress", follow_progress(progress, task))
            res = await client.request("database/migrate", m.DatabaseMigrateParams(source=source, work_done_token="migrate"),
                                       timeout=None)
            progress.update(task, completed=100)
    finally:
        await client.close()
    res = msgspec.convert(res, m.DatabaseMigrateResult) if not isinstance(res, m.DatabaseMigrateResult) else res
    if args.json:
        print_json(res)
        return 1 if res.conflicts else 0
    console.print(f"{escape(res.source)} → {escape(res.target)}: {res.sessions} sessions, copied {res.copied} "
                  f"({res.nodes:,} nodes), unchanged {res.unchanged}, conflicts {len(res.conflicts)}")
    for sid in res.conflicts:
        console.print(f"[yellow]conflict[/yellow] {sid}: changed on the target since it was copied; not overwritten")
    return 1 if res.conflicts else 0
