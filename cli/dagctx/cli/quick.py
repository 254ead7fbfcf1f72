"""``dagctx sessions`` on a path of its own: stdlib only, no asyncio, msgspec or rich.

Listing sessions is what a user types most, and against a warm shared daemon it is two
round trips on a Unix socket; the full CLI spends nearly all of its time importing
(asyncio, msgspec's Structs of the whole protocol, rich). This path speaks the protocol
with ``json`` over a blocking socket and draws the same table rich would draw
(``tests/unit/test_quick_cli.py`` holds the two equal).

It takes only what it can answer exactly: ``[--db X] sessions [--limit N] [--json]``
(global options before or after), a reachable daemon, an answer without error, and a
table that fits the console with plain-ASCII cells. Anything else returns None and the
full command runs — it reports errors in words and handles every option — so this path
never changes what a user sees, only when they see it (``DAGCTX_CLI_QUICK=0`` turns it
off). ``session/list`` reads only, so
running it again on the full path is harmless.
"""

from __future__ import annotations

import json
import os
import sys
import time
#: the ``sessions`` command's default ``--limit`` (cli/commands.py)
DEFAULT_LIMIT = 50
#: the console width when stdout is not a terminal (cli/ui.py ``make_console``)
PIPE_WIDTH = 140


def parse(argv: list[str]) -> dict[str, object] | None:
    """The options of ``[--db X] sessions [--limit N] [--json]``, or None for anything else."""
    if argv.count("sessions") != 1:
        return None
    out: dict[str, object] = {"db": None, "limit": DEFAULT_LIMIT, "json": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if a == "sessions":
            i += 1
        elif a == "--json":
            out["json"] = True
            i += 1
        elif a == "--db" and value is not None and not value.startswith("-"):
            out["db"] = value
            i += 2
        elif a.startswith("--db=") and len(a) > 5:
            out["db"] = a[5:]
            i += 1
        elif a == "--limit" and value is not None and value.isdigit():
            out["limit"] = int(value)
            i += 2
        elif a.startswith("--limit=") and a[8:].isdigit():
            out["limit"] = int(a[8:])
            i += 1
        elif a == "--log-level" and value is not None:
            i += 2  # a daemon's setting: this command starts none of its own
        else:
            return None
    return out


def _frame(message: dict[str, object]) -> bytes:
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _read(f: object) -> dict[str, object] | None:
    length = None
    while True:
        line = f.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None:
        return None
    body = f.read(length)
    return json.loads(body) if len(body) == length else None


def list_sessions(db: str | None, limit: int) -> tuple[dict[str, object], str] | None:
    """(``session/list``'s result, the database the daemon opened) from the shared daemon
    in one pipelined write, or None when anything is not plain success."""
    from dagctx.protocol import transport

    if not transport.supported():
        return None
    opts: dict[str, object] = {}
    if db is not None and "://" in db:
        opts["database"] = db  # a server URL travels as it is (as cli/ui.py ``connect`` does)
        db = None
    try:
        sock = transport.connect_or_start()
    except OSError:
        return None
    try:
        sock.settimeout(60)
        attach = {"cwd": os.getcwd(), "database": transport.client_database(db), "pid": os.getpid(),
                  "env": dict(os.environ)}
        init = {"processId": os.getpid(), "clientInfo": {"name": "dagctx-cli", "version": "0.1.0"},
                "capabilities": {}, "initializationOptions": opts}
        sock.sendall(
            _frame({"jsonrpc": "2.0", "method": "$/dagctx/attach", "params": attach})
            + _frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
            + _frame({"jsonrpc": "2.0", "method": "initialized", "params": {}})
            + _frame({"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {"limit": limit}})
        )
        f = sock.makefile("rb")
        database = None
        while True:
            msg = _read(f)
            if msg is None or "error" in msg:
                return None
            if msg.get("id") == 1 and "method" not in msg:
                database = (msg.get("result") or {}).get("database")
            elif msg.get("id") == 2 and "method" not in msg:
                result = msg.get("result")
                if not isinstance(result, dict) or database is None:
                    return None
                return result, database
            # anything else (a log message, a notification) is not ours
    except (OSError, ValueError):
        return None
    finally:
        sock.close()  # EOF ends the connection cleanly (SPEC §1.2)


def short(node_id: str | None, n: int = 8) -> str:
    """cli/ui.py ``short``: 8 characters of a UUID or hex id, more of a named one."""
    if not node_id:
        return ""
    if len(node_id) <= n + 2:
        return node_id
    if set(node_id[:n]) <= set("0123456789abcdefABCDEF-"):
        return node_id[:n]
    return node_id if len(node_id) <= 18 else node_id[:16] + "…"


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def source_of(session: dict[str, object]) -> str:
    fmt = (session.get("metadata") or {}).get("importedFrom")
    return fmt if isinstance(fmt, str) and fmt else "native"


BOLD, ITALIC, CYAN_BOLD, RESET = "\x1b[1m", "\x1b[3m", "\x1b[1;36m", "\x1b[0m"


def table(title: str, rows: list[list[str]], width: int, title_max: int, *, styled: bool = False) -> str | None:
    """The sessions table as rich draws it (box HEAVY_HEAD, one space of padding, the
    title centred over it, italic title and bold header on a terminal), or None when rich
    would have to wrap, shrink or measure wide characters — then rich itself draws it."""
    headers = ["session", "title", "nodes", "updated", "head", "from"]
    if not all(c.isascii() and c.isprintable() for c in [title, *(c for r in rows for c in r)]):
        return None
    if "[" in title:
        return None  # rich reads a title as markup
    # the title column cuts with an ellipsis at its maximum width (cli/cmd_sessions.py)
    rows = [[c if i != 1 or len(c) <= title_max else c[: title_max - 1] + "…" for i, c in enumerate(r)]
            for r in rows]
    widths = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(6)]
    widths[0] = max(widths[0], 36)
    total = sum(w + 3 for w in widths) + 1
    if total > width or len(title) > total:
        return None
    right = {2}

    def line(left: str, fill: str, mid: str, end: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + end

    def cell(i: int, v: str) -> str:
        return v.rjust(widths[i]) if i in right else v.ljust(widths[i])

    if styled:
        head = "┃" + "┃".join(f"{BOLD} {RESET}{BOLD}{cell(i, h)}{RESET}{BOLD} {RESET}" for i, h in enumerate(headers)) + "┃"
    else:
        head = "┃" + "┃".join(f" {cell(i, h)} " for i, h in enumerate(headers)) + "┃"
    pad = total - len(title)
    top = " " * (pad // 2) + title + " " * (pad - pad // 2)
    out = [f"{ITALIC}{top}{RESET}" if styled else top, line("┏", "━", "┳", "┓"), head, line("┡", "━", "╇", "┩")]
    out += ["│" + "│".join(f" {cell(i, v)} " for i, v in enumerate(r)) + "│" for r in rows]
    out.append(line("└", "─", "┴", "┘"))
    return "\n".join(out) + "\n"


def more_line(n: int, *, styled: bool = False) -> str:
    """``… N more (--limit)`` as rich prints it (its highlighter marks the number and brackets)."""
    if styled:
        return f"… {CYAN_BOLD}{n}{RESET} more {BOLD}({RESET}--limit{BOLD}){RESET}\n"
    return f"… {n} more (--limit)\n"


def terminal_width() -> int:
    """COLUMNS, else the terminal's width, else 80 (what rich measures; ``shutil`` would
    import compression modules for nothing)."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or 80
    except (OSError, ValueError):
        return 80


def run(argv: list[str]) -> int | None:
    """Answer ``dagctx sessions`` here, or None to let the full command answer."""
    if os.environ.get("DAGCTX_CLI_QUICK", "").strip() == "0":
        return None  # the full command, always (for comparing the two, or to rule this path out)
    opts = parse(argv)
    if opts is None:
        return None
    got = list_sessions(opts["db"] or os.environ.get("DAGCTX_DB") or None, opts["limit"])
    if got is None:
        return None
    result, database = got
    sessions = result.get("sessions") or []
    total = int(result.get("total") or 0)
    if opts["json"]:
        sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
        sys.stdout.flush()
        return 0
    styled = sys.stdout.isatty()
    if styled:
        if os.environ.get("TERM") == "dumb" or os.environ.get("FORCE_COLOR") is not None:
            return None  # rich's own rules for those
        width = terminal_width()
    else:
        width = int(os.environ.get("COLUMNS", str(PIPE_WIDTH)))
    rows = [[s["sessionId"], s.get("title") or "", str(s.get("nodeCount", 0)), when(s.get("updatedAt") or 0),
             short(s.get("head")), source_of(s)] for s in sessions]
    text = table(f"{total} sessions in {database}", rows, width, max(16, width - 103), styled=styled)
    if text is None:
        return None
    if total > len(sessions):
        text += more_line(total - len(sessions), styled=styled)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0
