"""The ``dagctx`` commands besides ``serve`` and ``schema``.

Every command is a client of the shared per-user daemon (``DagctxClient.connect``; a
private standalone one with ``--standalone``), speaking the same protocol an editor
does, and closes its connection (shutdown + exit) when done. The database
is ``--db``, else ``$DAGCTX_DB``, else the daemon's default in the user data directory.
A session may be named by a unique prefix of its id.

Each command lives in the room of its job (``cmd_import.py``, ``cmd_sessions.py``,
``cmd_context.py``, ``demo.py``) over what they share (``ui.py``); this module only
declares the arguments and names each command's function, imported when it runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Awaitable, Callable

def _command(module: str, name: str) -> Callable[[argparse.Namespace], Awaitable[int]]:
    """The command ``name`` of ``dagctx.cli.<module>``, imported when it runs: building the
    parser (which ``dagctx serve`` does) imports no terminal UI, no msgspec, no client."""

    async def call(args: argparse.Namespace) -> int:
        fn = getattr(importlib.import_module(f"dagctx.cli.{module}"), name)
        return await fn(args)

    return call


def run(fn: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace) -> int:
    from dagctx.cli.ui import run as run_command

    return run_command(fn, args)


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

    def json_flag(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument("--json", action="store_true",
                       help=f"print {what} as JSON on stdout (camelCase, as the protocol spells it); "
                            "words and progress go to stderr")

    p = add("import", _command("cmd_import", "cmd_import"), "import transcripts (files or folders such as ~/.claude/projects)")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--format", default="auto",
                   choices=get_args(ImportFormat))
    p.add_argument("--title", help="title for the imported session(s)")
    json_flag(p, "the imported sessions, skipped lines and failed paths")

    p = add("sessions", _command("cmd_sessions", "cmd_sessions"), "list the sessions of the database")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--source", metavar="FORMAT",
                   help="only sessions imported from this format (claude-code, codex, …), or 'native'")
    json_flag(p, "the sessions (session/list's result)")

    p = add("delete", _command("cmd_sessions", "cmd_delete"), "delete a session and everything in it")
    p.add_argument("session")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    json_flag(p, "what was deleted (needs --yes when stdin is a terminal)")

    p = add("show", _command("cmd_sessions", "cmd_show"), "print one node in full (its whole output, even when spilled)")
    p.add_argument("node", help="a node id or a unique prefix of one")
    p.add_argument("--session", help="the session holding it (default: look in every session)")
    json_flag(p, "the node")

    p = add("history", _command("cmd_sessions", "cmd_history"), "the branch ending at HEAD (or --head), oldest first")
    p.add_argument("session")
    p.add_argument("--head")
    json_flag(p, "the branch (session/history's result)")

    p = add("render", _command("cmd_context", "cmd_render"), "the messages a model would see for a head")
    p.add_argument("session")
    p.add_argument("--model")
    p.add_argument("--format", default="openai", choices=get_args(Format))
    p.add_argument("--head")
    json_flag(p, "the raw render result")

    p = add("search", _command("cmd_sessions", "cmd_search"), "full-text search over history (English, code identifiers, CJK)")
    p.add_argument("query")
    p.add_argument("--session")
    p.add_argument("--limit", type=int, default=20)
    json_flag(p, "the hits (search/query's result)")

    p = add("memory", _command("cmd_memory", "cmd_memory"),
            "a workspace's memory files (MEMORY.md, memory/*.md): index, status, search, get")
    msub = p.add_subparsers(dest="memory_cmd", required=True, metavar="{index,status,search,get}")

    def common(q: argparse.ArgumentParser) -> None:  # the connection flags after the subcommand too
        q.add_argument("--db", help="database: a SQLite file path or a postgresql:// URL", default=argparse.SUPPRESS)
        q.add_argument("--log-level", default=argparse.SUPPRESS, help="log level of a --standalone daemon")
        q.add_argument("--standalone", action="store_true", default=argparse.SUPPRESS,
                       help="use a private daemon instead of the shared per-user one")
        q.add_argument("--workspace", help="the workspace folder (default: the current folder)")

    q = msub.add_parser("index", help="index the workspace's memory files (incremental)")
    common(q)
    q.add_argument("--extra", action="append", metavar="PATH", help="an extra file or folder inside the workspace")
    q.add_argument("--chunk-tokens", type=int, default=400)
    q.add_argument("--overlap-tokens", type=int, default=80)
    q.add_argument("--force", action="store_true", help="re-chunk every file")
    json_flag(q, "memory/index's result (exit 3 when a file was skipped)")
    q = msub.add_parser("status", help="the indexed memory files and the session index")
    common(q)
    json_flag(q, "memory/status's result")
    q = msub.add_parser("search", help="keyword search over memory chunks (and sessions)")
    q.add_argument("query")
    common(q)
    q.add_argument("--max-results", type=int, default=6)
    q.add_argument("--min-score", type=float, default=0.0)
    q.add_argument("--sources", action="append", choices=["memory", "sessions"])
    q.add_argument("--half-life", type=float, metavar="DAYS", help="temporal decay half-life in days")
    q.add_argument("--mmr", type=float, metavar="LAMBDA", help="re-rank by MMR with this lambda (0..1)")
    json_flag(q, "memory/search's result")
    q = msub.add_parser("get", help="a chunk (--chunk) or lines of a memory file (--path)")
    common(q)
    q.add_argument("--chunk")
    q.add_argument("--path")
    q.add_argument("--from-line", type=int)
    q.add_argument("--lines", type=int)
    json_flag(q, "memory/get's result")

    p = add("stats", _command("cmd_context", "cmd_stats"), "token budget of a session's next turn (context/prepare)")
    p.add_argument("session")
    p.add_argument("--model")
    p.add_argument("--head")
    json_flag(p, "the budget, the compaction signals and the decision path")

    p = add("compact", _command("cmd_context", "cmd_compact"), "compact a branch into a rolling summary (needs an LLM endpoint)")
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
    json_flag(p, "the compaction result (context/compact's)")

    p = add("export", _command("cmd_context", "cmd_export"), "export a branch as a Claude Code transcript or OpenAI messages")
    p.add_argument("session")
    p.add_argument("--format", default="claude-code", choices=get_args(ExportFormat),
                   help="default: claude-code")
    p.add_argument("-o", "--output", help="file to write; stdout when absent")
    p.add_argument("--force", action="store_true", help="replace the --output file if it exists")
    p.add_argument("--all-branches", action="store_true", help="claude-code: every branch, not only HEAD's")
    p.add_argument("--head")
    json_flag(p, "what was written, with -o (without -o the export itself is the output)")

    p = sub.add_parser("migrate", help="copy every session from one database to another (idempotent)",
                       description="copy every session exactly from one database to another: a SQLite file "
                       "path or a postgresql:// URL on either side; running it again copies only what changed")
    p.add_argument("--from", dest="source", required=True, metavar="PATH_OR_URL")
    p.add_argument("--to", dest="target", required=True, metavar="PATH_OR_URL")
    p.add_argument("--json", action="store_true", help="print the migration's result as JSON on stdout")
    p.set_defaults(func=lambda args: run(_command("cmd_import", "cmd_migrate"), args))

    p = add("ui", _command("cmd_webui", "cmd_ui"),
            "a local web view of the sessions: graphs, what the model saw, summaries (127.0.0.1 only)")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a random free one)")
    p.add_argument("--no-open", action="store_true", help="print the URL without opening a browser")
    p.add_argument("--allow-writes", action="store_true",
                   help="let the page check out and fork (read-only without it)")

    p = add("eval", _command("cmd_eval", "cmd_eval"),
            "measure the quality of dagctx's context decisions by replaying transcripts or sessions (M1–M7, no model needed)",
            db_help="database holding the --session sessions (the replay itself runs in a scratch database)")
    p.add_argument("paths", nargs="*", metavar="PATH", help="transcript files or folders (any importable format)")
    p.add_argument("--session", action="append", default=[], metavar="ID",
                   help="a stored session to replay (repeatable; a unique prefix is enough)")
    p.add_argument("--window", action="append", default=[], metavar="TOKENS",
                   help="context window to replay at, e.g. 16k (repeatable or comma-separated; default 16k,32k,128k)")
    p.add_argument("--format", default="anthropic", choices=get_args(Format),
                   help="request format whose bytes are compared (default anthropic)")
    p.add_argument("--compaction", default="recommended", choices=["recommended", "auto", "off"],
                   help="recommended: compact when context/prepare recommends it (the reference agent loop); "
                        "auto: prepare's allowCompaction; off: never")
    p.add_argument("--keep-recent-tokens", type=int, metavar="TOKENS",
                   help="context/compact's keepRecentTokens (default: the daemon's keep-tail target)")
    p.add_argument("--cache-ttl", type=float, default=300.0,
                   help="prompt-cache lifetime in seconds: a longer pause in the source makes the cache cold (default 300)")
    p.add_argument("--summarizer", default="stand-in", choices=["stand-in", "structural", "endpoint"],
                   help="who writes summaries: the deterministic stand-in (default, no model), the daemon's "
                        "structural fallback (no summaries within a turn), or --endpoint")
    p.add_argument("--endpoint", help="OpenAI-compatible endpoint for the summaries (default: the deterministic stand-in)")
    p.add_argument("--endpoint-model", help="model name at that endpoint")
    p.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")
    p.add_argument("--no-recall", action="store_true", help="skip M1 (its searches are the slowest part)")
    p.add_argument("--max-sessions", type=int, help="replay at most this many sessions")
    p.add_argument("--jobs", type=int, default=2, help="sessions replayed at once, each in its own scratch daemon (default 2)")
    p.add_argument("--plots", metavar="DIR", help="write SVG plots into DIR (tokens per request, retention by class)")
    json_flag(p, "every metric, per session, window and in total")

    p = add("demo", _command("demo", "run_demo"), "generate a realistic agent session through the daemon and show what dagctx does",
            db_help="database file to use (default: a new temporary one, removed afterwards unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the demo database and print its path")
    p.add_argument("--turns", type=int, default=8, help="follow-up work turns after the opening ones (default 8)")
