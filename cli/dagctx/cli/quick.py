"""``dagctx sessions`` and ``dagctx show REF`` on a path of their own: stdlib only, no
asyncio, msgspec or rich.

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

``[--db X] show REF [--json]`` (issue #20: a node by id prefix in a fraction of a second)
is the same bargain: one ``id/resolve`` (an index range, SPEC §4.3) behind the handshake,
then ``session/get`` and ``node/get``; the node's table is drawn as rich draws it (folded
values, a collapsed value column) when its cells are plain one-cell characters, and the
input and output printed as rich prints them — else, or for an ambiguous or unknown
prefix, the full command answers (``tests/unit/test_quick_cli.py`` holds the drawing
equal to rich's).
"""

from __future__ import annotations

import json
import os
import re
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
        elif taken := _shared_option(a, value, out):
            i += taken
        elif a == "--limit" and value is not None and value.isdigit():
            out["limit"] = int(value)
            i += 2
        elif a.startswith("--limit=") and a[8:].isdigit():
            out["limit"] = int(a[8:])
            i += 1
        else:
            return None
    return out


def _shared_option(a: str, value: str | None, out: dict[str, object]) -> int:
    """How many arguments an option both quick commands take uses (``--json``, ``--db X``,
    ``--db=X``, ``--log-level X``), recorded in ``out``; 0 when ``a`` is none of them.
    ``value`` is the argument after ``a``, if any."""
    if a == "--json":
        out["json"] = True
        return 1
    if a == "--db" and value is not None and not value.startswith("-"):
        out["db"] = value
        return 2
    if a.startswith("--db=") and len(a) > 5:
        out["db"] = a[5:]
        return 1
    if a == "--log-level" and value is not None:
        return 2  # a daemon's setting: this command starts none of its own
    return 0


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


def _open(db: str | None) -> tuple[object, list[bytes]] | None:
    """A socket to the shared daemon and the frames that open a connection (attach,
    initialize as id 1, initialized), or None when the shared path is not available."""
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
    sock.settimeout(60)
    attach = {"cwd": os.getcwd(), "database": transport.client_database(db), "pid": os.getpid(),
              "env": dict(os.environ)}
    init = {"processId": os.getpid(), "clientInfo": {"name": "dagctx-cli", "version": "0.1.0"},
            "capabilities": {}, "initializationOptions": opts}
    return sock, [_frame({"jsonrpc": "2.0", "method": "$/dagctx/attach", "params": attach}),
                  _frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}),
                  _frame({"jsonrpc": "2.0", "method": "initialized", "params": {}})]


def _answers(f: object, ids: set[int]) -> dict[int, object] | None:
    """The results of the requests ``ids``, or None on any error or a closed connection."""
    got: dict[int, object] = {}
    while len(got) < len(ids):
        msg = _read(f)
        if msg is None or "error" in msg:
            return None
        if msg.get("id") in ids and "method" not in msg:
            got[msg["id"]] = msg.get("result")
        # anything else (a log message, a notification) is not ours
    return got


def _request(i: int, method: str, params: dict[str, object]) -> bytes:
    return _frame({"jsonrpc": "2.0", "id": i, "method": method, "params": params})


def list_sessions(db: str | None, limit: int) -> tuple[dict[str, object], str] | None:
    """(``session/list``'s result, the database the daemon opened) from the shared daemon
    in one pipelined write, or None when anything is not plain success."""
    opened = _open(db)
    if opened is None:
        return None
    sock, frames = opened
    try:
        sock.sendall(b"".join(frames) + _request(2, "session/list", {"limit": limit}))
        got = _answers(sock.makefile("rb"), {1, 2})
        if got is None:
            return None
        database = (got[1] or {}).get("database")
        result = got[2]
        if not isinstance(result, dict) or database is None:
            return None
        return result, database
    except (OSError, ValueError):
        return None
    finally:
        sock.close()  # EOF ends the connection cleanly (SPEC §1.2)


def fetch_node(db: str | None, ref: str) -> tuple[dict[str, object], dict[str, object]] | None:
    """(the node whose id is ``ref`` or the only one starting with it, its session) — the
    lookups of cli/cmd_sessions.py ``resolve_node`` and ``cmd_show``: one ``id/resolve``
    (an index range, SPEC §4.3) pipelined behind the handshake, then ``session/get`` and
    ``node/get`` together (and the whole output of a spilled node). None when anything is
    not plain success: no match, an ambiguous prefix, an error — the full command says it."""
    opened = _open(db)
    if opened is None:
        return None
    sock, frames = opened
    try:
        sock.sendall(b"".join(frames) + _request(2, "id/resolve", {"prefix": ref, "kinds": "node", "limit": 10}))
        f = sock.makefile("rb")
        got = _answers(f, {1, 2})
        if got is None or not isinstance(got[2], dict):
            return None
        matches = got[2].get("matches") or []
        exact = [x for x in matches if x.get("nodeId") == ref]
        found = exact if len(exact) == 1 else matches
        if len(found) != 1 or not found[0].get("nodeId"):
            return None
        sid, nid = found[0]["sessionId"], found[0]["nodeId"]
        sock.sendall(_request(3, "session/get", {"sessionId": sid})
                     + _request(4, "node/get", {"sessionId": sid, "ids": [nid]}))
        got = _answers(f, {3, 4})
        if got is None:
            return None
        info, nodes = got[3], (got[4] or {}).get("nodes") or []
        if not isinstance(info, dict) or len(nodes) != 1:
            return None
        node = nodes[0]
        if isinstance((node.get("metadata") or {}).get("spill"), dict):
            sock.sendall(_request(5, "node/get", {"sessionId": sid, "ids": [nid], "range": {"offset": 0}}))
            got = _answers(f, {5})
            nodes = ((got or {}).get(5) or {}).get("nodes") or []
            if len(nodes) != 1:
                return None
            node = nodes[0]
        return node, info
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    finally:
        sock.close()


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
    """Answer ``dagctx sessions`` or ``dagctx show REF`` here, or None to let the full command answer."""
    if os.environ.get("DAGCTX_CLI_QUICK", "").strip() == "0":
        return None  # the full command, always (for comparing the two, or to rule this path out)
    if "show" in argv:
        return run_show(argv)
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
        return _print_json(result)
    look = _console_look()
    if look is None:
        return None
    styled, width = look
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


# ---------------------------------------------------------------- dagctx show PREFIX

#: characters whose width this path knows is one cell (besides printable ASCII): the
#: printable Latin-1 letters and signs, and the common punctuation of U+2010–U+2027
_ONE_CELL = frozenset(chr(c) for c in [*range(0xA1, 0x100), *range(0x2010, 0x2028)] if c != 0xAD)


def _print_json(document: object) -> int:
    """``--json``: the one document on stdout, as the full command prints it; exit code 0."""
    sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()
    return 0


def _console_look() -> tuple[bool, int] | None:
    """Whether to style the output and how wide to draw it, as the full command's console
    decides (cli/ui.py ``make_console``); None where rich's own rules apply (``TERM=dumb``,
    ``FORCE_COLOR``): then the full command answers."""
    if not sys.stdout.isatty():
        return False, int(os.environ.get("COLUMNS", str(PIPE_WIDTH)))
    if os.environ.get("TERM") == "dumb" or os.environ.get("FORCE_COLOR") is not None:
        return None
    return True, terminal_width()


def parse_show(argv: list[str]) -> dict[str, object] | None:
    """The options of ``[--db X] show REF [--json]``, or None for anything else (``--session``
    among them: that lookup is the full command's)."""
    if argv.count("show") != 1:
        return None
    out: dict[str, object] = {"db": None, "json": False, "ref": None}
    seen = False
    i = 0
    while i < len(argv):
        a = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if a == "show" and not seen:
            seen = True
            i += 1
        elif taken := _shared_option(a, value, out):
            i += taken
        elif seen and out["ref"] is None and a and not a.startswith("-"):
            out["ref"] = a
            i += 1
        else:
            return None
    return out if out["ref"] is not None else None


def _cells_plain(text: str) -> bool:
    """A table cell or title this path measures exactly: one line of one-cell characters
    (the full command prints every character as stored: ``ui.escape``, no emoji codes)."""
    return all((ch.isascii() and ch.isprintable()) or ch in _ONE_CELL for ch in text)


def _json_exact(value: object) -> bool:
    """Whether ``json`` writes ``value`` as msgspec does (the full command's encoder): they
    differ only in floats with an exponent (``1e+16`` against ``1e16``)."""
    if isinstance(value, float):
        r = repr(value)
        return "e" not in r and "n" not in r  # inf, nan: not JSON at all
    if isinstance(value, dict):
        return all(_json_exact(v) for v in value.values())
    if isinstance(value, list):
        return all(_json_exact(v) for v in value)
    return True


def wrap_fold(text: str, width: int) -> list[str]:
    """One line of text in lines of at most ``width`` cells, as rich wraps a cell with
    ``overflow="fold"``: words (leading spaces, the word, its trailing spaces) fill a line
    greedily; a word longer than a line is cut into pieces of the line's width; trailing
    spaces that run past the width are dropped."""
    starts: list[int] = []
    used = 0
    pos = 0
    n = len(text)
    while pos < n:
        start = pos
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break  # only spaces left: they belong to no word
        while pos < n and not text[pos].isspace():
            pos += 1
        while pos < n and text[pos].isspace():
            pos += 1
        word = text[start:pos]
        length = len(word.rstrip())
        if width - used >= length:
            used += len(word)
        elif length > width:
            pieces = [word[k:k + width] for k in range(0, len(word), width)]
            for k, piece in enumerate(pieces):
                if start:
                    starts.append(start)
                if k == len(pieces) - 1:
                    used = len(piece)
                else:
                    start += len(piece)
        elif used and start:
            starts.append(start)
            used = len(word)
    bounds = [0, *starts, n]
    lines = []
    for a, b in zip(bounds, bounds[1:]):
        line = text[a:b]
        if len(line) > width:
            trail = len(line) - len(line.rstrip())
            line = line[: len(line) - min(trail, len(line) - width)]
        lines.append(line[:width])
    return lines or [""]


def node_text(title: str, rows: list[tuple[str, str]], sections: list[tuple[str, str]], width: int, *,
              styled: bool = False) -> str | None:
    """What ``dagctx show`` prints — the node's table (cli/cmd_sessions.py ``node_table``:
    no header, the field column bold, values folded) and its input and output sections — as
    rich prints it, or None where rich would measure, collapse or rewrite something this
    path does not (then rich itself prints it)."""
    if not _cells_plain(title) or not all(_cells_plain(f) and _cells_plain(v) for f, v in rows):
        return None
    avail = width - 3  # the borders of two columns
    a = max(len(f) for f, _ in rows) + 2
    b = min(max(len(v) for _, v in rows) + 2, avail)
    if a + b > avail:
        excess = a + b - avail
        if b - a < excess:
            return None  # rich shrinks both columns then: not drawn here
        b -= excess
    if a > avail or b < 3:
        return None
    total = a + b + 3
    bold, reset = (BOLD, RESET) if styled else ("", "")
    out = []
    for line in wrap_fold(title, total):  # the title: wrapped to the table's width, each line centred
        line = line.rstrip()
        pad = total - len(line)
        line = " " * (pad // 2) + line + " " * (pad - pad // 2)
        out.append(f"{ITALIC}{line}{RESET}" if styled else line)
    out.append("┌" + "─" * a + "┬" + "─" * b + "┐")
    for field, value in rows:
        values = wrap_fold(value, b - 2)
        for k, line in enumerate(values):
            if k == 0:
                left = (f"{bold} {reset}{bold}{field.ljust(a - 2)}{reset}{bold} {reset}" if styled
                        else f" {field.ljust(a - 2)} ")
            else:
                left = f"{bold}{' ' * a}{reset}" if styled else " " * a
            out.append(f"│{left}│ {line.ljust(b - 2)} │")
    out.append("└" + "─" * a + "┴" + "─" * b + "┘")
    text = "\n".join(out) + "\n"
    for label, body in sections:
        if any((ord(ch) < 32 and ch != "\n") or ch == "\x7f" for ch in body):
            return None
        if any(len(line) > width and line[-1:].isspace() for line in body.split("\n")):
            return None  # rich drops whitespace past the width of a long line
        text += (f"{BOLD}{label}{RESET}\n" if styled else f"{label}\n") + body + "\n"
    return text


def show_rows(node: dict[str, object]) -> list[tuple[str, str]] | None:
    """cli/cmd_sessions.py ``node_rows`` from the node as the wire spells it, or None."""
    rows = []
    for field, key in (("role", "role"), ("name", "name"), ("status", "status"), ("seq", "seq"),
                       ("created", "createdAt"), ("caller", "caller"), ("predecessor", "predecessor")):
        value = node.get(key)
        if field == "created":
            value = when(float(value or 0))
        rows.append((field, str(value if value is not None else "—")))
    reads = node.get("reads") or []
    if reads:
        rows.append(("reads", ", ".join(reads)))
    metadata = node.get("metadata") or {}
    if metadata:
        if not _json_exact(metadata):
            return None
        rows.append(("metadata", json.dumps(metadata, ensure_ascii=False, separators=(",", ":"))))
    return rows


def show_sections(node: dict[str, object]) -> list[tuple[str, str]] | None:
    """cli/cmd_sessions.py ``node_sections`` from the wire's node, or None."""
    out = []
    for label in ("input", "output"):
        value = node.get(label)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            if not _json_exact(value):
                return None
            value = json.dumps(value, ensure_ascii=False, indent=2)
        out.append((label, value))
    return out


def run_show(argv: list[str]) -> int | None:
    """Answer ``dagctx show REF`` here, or None to let the full command answer."""
    opts = parse_show(argv)
    if opts is None:
        return None
    got = fetch_node(opts["db"] or os.environ.get("DAGCTX_DB") or None, str(opts["ref"]))
    if got is None:
        return None
    node, info = got
    if opts["json"]:
        if not _json_exact(node):
            return None
        return _print_json(node)
    look = _console_look()
    if look is None:
        return None
    styled, width = look
    rows, sections = show_rows(node), show_sections(node)
    if rows is None or sections is None:
        return None
    title = f"node {node.get('id')} in {info.get('title') or ''} ({info.get('sessionId')})"
    text = node_text(title, rows, sections, width, styled=styled)
    if text is None:
        return None
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0
