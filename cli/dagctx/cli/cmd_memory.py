"""``dagctx memory index|status|search|get``: a workspace's memory files (SPEC §5.1).

A client like every command: it asks the daemon, which reads the workspace's files.
The workspace is ``--workspace`` (default: the current folder).
"""

from __future__ import annotations

import argparse
import os
import sys

from dagctx.cli.ui import escape
from rich.table import Table

from dagctx.protocol import memory_messages as mem

from .ui import connect, console, print_json


def _workspace(args: argparse.Namespace) -> str:
    return os.path.abspath(args.workspace or os.getcwd())


async def cmd_memory(args: argparse.Namespace) -> int:
    ws = _workspace(args)
    async with connect(args) as client:
        if args.memory_cmd == "index":
            opts = mem.MemoryIndexOptions(extra_paths=args.extra or [], chunk_tokens=args.chunk_tokens,
                                          overlap_tokens=args.overlap_tokens)
            res = await client.request("memory/index", mem.MemoryIndexParams(workspace=ws, options=opts,
                                                                             force=args.force), timeout=600)
        elif args.memory_cmd == "status":
            res = await client.request("memory/status", mem.MemoryStatusParams(workspace=ws))
        elif args.memory_cmd == "search":
            res = await client.request("memory/search", mem.MemorySearchParams(
                query=args.query, workspace=ws, max_results=args.max_results, min_score=args.min_score,
                sources=args.sources or ["memory"],
                temporal_decay=mem.MemoryDecay(half_life_days=args.half_life) if args.half_life else None,
                mmr=mem.MemoryMmr(lambda_=args.mmr) if args.mmr is not None else None))
        else:
            res = await client.request("memory/get", mem.MemoryGetParams(
                workspace=ws, chunk_id=args.chunk, path=args.path, from_line=args.from_line, lines=args.lines))
    if args.json:
        print_json(res)
        return 0
    if isinstance(res, mem.MemoryIndexResult):
        console.print(f"{res.files} files indexed in {escape(res.workspace)}: {res.reindexed} re-chunked, "
                      f"{res.unchanged} unchanged, {res.removed} removed; {res.chunks} chunks")
        for s in res.skipped:
            console.print(f"[yellow]skipped[/yellow] ({s.kind}) {escape(s.note)}")
        return 0 if res.complete else 3
    if isinstance(res, mem.MemoryStatusResult):
        table = Table(title=f"{len(res.files)} memory files, {res.chunks} chunks")
        for col in ("path", "source", "chunks", "bytes"):
            table.add_column(col)
        for f in res.files:
            table.add_row(escape(f.path), f.source, str(f.chunks), f"{f.size:,}")
        console.print(table)
        for s in res.skipped:
            console.print(f"[yellow]skipped[/yellow] ({s.kind}) {escape(s.note)}")
        if res.indexed_at is None:
            console.print("never indexed: run `dagctx memory index`")
        if res.embedding:
            console.print(f"vectors ({escape(res.embedding)}): {res.vectors} of {res.chunks} chunks")
        ss = res.sessions
        state = "up to date" if ss.up_to_date else f"{ss.pending} session(s) written since (the next search "\
            "over sessions indexes them)"
        console.print(f"sessions: {ss.sessions} indexed, {ss.chunks} chunks, {ss.vectors} with vectors "
                      f"({ss.vectors_missing} waiting); {state}")
        console.print(f"session catch-ups by this daemon: {ss.checks} asked, {ss.unchanged} found nothing "
                      f"changed, {ss.listings} compared every session, {ss.sessions_read} session(s) read")
        return 0
    if isinstance(res, mem.MemorySearchResult):
        table = Table(title=f"{len(res.hits)} hits ({escape(res.expression)})")
        for col in ("where", "chunk", "snippet", "score"):
            table.add_column(col, overflow="fold")
        for h in res.hits:
            where = f"{h.path}:{h.start_line}-{h.end_line}" if h.source == "memory" else f"{h.session_id}/{h.node_id}"
            table.add_row(escape(where), h.chunk_id or "", escape(" ".join(h.snippet.split())), f"{h.score:.3f}")
        console.print(table)
        return 0
    assert isinstance(res, mem.MemoryGetResult)
    sys.stdout.write(res.text + ("\n" if res.text and not res.text.endswith("\n") else ""))
    return 0
