"""A subscriber's cursor (``engine/watch.py``'s ``SessionWatch``) over a graph the store
read anew (SPEC §1.5): the graph's ``updates`` begin empty in a new lineage, so the cursor
asks the running nodes it told of instead of counting; a graph whose content may differ in
any node (its revisions went back: the file's content put back in place) is announced as
``replaced`` and the cursor starts over from it."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput


def _engine(database: str) -> EngineCore:
    e = EngineCore(DaemonConfig(database=database))
    e.initialize(m.InitializeParams())
    return e


def _append(e: EngineCore, sid: str, **node: object) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**node)))).node.id  # type: ignore[arg-type]


def _finish(e: EngineCore, sid: str, nid: str, output: str) -> None:
    asyncio.run(e.node_update(m.NodeUpdateParams(session_id=sid, node_id=nid, status="completed", output=output)))


def _turn_with_tools(e: EngineCore, sid: str, n: int) -> tuple[str, list[str]]:
    u = _append(e, sid, role="user", input="run the checks", predecessor=e.store.head(sid))
    turn = _append(e, sid, role="llm", output="running them", predecessor=u)
    return turn, [_append(e, sid, role="code", name=f"check{i}", input={}, status="running", caller=turn)
                  for i in range(n)]


def _said(changes: list[tuple[str, object]]) -> list[tuple[str, str]]:
    out = []
    for method, p in changes:
        if method == "session/didChange":
            out.append((method, p.change))  # type: ignore[attr-defined]
        else:
            out.append((method, p.node.id))  # type: ignore[attr-defined]
    return out


def test_finishes_after_the_graph_was_read_anew_are_each_announced_once(tmp_path: Path) -> None:
    e = _engine(str(tmp_path / "a.db"))
    sid = e.store.create_session("watched").session_id
    turn, tools = _turn_with_tools(e, sid, 4)
    w = e.watch(sid)
    _finish(e, sid, tools[0], "one")
    _finish(e, sid, tools[1], "two")
    assert _said(w.changes(None)) == [("node/didUpdate", tools[0]), ("node/didUpdate", tools[1])]
    before = e.store.graph(sid)
    assert e.store.evict(sid)  # the next read builds the graph again from the database
    late = _append(e, sid, role="code", name="late", input={}, status="running", caller=turn)
    _finish(e, sid, tools[3], "four")
    assert e.store.graph(sid).lineage is not before.lineage and len(e.store.graph(sid).updates) < 2
    # the graph read anew counted no update the cursor had not seen: the nodes are asked
    assert _said(w.changes(None)) == [("node/didAppend", late), ("node/didUpdate", tools[3])]
    assert w.changes(None) == []
    # on the new lineage, counting works again; the node appended running is known to run
    _finish(e, sid, tools[2], "three")
    _finish(e, sid, late, "late")
    assert _said(w.changes(None)) == [("node/didUpdate", tools[2]), ("node/didUpdate", late)]
    e.store.evict(sid)
    assert w.changes(None) == []  # nothing finished since: nothing to tell
    e.close()


def test_a_graph_whose_revisions_went_back_is_announced_replaced(tmp_path: Path) -> None:
    db, saved = tmp_path / "a.db", tmp_path / "saved.db"
    e = _engine(str(db))
    sid = e.store.create_session("watched").session_id
    turn, tools = _turn_with_tools(e, sid, 2)
    with sqlite3.connect(db) as a, sqlite3.connect(saved) as b:
        a.backup(b)  # the file as it is now
    a.close()
    b.close()
    w = e.watch(sid)
    _finish(e, sid, tools[0], "one")
    after = _append(e, sid, role="user", input="and then?", predecessor=turn)
    assert [meth for meth, _ in w.changes(None)] == ["node/didAppend", "node/didUpdate", "session/didChange"]
    # the saved content is put back into the same file (the daemon keeps it open)
    with sqlite3.connect(saved) as a, sqlite3.connect(db) as b:
        a.backup(b)
    a.close()
    b.close()
    got = w.changes(None)
    assert _said(got) == [("session/didChange", "replaced")]
    change = got[0][1]
    assert change.head == turn and change.origin is None  # type: ignore[attr-defined]
    assert after not in e.store.graph(sid).nodes
    # the cursor starts over from the content put back: its running nodes are known
    _finish(e, sid, tools[0], "one again")
    assert _said(w.changes(None)) == [("node/didUpdate", tools[0])]
    e.close()
