"""The memory tools of ``dagctx mcp`` (``memory_search``, ``memory_get``; SPEC §5.1), apart from
the history tools of ``mcp_tools`` (their table and argument checks are there). They serve the
workspace the server was started for (``HistoryTools.workspace``)."""

from __future__ import annotations

import json
import sys
from typing import Any


def _h(tools: Any) -> Any:
    """``mcp_tools``, the module of ``tools`` (its answer, pager and error types; not imported
    here, so the two modules do not import each other)."""
    return sys.modules[type(tools).__module__]


def _workspace(tools: Any) -> str:
    if not tools.workspace:
        raise _h(tools).ToolError("no workspace: start the server with --workspace DIR (the folder holding MEMORY.md "
                        "and memory/)")
    return tools.workspace

async def memory_search(tools: Any, client: Any, a: dict[str, Any]) -> Any:
    from dagctx.protocol import memory_messages as mem

    sources = a.get("sources") or ["memory"]
    notes: list[str] = []
    if "memory" in sources:
        ws = _workspace(tools)
        idx = await client.request("memory/index", mem.MemoryIndexParams(workspace=ws))
        notes = [s.note for s in idx.skipped]
    else:
        ws = tools.workspace
    res = await client.request("memory/search", mem.MemorySearchParams(
        query=a["query"], workspace=ws, max_results=a.get("maxResults", 6), min_score=a.get("minScore", 0.0),
        sources=sources, mmr=mem.MemoryMmr()))
    head = f"# memory_search {json.dumps(a['query'], ensure_ascii=False)}"
    if res.keywords:
        head += f" (keywords: {' '.join(res.keywords)})"
    pager = _h(tools).Pager(len(head) + 400 + sum(len(n) + 3 for n in notes[:5]))
    hits = []
    for i, h in enumerate(res.hits, 1):
        if h.source == "memory":
            where = f"{h.path} lines {h.start_line}–{h.end_line} · chunkId {h.chunk_id}"
        else:
            where = f"session {h.session_id} · node {h.node_id}"
        body, cut = _h(tools).clip(h.text, 2000)
        block = f"## {i}. {where} · score {h.score:.3f}\n{body}" + (
            "\n… [cut: memory_get chunkId gives the chunk whole]" if cut and h.source == "memory" else
            "\n… [cut: read_node gives the node whole]" if cut else "")
        if not pager.add(block):
            break
        hits.append({k: v for k, v in {
            "source": h.source, "score": h.score, "textScore": h.text_score, "text": body, "chunkId": h.chunk_id,
            "path": h.path, "startLine": h.start_line, "endLine": h.end_line, "sessionId": h.session_id,
            "nodeId": h.node_id, "time": h.time}.items() if v is not None})
    head += f": {len(hits)} hits" if hits else ": no hits"
    if len(hits) < len(res.hits):
        head += f" ({len(res.hits) - len(hits)} more left out to stay within {_h(tools).ANSWER_CHARS} characters)"
    tail = ""
    if notes:
        tail = "\n\nNot indexed (" + str(len(notes)) + "):\n" + "\n".join(f"- {n}" for n in notes[:5]) + (
            f"\n- … and {len(notes) - 5} more" if len(notes) > 5 else "")
    text = "\n\n".join([head, *pager.blocks]) + tail
    return _h(tools).Answer(text, {"query": a["query"], "keywords": list(res.keywords), "mode": res.mode, "hits": hits,
                         "notIndexed": notes})

async def memory_get(tools: Any, client: Any, a: dict[str, Any]) -> Any:
    from dagctx.protocol import memory_messages as mem

    if ("chunkId" in a) == ("path" in a):
        raise _h(tools).ToolError("memory_get: give exactly one of chunkId (from memory_search) and path (a memory file "
                        "relative to the workspace)")
    ws = _workspace(tools)
    want = a.get("lines")
    res = await client.request("memory/get", mem.MemoryGetParams(
        workspace=ws, chunk_id=a.get("chunkId"), path=a.get("path"), from_line=a.get("fromLine"),
        lines=min(want or 2000, 2000)))
    lines = res.text.split("\n") if res.end_line >= res.start_line else []
    pager = _h(tools).Pager(300)
    shown: list[str] = []
    cut_line = False
    for line in lines:
        if not shown and len(line) > pager.left:
            shown.append(line[: max(0, pager.left)])
            cut_line = True
            break
        if not pager.add(line):
            break
        shown.append(line)
    end = res.start_line + len(shown) - 1
    if end < res.end_line:  # the answer's bound cut the lines the daemon gave
        nxt: int | None = end + 1
    elif res.chunk_id is None and end < res.total_lines and (want is None or end < res.start_line + want - 1):
        nxt = end + 1  # asked for more than one request reads (2000 lines)
    else:
        nxt = None
    text_out = "\n".join(shown)
    head = (f"# memory_get {res.path} lines {res.start_line}–{end} of {res.total_lines}" if shown
            else f"# memory_get {res.path}: no lines from {res.start_line} (it has {res.total_lines})")
    if res.chunk_id:
        head += f" (chunk {res.chunk_id})"
    more = ""
    if cut_line:
        more += f"\n… [line {end} is longer than one answer: cut at {len(shown[0]):,} characters]"
    if nxt is not None:
        more += f"\n\nMore: call memory_get again with path \"{res.path}\" and fromLine {nxt}."
    return _h(tools).Answer(head + "\n" + text_out + more, {
        "path": res.path, "text": text_out, "startLine": res.start_line, "endLine": end,
        "totalLines": res.total_lines, "chunkId": res.chunk_id, "nextFromLine": nxt, "lineCut": cut_line})
