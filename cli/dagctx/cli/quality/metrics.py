"""M1–M7 of one replayed session (issue #23), each from what the daemon handed out.

* M1 lossless recall — every identifier of a node whose content compaction, aging or
  reduction took out of a request (and that the request no longer carries) must be
  found again through dagctx's own recovery tools, the ones ``dagctx mcp`` gives a model
  (``HistoryTools``, over the same daemon): ``read_node`` of a node the request names (a
  reduced result names its node), else ``search_history`` for the identifier (top 10)
  and ``read_node`` of a hit, else ``expand_summary`` of a summary the request names.
  A route counts only when the text it returned holds the identifier.
* M2 identifier retention by class — of each summary (dagctx's, and the ones recorded in
  the transcript by the agent that wrote it), what share of the identifiers of the nodes
  it covers it names.
* M3 artifact trail — files edited or written in the covered nodes that the summary names
  (its path or its file name).
* M4 budget conformance and M5 cache economics — ``cache.py``.
* M6 aging regret — aged tool results whose removed identifiers the session uses again
  later (in a user message, a model's reply or a tool call's arguments).
* M7 replay determinism — ``context/replay`` of every handed-out request, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dagctx.cli.quality import cache as cm
from dagctx.cli.quality import identifiers as ids
from dagctx.cli.quality.replay import Replay, Source

#: tools whose call writes a file, and the argument naming it
EDIT_TOOLS = {"Edit": "file_path", "Write": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path",
              "write_file": "path", "edit_file": "path", "create_file": "path", "str_replace_editor": "path",
              "str_replace_based_edit_tool": "path", "apply_patch": None, "edit": "path", "write": "path"}


def node_text(n: Any) -> str:
    """What a node says: its input and its output, as text."""
    parts = []
    for v in (n.input, n.output):
        if v is None:
            continue
        parts.append(v if isinstance(v, str) else cm.unit_text(v))
    return "\n".join(p for p in parts if p)


class NodeIds:
    def __init__(self, src: Source) -> None:
        self.src = src
        self._memo: dict[str, dict[str, str]] = {}

    def __call__(self, nid: str) -> dict[str, str]:
        got = self._memo.get(nid)
        if got is None:
            n = self.src.nodes.get(nid)
            got = ids.extract(node_text(n)) if n is not None else {}
            self._memo[nid] = got
        return got


def _turn(src: Source, chain_ids: list[str]) -> list[str]:
    out: list[str] = []
    for c in chain_ids:
        out.append(c)
        out.extend(src.below.get(c, []))
    return out


def removed_nodes(src: Source, manifest: dict[str, Any]) -> dict[str, str]:
    """node id → how a request took its content out (compaction, aging, reduction, checkpoint)."""
    out: dict[str, str] = {}
    for nid in _turn(src, [c for c in manifest.get("coversIds") or [] if c in src.nodes]):
        out[nid] = "compaction"
    tr = manifest.get("turnReduction") or {}
    for nid in (tr.get("results") or {}):
        out.setdefault(nid, "reduction")
    for nid in manifest.get("aged") or []:  # ids whose output the request replaced (reduced ones too)
        out.setdefault(nid, "aging")
    cp = tr.get("checkpoint") or {}
    for nid in _turn(src, [c for c in cp.get("coversIds") or [] if c in src.nodes]):
        out.setdefault(nid, "checkpoint")
    return out


def fts_phrase(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


async def m1_recall(rep: Replay, tools: Any, node_ids: NodeIds, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    src = rep.source
    removed: dict[tuple[str, str], tuple[int, str]] = {}
    seen: set[tuple[str, str]] = set()
    named: dict[tuple[str, str], tuple[bool, str | None]] = {}
    for req in rep.requests:
        if req.node_id is None:
            continue
        gone = removed_nodes(src, req.manifest)
        fresh = [(n, how) for n, how in gone.items() if (n, how) not in seen]
        if not fresh:
            continue
        text = "\n".join(cm.unit_text(u) for u in cm.units_of(cm.Sent(req.at, req.system, req.messages)))
        summary = req.manifest.get("summaryId")
        for n, how in fresh:
            seen.add((n, how))
            for x in node_ids(n):
                if x not in text and (x, n) not in removed:
                    removed[(x, n)] = (req.index, how)
                    named[(x, n)] = (n in text, summary if summary and summary in text else None)
    reads: dict[str, str] = {}

    async def read(nid: str) -> str:
        if nid not in reads:
            # the pages of the output, joined as they were cut (an identifier may span two),
            # then the input, whole (``part: input``) when the output's page shows it cut
            pages, offset, inp, cut = [], 0, "", False
            while True:
                ans = await tools.call("read_node", {"sessionId": rep.session_id, "nodeId": nid, "offset": offset})
                pages.append(ans.data.get("text", ""))
                inp = str(ans.data.get("input", ""))
                cut = bool(ans.data.get("inputTruncated"))
                offset = ans.data.get("nextOffset")
                if offset is None:
                    break
            if cut:
                parts, offset = [], 0
                while offset is not None:
                    ans = await tools.call("read_node", {"sessionId": rep.session_id, "nodeId": nid, "part": "input",
                                                         "offset": offset})
                    parts.append(ans.data.get("text", ""))
                    offset = ans.data.get("nextOffset")
                inp = "".join(parts)
            reads[nid] = "".join(pages) + "\n" + inp
        return reads[nid]

    hits_of: dict[str, list[str]] = {}
    routes = {"read_node": 0, "search": 0, "search (another node)": 0, "expand_summary": 0}
    by_how: dict[str, list[int]] = {}
    by_class: dict[str, list[int]] = {c: [0, 0] for c in ids.CLASSES}
    lost: list[dict[str, Any]] = []
    per_node: dict[str, list[int]] = {}
    for i, ((x, n), (at, how)) in enumerate(sorted(removed.items(), key=lambda kv: (kv[1][0], kv[0][1], kv[0][0]))):
        if progress is not None and i % 500 == 0 and i:
            progress(f"M1 {rep.source.title[:30]} @ {rep.window.label}: {i}/{len(removed)} identifiers")
        route = None
        node_named, summary_named = named[(x, n)]
        if node_named and x in await read(n):
            route = "read_node"
        if route is None:
            if x not in hits_of:
                ans = await tools.call("search_history", {"query": fts_phrase(x), "sessionId": rep.session_id, "limit": 10})
                hits_of[x] = [h["nodeId"] for h in ans.data.get("hits", [])]
            hits = hits_of[x]
            if n in hits and x in await read(n):
                route = "search"
            else:
                for h in hits[:10]:
                    if h != n and x in await read(h):
                        route = "search (another node)"
                        break
        if route is None and summary_named:
            ans = await tools.call("expand_summary", {"sessionId": rep.session_id, "nodeId": summary_named, "limit": 200})
            if x in ans.text:
                route = "expand_summary"
        cls = node_ids(n).get(x, "symbol")
        by_class[cls][1] += 1
        b = by_how.setdefault(how, [0, 0])
        b[1] += 1
        pn = per_node.setdefault(n, [0, 0])
        pn[1] += 1
        if route is not None:
            pn[0] += 1
            routes[route] += 1
            by_class[cls][0] += 1
            b[0] += 1
        elif len(lost) < 20:
            lost.append({"identifier": x, "node": n, "request": at, "removedBy": how})
    total = len(removed)
    found = sum(routes.values())
    return {"removed": total, "recovered": found, "recall": round(found / total, 4) if total else None,
            "routes": routes, "byMechanism": by_how, "byClass": by_class, "lost": lost,
            # per node: [recovered, removed] identifiers (the first 100 nodes)
            "nodes": dict(list(per_node.items())[:100])}


def covered_nodes(src: Source, covers: list[str]) -> list[str]:
    return _turn(src, [c for c in covers if c in src.nodes])


def edited_files(src: Source, nids: list[str]) -> list[str]:
    files: list[str] = []
    for nid in nids:
        n = src.nodes[nid]
        if n.role != "code" or n.name not in EDIT_TOOLS:
            continue
        arg = EDIT_TOOLS[n.name]
        inp = n.input
        if isinstance(inp, str):
            try:
                inp = json.loads(inp)
            except ValueError:
                inp = {"patch": inp}
        if not isinstance(inp, dict):
            continue
        if n.name == "str_replace_based_edit_tool" and inp.get("command") == "view":
            continue
        if arg is None:  # apply_patch: the files are in the patch
            patch = str(inp.get("input") or inp.get("patch") or "")
            for line in patch.splitlines():
                for tag in ("*** Update File: ", "*** Add File: ", "*** Delete File: "):
                    if line.startswith(tag):
                        files.append(line[len(tag):].strip())
            continue
        path = inp.get(arg) or inp.get("file_path") or inp.get("path")
        if isinstance(path, str) and path:
            files.append(path)
    return list(dict.fromkeys(files))


def summary_quality(src: Source, text: str, covers: list[str], node_ids: NodeIds) -> dict[str, Any]:
    """M2 and M3 of one summary against the nodes it covers."""
    nids = covered_nodes(src, covers)
    idents: dict[str, str] = {}
    for nid in nids:
        for x, cls in node_ids(nid).items():
            idents.setdefault(x, cls)
    ret = ids.retention(idents, text)
    files = edited_files(src, nids)
    named = [f for f in files if f in text or f.rsplit("/", 1)[-1] in text]
    return {"coveredNodes": len(nids), "chars": len(text), "retention": ret,
            "kept": sum(v[0] for v in ret.values()), "identifiers": sum(v[1] for v in ret.values()),
            "filesEdited": len(files), "filesNamed": len(named), "filesMissing": [f for f in files if f not in named][:10]}


async def m2_dagctx(client: Any, rep: Replay, node_ids: NodeIds) -> list[dict[str, Any]]:
    out = []
    for c in rep.compactions:
        sid = c.get("summaryId")
        if not (c.get("ok") and sid):
            continue
        node = (await client.get_nodes(rep.session_id, [sid])).nodes[0]
        text = node.output if isinstance(node.output, str) else cm.unit_text(node.output)
        q = summary_quality(rep.source, text, list(node.metadata.get("covers_ids") or []), node_ids)
        out.append({"summaryId": sid, "request": c.get("request"), **q})
    return out


def m2_recorded(src: Source, node_ids: NodeIds) -> list[dict[str, Any]]:
    out = []
    for node in src.recorded_summaries:
        text = node.output if isinstance(node.output, str) else cm.unit_text(node.output)
        q = summary_quality(src, text, list(node.metadata.get("covers_ids") or []), node_ids)
        out.append({"summaryId": node.id, "trigger": node.metadata.get("trigger"), **q})
    return out


def m6_regret(rep: Replay, node_ids: NodeIds) -> dict[str, Any]:
    src = rep.source
    pos = {c: i for i, c in enumerate(src.chain)}
    uses: dict[str, list[int]] = {}
    for i, c in enumerate(src.chain):
        n = src.nodes[c]
        texts = [node_text(n)] if n.role in ("user", "llm") else []
        texts += [cm.unit_text(src.nodes[b].input) for b in src.below[c] if src.nodes[b].input is not None]
        for t in texts:
            for x in ids.extract(t):
                uses.setdefault(x, []).append(i)
    first_aged: dict[str, tuple[int, str]] = {}
    for req in rep.requests:
        reduced = (req.manifest.get("turnReduction") or {}).get("results") or {}
        for nid in req.manifest.get("aged") or []:
            if nid not in reduced and nid not in first_aged:
                first_aged[nid] = (pos.get(req.head, -1), (req.manifest.get("agedText") or {}).get(nid, ""))
    regret = []
    for nid, (at, aged_text) in first_aged.items():
        gone = [x for x in node_ids(nid) if x not in aged_text]
        again = [x for x in gone if any(p > at for p in uses.get(x, []))]
        if again:
            regret.append({"node": nid, "identifiers": again[:5], "count": len(again)})
    return {"aged": len(first_aged), "regretted": len(regret),
            "share": round(len(regret) / len(first_aged), 4) if first_aged else None, "examples": regret[:10]}
