"""The JSON API of ``dagctx ui``: each route is a few protocol calls through the Python client.

Nothing here decides what a model saw: the request view is ``context/replay``, the graph
is ``session/graph``, coverage is what the daemon states. This module only arranges
those answers for the page: the difference between two replays, which message belongs
to which token category, the decision path as sentences read off the manifest.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m

Route = Callable[[dict[str, Any]], Awaitable[Any]]

SUMMARY_NAME = "context/summary"
#: Anthropic-style prompt-cache prices relative to base input (cache write 1.25x, read 0.1x)
CACHE_WRITE_FACTOR = 1.25
CACHE_READ_FACTOR = 0.1
#: how far back along the branch the previous request is looked for
PREVIOUS_WALK = 500
#: covered nodes a compaction view lists at most
COVERED_LIMIT = 2_000
#: active summaries whose rows come with a graph's first page at most
ACTIVE_SUMMARIES = 20

_enc = msgspec.json.Encoder()


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _need(p: dict[str, Any], name: str) -> str:
    v = p.get(name)
    if not isinstance(v, str) or not v:
        raise ApiError(400, f"missing parameter {name!r}")
    return v


def _int(p: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = p.get(name)
    if v in (None, ""):
        return default
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise ApiError(400, f"{name} must be an integer") from None
    if not lo <= n <= hi:
        raise ApiError(400, f"{name} must be between {lo} and {hi}")
    return n


def _b(value: Any) -> Any:
    return msgspec.to_builtins(value)


def source_of(info: m.SessionInfo) -> str:
    meta = info.metadata or {}
    return str(meta.get("importedFrom") or meta.get("source_format") or "native")


def session_row(info: m.SessionInfo) -> dict[str, Any]:
    return {"sessionId": info.session_id, "title": info.title, "source": source_of(info),
            "nodes": info.node_count, "updatedAt": info.updated_at, "createdAt": info.created_at,
            "head": info.head}


class Api:
    def __init__(self, client: DagctxClient, *, allow_writes: bool = False) -> None:
        self.client = client
        self.allow_writes = allow_writes
        self._routes: dict[tuple[str, str], Route] = {
            ("GET", "info"): self.info,
            ("GET", "sessions"): self.sessions,
            ("GET", "search"): self.search,
            ("GET", "graph"): self.graph,
            ("GET", "nodes"): self.nodes,
            ("GET", "request"): self.request,
            ("GET", "compaction"): self.compaction,
            ("POST", "checkout"): self.checkout,
            ("POST", "fork"): self.fork,
        }

    def route(self, method: str, name: str) -> Route | None:
        return self._routes.get((method, name))

    # ------------------------------------------------------------ sessions

    async def info(self, p: dict[str, Any]) -> Any:
        init = self.client.initialize_result
        return {"database": init.database if init else None, "allowWrites": self.allow_writes,
                "version": init.server_info.version if init else None}

    async def sessions(self, p: dict[str, Any]) -> Any:
        q = (p.get("q") or "").strip()
        offset = _int(p, "offset", 0, 0, 10**9)
        limit = _int(p, "limit", 100, 1, 500)
        if not q:
            page = await self.client.session_list(limit=limit, offset=offset)
            return {"sessions": [session_row(s) for s in page.sessions], "total": page.total, "query": None}
        # full text (SPEC §5): the sessions whose nodes match, best hit first
        hits = (await self.client.search(q, limit=500)).hits
        order: list[str] = []
        first: dict[str, m.SearchHit] = {}
        count: dict[str, int] = {}
        for h in hits:
            if h.session_id not in first:
                order.append(h.session_id)
                first[h.session_id] = h
            count[h.session_id] = count.get(h.session_id, 0) + 1
        rows = []
        for sid in order[offset: offset + limit]:
            try:
                info = await self.client.session_get(sid)
            except RpcError:
                continue
            row = session_row(info)
            row["hits"] = count[sid]
            row["snippet"] = first[sid].snippet
            rows.append(row)
        return {"sessions": rows, "total": len(order), "query": q}

    async def search(self, p: dict[str, Any]) -> Any:
        q = _need(p, "q")
        sid = p.get("session") or None
        res = await self.client.search(q, session_id=sid, limit=_int(p, "limit", 50, 1, 500))
        return {"hits": _b(res.hits)}

    # ------------------------------------------------------------ graph and nodes

    async def graph(self, p: dict[str, Any]) -> Any:
        sid = _need(p, "session")
        after = _int(p, "after", -1, -1, 2**62)
        conversation_only = p.get("all") not in ("1", "true")
        # both asked at once: the session row does not wait for the graph page's round trip
        res, info = await asyncio.gather(
            self.client.graph(sid, after_seq=after, limit=_int(p, "limit", 5_000, 1, 20_000),
                              conversation_only=conversation_only),
            self.client.session_get(sid),
        )
        out: dict[str, Any] = {"graph": res, "session": session_row(info)}
        if after == -1 and res.next_after_seq is not None:
            # a summary is written after the turns it covers, so the first page of a long
            # session rarely holds the row of the summary the heads use: its row (with the
            # coverage session/graph states) comes with the first page, and the page folds
            # the covered turns into the capsule from its first drawing
            out["summaries"] = await self._active_summary_rows(sid, res, conversation_only)
        # the Struct is encoded as it is (no copy into dicts: a page holds thousands of rows)
        return out

    async def _active_summary_rows(self, sid: str, res: m.SessionGraphResult,
                                   conversation_only: bool) -> list[m.GraphNode]:
        on_page = {r.id for r in res.nodes}
        wanted = list(dict.fromkeys(h.summary_id for h in res.heads
                                    if h.summary_id is not None and h.summary_id not in on_page))[:ACTIVE_SUMMARIES]
        if not wanted:
            return []
        try:
            nodes = (await self.client.get_nodes(sid, wanted)).nodes
        except RpcError:  # gone since (a new state): the rest of the pages bring what is there
            return []
        pages = await asyncio.gather(*(
            self.client.graph(sid, after_seq=n.seq - 1, limit=1, conversation_only=conversation_only)
            for n in nodes))
        return [row for page in pages for row in page.nodes[:1] if row.id in wanted and row.covers_ids is not None]

    async def nodes(self, p: dict[str, Any]) -> Any:
        sid = _need(p, "session")
        ids = [i for i in _need(p, "ids").split(",") if i][:COVERED_LIMIT]
        res = await self.client.get_nodes(sid, ids, include_callees=p.get("callees") in ("1", "true"))
        return _b(res)

    # ------------------------------------------------------------ what the model saw

    async def _node(self, sid: str, nid: str) -> m.Call:
        return (await self.client.get_nodes(sid, [nid])).nodes[0]

    async def _previous_request(self, sid: str, node: Any) -> str | None:
        """The previous llm node of the same branch: walk ``predecessor`` back from it."""
        pred = node.predecessor
        for _ in range(PREVIOUS_WALK):
            if not pred:
                return None
            try:
                prev = await self._node(sid, pred)
            except RpcError:
                return None
            if prev.role == "llm" and prev.name != SUMMARY_NAME:
                return prev.id
            pred = prev.predecessor
        return None

    async def request(self, p: dict[str, Any]) -> Any:
        sid, nid = _need(p, "session"), _need(p, "node")
        node = await self._node(sid, nid)
        if node.role != "llm" or node.name == SUMMARY_NAME:
            raise ApiError(400, "the request view is for llm calls (what a model was sent)")
        replay = await self.client.replay(sid, nid)
        fmt = replay.manifest.get("format") or "neutral"
        prev_id = await self._previous_request(sid, node)
        prev = await self.client.replay(sid, prev_id, format=fmt) if prev_id else None
        system_node = None
        sys_id = replay.manifest.get("systemNode")
        if sys_id:
            try:
                system_node = await self._node(sid, sys_id)
            except RpcError:
                system_node = None
        return {
            "nodeId": nid,
            "node": _b(node),
            "replay": _b(replay),
            "format": fmt,
            "categories": token_categories(replay, system_node),
            "decisionPath": decision_path(replay, node),
            "decisionPathRecorded": isinstance(node.metadata.get("decisionPath"), list),
            "tools": replay.tools,
            "previous": None if prev is None else {"nodeId": prev_id, "diff": request_diff(prev, replay)},
            "usage": usage_view(replay),
        }

    async def compaction(self, p: dict[str, Any]) -> Any:
        sid, nid = _need(p, "session"), _need(p, "summary")
        node = await self._node(sid, nid)
        if node.name != SUMMARY_NAME:
            raise ApiError(400, "not a summary node")
        covers = [str(x) for x in (node.metadata.get("covers_ids") or node.metadata.get("coversIds") or [])]
        got = await self.client.get_nodes(sid, covers[:COVERED_LIMIT], include_callees=True) if covers else None
        covered = list(got.nodes) + list(got.callees) if got else []
        stats = node.metadata.get("stats") if isinstance(node.metadata.get("stats"), dict) else {}
        text = node.output if isinstance(node.output, str) else msgspec.json.encode(node.output).decode()
        checked = stats.get("identifiersChecked")
        if isinstance(checked, list):
            missing = set(stats.get("identifiersMissing") or [])
            kept = [i for i in checked if i not in missing]
            dropped = [i for i in checked if i in missing]
            how = "the identifiers the compaction's fidelity gate checked (stored on the summary)"
        else:
            kept, dropped = identifier_split([_node_text(n) for n in covered], text)
            how = "identifiers found in the covered turns by the viewer (paths, hashes, URLs, code names)"
        return {
            "summary": _b(node),
            "coversIds": covers,
            "covered": _b(sorted(covered, key=lambda n: n.seq)),
            "tokensBefore": stats.get("tokensBefore"),
            "tokensAfter": stats.get("tokensAfter"),
            "identifierRetention": node.metadata.get("identifierRetention"),
            "kept": kept,
            "dropped": dropped,
            "identifiersFrom": how,
        }

    # ------------------------------------------------------------ writes (--allow-writes)

    def _writable(self) -> None:
        if not self.allow_writes:
            raise ApiError(403, "this view is read-only; start it with `dagctx ui --allow-writes` to check out or fork")

    async def checkout(self, p: dict[str, Any]) -> Any:
        self._writable()
        res = await self.client.checkout(_need(p, "session"), _need(p, "node"))
        return _b(res)

    async def fork(self, p: dict[str, Any]) -> Any:
        self._writable()
        sid, at = _need(p, "session"), _need(p, "node")
        text = _need(p, "text")
        res = await self.client.append(sid, "user", output=text, predecessor=at, move_head=True)
        return _b(res)


# ---------------------------------------------------------------- pure helpers (tested in-process)


def _node_text(n: Any) -> str:
    parts = []
    for v in (n.input, n.output):
        if v is None:
            continue
        parts.append(v if isinstance(v, str) else msgspec.json.encode(v).decode("utf-8", "replace"))
    return "\n".join(parts)


_IDENT = re.compile(
    r"https?://[^\s\"'<>)\]]+"                      # URLs
    r"|(?:[\w.-]+/)+[\w.-]+"                         # paths
    r"|\b[\w-]+\.(?:py|ts|js|tsx|jsx|rs|go|java|c|h|cpp|md|json|toml|yaml|yml|txt|sh|sql|html|css)\b"
    r"|\b[0-9a-f]{7,40}\b"                           # hashes
    r"|\b[a-z]+(?:_[a-z0-9]+)+\b"                    # snake_case
    r"|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b|\b(?:[A-Z][a-z0-9]+){2,}\b"  # camelCase, CamelCase
)


def identifier_split(texts: list[str], summary: str, cap: int = 400) -> tuple[list[str], list[str]]:
    """Distinct identifiers of ``texts`` (first appearance order) split into those the
    summary text contains and those it does not."""
    seen: dict[str, None] = {}
    for t in texts:
        for mo in _IDENT.finditer(t):
            ident = mo.group(0).rstrip(".,:;")
            if len(ident) >= 4:
                seen.setdefault(ident, None)
            if len(seen) >= cap:
                break
    kept = [i for i in seen if i in summary]
    dropped = [i for i in seen if i not in summary]
    return kept, dropped


def _tool_ids(manifest: dict[str, Any]) -> tuple[set[str], set[str]]:
    tr = manifest.get("turnReduction") or {}
    results = tr.get("results") or {}
    # the manifest names each summarized result by node id (SPEC §8: {nodeId: summaryKey})
    reduced = ({str(k) for k in results} if isinstance(results, dict)
               else {str(r.get("nodeId")) for r in results if isinstance(r, dict)})
    cp = tr.get("checkpoint") or {}
    checkpoint = set()
    if isinstance(cp, dict) and cp.get("id"):
        checkpoint.add(str(cp["id"]))
    return reduced, checkpoint


def token_categories(replay: c.ReplayResult, system_node: Any = None) -> dict[str, Any]:
    """The request's tokens by category (system prompt layers, tools, summary, verbatim
    tail, aged placeholders, reduced results, output reserve) against the window."""
    man = replay.manifest
    tokens = replay.tokens
    per = list(tokens.per_message) if tokens else []
    system = tokens.system if tokens else 0
    layers: list[dict[str, Any]] = []
    sections = (system_node.metadata.get("sections") if system_node is not None else None) or []
    total_chars = sum(int(s.get("chars") or 0) for s in sections if isinstance(s, dict))
    if system and total_chars:
        given = 0
        for i, s in enumerate(sections):
            share = system - given if i == len(sections) - 1 else round(system * int(s.get("chars") or 0) / total_chars)
            given += share
            layers.append({"name": str(s.get("name")), "tokens": share, "source": s.get("source")})
    elif system:
        layers.append({"name": "system prompt", "tokens": system, "source": None})
    aged = set(man.get("aged") or [])
    reduced, checkpoint = _tool_ids(man)
    summary_id = man.get("summaryId")
    cats = {"summary": 0, "verbatim": 0, "aged": 0, "reduced": 0}
    kinds: list[str] = []
    for i, msg in enumerate(replay.messages):
        ids = set(replay.message_nodes[i]) if i < len(replay.message_nodes) else set()
        if isinstance(msg, dict) and msg.get("role") == "system":
            kinds.append("system")
            continue
        if summary_id and summary_id in ids:
            kind = "summary"
        elif ids & aged:
            kind = "aged"
        elif ids & (reduced | checkpoint):
            kind = "reduced"
        else:
            kind = "verbatim"
        kinds.append(kind)
        cats[kind] += per[i] if i < len(per) else 0
    tools = int(man.get("toolsTokens") or 0)
    return {
        "window": replay.context_window,
        "outputReserve": replay.output_reserve,
        "system": system,
        "systemLayers": layers,
        "tools": tools,
        **cats,
        "total": (tokens.total if tokens else 0) + tools,
        "messageKinds": kinds,
        "tokenizer": tokens.tokenizer if tokens else None,
        "exact": bool(tokens.exact) if tokens else False,
    }


def decision_path(replay: c.ReplayResult, node: Any = None) -> list[str]:
    """The request's decision path: as the engine wrote it when it handed the request out
    (the call's ``metadata.decisionPath``, SPEC §6) — else, for a call recorded without it,
    what its manifest records, as sentences (aging, summary, reduction, checkpoint)."""
    man = replay.manifest
    recorded = node.metadata.get("decisionPath") if node is not None else None
    if isinstance(recorded, list) and all(isinstance(s, str) for s in recorded):
        return list(recorded) + ([] if replay.exact else
                                 ["replay differs from the recorded render: the branch changed under it"])
    out: list[str] = ["(read off the manifest: this call did not record its decision path)"]
    if man.get("systemNode"):
        out.append(f"system prompt: node {man['systemNode']}")
    aged = man.get("aged") or []
    out.append(f"aging: {len(aged)} tool result{'s' if len(aged) != 1 else ''} shown aged" if aged
               else "aging: no tool result aged")
    long_turn = man.get("agingLongTurn")
    if isinstance(long_turn, dict):
        out.append(f"aging within a long turn: {long_turn.get('steps')} steps, step boundary "
                   f"{long_turn.get('stepBoundary')}")
    if man.get("summaryId"):
        out.append(f"compaction: summary {man['summaryId']} replaces {len(man.get('coversIds') or [])} nodes")
    else:
        out.append("compaction: no summary applies to this branch")
    if man.get("supersededSummaries"):
        out.append(f"superseded summaries not used: {', '.join(man['supersededSummaries'])}")
    tr = man.get("turnReduction")
    if isinstance(tr, dict):
        n = len(tr.get("results") or [])
        out.append(f"reduction within the turn: {n} tool result{'s' if n != 1 else ''} summarized")
        cp = tr.get("checkpoint")
        if isinstance(cp, dict):
            out.append(f"checkpoint: {len(cp.get('coversIds') or [])} earlier steps replaced by a task summary")
    else:
        out.append("reduction within the turn: none")
    for r in man.get("repairs") or []:
        out.append(f"repair: {r}")
    if man.get("tokens") is not None:
        out.append(f"recorded size: {man['tokens']:,} tokens ({man.get('tokenizer') or 'estimate'}, "
                   f"model {man.get('model')})")
    if not replay.exact:
        out.append("replay is a reconstruction: this call did not record its render (no renderManifest)")
    return out


def request_diff(prev: c.ReplayResult, cur: c.ReplayResult) -> dict[str, Any]:
    """How ``cur`` differs from ``prev`` (both in one format): the byte-stable prefix,
    the messages added after it and the previous messages it replaced."""
    same_system = prev.system == cur.system
    pm = [_enc.encode(x) for x in prev.messages]
    cm = [_enc.encode(x) for x in cur.messages]
    k = 0
    if same_system:
        while k < len(pm) and k < len(cm) and pm[k] == cm[k]:
            k += 1
    per = list(cur.tokens.per_message) if cur.tokens else []
    sys_tokens = cur.tokens.system if cur.tokens else 0
    # OpenAI carries the system prompt as message 0, counted there
    system_inside = bool(cur.messages) and isinstance(cur.messages[0], dict) and cur.messages[0].get("role") == "system"
    prefix_tokens = sum(per[:k]) + (sys_tokens if same_system and not system_inside else 0)
    prev_rest = set(pm[k:])
    cur_rest = set(cm[k:])
    return {
        "sameSystem": same_system,
        "stablePrefixMessages": k,
        "stablePrefixTokens": prefix_tokens,
        "added": [i for i in range(k, len(cm)) if cm[i] not in prev_rest],
        "kept": [i for i in range(k, len(cm)) if cm[i] in prev_rest],
        "replaced": [i for i in range(k, len(pm)) if pm[i] not in cur_rest],
        "previousMessages": prev.messages,
        "previousCount": len(pm),
    }


def usage_view(replay: c.ReplayResult) -> dict[str, Any] | None:
    u = replay.usage
    if u is None:
        return None
    return {
        "input": u.input, "output": u.output, "cacheRead": u.cache_read, "cacheWrite": u.cache_write,
        "prompt": u.input + u.cache_read + u.cache_write,
        # cost in base-input-token equivalents (Anthropic-style prompt-cache prices)
        "inputEquivalent": round(u.input + CACHE_WRITE_FACTOR * u.cache_write + CACHE_READ_FACTOR * u.cache_read, 1),
        "factors": {"cacheWrite": CACHE_WRITE_FACTOR, "cacheRead": CACHE_READ_FACTOR},
    }
