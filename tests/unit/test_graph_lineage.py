"""What the views derive from a session's graph — token counts, reference lists, the
cached render and aging prefix — holds only for the graph's lineage (``SessionGraph.lineage``):
a graph read anew, after the database file was replaced underneath the daemon (SPEC §2.1),
may have any node changed though it saw no update, and nothing derived from the old one is
taken for it. A copy made of a graph (the compaction's candidate) keeps its lineage."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from dagctx.context import compaction_plan
from dagctx.context.tokens import ESTIMATE, estimate_tokens
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.engine.render_cache import Snapshot, still_valid_prefix
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

FINISHED = "Traceback: src/payments/ledger.py line 40 in post_entry\n" * 60


def _engine(database: str) -> EngineCore:
    e = EngineCore(DaemonConfig(database=database))
    e.initialize(m.InitializeParams())
    return e


def _append(e: EngineCore, sid: str, **node: object) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**node)))).node.id  # type: ignore[arg-type]


def test_nothing_derived_from_the_replaced_files_graph_is_taken(tmp_path: Path) -> None:
    db, copy = tmp_path / "a.db", tmp_path / "b.db"
    e = _engine(str(db))
    sid = e.store.create_session("lineage").session_id
    u = _append(e, sid, role="user", output="why does posting fail?", predecessor=e.store.head(sid))
    a = _append(e, sid, role="llm", name="gpt-4o", output="reading the log", predecessor=u)
    t = _append(e, sid, role="code", name="bash", input={"cmd": "tail app.log"}, output="(running)",
                status="running", caller=a, metadata={"toolCallId": "c1"})
    old = e.store.graph(sid)
    assert e.views.node_tokens(old, ESTIMATE)[t][1] == estimate_tokens("(running)")
    assert not e.views._stored_refs(old).get(t)
    rendered = e.views.render(sid)
    assert "(running)" in str(rendered.messages)

    # the same session in another file, its call finished there, moved over ours
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    other = _engine(str(copy))
    asyncio.run(other.node_update(m.NodeUpdateParams(session_id=sid, node_id=t, status="completed", output=FINISHED)))
    other.close()
    os.replace(copy, db)

    new = e.store.graph(sid)  # the file was replaced: read anew, no update seen
    assert new.lineage is not old.lineage and not new.updates
    assert e.views.node_tokens(new, ESTIMATE)[t][1] == estimate_tokens(FINISHED)
    assert "src/payments/ledger.py" in e.views._stored_refs(new)[t]
    again = e.views.render(sid)
    assert FINISHED.strip() in str(again.messages).replace("\\n", "\n")
    fresh = _engine(str(db))
    truth = fresh.views.render(sid)
    assert again.messages == truth.messages and again.per_message == truth.per_message
    fresh.close()
    e.close()


def test_a_copy_keeps_the_lineage_and_another_read_does_not(tmp_path: Path) -> None:
    e = _engine(str(tmp_path / "c.db"))
    sid = e.store.create_session("copy").session_id
    u = _append(e, sid, role="user", output="hello", predecessor=e.store.head(sid))
    graph = e.store.graph(sid)
    chain = [n.id for n in graph.chain(u)]
    snap = Snapshot.of(graph, chain)
    candidate = compaction_plan.with_candidate(graph, {"role": "llm", "output": "a summary", "metadata": {}})
    assert candidate.lineage is graph.lineage and still_valid_prefix(candidate, snap, chain)
    assert e.store.evict(sid)
    reread = e.store.graph(sid)
    assert reread.lineage is not graph.lineage and not still_valid_prefix(reread, snap, chain)
    e.close()
