"""The tools of ``dagctx mcp``: their table, argument checks, paging, and what they do.

Kept apart from the MCP wiring (``mcp_server``) so the contract — tool names in
``tools/list`` order, input schemas, error texts — is declared once, here, and is plain
Python (tested without processes). ``HistoryTools`` runs a tool over one daemon
connection (``dagctx.client``); every tool is read-only. Only ``memory_get`` takes a path,
and only one relative to the workspace this server was started for (``--workspace``),
naming a memory file there: the daemon refuses anything else (SPEC §5.1, ``WorkspaceEscape``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

#: The bound on every answer: a tool's text is at most about this many characters (a page of
#: items is closed before it would pass it; one item's own parts are cut to fit). The
#: structured content carries the same page, so it is bounded alike.
ANSWER_CHARS = 24_000
#: How many characters of a node's text ``session_history`` shows per node.
HISTORY_PREVIEW_CHARS = 2000
#: How many characters of a covered turn's text, and of each tool call's input and output,
#: ``expand_summary`` shows (``read_node`` gives any of them whole, by range).
TURN_CHARS = 4000
CALL_CHARS = 1500
#: What ``read_node`` returns of an output (or input) when no ``length`` is given, and at most.
READ_DEFAULT_LENGTH = 20000
READ_MAX_LENGTH = 20000
#: How much of a code node's input ``read_node`` shows beside its output (``part: input`` pages it).
INPUT_PREVIEW_CHARS = 2000
#: Sessions per ``resources/list`` page; each session is the resource ``dagctx://session/<id>``.
RESOURCE_PAGE = 100
#: A session resource (a transcript) is cut at this many characters; the tools page the rest.
RESOURCE_CHARS = 100_000
SESSION_URI = "dagctx://session/"

_SESSION = {"type": "string", "minLength": 1, "description": "a session id (from list_sessions or search_history)"}
_NODE = {"type": "string", "minLength": 1, "description": "a node id (from search_history or session_history)"}
_CURSOR = {"type": "string", "description": "nextCursor of the previous page; omit for the first page"}


def _limit(default: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": maximum, "default": default,
            "description": f"at most this many items (1–{maximum}, default {default})"}


def _object(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


_PAGED = (f"Answers are plain text with headers (structured content carries the same data); "
          f"each is at most about {ANSWER_CHARS} characters: when there is more, the answer ends "
          "with the cursor of the next page.")

#: name → (description, input schema), in the ``tools/list`` order (deterministic).
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "search_history": (
        "Full-text search over every recorded turn (user, assistant, tool calls and their whole "
        "outputs), in one session or all. Words, code identifiers, \"phrases\", prefix*, AND/OR/NOT; "
        "Chinese/Japanese words are found inside unspaced sentences. Hits carry sessionId and "
        "nodeId for read_node; matches are marked [like this]. No hits is an empty list. " + _PAGED,
        _object({
            "query": {"type": "string", "minLength": 1, "description": "the search expression"},
            "sessionId": {**_SESSION, "description": "search only this session (default: all)"},
            "limit": _limit(10, 100),
            "roles": {"type": "array", "items": {"enum": ["user", "llm", "code"]}, "uniqueItems": True,
                      "description": "only these roles (user, llm = assistant, code = tool calls)"},
            "cursor": _CURSOR,
        }, ["query"]),
    ),
    "read_node": (
        "The full content of one node, by character range: its output (a large or spilled tool "
        "output too) or, with part: input, a tool call's input. totalChars says how long the part "
        "is and nextOffset where the next slice starts; a slice is at most "
        f"{READ_MAX_LENGTH} characters.",
        _object({
            "sessionId": _SESSION,
            "nodeId": _NODE,
            "part": {"enum": ["output", "input"], "default": "output",
                     "description": "which text to read by range (default output)"},
            "offset": {"type": "integer", "minimum": 0, "default": 0,
                       "description": "first character to return"},
            "length": {"type": "integer", "minimum": 1, "maximum": READ_MAX_LENGTH, "default": READ_DEFAULT_LENGTH,
                       "description": f"characters to return (default and at most {READ_MAX_LENGTH})"},
        }, ["sessionId", "nodeId"]),
    ),
    "expand_summary": (
        "The turns a compaction summary (a node named context/summary) replaced, in chain order, "
        "paged; each with the tool calls it made. A turn's text is shown up to "
        f"{TURN_CHARS} characters and each call's input and output up to {CALL_CHARS}; read_node "
        "gives any of them whole. Use it to recover details the summary left out. " + _PAGED,
        _object({"sessionId": _SESSION, "nodeId": {**_NODE, "description": "the summary node's id"},
                 "limit": _limit(20, 200), "cursor": _CURSOR}, ["sessionId", "nodeId"]),
    ),
    "list_sessions": (
        "Recorded sessions, most recently updated first, paged. " + _PAGED,
        _object({"limit": _limit(20, 200), "cursor": _CURSOR}, []),
    ),
    "session_history": (
        "The branch of a session ending at HEAD (or at headId), oldest first, paged; each node's "
        f"text is cut at {HISTORY_PREVIEW_CHARS} characters (read_node gives it whole). " + _PAGED,
        _object({"sessionId": _SESSION,
                 "headId": {**_NODE, "description": "end the branch at this node instead of HEAD"},
                 "limit": _limit(50, 500), "cursor": _CURSOR}, ["sessionId"]),
    ),
    "context_stats": (
        "How a session's next turn uses the model's context window: window, output reserve, input "
        "budget, tokens used by system prompt, tools and history, percent used, whether compaction "
        "is recommended.",
        _object({"sessionId": _SESSION,
                 "model": {"type": "string", "minLength": 1,
                           "description": "the model to measure against (default: the daemon's default)"}},
                ["sessionId"]),
    ),
    "memory_search": (
        "Search the workspace's memory files (MEMORY.md, memory/*.md) — and, with sources, recorded "
        "sessions — for what was noted or decided before. Ask in plain words: a conversational question "
        "is reduced to its keywords; Chinese/Japanese work too. Each hit names its file and lines and a "
        "chunkId; memory_get reads more of it. The index is brought up to date before each search "
        "(only changed files are re-read). Answers are plain text with headers (structured content "
        f"carries the same data), at most about {ANSWER_CHARS} characters.",
        _object({
            "query": {"type": "string", "minLength": 1, "maxLength": 4096,
                      "description": "what to look for, in plain words"},
            "maxResults": _limit(6, 50),
            "minScore": {"type": "number", "minimum": 0, "maximum": 1, "default": 0,
                         "description": "drop hits scoring below this (scores lie in [0, 1))"},
            "sources": {"type": "array", "items": {"enum": ["memory", "sessions"]}, "uniqueItems": True,
                        "minItems": 1, "description": "where to look (default: memory only)"},
        }, ["query"]),
    ),
    "memory_get": (
        "Read a memory file of the workspace by lines: a chunk from memory_search (chunkId), or a file "
        "(path, relative to the workspace: MEMORY.md or memory/…) from fromLine for lines lines. "
        f"Long reads come in pages of about {ANSWER_CHARS} characters: the answer says the next fromLine.",
        _object({
            "chunkId": {"type": "string", "minLength": 1, "description": "a chunkId from memory_search"},
            "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                     "description": "a memory file, relative to the workspace (MEMORY.md, memory/2026-12-01.md)"},
            "fromLine": {"type": "integer", "minimum": 1, "description": "first line, 1-based (default 1)"},
            "lines": {"type": "integer", "minimum": 1, "maximum": 10000,
                      "description": "how many lines (default: as many as fit one answer)"},
        }, []),
    ),
}


class ToolError(Exception):
    """A tool call that failed for a reason the caller can fix; ``kind`` as the daemon's."""

    def __init__(self, message: str, kind: str = "InvalidParams") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


# ---------------------------------------------------------------- arguments


_VALIDATORS: dict[str, Any] = {}


def _validator(name: str) -> Any:
    """The tool's schema validator, built once (building one costs more than validating)."""
    v = _VALIDATORS.get(name)
    if v is None:
        from jsonschema import Draft202012Validator

        v = _VALIDATORS[name] = Draft202012Validator(TOOLS[name][1])
    return v


def check_arguments(name: str, args: Any) -> dict[str, Any]:
    """Validate ``args`` against the tool's input schema; a clear message when they do not fit."""
    if name not in TOOLS:
        raise ToolError(f"unknown tool {name!r}; the tools are: {', '.join(TOOLS)}", "MethodNotFound")
    args = {} if args is None else args
    schema = TOOLS[name][1]
    errors = sorted(_validator(name).iter_errors(args), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.path) or "arguments"
        if e.validator == "additionalProperties":
            allowed = ", ".join(schema["properties"])
            raise ToolError(f"{name}: {e.message}; the arguments are: {allowed}")
        raise ToolError(f"{name}: {where}: {e.message}")
    return args


def encode_cursor(offset: int) -> str:
    """An opaque page token (MCP cursors are opaque to clients)."""
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        offset = json.loads(raw)["o"]
        if isinstance(offset, int) and offset >= 0:
            return offset
    except (ValueError, KeyError, TypeError):
        pass
    raise ToolError(f"cursor {cursor!r} is not a nextCursor this server returned; omit it for the first page")


def node_text(value: Any) -> str:
    """A node's input or output as text, exactly as recorded (JSON for structured values)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def clip(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut at ``limit`` characters, and whether it was cut."""
    return (text, False) if len(text) <= limit else (text[:limit], True)


@dataclass
class Answer:
    """A tool's answer: ``text`` for the model (plain text with headers), ``data`` for programs."""

    text: str
    data: dict[str, Any]


class Pager:
    """Collects the blocks of one answer up to ``ANSWER_CHARS``; the first block always fits."""

    def __init__(self, head_chars: int, budget: int = ANSWER_CHARS) -> None:
        self.left = budget - head_chars
        self.blocks: list[str] = []

    def add(self, block: str) -> bool:
        if self.blocks and len(block) + 1 > self.left:
            return False
        self.blocks.append(block)
        self.left -= len(block) + 1
        return True


def _more(tool: str, cursor: str | None) -> str:
    return f"\n\nMore: call {tool} again with cursor \"{cursor}\"." if cursor else ""


def _label(node: Any) -> str:
    """``#12 code bash [completed]``: how a node is named in answers."""
    status = f" [{node.status}]" if node.status not in (None, "", "completed") else ""
    return f"#{node.seq} {node.role}{' ' + node.name if node.name else ''}{status}"


def _node_brief(node: Any, text_chars: int, input_chars: int | None = None) -> dict[str, Any]:
    """A node for an answer: its text (and a code node's input) cut at the given sizes,
    with ``truncated`` and the whole lengths when cut."""
    text, cut = clip(node_text(node.output), text_chars)
    out: dict[str, Any] = {"nodeId": node.id, "seq": node.seq, "role": node.role, "name": node.name,
                           "status": node.status, "text": text}
    if cut:
        out["truncated"] = True
        out["textChars"] = len(node_text(node.output))
    if node.role == "code" and node.input is not None:
        whole = node_text(node.input)
        out["input"], icut = clip(whole, input_chars if input_chars is not None else text_chars)
        if icut:
            out["inputTruncated"] = True
            out["inputChars"] = len(whole)
    spill = node.metadata.get("spill")
    if isinstance(spill, dict):
        out["spilled"] = True
        if cut:
            out["textChars"] = int(spill.get("chars") or out["textChars"])
    if node.caller is not None:
        out["caller"] = node.caller
    return out


def _brief_text(b: dict[str, Any], sid: str, level: str = "##") -> str:
    """A node brief as a block of plain text: a header line, its input, its text, what was cut."""
    name = f" {b['name']}" if b.get("name") else ""
    status = f" [{b['status']}]" if b.get("status") not in (None, "", "completed") else ""
    lines = [f"{level} #{b['seq']} {b['role']}{name}{status} · node {b['nodeId']}"]
    if "input" in b:
        lines.append("input: " + b["input"] + (f" … [cut: {b['inputChars']} characters; read_node part "
                                               "input]" if b.get("inputTruncated") else ""))
    lines.append(b["text"])
    if b.get("truncated"):
        lines.append(f"… [cut at {len(b['text'])} of {b['textChars']} characters: read_node sessionId "
                     f"{sid} nodeId {b['nodeId']} for the rest]")
    return "\n".join(lines)


def _turn_of(node: Any, callees: list[Any]) -> str:
    """The covered node a callee belongs to: follow ``caller`` up past the other callees."""
    inner = {c.id: c for c in callees}
    while node.caller in inner:
        node = inner[node.caller]
    return node.caller


# ---------------------------------------------------------------- the tools


class HistoryTools:
    """The tools, over one daemon connection (re-opened if the daemon went away)."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], workspace: str | None = None) -> None:
        self._connect = connect
        #: the folder the memory tools serve (chosen when the server starts, never by a tool call)
        self.workspace = workspace
        self._client: Any = None
        self._lock: Any = None

    async def client(self) -> Any:
        """The connection; calls that arrive together while it opens share one daemon."""
        import asyncio

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is None or self._client.closed.done():
                self._client = await self._connect()
        return self._client

    async def close(self) -> None:
        if self._client is not None and not self._client.closed.done():
            await self._client.close()
        self._client = None

    async def call(self, name: str, args: Any) -> Answer:
        """Run a tool; its answer, or ``ToolError`` with the daemon's message."""
        from dagctx.client import RpcError

        args = check_arguments(name, args)
        client = await self.client()
        try:
            return await getattr(self, "_" + name)(client, args)
        except RpcError as exc:
            raise ToolError(exc.message, exc.kind or "InternalError") from None

    async def _search_history(self, client: Any, a: dict[str, Any]) -> Answer:
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 10)
        if start + limit > 999:
            raise ToolError("search_history pages reach the first 999 hits; narrow the query instead")
        # one hit more than the page: whether another page follows
        res = await client.search(a["query"], session_id=a.get("sessionId"), limit=start + limit + 1,
                                  roles=a.get("roles"))
        where = f"in session {a['sessionId']}" if a.get("sessionId") else "in every session"
        head = f"# search_history {json.dumps(a['query'], ensure_ascii=False)} {where}"
        pager = Pager(len(head) + 200)
        hits = []
        for i, h in enumerate(res.hits[start:start + limit], start + 1):
            snippet, _ = clip(h.snippet, HISTORY_PREVIEW_CHARS)
            block = (f"## {i}. #{h.seq} {h.role}{' ' + h.name if h.name else ''} · session {h.session_id} "
                     f"· node {h.node_id}\n{snippet}")
            if not pager.add(block):
                break
            hits.append({"sessionId": h.session_id, "nodeId": h.node_id, "role": h.role, "name": h.name,
                         "seq": h.seq, "snippet": snippet, "score": h.score})
        nxt = start + len(hits)
        more = len(res.hits) > nxt
        cursor = encode_cursor(nxt) if more else None
        if hits:
            head += f": hits {start + 1}–{nxt}" + (" (more follow)" if more else "")
        else:
            head += ": no hits" if start == 0 else ": no more hits"
        text = "\n\n".join([head, *pager.blocks]) + _more("search_history", cursor)
        return Answer(text, {"query": a["query"], "hits": hits, "nextCursor": cursor})

    async def _read_node(self, client: Any, a: dict[str, Any]) -> Answer:
        from dagctx.protocol import messages as m

        sid, nid = a["sessionId"], a["nodeId"]
        part = a.get("part", "output")
        offset, length = a.get("offset", 0), a.get("length", READ_DEFAULT_LENGTH)
        node = (await client.get_nodes(sid, [nid])).nodes[0]
        spill = node.metadata.get("spill")
        if part == "input":
            whole = node_text(node.input)
            total, text = len(whole), whole[offset:offset + length]
        else:
            total = int(spill["chars"]) if isinstance(spill, dict) else len(node_text(node.output))
            if isinstance(node.output, str) and isinstance(spill, dict):
                # the whole output lives in the blob: ask for the slice
                got = await client.get_nodes(sid, [nid], range=m.OutputRange(offset=offset, length=length))
                text = node_text(got.nodes[0].output)
            else:
                text = node_text(node.output)[offset:offset + length]
        end = offset + len(text)
        nxt = end if end < total else None
        data: dict[str, Any] = {"sessionId": sid, "nodeId": node.id, "seq": node.seq, "role": node.role,
                                "name": node.name, "status": node.status, "part": part, "text": text,
                                "offset": offset, "totalChars": total, "nextOffset": nxt,
                                "predecessor": node.predecessor, "createdAt": node.created_at}
        if node.caller is not None:
            data["caller"] = node.caller
        if isinstance(spill, dict):
            data["spilled"] = True
        lines = [f"# read_node {node.id} · session {sid}", f"{_label(node)} · created {node.created_at}"
                 + (f" · called by {node.caller}" if node.caller else "")]
        if part == "output" and node.role == "code" and node.input is not None:
            data["input"], icut = clip(node_text(node.input), INPUT_PREVIEW_CHARS)
            if icut:
                data["inputTruncated"], data["inputChars"] = True, len(node_text(node.input))
            lines.append("## input" + (f" (first {INPUT_PREVIEW_CHARS} of {data['inputChars']} characters; "
                                       "part input reads it all)" if icut else ""))
            lines.append(data["input"])
        if node.name == "context/summary":
            data["coversIds"] = list(node.metadata.get("covers_ids") or [])
            lines.append(f"(a compaction summary of {len(data['coversIds'])} turns: expand_summary shows them)")
        span = f"characters {offset}–{end} of {total}" if (offset or nxt is not None) else f"{total} characters"
        lines.append(f"## {part}, {span}" + (" (spilled: stored whole outside the node)"
                                               if isinstance(spill, dict) and part == "output" else ""))
        lines.append(text)
        if nxt is not None:
            lines.append(f"\nMore: call read_node again with offset {nxt}"
                         + (' and part "input"' if part == "input" else "") + ".")
        return Answer("\n".join(lines), data)

    async def _expand_summary(self, client: Any, a: dict[str, Any]) -> Answer:
        sid, nid = a["sessionId"], a["nodeId"]
        node = (await client.get_nodes(sid, [nid])).nodes[0]
        covers = node.metadata.get("covers_ids")
        if node.name != "context/summary" or not isinstance(covers, list):
            raise ToolError(f"node {nid!r} is not a compaction summary (its name is {node.name!r}, a summary's "
                            "is 'context/summary'); give the id of a summary node", "InvalidParams")
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 20)
        page_ids = covers[start:start + limit]
        got = await client.get_nodes(sid, page_ids, include_callees=True) if page_ids else None
        calls_of: dict[str, list[dict[str, Any]]] = {}
        for c in got.callees if got else []:
            calls_of.setdefault(_turn_of(c, got.callees), []).append(_node_brief(c, CALL_CHARS, CALL_CHARS))
        head = f"# expand_summary {nid} · session {sid}"
        summary = None
        pager = Pager(len(head) + 200)
        if start == 0:
            summary, cut = clip(node_text(node.output), TURN_CHARS)
            pager.add("## the summary\n" + summary + (" … [cut: read_node gives it whole]" if cut else ""))
        turns = []
        for i, n in enumerate(got.nodes if got else [], start + 1):
            turn = _node_brief(n, TURN_CHARS)
            calls = calls_of.get(n.id, [])
            parts = [f"## turn {i} of {len(covers)}", _brief_text(turn, sid, "###")]
            size = sum(len(x) + 1 for x in parts)
            if turns:  # a later turn comes whole or starts the next page
                blocks = [_brief_text(c, sid, "####") for c in calls]
                if size + sum(len(x) + 1 for x in blocks) > pager.left:
                    break
                turn["calls"] = calls
                parts += blocks
            else:  # the page's first turn: as many of its calls as the bound allows
                turn["calls"] = []
                for c in calls:
                    block = _brief_text(c, sid, "####")
                    if size + len(block) + 1 > pager.left and turn["calls"]:
                        break
                    turn["calls"].append(c)
                    parts.append(block)
                    size += len(block) + 1
                if len(turn["calls"]) < len(calls):
                    turn["callsOmitted"] = [c["nodeId"] for c in calls[len(turn["calls"]):]]
                    parts.append(f"… {len(turn['callsOmitted'])} more calls of this turn, not shown to stay "
                                 f"within {ANSWER_CHARS} characters: read_node each of "
                                 + ", ".join(turn["callsOmitted"]))
            block = "\n".join(parts)
            pager.blocks.append(block)
            pager.left -= len(block) + 1
            turns.append(turn)
        nxt = start + len(turns)
        cursor = encode_cursor(nxt) if nxt < len(covers) else None
        head += (f": turns {start + 1}–{nxt} of {len(covers)}, verbatim in chain order" if turns
                 else f": no turns after {start} (it covers {len(covers)})")
        text = "\n\n".join([head, *pager.blocks]) + _more("expand_summary", cursor)
        return Answer(text, {"summaryId": nid, "summary": summary, "totalTurns": len(covers), "turns": turns,
                             "nextCursor": cursor})

    async def _list_sessions(self, client: Any, a: dict[str, Any]) -> Answer:
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 20)
        res = await client.session_list(limit=limit, offset=start)
        pager = Pager(300)
        sessions = []
        for s in res.sessions:
            title, _ = clip(s.title or "", 200)
            if not pager.add(f"- {s.session_id} · {json.dumps(title, ensure_ascii=False)} · {s.node_count} nodes "
                             f"· updated {s.updated_at}"):
                break
            sessions.append({"sessionId": s.session_id, "title": title, "head": s.head, "nodeCount": s.node_count,
                             "createdAt": s.created_at, "updatedAt": s.updated_at})
        nxt = start + len(sessions)
        cursor = encode_cursor(nxt) if sessions and nxt < res.total else None
        head = (f"# list_sessions: {start + 1}–{nxt} of {res.total}, most recently updated first" if sessions
                else f"# list_sessions: none (of {res.total})")
        text = "\n".join([head, "", *pager.blocks]) + _more("list_sessions", cursor)
        return Answer(text, {"sessions": sessions, "total": res.total, "nextCursor": cursor})

    async def _session_history(self, client: Any, a: dict[str, Any]) -> Answer:
        sid = a["sessionId"]
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 50)
        res = await client.history(sid, head=a.get("headId"))
        pager = Pager(300)
        nodes = []
        for n in res.nodes[start:start + limit]:
            b = _node_brief(n, HISTORY_PREVIEW_CHARS)
            if not pager.add(_brief_text(b, sid)):
                break
            nodes.append(b)
        nxt = start + len(nodes)
        cursor = encode_cursor(nxt) if nxt < len(res.nodes) else None
        head = (f"# session_history {sid}: nodes {start + 1}–{nxt} of {len(res.nodes)}, oldest first "
                f"(branch ending at {res.head})" if nodes else f"# session_history {sid}: no nodes after {start}")
        text = "\n\n".join([head, *pager.blocks]) + _more("session_history", cursor)
        return Answer(text, {"sessionId": sid, "head": res.head, "total": len(res.nodes), "nodes": nodes,
                             "nextCursor": cursor})

    # ------------------------------------------------------------ resources

    async def session_resources(self, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """One page of sessions as ``dagctx://session/<id>`` resources."""
        from dagctx.client import RpcError

        start = decode_cursor(cursor)
        client = await self.client()
        try:
            res = await client.session_list(limit=RESOURCE_PAGE, offset=start)
        except RpcError as exc:
            raise ToolError(exc.message, exc.kind or "InternalError") from None
        items = [{"uri": SESSION_URI + s.session_id, "name": s.title or s.session_id,
                  "description": f"{s.node_count} nodes; the branch at HEAD as a transcript"} for s in res.sessions]
        nxt = start + len(items)
        return items, (encode_cursor(nxt) if items and nxt < res.total else None)

    async def read_session(self, uri: str) -> str:
        """The branch at HEAD of the session ``uri`` names, as a plain-text transcript (each
        node's text cut at ``HISTORY_PREVIEW_CHARS``, the whole at ``RESOURCE_CHARS``)."""
        from dagctx.client import RpcError

        if not uri.startswith(SESSION_URI) or len(uri) == len(SESSION_URI):
            raise ToolError(f"unknown resource {uri!r}; session resources are {SESSION_URI}<sessionId>")
        sid = uri[len(SESSION_URI):]
        client = await self.client()
        try:
            info = await client.session_get(sid)
            hist = await client.history(sid)
        except RpcError as exc:
            raise ToolError(exc.message, exc.kind or "InternalError") from None
        head = f"# {info.title or sid}\nsession {sid}, HEAD {hist.head}, {len(hist.nodes)} nodes"
        pager = Pager(len(head) + 300, RESOURCE_CHARS)
        shown = 0
        for n in hist.nodes:
            if not pager.add(_brief_text(_node_brief(n, HISTORY_PREVIEW_CHARS), sid)):
                break
            shown += 1
        tail = "" if shown == len(hist.nodes) else (
            f"\n\n… {len(hist.nodes) - shown} more nodes: the tool session_history pages through them all "
            f"(cursor from node {shown + 1}: \"{encode_cursor(shown)}\").")
        return "\n\n".join([head, *pager.blocks]) + tail + "\n"

    async def _context_stats(self, client: Any, a: dict[str, Any]) -> Answer:
        # promptMode none: measuring must not assemble (or record) a system prompt (SPEC §7).
        sid = a["sessionId"]
        prep = await client.prepare(sid, model=a.get("model"), prompt_mode="none", format="openai")
        b = prep.budget
        data = {"sessionId": sid, "model": prep.manifest.get("model"),
                "budget": {"contextWindow": b.context_window, "outputReserve": b.output_reserve,
                           "inputBudget": b.input_budget, "inputUsed": b.input_used,
                           "systemPrompt": b.system_prompt, "toolsSchema": b.tools_schema, "history": b.history,
                           "percentUsed": b.percent_used, "headroom": b.headroom, "source": b.source},
                "recommendCompaction": prep.recommend_compaction, "needsCompaction": prep.needs_compaction,
                "summaryId": prep.summary_id, "messages": len(prep.messages)}
        yes = {True: "yes", False: "no"}
        text = "\n".join([
            f"# context_stats {sid} (model {data['model']})",
            f"window {b.context_window} tokens: output reserve {b.output_reserve}, input budget {b.input_budget}",
            f"used {b.input_used} tokens ({b.percent_used}% of the input budget; counted by {b.source}): "
            f"system prompt {b.system_prompt}, tools {b.tools_schema}, history {b.history}; headroom {b.headroom}",
            f"compaction recommended: {yes[bool(prep.recommend_compaction)]}; needed: "
            f"{yes[bool(prep.needs_compaction)]}",
            f"rolling summary: {prep.summary_id or 'none'}; messages the model would see: {len(prep.messages)}",
        ])
        return Answer(text, data)

    # ------------------------------------------------------------ memory (SPEC §5.1): mcp_memory.py

    async def _memory_search(self, client: Any, a: dict[str, Any]) -> Answer:
        from dagctx.cli import mcp_memory

        return await mcp_memory.memory_search(self, client, a)

    async def _memory_get(self, client: Any, a: dict[str, Any]) -> Answer:
        from dagctx.cli import mcp_memory

        return await mcp_memory.memory_get(self, client, a)
