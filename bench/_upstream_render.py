# pyright: reportMissingImports=false
# (openprogram is installed only in the throwaway venv this bench creates)
"""Time OpenProgram's render of one head of an exported dagctx graph (helper of
``bench_render.py``; runs inside the throw-away venv where ``openprogram`` is
installed, with the standard library and OpenProgram only).

Usage: <venv>/bin/python bench/_upstream_render.py GRAPH.json [--runs N]

GRAPH.json is what ``bench_render.py`` exports: ``{"root", "head", "nodes": [Call…]}``
with dagctx's camelCase Call fields. Both upstream render paths are built from the
same nodes and timed from the in-memory model to OpenAI Chat Completions messages
(OpenProgram's own ``openai_completions`` message builder):

``dag``
    ``openprogram.context.nodes``: a ``Graph`` of ``Call`` dataclasses
    (``called_by`` = our caller edge; OpenProgram's node has no predecessor edge),
    ``compute_reads(graph, head_seq=…)`` picks the ids, ``render.render_dag_messages``
    turns them into provider messages. It is seq-ordered, not branch-aware: every node
    with ``seq <= head.seq`` is read, including abandoned forks, and tool calls render
    as text pairs (user ``name(args)`` + assistant result).
``chat``
    the chat/session path: message dicts → ``_msg_to_node`` → ``SessionMemoryIndex``
    (conversation edge ``metadata.parent_id``, tool rows ``called_by`` the assistant,
    tool calls also kept on the assistant message as the dispatcher persists them);
    timed: ``get_branch`` walk from the head + ``_node_to_msg`` +
    ``DefaultContextEngine._assemble_messages`` (the engine's non-commit assembly),
    which emits real tool calls and results.

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from importlib import metadata as importlib_metadata
from typing import Any, Callable


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _time(fn: Callable[[], Any], runs: int) -> tuple[float, float, Any]:
    t = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return first, statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()

    with open(args.graph, encoding="utf-8") as f:
        data = json.load(f)
    root, head = data["root"], data["head"]
    nodes = [n for n in data["nodes"] if n["id"] != root]
    by_id = {n["id"]: n for n in nodes}

    from openprogram.context.engine import DefaultContextEngine
    from openprogram.context.nodes import Call, Graph, compute_reads
    from openprogram.context.render import render_dag_messages
    from openprogram.providers.openai_completions.openai_completions import _build_messages
    from openprogram.providers.types import Context, Model
    from openprogram.store.session._msg_adapter import _msg_to_node, _node_to_msg
    from openprogram.store.session.memory_index import SessionMemoryIndex

    model = Model(id="gpt-4o", name="gpt-4o", api="openai-completions", provider="openai",
                  base_url="https://api.openai.com/v1")

    def to_openai(messages: list[Any]) -> list[dict[str, Any]]:
        return _build_messages(Context(messages=messages), model)

    def edge(x: str | None) -> str:
        return "" if x in (None, root) else x

    # ---- dag path: Graph + compute_reads + render_dag_messages
    graph = Graph()
    for n in nodes:
        meta = dict(n.get("metadata") or {})
        if n.get("status", "completed") != "completed":
            meta["status"] = n["status"]
        graph.add(Call(id=n["id"], created_at=n["createdAt"], seq=n["seq"], role=n["role"], name=n.get("name") or "",
                       input=n.get("input"), output=n.get("output"), called_by=edge(n.get("caller")),
                       metadata=meta))
    head_seq = graph.nodes[head].seq

    def dag() -> list[dict[str, Any]]:
        ids = compute_reads(graph, head_seq=head_seq)
        return to_openai(render_dag_messages(graph, ids))

    # ---- chat path: message dicts → SessionMemoryIndex → branch walk → assemble
    tools_of: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        if n["role"] == "code" and n.get("caller") in by_id and (n.get("metadata") or {}).get("toolCallId"):
            tools_of.setdefault(n["caller"], []).append(n)
    index = SessionMemoryIndex()
    sid = data.get("sessionId", "bench")
    for n in nodes:
        ts = n["createdAt"]
        if n["role"] == "user":
            msg = {"id": n["id"], "role": "user", "content": _text(n.get("output") if n.get("output") is not None
                                                                   else n.get("input")),
                   "parent_id": edge(n.get("predecessor")) or None, "timestamp": ts}
        elif n["role"] == "llm":
            calls = [{"tool": t["name"], "input": t.get("input"), "result": _text(t.get("output")),
                      "tool_call_id": t["metadata"]["toolCallId"], "is_error": t.get("status") == "error"}
                     for t in tools_of.get(n["id"], ())]
            msg = {"id": n["id"], "role": "assistant", "content": _text(n.get("output")),
                   "parent_id": edge(n.get("predecessor")) or None, "timestamp": ts,
                   "token_model": n.get("name") or ""}
            if calls:
                msg["tool_calls"] = calls
        else:
            msg = {"id": n["id"], "role": "tool", "content": _text(n.get("output")), "function": n.get("name") or "",
                   "parent_id": edge(n.get("caller")), "timestamp": ts,
                   "extra": {"tool_use": {"name": n.get("name") or "", "arguments": n.get("input") or {},
                                          "called_by": edge(n.get("caller"))}}}
        node = _msg_to_node(msg)
        pred = (node.metadata or {}).get("parent_id") or None
        index.append(node, predecessor=pred, caller=node.called_by or None)
    index.set_head(head)
    engine = DefaultContextEngine()

    def conv_edge(c: Any) -> str | None:
        return (c.metadata or {}).get("parent_id") or c.called_by or None

    def chat() -> list[dict[str, Any]]:
        history = [_node_to_msg(c, sid) for c in index.get_branch(head, conv_edge)]
        return to_openai(engine._assemble_messages(history))

    paths: dict[str, Any] = {}
    for name, fn, what in (
        ("dag", dag, "context.nodes.compute_reads + context.render.render_dag_messages"
                     " → openai_completions._build_messages"),
        ("chat", chat, "SessionMemoryIndex.get_branch + _node_to_msg + DefaultContextEngine._assemble_messages"
                       " → _build_messages"),
    ):
        first, med, out = _time(fn, args.runs)
        roles: dict[str, int] = {}
        for m in out:
            roles[m["role"]] = roles.get(m["role"], 0) + 1
        calls = sum(len(m.get("tool_calls") or ()) for m in out)
        if name == "dag":
            note = f"seq-ordered, no branches: reads {len(compute_reads(graph, head_seq=head_seq)):,} nodes"
        else:
            note = f"branch walk; {calls:,} real tool calls"
        role_seq = hashlib.sha1("".join(m["role"][0] for m in out).encode()).hexdigest()
        paths[name] = {"what": what, "first": first, "median": med, "messages": len(out), "roles": roles,
                       "roleSeq": role_seq,
                       "toolCalls": calls, "bytes": len(json.dumps(out, ensure_ascii=False).encode()), "note": note}

    try:
        version = importlib_metadata.version("openprogram")
    except importlib_metadata.PackageNotFoundError:
        version = "?"
    json.dump({"version": version, "python": sys.version.split()[0], "runs": args.runs, "paths": paths}, sys.stdout)


if __name__ == "__main__":
    main()
