"""The hub's notifications in-process (SPEC §1.5): a node this daemon wrote is announced
once, with its writer's connection as ``origin``, even when the poller looks at the
session between the commit and the announcement; another process's node is found by the
poller with ``origin: null``. The timing is forced here step by step; the shared-daemon
tests (tests/integration/test_shared_daemon.py) run the same over real connections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dagctx.engine.watch import SessionWatch
from dagctx.ledger import Store
from dagctx.ledger import write_marks
from dagctx.protocol.nodes import NodeInput
from dagctx.server.hub import Hub


class Listener:
    """Stands where a connection does: the hub hands it encoded frames."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def write_bytes(self, data: bytes) -> None:
        body = data.split(b"\r\n\r\n", 1)[1]
        self.frames.append(json.loads(body))

    def appends(self) -> list[tuple[str, str | None]]:
        return [(f["params"]["node"]["id"], f["params"]["origin"]) for f in self.frames
                if f["method"] == "node/didAppend"]


#: the database's key the hub knows it by (the engine's ``database_key``)
DB = "hub.db"


@pytest.fixture
def setup(fresh_sqlite: Path):
    store = Store(fresh_sqlite)
    hub = Hub()
    listener = Listener()
    sid = store.create_session("watched").session_id
    hub.subscribe(listener, DB, sid, lambda s: SessionWatch.open(store, s))  # type: ignore[arg-type]
    w = hub.watches[(DB, sid)]
    yield store, hub, listener, sid, w
    hub.pool.shutdown()
    store.close()


def test_a_poll_between_commit_and_announcement_leaves_the_node_to_its_announcement(setup) -> None:
    store, hub, listener, sid, w = setup
    out = store.append(sid, NodeInput(role="user", input="mine", predecessor=store.head(sid)))
    hub._poll(w)  # committed, not yet announced: the poll must not claim it for another process
    assert listener.appends() == []
    hub.changed(DB, sid, "c7", frozenset({out.node.id}))
    assert listener.appends() == [(out.node.id, "c7")]
    hub._poll(w)
    assert listener.appends() == [(out.node.id, "c7")]  # told once


def test_another_processs_write_is_found_by_the_poller_with_origin_null(setup, fresh_sqlite: Path) -> None:
    store, hub, listener, sid, w = setup
    other = Store(fresh_sqlite)  # another daemon on the same file
    try:
        theirs = other.append(sid, NodeInput(role="user", input="theirs", predecessor=other.head(sid))).node
    finally:
        other.close()
    hub._poll(w)
    assert listener.appends() == [(theirs.id, None)]
    # and a write of this daemon after it still carries its origin
    mine = store.append(sid, NodeInput(role="llm", output="mine", predecessor=theirs.id)).node
    hub._poll(w)
    hub.changed(DB, sid, "c1", frozenset({mine.id}))
    assert listener.appends() == [(theirs.id, None), (mine.id, "c1")]


def test_an_announcement_names_other_processes_nodes_it_finds_as_theirs(setup, fresh_sqlite: Path) -> None:
    store, hub, listener, sid, w = setup
    other = Store(fresh_sqlite)
    try:
        theirs = other.append(sid, NodeInput(role="user", input="theirs", predecessor=other.head(sid))).node
    finally:
        other.close()
    mine = store.append(sid, NodeInput(role="llm", output="mine", predecessor=theirs.id)).node
    hub._poll(w)  # mine is not announced yet: the poll leaves both to the announcement
    assert listener.appends() == []
    hub.changed(DB, sid, "c2", frozenset({mine.id}))
    assert listener.appends() == [(theirs.id, None), (mine.id, "c2")]


def test_a_refused_write_holds_no_poll_back(setup) -> None:
    store, hub, listener, sid, w = setup
    with pytest.raises(Exception):
        store.append(sid, NodeInput(role="user", input="x", predecessor="no-such-node"))
    assert store.marks.settled(sid)[0]


def test_a_write_never_announced_stops_holding_polls_back(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    store, hub, listener, sid, w = setup
    out = store.append(sid, NodeInput(role="user", input="unannounced", predecessor=store.head(sid)))
    hub._poll(w)
    assert listener.appends() == []
    monkeypatch.setattr(write_marks, "STALE_SECONDS", 0.0)
    hub._poll(w)
    assert listener.appends() == [(out.node.id, None)]


def test_a_write_beginning_while_a_poll_reads_makes_the_poll_send_nothing(setup, monkeypatch) -> None:
    store, hub, listener, sid, w = setup
    real_graph = store.graph
    written = []

    def graph_while_a_write_commits(session_id: str):  # the write lands between the poll's two looks
        if not written:
            written.append(store.append(sid, NodeInput(role="user", input="raced", predecessor=store.head(sid))).node)
        return real_graph(session_id)

    monkeypatch.setattr(store, "graph", graph_while_a_write_commits)
    hub._poll(w)
    assert listener.appends() == []
    monkeypatch.setattr(store, "graph", real_graph)
    hub.changed(DB, sid, "c3", frozenset({written[0].id}))
    assert listener.appends() == [(written[0].id, "c3")]
