"""Importing transcripts and replaying each session step by step through the real daemon.

A session is replayed by appending its HEAD branch to a fresh session, node by node in
its order, and asking ``context/prepare`` for every top-level model call before the call
is appended — the loop of ``examples/python/agent.py``: when the answer recommends
compaction (SPEC §7), ``context/compact`` runs and the request is prepared again (once
per user turn when there was nothing to fold). The call is then appended with the
request's ``renderId``, so ``context/replay`` can rebuild it (M7). What each request was,
as handed out, is kept in ``Request``.

Node ids are kept (they are unique per session), so a replayed node is the source's node.
Recorded summaries (another agent's compactions, ``context/summary``) and system-prompt
nodes are not replayed: dagctx makes its own decisions; the recorded summaries are
measured beside dagctx's (M2, M3).

Beside the managed replay, every session is appended once more *without* management
(``baseline``): ``context/render`` with aging off gives, at each model call, the request a
client without context management would send — the first baseline of M5.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

SUMMARY_NAME = "context/summary"
SYSTEM_PROMPT_NAME = "context/system_prompt"
#: node metadata that belongs to the source's storage, not to the node
_DROP_METADATA = ("spill", "renderManifest", "decisionPath")
_BATCH = 200


@dataclass
class Window:
    """One context window of the replay: a model of the daemon's table (``models``)."""

    tokens: int
    max_output: int

    @property
    def model(self) -> str:
        return f"dagctx-eval-{self.label}"

    @property
    def label(self) -> str:
        return f"{self.tokens // 1000}k" if self.tokens % 1000 == 0 else str(self.tokens)

    def spec(self) -> dict[str, Any]:
        return {"contextWindow": self.tokens, "maxOutput": self.max_output, "tokenizer": "cl100k_base"}


def parse_window(text: str) -> Window:
    t = text.strip().lower()
    try:
        tokens = int(float(t[:-1]) * 1000) if t.endswith("k") else int(t)
    except ValueError:
        raise ValueError(f"window {text!r}: give tokens, e.g. 16k, 32k, 128k or 20000") from None
    if not 2_000 <= tokens <= 10_000_000:
        raise ValueError(f"window {text!r}: between 2k and 10M tokens")
    return Window(tokens, max_output=min(4096, tokens // 8))


@dataclass
class Source:
    """One session to replay: its nodes (whole), its HEAD branch, its recorded summaries."""

    session_id: str
    title: str
    origin: str
    nodes: dict[str, m.Call]
    chain: list[str]
    #: chain node id → the nodes below it by caller (tool calls, inner calls, spawned branches), by seq
    below: dict[str, list[str]]
    recorded_summaries: list[m.Call]

    @property
    def model_calls(self) -> int:
        return sum(1 for i in self.chain if self.nodes[i].role == "llm")


@dataclass
class Request:
    """One request as the daemon handed it out (or refused it)."""

    index: int
    head: str
    #: the model call appended with this request's renderId (None when refused)
    node_id: str | None
    #: when the source's model call happened (Unix seconds), for the cache lifetime
    at: float
    system: str | None = None
    messages: list[Any] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    max_output_tokens: int | None = None
    stable_prefix: dict[str, Any] = field(default_factory=dict)
    reduction: dict[str, Any] | None = None
    compaction: dict[str, Any] | None = None
    refused: str | None = None
    #: the prompt-cache break the daemon reported for this request (``cacheBreak``, SPEC §7)
    cache_break: dict[str, Any] | None = None


@dataclass
class Replay:
    source: Source
    window: Window
    session_id: str
    requests: list[Request]
    compactions: list[dict[str, Any]]
    seconds: float


@dataclass
class BaselineRequest:
    index: int
    at: float
    system: str | None
    messages: list[Any]


def _plain(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value) if value is not None else None


# ---------------------------------------------------------------- sources


async def load_source(client: DagctxClient, session_id: str, origin: str = "") -> Source:
    """Every node of a session (outputs whole, also spilled ones) and its HEAD branch."""
    rows: list[m.GraphNode] = []
    after = -1
    head = root = None
    title = ""
    while True:
        g = await client.graph(session_id, after_seq=after, limit=2000)
        head, root = g.head, g.root_id
        rows.extend(g.nodes)
        if g.next_after_seq is None or not g.nodes:
            break
        after = g.next_after_seq
    info = await client.session_get(session_id)
    title = info.title or session_id
    by_id = {r.id: r for r in rows}
    ids = [r.id for r in rows if r.id != root]
    nodes: dict[str, m.Call] = {}
    for i in range(0, len(ids), 500):
        got = await client.get_nodes(session_id, ids[i:i + 500])
        for n in got.nodes:
            spill = n.metadata.get("spill")
            if isinstance(spill, dict) and isinstance(n.output, str):
                whole = await client.get_nodes(session_id, [n.id], range=m.OutputRange(offset=0))
                n = whole.nodes[0]
            nodes[n.id] = n
    chain: list[str] = []
    cur = head
    while cur is not None and cur != root:
        row = by_id[cur]
        if not row.summary and not row.system_prompt:
            chain.append(cur)
        cur = row.predecessor
    chain.reverse()
    # Spawned branches (subagents) are not replayed: only ``session/spawn`` creates their
    # roots, and a request's render shows a tool call's input and output, not its branch.
    spawned: set[str] = set()
    for r in sorted(rows, key=lambda r: r.seq):
        if r.spawn_root or r.caller in spawned or r.predecessor in spawned:
            spawned.add(r.id)
    children: dict[str, list[str]] = {}
    for r in rows:
        if r.caller is not None and r.id not in spawned:
            children.setdefault(r.caller, []).append(r.id)
    below: dict[str, list[str]] = {}
    for cid in chain:
        out: list[str] = []
        stack = list(children.get(cid, []))
        while stack:
            x = stack.pop()
            out.append(x)
            stack.extend(children.get(x, []))
            # a spawned branch continues by predecessor under the same caller: its rows
            # name the caller, so they are children already
        below[cid] = sorted(out, key=lambda i: by_id[i].seq)
    on_chain = set(chain)
    recorded = [nodes[r.id] for r in rows if r.summary and r.id in nodes
                and any(c in on_chain for c in (nodes[r.id].metadata.get("covers_ids") or []))]
    return Source(session_id, title, origin, nodes, chain, below, recorded)


async def import_sources(client: DagctxClient, paths: list[str]) -> tuple[list[Source], list[str]]:
    """Import each file (any format ``session/import`` reads); the sessions and the notes."""
    sources: list[Source] = []
    notes: list[str] = []
    for path in paths:
        res = await client.import_path(path)
        for s in res.sessions:
            sources.append(await load_source(client, s.session_id, origin=path))
        if res.skipped:
            notes.append(f"{path}: {len(res.skipped) + res.skipped_more} lines skipped by the importer")
    return sources, notes


def _input(n: m.Call, predecessor: str | None) -> NodeInput:
    md = {k: v for k, v in n.metadata.items() if k not in _DROP_METADATA}
    return NodeInput(role=n.role, id=n.id, name=n.name, input=n.input, output=n.output, status=n.status,
                     caller=n.caller, predecessor=predecessor, metadata=md)


def _pred(src: Source, i: int) -> str:
    return "ROOT" if i == 0 else src.chain[i - 1]


def _steps(src: Source) -> list[tuple[str, list[NodeInput]]]:
    """The branch as steps: ("call", [the model call]) or ("nodes", [nodes to append])."""
    out: list[tuple[str, list[NodeInput]]] = []
    pending: list[NodeInput] = []
    for i, cid in enumerate(src.chain):
        n = src.nodes[cid]
        below = [_input(src.nodes[b], src.nodes[b].predecessor) for b in src.below[cid]]
        if n.role == "llm":
            if pending:
                out.append(("nodes", pending))
                pending = []
            out.append(("call", [_input(n, _pred(src, i))]))
            pending = below
        else:
            pending.append(_input(n, _pred(src, i)))
            pending.extend(below)
    if pending:
        out.append(("nodes", pending))
    return out


async def _append(client: DagctxClient, sid: str, nodes: list[NodeInput], render_id: str | None = None) -> None:
    for i in range(0, len(nodes), _BATCH):
        await client.append_batch(sid, nodes[i:i + _BATCH], render_id=render_id)


# ---------------------------------------------------------------- replays


@dataclass
class Options:
    format: str = "anthropic"
    #: "recommended" (the reference agent loop), "auto" (prepare's allowCompaction), "off"
    compaction: str = "recommended"
    reasoning: str = "provider"
    reduction_timeout: float = 60.0
    #: ``context/compact``'s ``fallback``: "structural" when no summarizer answers (SPEC §8)
    fallback: str = "none"
    #: ``context/compact``'s ``keepRecentTokens`` (default: the daemon's keep-tail target, SPEC §8)
    keep_recent_tokens: int | None = None
    #: the provider's prompt-cache lifetime of the replayed times (M5's): each prepare tells
    #: the daemon ``promptCache`` cold when the source's previous model call is longer ago
    #: (SPEC §7) — the replay appends in seconds what took hours, so the daemon's own clock
    #: would find every cache warm. None: say nothing.
    cache_ttl: float | None = None


Progress = Callable[[str], None]


async def replay(client: DagctxClient, src: Source, window: Window, opts: Options,
                 progress: Progress | None = None) -> Replay:
    """Replay ``src`` at ``window`` in a new session of the daemon ``client`` speaks to."""
    t0 = time.perf_counter()
    sid = (await client.session_create(f"eval {window.label}: {src.title[:60]}", evalOf=src.session_id)).session_id
    requests: list[Request] = []
    compactions: list[dict[str, Any]] = []
    tip = "ROOT"
    nothing_to_fold = False
    steps = _steps(src)
    calls = sum(1 for k, _ in steps if k == "call")

    last_at: float | None = None
    cache: str | None = None

    async def prepare(head: str) -> Any:
        return await client.prepare(sid, head=None if head == "ROOT" else head, model=window.model,
                                    format=opts.format, allow_compaction=opts.compaction == "auto",
                                    prompt_mode="minimal", reasoning=opts.reasoning,
                                    reduction_timeout_seconds=opts.reduction_timeout, prompt_cache=cache)

    for kind, nodes in steps:
        if kind == "nodes":
            if any(n.role == "user" and n.caller is None for n in nodes):
                nothing_to_fold = False  # a new user turn
            await _append(client, sid, nodes)
            tip = next((n.id for n in reversed(nodes) if n.caller is None), tip)  # type: ignore[misc]
            continue
        call = nodes[0]
        src_call = src.nodes[call.id]  # type: ignore[index]
        req = Request(index=len(requests), head=tip, node_id=None,
                      at=float(src_call.metadata.get("timestamp") or src_call.created_at))
        cache = None
        if opts.cache_ttl is not None and last_at is not None:
            cache = "cold" if req.at - last_at > opts.cache_ttl else "warm"
        try:
            prep = await prepare(tip)
            if prep.recommend_compaction and opts.compaction == "recommended" and not nothing_to_fold and tip != "ROOT":
                res = await client.compact(sid, head=tip, model=window.model, trigger="auto", format=opts.format,
                                         fallback=opts.fallback, keep_recent_tokens=opts.keep_recent_tokens)
                rec = {"request": req.index, "head": tip, **_plain(res)}
                compactions.append(rec)
                req.compaction = rec
                if res.ok and res.summary_id:
                    prep = await prepare(tip)
                else:
                    nothing_to_fold = True
            elif prep.compaction:
                rec = {"request": req.index, "head": tip, **prep.compaction}
                compactions.append(rec)
                req.compaction = rec
        except RpcError as exc:
            req.refused = f"{exc.kind}: {exc.message}"
            requests.append(req)
            await _append(client, sid, [call])
            tip = call.id  # type: ignore[assignment]
            continue
        req.system = prep.system
        req.messages = prep.messages
        req.manifest = prep.manifest
        req.budget = _plain(prep.budget)
        req.max_output_tokens = prep.max_output_tokens
        req.stable_prefix = _plain(prep.stable_prefix) or {}
        req.reduction = _plain(prep.reduction)
        req.cache_break = _plain(prep.cache_break)
        await client.append_batch(sid, [call], render_id=prep.render_id)
        req.node_id = call.id
        last_at = req.at  # the cache holds what was sent: the previous served request
        requests.append(req)
        tip = call.id  # type: ignore[assignment]
        if progress is not None and (req.index % 10 == 0 or req.index == calls - 1):
            progress(f"{src.title[:40]} @ {window.label}: request {req.index + 1}/{calls}")
    return Replay(src, window, sid, requests, compactions, time.perf_counter() - t0)


async def baseline(client: DagctxClient, src: Source, model: str, fmt: str, reasoning: str) -> list[BaselineRequest]:
    """The unmanaged requests: the whole branch at every model call (aging off, no summary)."""
    sid = (await client.session_create(f"eval baseline: {src.title[:60]}", evalOf=src.session_id)).session_id
    out: list[BaselineRequest] = []
    tip = "ROOT"
    for kind, nodes in _steps(src):
        if kind == "nodes":
            await _append(client, sid, nodes)
            tip = next((n.id for n in reversed(nodes) if n.caller is None), tip)  # type: ignore[misc]
            continue
        call = nodes[0]
        src_call = src.nodes[call.id]  # type: ignore[index]
        at = float(src_call.metadata.get("timestamp") or src_call.created_at)
        if tip == "ROOT":
            out.append(BaselineRequest(len(out), at, None, []))
        else:
            r = await client.render(sid, head=tip, format=fmt, model=model, aging=False, reasoning=reasoning)
            out.append(BaselineRequest(len(out), at, r.system, r.messages))
        await _append(client, sid, [call])
        tip = call.id  # type: ignore[assignment]
    return out


async def replay_nodes(client: DagctxClient, rep: Replay) -> dict[str, Any]:
    """M7: ``context/replay`` of every handed-out request, after the whole session was replayed."""
    same = differ = 0
    first_diff: list[int] = []
    for req in rep.requests:
        if req.node_id is None:
            continue
        r = await client.replay(rep.session_id, req.node_id, format=None)
        if _canon(r.system) == _canon(req.system) and _canon(r.messages) == _canon(req.messages):
            same += 1
        else:
            differ += 1
            if len(first_diff) < 5:
                first_diff.append(req.index)
    return {"requests": same + differ, "identical": same, "different": differ, "firstDifferent": first_diff}


def _canon(value: Any) -> bytes:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

