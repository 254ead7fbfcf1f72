"""A tool result's ranked references are mined once, when it is written (SPEC §8).

The citation gate of aging reads them from the node's row instead of mining every old
result at every plan, so a session of huge results costs a render with aging about what
one without does (``bench/bench_aging_huge.py``). Checked here through a real daemon on
both backends: what is stored at ``node/append``, ``node/update`` and import (spilled
outputs: what the node keeps), and that the gate reads the stored list. A database of
schema version 1 (no such column): ``test_schema_migration.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from dagctx.client import DagctxClient
from dagctx.context.aging import stored_references

from rawdb import RawDb

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database);
    the fresh daemon and the other process that two tests need run standalone."""

MODEL = "gpt-4"
AGING = {"minAgeSeconds": 0, "keepRecentTurns": 2, "minTokens": 200, "hardClearAfterTurns": 4}


def result(i: int) -> str:
    return f"# src/pkg/mod_{i}.py\n" + "\n".join(
        f"def handler_{i}_{k}(): return load_settings_{i}(key={k})" for k in range(60)
    )


def stored(db: str, sid: str, node_id: str) -> list[str] | None:
    with RawDb(db) as raw:
        rows = raw.execute("SELECT refs FROM nodes WHERE session_id=? AND id=?", (sid, node_id))
    blob = rows[0][0]
    return None if blob is None else msgspec.msgpack.decode(bytes(blob))


async def build(c: DagctxClient, turns: int, cite: int | None, *, sid: str | None = None,
                start: int = 0) -> tuple[str, list[str]]:
    """``turns`` user turns (numbered from ``start``, in a new session or after ``sid``'s
    HEAD), each reading one module; the last turn's user message names the module read in
    turn ``cite`` (so that result is cited, the others age)."""
    if sid is None:
        s = await c.session_create("refs")
        sid, head = s.session_id, s.head
    else:
        head = (await c.session_get(sid)).head
    tools = []
    for i in range(start, start + turns):
        last = i == start + turns - 1
        ask = f"now fix src/pkg/mod_{cite}.py please" if last and cite is not None else f"turn {i}: next one"
        u = await c.append(sid, "user", output=ask, predecessor=head)
        llm = await c.append(sid, "llm", name=MODEL, output="Reading.", predecessor=u.node.id)
        t = await c.append(sid, "code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"},
                           output=result(i), caller=llm.node.id, metadata={"toolCallId": f"call_{i}"})
        tools.append(t.node.id)
        head = llm.node.id
    return sid, tools


async def test_references_are_stored_at_append_update_and_import(database: str, tmp_path: Path) -> None:
    c = await DagctxClient.spawn(database)
    try:
        s = await c.session_create("write paths")
        u = await c.append(s.session_id, "user", output="read src/app.py", predecessor=s.head)
        assert stored(database, s.session_id, u.node.id) is None, "only tool results carry references"
        llm = await c.append(s.session_id, "llm", name=MODEL, output="ok", predecessor=u.node.id)
        done = await c.append(s.session_id, "code", name="read_file", output=result(1), caller=llm.node.id)
        refs = stored(database, s.session_id, done.node.id)
        assert refs == stored_references(result(1)) and "src/pkg/mod_1.py" in refs
        many = " ".join(f"src/m/f_{k}.py" for k in range(300))
        wide = await c.append(s.session_id, "code", name="ls", output=many, caller=llm.node.id)
        assert len(stored(database, s.session_id, wide.node.id) or []) == 256, "cut at STORED_REFERENCES"
        # a running call has no output yet; its result is mined when node/update fills it
        running = await c.append(s.session_id, "code", name="bash", caller=llm.node.id, status="running")
        assert stored(database, s.session_id, running.node.id) is None
        await c.update(s.session_id, running.node.id, "completed", output="wrote build/out_0042.log")
        assert stored(database, s.session_id, running.node.id) == stored_references("wrote build/out_0042.log")
        assert "build/out_0042.log" in stored_references("wrote build/out_0042.log")
        # a spilled output: what the node keeps (head + tail) is what aging reads and mines
        middle = "only_in_the_middle_of_it"
        big = "\n".join([f"head_line_{k} src/a_{k}.py" for k in range(400)] + [middle * 3]
                        + [f"tail_line_{k} src/z_{k}.py" for k in range(2000)])
        spilled = await c.append(s.session_id, "code", name="dump", output=big, caller=llm.node.id)
        kept = (await c.get_nodes(s.session_id, [spilled.node.id])).nodes[0].output
        assert kept != big and middle not in kept
        assert stored(database, s.session_id, spilled.node.id) == stored_references(kept)
        # an import writes them too (one transaction with the nodes)
        def line(uuid: str, parent: str | None, typ: str, content: object) -> str:
            msg: dict = {"role": typ, "content": content}
            if typ == "assistant":
                msg.update({"id": f"msg-{uuid}", "model": "claude-sonnet-4-5", "type": "message"})
            return json.dumps({"parentUuid": parent, "isSidechain": False, "sessionId": "s1", "type": typ,
                               "uuid": uuid, "timestamp": "2026-03-01T10:00:00.000Z", "message": msg}) + "\n"

        observed = "def read_all(): ...  # src/lib/io_utils.py parse_header"
        (tmp_path / "cc.jsonl").write_text(
            line("u1", None, "user", "read it")
            + line("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Read",
                                              "input": {"file_path": "src/lib/io_utils.py"}}])
            + line("u2", "a1", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": observed}])
            + line("a2", "u2", "assistant", [{"type": "text", "text": "done"}]))
        imported = (await c.import_path(str(tmp_path / "cc.jsonl"))).sessions[0].session_id
        chain = [n.id for n in (await c.history(imported)).nodes]
        got = await c.get_nodes(imported, chain, include_callees=True)
        codes = [n for n in got.callees if n.role == "code"]
        assert codes and all(stored(database, imported, n.id) == stored_references(n.output) for n in codes)
        assert "src/lib/io_utils.py" in stored(database, imported, codes[0].id)
    finally:
        await c.close()


async def test_the_citation_gate_reads_the_stored_list(database: str) -> None:
    c = await DagctxClient.spawn(database, initialization_options={"aging": AGING})
    try:
        sid, tools = await build(c, 7, cite=1)
        r = await c.render(sid, model=MODEL)
        assert tools[1] not in r.manifest["agingKinds"], "cited by the newest user message"
        assert tools[0] in r.manifest["agingKinds"] and tools[2] in r.manifest["agingKinds"]
    finally:
        await c.close()
    # Empty the cited result's stored list behind the daemon's back: a fresh daemon, which
    # does not mine what is stored, now finds nothing of it cited and ages it.
    with RawDb(database) as raw:
        raw.execute("UPDATE nodes SET refs=? WHERE session_id=? AND id=?",
                    (msgspec.msgpack.encode([]), sid, tools[1]))
    c = await DagctxClient.spawn(database, initialization_options={"aging": AGING}, standalone=True)
    try:
        r = await c.render(sid, model=MODEL)
        assert tools[1] in r.manifest["agingKinds"]
    finally:
        await c.close()


async def test_a_running_daemon_reads_the_lists_of_nodes_written_after_it_loaded(database: str) -> None:
    """Nodes appended after the first plan (by this daemon or another process) are read
    from the ledger too, not mined: the second plan honours a list changed on disk."""
    c = await DagctxClient.spawn(database, initialization_options={"aging": AGING})
    other = await DagctxClient.spawn(database, standalone=True)
    try:
        plans = {}
        for name in ("tampered", "control"):
            sid, _ = await build(c, 2, None)
            await c.render(sid, model=MODEL)  # this daemon has read the session's lists now
            _, later = await build(other, 5, cite=2, sid=sid, start=2)  # written by another process
            plans[name] = (sid, later[0])
        sid, read_later = plans["tampered"]
        with RawDb(database) as raw:
            raw.execute("UPDATE nodes SET refs=? WHERE session_id=? AND id=?",
                        (msgspec.msgpack.encode([]), sid, read_later))
        for name, (sid, read_later) in plans.items():
            kinds = (await c.render(sid, model=MODEL)).manifest["agingKinds"]
            assert (read_later in kinds) == (name == "tampered"), (name, kinds)
    finally:
        await other.close()
        await c.close()
