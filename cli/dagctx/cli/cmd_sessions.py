"""``dagctx sessions|delete|show|history|search``: browsing what a database holds.
"""

from __future__ import annotations

import argparse
import sys

import msgspec
from dagctx.cli.ui import escape
from rich.table import Table

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m

from .ui import all_sessions, connect, console, preview, print_json, resolve_session, short, source_of, when


async def cmd_sessions(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        db = client.initialize_result.database if client.initialize_result else "?"
        if args.source:
            rows = [s for s in await all_sessions(client) if source_of(s) == args.source]
            res = m.SessionListResult(sessions=rows[: args.limit], total=len(rows))
        else:
            res = await client.session_list(limit=args.limit)
    if args.json:
        print_json(res)
        return 0
    what = f" from {args.source}" if args.source else ""
    rows = [[s.session_id, s.title, str(s.node_count), when(s.updated_at), short(s.head), source_of(s)]
            for s in res.sessions]
    table = sessions_table(f"{res.total} sessions{what} in {db}", rows, console.width)
    console.print(table)
    if res.total > len(res.sessions):
        console.print(f"… {res.total - len(res.sessions)} more (--limit)")
    return 0


def sessions_table(title: str, rows: list[list[str]], width: int) -> Table:
    """The ``sessions`` table (cli/quick.py draws the same one without rich); ``title`` and
    ``rows`` are text, printed as they are."""
    table = Table(title=escape(title))
    table.add_column("session", min_width=36)
    table.add_column("title", overflow="ellipsis", max_width=max(16, width - 103), no_wrap=True)
    table.add_column("nodes", justify="right")
    table.add_column("updated")
    table.add_column("head")
    table.add_column("from")
    for row in rows:
        table.add_row(*map(escape, row))
    return table


async def cmd_delete(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        if not args.yes and sys.stdin.isatty():
            if args.json:
                console.print("[red]error[/red]: --json does not ask; add --yes to delete. Nothing was deleted.")
                return 2
            answer = input(f"Delete session {info.session_id} {info.title!r} ({info.node_count} nodes)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                console.print("Nothing was deleted.")
                return 1
        res = await client.session_delete(info.session_id)
    if args.json:
        print_json({"sessionId": info.session_id, "title": info.title, "nodesRemoved": res.nodes_removed})
        return 0
    console.print(f"Deleted session {info.session_id} {escape(repr(info.title))} ({res.nodes_removed} nodes).")
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info, nid = await resolve_node(client, args.node, args.session)
        node = (await client.get_nodes(info.session_id, [nid])).nodes[0]
        spill = node.metadata.get("spill")
        if isinstance(spill, dict):
            node = (await client.get_nodes(info.session_id, [nid], range=m.OutputRange(offset=0))).nodes[0]
    if args.json:
        print_json(node)
        return 0
    console.print(node_table(f"node {node.id} in {info.title} ({info.session_id})", node_rows(node)))
    for label, text in node_sections(node):
        console.print(f"[bold]{label}[/bold]")
        console.print(escape(text), markup=True, highlight=False, soft_wrap=True)
    return 0


def node_rows(node: m.Call) -> list[tuple[str, str]]:
    """The ``show`` table's rows: field, value as printed (cli/quick.py makes the same ones)."""
    rows = [(field, str(value if value is not None else "—"))
            for field, value in (("role", node.role), ("name", node.name), ("status", node.status), ("seq", node.seq),
                                 ("created", when(node.created_at)), ("caller", node.caller),
                                 ("predecessor", node.predecessor))]
    if node.reads:
        rows.append(("reads", ", ".join(node.reads)))
    if node.metadata:
        rows.append(("metadata", msgspec.json.encode(node.metadata).decode("utf-8")))
    return rows


def node_table(title: str, rows: list[tuple[str, str]]) -> Table:
    """The ``show`` table (cli/quick.py draws the same one without rich)."""
    table = Table(title=escape(title), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field, value in rows:
        table.add_row(field, escape(value))
    return table


def node_sections(node: m.Call) -> list[tuple[str, str]]:
    """What ``show`` prints after the table: the input and the output, JSON indented."""
    out = []
    for label, value in (("input", node.input), ("output", node.output)):
        if value is None or value == "":
            continue
        out.append((label, value if isinstance(value, str) else
                    msgspec.json.format(msgspec.json.encode(value), indent=2).decode()))
    return out


async def resolve_node(client: DagctxClient, ref: str, session: str | None) -> tuple[m.SessionInfo, str]:
    """The node with id ``ref``, or the only one whose id starts with ``ref`` (in the
    session ``session`` names, else in any): one ``id/resolve``, an index lookup (SPEC §4.3)."""
    scope = await resolve_session(client, session) if session else None
    if scope is not None and ref == "ROOT":
        return scope, scope.root_id
    res = await client.id_resolve(ref, kinds="node", session_id=scope.session_id if scope else None, limit=10)
    exact = [x for x in res.matches if x.node_id == ref]
    found = exact if len(exact) == 1 else res.matches
    if len(found) == 1 and found[0].node_id is not None:
        return scope or await client.session_get(found[0].session_id), found[0].node_id
    where = f" in session {scope.session_id}" if scope else ""
    if not found:
        raise RpcError(-32001, f"node {ref!r}: no node id starts with it{where} (ids are listed by "
                       "`dagctx history SESSION`)", {"kind": "NodeNotFound"})
    listed = "; ".join(f"{x.node_id} ({x.role}, session {x.session_id})" for x in found)
    more = " and more" if res.truncated else ""
    raise RpcError(-32602, f"node {ref!r} is ambiguous: {len(found)}{'+' if res.truncated else ''} node ids start "
                   f"with it{where}: {listed}{more}; give more characters (or --session)", {"kind": "InvalidParams"})


async def cmd_history(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        info = await resolve_session(client, args.session)
        res = await client.history(info.session_id, head=args.head)
    if args.json:
        print_json(res)
        return 0
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
    if args.json:
        print_json(res)
        return 0
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
