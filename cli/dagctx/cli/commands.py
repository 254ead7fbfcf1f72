"""The ``dagctx`` commands besides ``serve`` and ``schema``.

Every command is a client of the shared per-user daemon (``DagctxClient.connect``; a
private standalone one with ``--standalone``), speaking the same protocol an editor
does, and closes its connection (shutdown + exit) when done. The database
is ``--db``, else ``$DAGCTX_DB``, else the daemon's default in the user data directory.
A session may be named by a unique prefix of its id.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from dagctx.client import DagctxClient
    from dagctx.protocol import context_messages as c
    from dagctx.protocol import errors
    from dagctx.protocol import messages as m



def ensure_ui() -> None:
    """Import what the commands use (rich, msgspec, the client) on first use.

    ``dagctx serve`` imports this module to build its argument parser; the daemon must
    not pay for a terminal UI it never shows, so nothing heavy is imported at module level.
    """
    global asyncio, msgspec, escape, BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    global Table, Text, DagctxClient, RpcError, c, errors, m  # noqa: PLW0603
    import asyncio

    import msgspec
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table
    from rich.text import Text

    from dagctx.client import DagctxClient, RpcError
    from dagctx.protocol import context_messages as c
    from dagctx.protocol import errors
    from dagctx.protocol import messages as m


def make_console() -> Console:
    """A console; when stdout is not a terminal, wide enough that tables stay readable."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=int(os.environ.get("COLUMNS", "140")), soft_wrap=False)


class _LazyConsole:
    """``console`` for the whole CLI, created on first use (see ``ensure_ui``)."""

    _real: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._real is None:
            type(self)._real = make_console()
        return getattr(self._real, name)


console: Console = _LazyConsole()  # type: ignore[assignment]


def real_console() -> Console:
    """The console itself (rich objects such as ``Progress`` need the real one)."""
    console.width  # noqa: B018 - creates it
    return _LazyConsole._real  # type: ignore[return-value]


# ---------------------------------------------------------------- registration


def register(sub: argparse._SubParsersAction) -> None:
    from typing import get_args

    from dagctx.protocol.context_messages import ExportFormat, Format, ImportFormat

    def add(name: str, fn: Callable[[argparse.Namespace], Awaitable[int]], help: str,
            db_help: str = "database: a SQLite file path or a postgresql:// URL (default: $DAGCTX_DB or the user data dir)") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        # SUPPRESS: ``dagctx --db F cmd`` and ``dagctx cmd --db F`` both work (see build_parser).
        p.add_argument("--db", help=db_help, default=argparse.SUPPRESS)
        p.add_argument("--log-level", default=argparse.SUPPRESS, help="log level of a --standalone daemon")
        p.add_argument("--standalone", action="store_true",
                       help="use a private daemon instead of the shared per-user one (also DAGCTX_STANDALONE=1)")
        p.set_defaults(func=lambda args: run(fn, args))
        return p

    p = add("import", cmd_import, "import transcripts (files or folders such as ~/.claude/projects)")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--format", default="auto",
                   choices=get_args(ImportFormat))
    p.add_argument("--title", help="title for the imported session(s)")

    p = add("sessions", cmd_sessions, "list the sessions of the database")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--source", metavar="FORMAT",
                   help="only sessions imported from this format (claude-code, codex, …), or 'native'")

    p = add("delete", cmd_delete, "delete a session and everything in it")
    p.add_argument("session")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")

    p = add("show", cmd_show, "print one node in full (its whole output, even when spilled)")
    p.add_argument("node", help="a node id or a unique prefix of one")
    p.add_argument("--session", help="the session holding it (default: look in every session)")
    p.add_argument("--json", action="store_true", help="print the node as JSON")

    p = add("history", cmd_history, "the branch ending at HEAD (or --head), oldest first")
    p.add_argument("session")
    p.add_argument("--head")

    p = add("render", cmd_render, "the messages a model would see for a head")
    p.add_argument("session")
    p.add_argument("--model")
    p.add_argument("--format", default="openai", choices=get_args(Format))
    p.add_argument("--head")
    p.add_argument("--json", action="store_true", help="print the raw render result as JSON")

    p = add("search", cmd_search, "full-text search over history (English, code identifiers, CJK)")
    p.add_argument("query")
    p.add_argument("--session")
    p.add_argument("--limit", type=int, default=20)

    p = add("stats", cmd_stats, "token budget of a session's next turn (context/prepare)")
    p.add_argument("session")
    p.add_argument("--model")
    p.add_argument("--head")

    p = add("compact", cmd_compact, "compact a branch into a rolling summary (needs an LLM endpoint)")
    p.add_argument("session")
    p.add_argument("--model")
    p.add_argument("--head")
    p.add_argument("--keep-recent-tokens", type=int)
    p.add_argument("--instructions")
    p.add_argument("--endpoint", help="base URL of an OpenAI-compatible endpoint for the summary")
    p.add_argument("--endpoint-model", help="model name at that endpoint")
    p.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")
    p.add_argument("--fallback", choices=["none", "structural"], default="none",
                   help="'structural': a deterministic structural summary when no LLM answers (explicit opt-in)")

    p = add("export", cmd_export, "export a branch as a Claude Code transcript or OpenAI messages")
    p.add_argument("session")
    p.add_argument("--format", default="claude-code", choices=get_args(ExportFormat),
                   help="default: claude-code")
    p.add_argument("-o", "--output", help="file to write; stdout when absent")
    p.add_argument("--force", action="store_true", help="replace the --output file if it exists")
    p.add_argument("--all-branches", action="store_true", help="claude-code: every branch, not only HEAD's")
    p.add_argument("--head")

    p = sub.add_parser("migrate", help="copy every session from one database to another (idempotent)",
                       description="copy every session exactly from one database to another: a SQLite file "
                       "path or a postgresql:// URL on either side; running it again copies only what changed")
    p.add_argument("--from", dest="source", required=True, metavar="PATH_OR_URL")
    p.add_argument("--to", dest="target", required=True, metavar="PATH_OR_URL")
    p.set_defaults(func=lambda args: run(cmd_migrate, args))

    p = add("demo", cmd_demo, "generate a realistic agent session through the daemon and show what dagctx does",
            db_help="database file to use (default: a new temporary one, removed afterwards unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the demo database and print its path")
    p.add_argument("--turns", type=int, default=8, help="follow-up work turns after the opening ones (default 8)")


def run(fn: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace) -> int:
    ensure_ui()
    try:
        return asyncio.run(fn(args))
    except RpcError as exc:
        console.print(f"[red]error[/red]: {escape(sentence(exc.message))} ({exc.kind or exc.code})")
        return 1
    except (ConnectionError, OSError) as exc:
        first, _, rest = str(exc).partition("\n")
        console.print(f"[red]error[/red]: {escape(sentence(first))}")
        if rest:
            console.print(escape(rest), highlight=False)  # the daemon's last stderr lines, as written
        return 1
    except KeyboardInterrupt:
        return 130


def database_of(args: argparse.Namespace) -> str | None:
    return getattr(args, "db", None) or os.environ.get("DAGCTX_DB") or None


@asynccontextmanager
async def connect(args: argparse.Namespace, **kw: Any) -> AsyncIterator[DagctxClient]:
    """A client of the shared per-user daemon (straight to its socket), or of a private
    standalone daemon with ``--standalone`` / ``DAGCTX_STANDALONE=1``."""
    from dagctx.cli import standalone_requested
    from dagctx.protocol import transport

    if getattr(args, "standalone", False) or standalone_requested() or not transport.supported():
        level = getattr(args, "log_level", None)
        if level:
            kw.setdefault("extra_args", ["--log-level", level])
        client = await DagctxClient.spawn(database_of(args), standalone=True, **kw)
    else:
        kw.pop("stderr", None)
        db = database_of(args)
        if db is not None and "://" in db:
            # A server URL is not a path: it travels as initializationOptions.database,
            # which the daemon takes as it is (the attach message makes paths absolute).
            opts = {**(kw.pop("initialization_options", None) or {}), "database": db}
            client = await DagctxClient.connect(None, initialization_options=opts, **kw)
        else:
            client = await DagctxClient.connect(db, **kw)
    try:
        yield client
    finally:
        await client.close()


async def resolve_session(client: DagctxClient, ref: str) -> m.SessionInfo:
    """The session with id ``ref``, or the only one whose id starts with ``ref``."""
    try:
        return await client.session_get(ref)
    except RpcError as exc:
        if exc.kind != "SessionNotFound":
            raise
    matches: list[m.SessionInfo] = []
    offset = 0
    while True:
        page = await client.session_list(limit=500, offset=offset)
        matches.extend(s for s in page.sessions if s.session_id.startswith(ref))
        offset += len(page.sessions)
        if not page.sessions or offset >= page.total:
            break
    if len(matches) == 1:
        return matches[0]
    why = "no session id starts with it" if not matches else f"{len(matches)} sessions match; give more characters"
    raise RpcError(-32001, f"session {ref!r}: {why} (list them with `dagctx sessions`)", {"kind": "SessionNotFound"})


# ---------------------------------------------------------------- text helpers


def sentence(text: str) -> str:
    """``text`` as a sentence: capital first letter, final full stop."""
    text = " ".join(text.split())
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?…):" else text + "."


def preview(value: Any, limit: int = 90) -> str:
    """One line of a node input/output or message content."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, list):
        parts = []
        for b in value:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, dict):
                if isinstance(b.get("text"), str):
                    parts.append(b["text"])
                elif b.get("type") in ("tool_use", "tool_call"):
                    parts.append(f"→ {b.get('name')}({preview(b.get('input'), 60)})")
                elif b.get("type") == "tool_result":
                    parts.append(f"← {preview(b.get('content'), limit)}")
                else:
                    parts.append(f"[{b.get('type')}]")
        text = " ".join(parts)
    else:
        text = msgspec.json.encode(value).decode("utf-8")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_HEXISH = frozenset("0123456789abcdef-")


def short(node_id: str, n: int = 8) -> str:
    """A short form of an id: 8 characters of a UUID or hex id, more of a named one
    (``summary-1edb3dff…``, ``toolu_01NUB6cF…``)."""
    if len(node_id) <= n + 2:
        return node_id
    if set(node_id[:n]) <= _HEXISH:
        return node_id[:n]
    return node_id if len(node_id) <= 18 else node_id[:16] + "…"


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def message_text(msg: dict[str, Any], limit: int = 240) -> str:
    """A readable preview of one rendered message in any of the three formats."""
    parts = []
    content = msg.get("content")
    if content is not None:
        parts.append(preview(content, limit))
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        parts.append(f"→ {fn.get('name')}({preview(fn.get('arguments'), 80)}) [{call.get('id')}]")
    if msg.get("tool_call_id"):
        parts.insert(0, f"[{msg['tool_call_id']}]")
    return " ".join(p for p in parts if p)


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
    print_import_summary(sessions, skipped, more)
    for path, why in failed:
        console.print(f"[red]failed[/red] {escape(path)}: {escape(sentence(why))}")
    not_imported = [s for s in skipped if s.line is None]
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

            def on_progress(params: Any) -> None:
                value = getattr(params, "value", None) or {}
                if value.get("percentage") is not None:
                    progress.update(task, completed=int(value["percentage"]))
                if value.get("message"):
                    progress.update(task, note=str(value["message"]))

            client.on_notification("$/progress", on_progress)
            res = await client.request("database/migrate", m.DatabaseMigrateParams(source=source, work_done_token="migrate"),
                                       timeout=None)
            progress.update(task, completed=100)
    finally:
        await client.close()
    res = msgspec.convert(res, m.DatabaseMigrateResult) if not isinstance(res, m.DatabaseMigrateResult) else res
    console.print(f"{escape(res.source)} → {escape(res.target)}: {res.sessions} sessions, copied {res.copied} "
                  f"({res.nodes:,} nodes), unchanged {res.unchanged}, conflicts {len(res.conflicts)}")
    for sid in res.conflicts:
        console.print(f"[yellow]conflict[/yellow] {sid}: changed on the target since it was copied; not overwritten")
    return 1 if res.conflicts else 0


async def cmd_sessions(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        db = client.initialize_result.database if client.initialize_result else "?"
        if args.source:
            rows = [s for s in await all_sessions(client) if source_of(s) == args.source]
            res = m.SessionListResult(sessions=rows[: args.limit], total=len(rows))
        else:
            res = await client.session_list(limit=args.limit)
    what = f" from {args.source}" if args.source else ""
    table = Table(title=f"{res.total} sessions{what} in {db}")
    table.add_column("session", min_width=36)
    table.add_column("title", overflow="ellipsis", max_width=max(16, console.width - 103), no_wrap=True)
    table.add_column("nodes", justify="right")
    table.add_column("updated")
    table.add_column("head")
    table.add_column("from")
    for s in res.sessions:
        table.add_row(s.session_id, escape(s.title), str(s.node_count), when(s.updated_at), short(s.head),
                      source_of(s))
    console.print(table)
    if res.total > len(res.sessions):
        console.print(f"… {res.total - len(res.sessions)} more (--limit)")
    return 0


def source_of(s: m.SessionInfo) -> str:
    """Where a session came from: the format it was imported from, else ``native``."""
    fmt = s.metadata.get("importedFrom")
    return fmt if isinstance(fmt, str) and fmt else "native"


async def all_sessions(client: DagctxClient) -> list[m.SessionInfo]:
    out: list[m.SessionInfo] = []
    while True:
        page = await client.session_list(limit=500, offset=len(out))
        out.extend(page.sessions)
        if not page.sessions or len(out) >= page.total:
            return out


async def cmd_delete(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        if not args.yes and sys.stdin.isatty():
            answer = input(f"Delete session {info.session_id} {info.title!r} ({info.node_count} nodes)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                console.print("Nothing was deleted.")
                return 1
        res = await client.session_delete(info.session_id)
    console.print(f"Deleted session {info.session_id} {escape(info.title)!r} ({res.nodes_removed} nodes).")
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        sessions = [await resolve_session(client, args.session)] if args.session else await all_sessions(client)
        found: list[tuple[m.SessionInfo, str]] = []
        for info in sessions:
            got = (await client.get_nodes(info.session_id, [args.node])).nodes if await _has_node(
                client, info.session_id, args.node) else []
            if got:
                found = [(info, got[0].id)]
                break
        if not found:
            for info in sessions:
                found.extend((info, nid) for nid in await _node_ids(client, info.session_id) if nid.startswith(args.node))
            found = list({(i.session_id, nid): (i, nid) for i, nid in found}.values())
        if len(found) != 1:
            why = "no node id starts with it" if not found else f"{len(found)} nodes match; give more characters"
            raise RpcError(-32001, f"node {args.node!r}: {why} (ids are listed by `dagctx history SESSION`)",
                           {"kind": "NodeNotFound"})
        info, nid = found[0]
        node = (await client.get_nodes(info.session_id, [nid])).nodes[0]
        spill = node.metadata.get("spill")
        if isinstance(spill, dict):
            node = (await client.get_nodes(info.session_id, [nid], range=m.OutputRange(offset=0))).nodes[0]
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(node), indent=2).decode("utf-8") + "\n")
        return 0
    table = Table(title=f"node {node.id} in {escape(info.title)} ({info.session_id})", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field, value in (("role", node.role), ("name", node.name), ("status", node.status), ("seq", node.seq),
                         ("created", when(node.created_at)), ("caller", node.caller), ("predecessor", node.predecessor)):
        table.add_row(field, escape(str(value if value is not None else "—")))
    if node.reads:
        table.add_row("reads", escape(", ".join(node.reads)))
    if node.metadata:
        table.add_row("metadata", escape(msgspec.json.encode(node.metadata).decode("utf-8")))
    console.print(table)
    for label, value in (("input", node.input), ("output", node.output)):
        if value is None or value == "":
            continue
        text = value if isinstance(value, str) else msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
        console.print(f"[bold]{label}[/bold]")
        console.print(escape(text), markup=True, highlight=False, soft_wrap=True)
    return 0


async def _has_node(client: DagctxClient, session_id: str, node_id: str) -> bool:
    try:
        return bool((await client.get_nodes(session_id, [node_id])).nodes)
    except RpcError as exc:
        if exc.kind == "NodeNotFound":
            return False
        raise


async def _node_ids(client: DagctxClient, session_id: str) -> list[str]:
    """Ids of the session's conversation nodes on every branch and the nodes they read
    (their tool calls): what a prefix may name."""
    ids: list[str] = []
    for b in (await client.branches(session_id)).branches:
        for n in (await client.history(session_id, head=b.head)).nodes:
            ids.append(n.id)
        r = await client.render(session_id, head=b.head, format="neutral")
        ids.extend(r.reads)
    return list(dict.fromkeys(ids))


async def cmd_history(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        res = await client.history(info.session_id, head=args.head)
    table = Table(title=f"{escape(info.title)} — {len(res.nodes)} turns to {res.head}")
    table.add_column("seq", justify="right")
    table.add_column("id")
    table.add_column("role")
    table.add_column("name", overflow="ellipsis", max_width=26, no_wrap=True)
    table.add_column("status")
    table.add_column("text", overflow="ellipsis", no_wrap=True, max_width=max(20, console.width - 73))
    for n in res.nodes:
        text = n.output if n.output not in (None, "") else n.input
        status = n.status if n.status == "completed" else f"[red]{n.status}[/red]"
        table.add_row(str(n.seq), short(n.id), n.role, escape(n.name), status, escape(preview(text, 160)))
    console.print(table)
    return 0


async def cmd_search(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        sid = (await resolve_session(client, args.session)).session_id if args.session else None
        res = await client.search(args.query, session_id=sid, limit=args.limit)
    print_hits(args.query, res)
    return 0


def print_hits(query: str, res: m.SearchResult, title: str | None = None) -> None:
    table = Table(title=title or f"{len(res.hits)} hits for {escape(query)!r}")
    table.add_column("session")
    table.add_column("node")
    table.add_column("role")
    table.add_column("name", overflow="ellipsis", max_width=24)
    table.add_column("snippet", overflow="fold", max_width=90)
    table.add_column("score", justify="right")
    for h in res.hits:
        table.add_row(short(h.session_id), short(h.node_id), h.role, escape(h.name), escape(" ".join(h.snippet.split())),
                      f"{h.score:.2f}")
    console.print(table)


# ---------------------------------------------------------------- render


async def cmd_render(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        res = await client.render(info.session_id, head=args.head, format=args.format, model=args.model)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(res), indent=2).decode("utf-8") + "\n")
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
    print_budget(stats, title=f"{escape(info.title)} — {len(prep.messages)} messages")
    for line in prep.decision_path:
        console.print(f"  [dim]· {escape(line)}[/dim]")
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
    return 0 if res.ok else 1


async def run_compaction(client: DagctxClient, session_id: str, **kw: Any) -> c.CompactResult | None:
    """``context/compact`` with a progress bar; ``None`` when the daemon lacks the method."""
    kw = {k: v for k, v in kw.items() if v is not None}
    token = f"compact-{session_id[:8]}"
    with Progress(TextColumn("[bold]compacting"), BarColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=real_console(), transient=True) as progress:
        task = progress.add_task("compact", total=100, note="")

        def on_progress(params: Any) -> None:
            if str(getattr(params, "token", "")) != token:
                return
            value = getattr(params, "value", None) or {}
            if value.get("percentage") is not None:
                progress.update(task, completed=int(value["percentage"]))
            if value.get("message"):
                progress.update(task, note=str(value["message"]))

        client.on_notification("$/progress", on_progress)
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
    else:
        unit = "lines" if args.format == "claude-code" else "messages"
        console.print(f"wrote {res.lines:,} {unit} ({args.format}) to {escape(res.path or path)}")
    return 0


# ---------------------------------------------------------------- demo


async def cmd_demo(args: argparse.Namespace) -> int:
    from dagctx.cli.demo import run_demo

    return await run_demo(args)
