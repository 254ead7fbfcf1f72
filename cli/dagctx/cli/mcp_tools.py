"""The tools of ``dagctx mcp``: their table, argument checks, paging, and what they do.

Kept apart from the MCP wiring (``mcp_server``) so the contract — tool names in
``tools/list`` order, input schemas, error texts — is declared once, here, and is plain
Python (tested without processes). ``HistoryTools`` runs a tool over one daemon
connection (``dagctx.client``); every tool is read-only and none takes a path.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

#: How many characters of a node's text ``session_history`` shows per node.
HISTORY_PREVIEW_CHARS = 2000
#: What ``read_node`` returns of an output when no ``length`` is given.
READ_DEFAULT_LENGTH = 20000
#: Sessions per ``resources/list`` page; each session is the resource ``dagctx://session/<id>``.
RESOURCE_PAGE = 100
SESSION_URI = "dagctx://session/"

_SESSION = {"type": "string", "minLength": 1, "description": "a session id (from list_sessions or search_history)"}
_NODE = {"type": "string", "minLength": 1, "description": "a node id (from search_history or session_history)"}
_CURSOR = {"type": "string", "description": "nextCursor of the previous page; omit for the first page"}


def _limit(default: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": maximum, "default": default,
            "description": f"at most this many items (1–{maximum}, default {default})"}


def _object(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


#: name → (description, input schema), in the ``tools/list`` order (deterministic).
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "search_history": (
        "Full-text search over every recorded turn (user, assistant, tool calls and their whole "
        "outputs), in one session or all. Words, code identifiers, \"phrases\", prefix*, AND/OR/NOT; "
        "Chinese/Japanese words are found inside unspaced sentences. Hits carry sessionId and "
        "nodeId for read_node; matches are marked [like this]. No hits is an empty list.",
        _object({
            "query": {"type": "string", "minLength": 1, "description": "the search expression"},
            "sessionId": {**_SESSION, "description": "search only this session (default: all)"},
            "limit": _limit(10, 100),
            "roles": {"type": "array", "items": {"enum": ["user", "llm", "code"]}, "uniqueItems": True,
                      "description": "only these roles (user, llm = assistant, code = tool calls)"},
        }, ["query"]),
    ),
    "read_node": (
        "The full content of one node: its input and output. A large tool output is returned by "
        "character range (offset, length) over the whole stored output, also when it was spilled; "
        "totalChars says how long it is and nextOffset where the next slice starts.",
        _object({
            "sessionId": _SESSION,
            "nodeId": _NODE,
            "offset": {"type": "integer", "minimum": 0, "default": 0,
                       "description": "first character of the output to return"},
            "length": {"type": "integer", "minimum": 1, "maximum": 200000, "default": READ_DEFAULT_LENGTH,
                       "description": f"characters of the output to return (default {READ_DEFAULT_LENGTH})"},
        }, ["sessionId", "nodeId"]),
    ),
    "expand_summary": (
        "The turns a compaction summary (a node named context/summary) replaced, verbatim, in "
        "chain order, paged; each with the tool calls it made (calls: input and output). Use it to "
        "recover details the summary left out.",
        _object({"sessionId": _SESSION, "nodeId": {**_NODE, "description": "the summary node's id"},
                 "limit": _limit(20, 200), "cursor": _CURSOR}, ["sessionId", "nodeId"]),
    ),
    "list_sessions": (
        "Recorded sessions, most recently updated first, paged.",
        _object({"limit": _limit(20, 200), "cursor": _CURSOR}, []),
    ),
    "session_history": (
        "The branch of a session ending at HEAD (or at headId), oldest first, paged; each node's "
        f"text is cut at {HISTORY_PREVIEW_CHARS} characters (read_node gives it whole).",
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


def _node_brief(node: Any, text_chars: int | None) -> dict[str, Any]:
    text = node_text(node.output)
    out: dict[str, Any] = {"nodeId": node.id, "seq": node.seq, "role": node.role, "name": node.name,
                           "status": node.status}
    if node.role == "code" and node.input is not None:
        out["input"] = node_text(node.input) if text_chars is None else node_text(node.input)[:text_chars]
    if text_chars is not None and len(text) > text_chars:
        out["text"] = text[:text_chars]
        out["truncated"] = True
    else:
        out["text"] = text
    if isinstance(node.metadata.get("spill"), dict):
        out["spilled"] = True
    if node.caller is not None:
        out["caller"] = node.caller
    return out


def _turn_of(node: Any, callees: list[Any]) -> str:
    """The covered node a callee belongs to: follow ``caller`` up past the other callees."""
    inner = {c.id: c for c in callees}
    while node.caller in inner:
        node = inner[node.caller]
    return node.caller


# ---------------------------------------------------------------- the tools


class HistoryTools:
    """The tools, over one daemon connection (re-opened if the daemon went away)."""

    def __init__(self, connect: Callable[[], Awaitable[Any]]) -> None:
        self._connect = connect
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

    async def call(self, name: str, args: Any) -> dict[str, Any]:
        """Run a tool; its structured result, or ``ToolError`` with the daemon's message."""
        from dagctx.client import RpcError

        args = check_arguments(name, args)
        client = await self.client()
        try:
            return await getattr(self, "_" + name)(client, args)
        except RpcError as exc:
            raise ToolError(exc.message, exc.kind or "InternalError") from None

    async def _search_history(self, client: Any, a: dict[str, Any]) -> dict[str, Any]:
        res = await client.search(a["query"], session_id=a.get("sessionId"), limit=a.get("limit", 10),
                                  roles=a.get("roles"))
        hits = [{"sessionId": h.session_id, "nodeId": h.node_id, "role": h.role, "name": h.name, "seq": h.seq,
                 "snippet": h.snippet, "score": h.score} for h in res.hits]
        return {"query": a["query"], "hits": hits}

    async def _read_node(self, client: Any, a: dict[str, Any]) -> dict[str, Any]:
        from dagctx.protocol import messages as m

        sid, nid = a["sessionId"], a["nodeId"]
        offset, length = a.get("offset", 0), a.get("length", READ_DEFAULT_LENGTH)
        node = (await client.get_nodes(sid, [nid])).nodes[0]
        spill = node.metadata.get("spill")
        total = int(spill["chars"]) if isinstance(spill, dict) else len(node_text(node.output))
        if isinstance(node.output, str):
            if isinstance(spill, dict):  # the whole output lives in the blob: ask for the slice
                part = (await client.get_nodes(sid, [nid], range=m.OutputRange(offset=offset, length=length)))
                text = node_text(part.nodes[0].output)
            else:
                text = node.output[offset:offset + length]
        else:
            text = node_text(node.output)[offset:offset + length]
        end = offset + len(text)
        out = _node_brief(node, None)
        out.update(text=text, offset=offset, totalChars=total, nextOffset=end if end < total else None,
                   predecessor=node.predecessor, createdAt=node.created_at)
        out.pop("truncated", None)
        if node.name == "context/summary":
            out["coversIds"] = list(node.metadata.get("covers_ids") or [])
        return out

    async def _expand_summary(self, client: Any, a: dict[str, Any]) -> dict[str, Any]:
        sid, nid = a["sessionId"], a["nodeId"]
        node = (await client.get_nodes(sid, [nid])).nodes[0]
        covers = node.metadata.get("covers_ids")
        if node.name != "context/summary" or not isinstance(covers, list):
            raise ToolError(f"node {nid!r} is not a compaction summary (its name is {node.name!r}, a summary's "
                            "is 'context/summary'); give the id of a summary node", "InvalidParams")
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 20)
        page_ids = covers[start:start + limit]
        got = await client.get_nodes(sid, page_ids, include_callees=True) if page_ids else None
        turns = []
        calls_of: dict[str, list[dict[str, Any]]] = {}
        for c in got.callees if got else []:
            calls_of.setdefault(_turn_of(c, got.callees), []).append(_node_brief(c, None))
        for n in got.nodes if got else []:
            turn = _node_brief(n, None)
            turn["calls"] = calls_of.get(n.id, [])
            turns.append(turn)
        nxt = start + len(page_ids)
        return {"summaryId": nid, "summary": node_text(node.output), "totalTurns": len(covers), "turns": turns,
                "nextCursor": encode_cursor(nxt) if nxt < len(covers) else None}

    async def _list_sessions(self, client: Any, a: dict[str, Any]) -> dict[str, Any]:
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 20)
        res = await client.session_list(limit=limit, offset=start)
        sessions = [{"sessionId": s.session_id, "title": s.title, "head": s.head, "nodeCount": s.node_count,
                     "createdAt": s.created_at, "updatedAt": s.updated_at} for s in res.sessions]
        nxt = start + len(sessions)
        return {"sessions": sessions, "total": res.total,
                "nextCursor": encode_cursor(nxt) if sessions and nxt < res.total else None}

    async def _session_history(self, client: Any, a: dict[str, Any]) -> dict[str, Any]:
        start, limit = decode_cursor(a.get("cursor")), a.get("limit", 50)
        res = await client.history(a["sessionId"], head=a.get("headId"))
        page = res.nodes[start:start + limit]
        nxt = start + len(page)
        return {"sessionId": a["sessionId"], "head": res.head, "total": len(res.nodes),
                "nodes": [_node_brief(n, HISTORY_PREVIEW_CHARS) for n in page],
                "nextCursor": encode_cursor(nxt) if nxt < len(res.nodes) else None}

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
        """The branch at HEAD of the session ``uri`` names, as a plain-text transcript."""
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
        lines = [f"# {info.title or sid}", f"session {sid}, HEAD {hist.head}", ""]
        for n in hist.nodes:
            lines.append(f"## {n.role}{' ' + n.name if n.name else ''} (seq {n.seq}, node {n.id})")
            lines.append(node_text(n.output))
            lines.append("")
        return "\n".join(lines)

    async def _context_stats(self, client: Any, a: dict[str, Any]) -> dict[str, Any]:
        # promptMode none: measuring must not assemble (or record) a system prompt (SPEC §7).
        prep = await client.prepare(a["sessionId"], model=a.get("model"), prompt_mode="none", format="openai")
        b = prep.budget
        return {"sessionId": a["sessionId"], "model": prep.manifest.get("model"),
                "budget": {"contextWindow": b.context_window, "outputReserve": b.output_reserve,
                           "inputBudget": b.input_budget, "inputUsed": b.input_used,
                           "systemPrompt": b.system_prompt, "toolsSchema": b.tools_schema, "history": b.history,
                           "percentUsed": b.percent_used, "headroom": b.headroom, "source": b.source},
                "recommendCompaction": prep.recommend_compaction, "needsCompaction": prep.needs_compaction,
                "summaryId": prep.summary_id, "messages": len(prep.messages)}
