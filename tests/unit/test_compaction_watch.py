"""The compaction's conflict check (SPEC §8: a change to a covered or kept node, or to a
node under one, while the summarizer runs is a conflict) answers what it answered when
its snapshot held each watched node's status, output and metadata and compared all of
them: now it holds the node objects and passes over the comparison when the graph it
read has had no node replaced since. Each case runs on a real store and is checked
against the check as it was written before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dagctx.context.content import covers_of
from dagctx.context.summary_choice import summary_applies
from dagctx.engine.compaction_pipeline import _touched, _watch
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.ledger.graph import is_summary
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

MODEL = "gpt-4o"


def _engine(path: Path) -> EngineCore:
    e = EngineCore(DaemonConfig(database=str(path)))
    e.initialize(m.InitializeParams(initialization_options=m.InitializationOptions()))
    return e


def _append(e: EngineCore, sid: str, **kw: Any) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw)))).node.id


def _update(e: EngineCore, sid: str, nid: str, output: str, status: str = "completed") -> None:
    asyncio.run(e.node_update(m.NodeUpdateParams(session_id=sid, node_id=nid, status=status, output=output)))


def _reference_watch(graph: Any, ids: set[str], also: set[str]) -> dict[str, tuple[Any, Any, Any]]:
    watched = set(ids) | also | graph.below(ids)
    return {nid: (graph.nodes[nid].status, graph.nodes[nid].output, graph.nodes[nid].metadata)
            for nid in watched if nid in graph.nodes}


def _reference_touched(now: Any, snapshot: dict[str, tuple[Any, Any, Any]], known: set[str], head: str) -> bool:
    """``_touched`` as it was written before: every watched node's fields compared."""
    for nid, (status, output, metadata) in snapshot.items():
        node = now.nodes.get(nid)
        if node is None:
            return True
        if node.status != status or node.output != output or node.metadata != metadata:
            return True
    new = [n for n in now.by_seq if n.id not in known]
    if any(n.predecessor in snapshot or n.caller in snapshot for n in new):
        return True
    summaries = [n for n in new if is_summary(n) and covers_of(n)]
    if summaries:
        chain = now.chain(head)
        return any(summary_applies(now, n, chain) for n in summaries)
    return False


def _session(e: EngineCore) -> tuple[str, list[str], str, dict[str, str]]:
    """A session of four turns, each reply with a running tool call: (session, covered
    chain ids, kept node, {name: id} of the nodes the cases touch)."""
    sid = e.store.create_session("watch").session_id
    head = e.store.head(sid)
    chain: list[str] = []
    calls: list[str] = []
    for i in range(4):
        u = _append(e, sid, role="user", output=f"turn {i}: check src/mod_{i}.py", predecessor=head)
        head = _append(e, sid, role="llm", name=MODEL, output=f"Reading src/mod_{i}.py.", predecessor=u)
        calls.append(_append(e, sid, role="code", name="read_file", input={"path": f"src/mod_{i}.py"},
                             status="running", caller=head, metadata={"toolCallId": f"call_{i}"}))
        chain += [u, head]
    # covered: the first two turns; kept from the third turn's user node
    return sid, chain[:4], chain[4], {"covered_call": calls[0], "kept_call": calls[3], "last": chain[-1],
                                      "covered_reply": chain[1]}


def _case(tmp_path: Path, name: str, change: Any) -> tuple[bool, bool]:
    """(the check now, the check as before) after ``change(engine, session, ids)``."""
    e = _engine(tmp_path / f"{name}.db")
    try:
        sid, covered, kept, ids = _session(e)
        graph = e.store.graph(sid)
        head = e.store.head(sid)
        snapshot = _watch(graph, set(covered), also={kept})
        before = _reference_watch(graph, set(covered), also={kept})
        assert {nid: (n.status, n.output, n.metadata) for nid, n in snapshot.items()} == before
        known = set(graph.nodes)
        change(e, sid, ids)
        now = e.store.graph(sid)
        return _touched(now, snapshot, known, head), _reference_touched(now, before, known, head)
    finally:
        e.close()


def test_nothing_changed(tmp_path: Path) -> None:
    assert _case(tmp_path, "same", lambda e, sid, ids: None) == (False, False)


def test_a_covered_tool_call_completed(tmp_path: Path) -> None:
    got = _case(tmp_path, "covered", lambda e, sid, ids: _update(e, sid, ids["covered_call"], "412 passed"))
    assert got == (True, True)


def test_a_tool_call_outside_the_watched_part_completed(tmp_path: Path) -> None:
    # a node replaced, none of them watched: compared one by one, nothing changed
    got = _case(tmp_path, "kept", lambda e, sid, ids: _update(e, sid, ids["kept_call"], "done"))
    assert got == (False, False)


def test_a_turn_appended_to_the_head(tmp_path: Path) -> None:
    got = _case(tmp_path, "append", lambda e, sid, ids: _append(
        e, sid, role="user", output="one more thing", predecessor=ids["last"]))
    assert got == (False, False)


def test_a_node_attached_under_a_covered_node(tmp_path: Path) -> None:
    got = _case(tmp_path, "attached", lambda e, sid, ids: _append(
        e, sid, role="code", name="grep", input={"pattern": "x"}, output="", caller=ids["covered_reply"]))
    assert got == (True, True)


def test_the_graph_read_again_from_the_database(tmp_path: Path) -> None:
    # another object with equal nodes (evicted, read again): compared one by one
    got = _case(tmp_path, "evicted", lambda e, sid, ids: e.store.evict(sid))
    assert got == (False, False)

    def evict_then_update(e: EngineCore, sid: str, ids: dict[str, str]) -> None:
        e.store.evict(sid)
        _update(e, sid, ids["covered_call"], "failed", status="error")

    assert _case(tmp_path, "evicted-updated", evict_then_update) == (True, True)
