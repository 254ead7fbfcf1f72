"""What every command shares: the console, running a command (errors in words, exit codes),
the connection to a daemon, naming a session by a prefix, and text helpers.

Imported only when a command runs: ``dagctx serve`` builds the argument parser from
``commands.py`` without paying for a terminal UI.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import re

import msgspec
from rich.console import Console

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m


def make_console() -> Console:
    """A console; when stdout is not a terminal, wide enough that tables stay readable."""
    from rich.console import Console

    # emoji=False: a stored ``:smile:`` is text, printed as written (rich would draw 😄)
    if sys.stdout.isatty():
        return Console(emoji=False)
    return Console(width=int(os.environ.get("COLUMNS", "140")), soft_wrap=False, emoji=False)


class _LazyConsole:
    """``console`` for the whole CLI, created on first use (its width depends on stdout)."""

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


#: a ``[`` rich's markup reads as a tag, with the backslashes before it
_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
#: the other ``[``s with backslashes before them
_BACKSLASHED_BRACKET = re.compile(r"(\\+)(\[)")


def escape(text: str) -> str:
    """``text`` (a title, a path, a node's words, a daemon's message) as console markup that
    prints exactly ``text``: every character, every backslash, no tag and no emoji.

    rich's own ``escape()`` is not exact: it leaves ``x\\[y`` alone (the markup then reads
    ``\\[`` as an escaped ``[`` and prints ``x[y``) and doubles a final backslash (printed
    twice at the end of a line). Here a tag-shaped ``[`` after k backslashes gets 2k + 1 of
    them (k printed, the tag escaped), any other ``[`` after k backslashes gets k + 1 (the
    markup drops one), and a final backslash is kept single. So the text must not be
    followed directly by a tag in the markup around it (a test checks the CLI's sources);
    the consoles here print emoji codes as written (``emoji=False``).
    """
    out = []
    pos = 0
    for m in _TAG.finditer(text):
        out.append(_BACKSLASHED_BRACKET.sub(r"\1\\\2", text[pos:m.start()]))
        slashes = m.group(1)
        out.append(f"{slashes}{slashes}\\{m.group(2)}")
        pos = m.end()
    out.append(_BACKSLASHED_BRACKET.sub(r"\1\\\2", text[pos:]))
    return "".join(out)


def print_json(value: Any) -> None:
    """``--json``: the command's data on stdout, as the protocol spells it (camelCase)."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode("utf-8") + "\n")
    sys.stdout.flush()


def run(fn: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        # --json: stdout carries the JSON document only; words, progress and errors go to stderr
        _LazyConsole._real = Console(stderr=True, width=int(os.environ.get("COLUMNS", "140")), soft_wrap=False,
                                     emoji=False)
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
    from dagctx.cli.options import standalone_requested
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
    # one id/resolve: an index lookup, however many sessions the database holds (SPEC §4.3)
    res = await client.id_resolve(ref, kinds="session", limit=10)
    if len(res.matches) == 1:
        return await client.session_get(res.matches[0].session_id)
    if not res.matches:
        raise RpcError(-32001, f"session {ref!r}: no session id starts with it (list them with `dagctx sessions`)",
                       {"kind": "SessionNotFound"})
    listed = "; ".join(f"{x.session_id} ({x.title!r})" for x in res.matches)
    more = " and more" if res.truncated else ""
    raise RpcError(-32602, f"session {ref!r} is ambiguous: {len(res.matches)}{'+' if res.truncated else ''} session "
                   f"ids start with it: {listed}{more}; give more characters", {"kind": "InvalidParams"})


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


def follow_progress(progress: Any, task: Any, token: str | None = None) -> Callable[[Any], None]:
    """A ``$/progress`` handler moving ``task`` of a rich ``Progress`` (only for ``token``
    when given): its percentage, and its message as the task's note."""

    def on_progress(params: Any) -> None:
        if token is not None and str(getattr(params, "token", "")) != token:
            return
        value = getattr(params, "value", None) or {}
        if value.get("percentage") is not None:
            progress.update(task, completed=int(value["percentage"]))
        if value.get("message"):
            progress.update(task, note=str(value["message"]))

    return on_progress
