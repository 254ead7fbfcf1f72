"""The quick reads (SPEC §1.4) through a real shared daemon: ``session/list`` and
``session/get`` of a SQLite file answered on the event loop when nothing the connection
sent before them is unanswered — the same answers as the pool's, in arrival order, fresh
after any process's write, and what they cannot answer (an unknown session, a window past
their bound) answered by the usual path in its words."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError

from test_storage_isolation import SharedDaemon, shared  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.slow


async def _on_loop(c: DagctxClient) -> int:
    return (await c.daemon_status()).queue.answered_on_loop


async def test_small_reads_are_answered_on_the_loop_with_the_pools_answers(shared: SharedDaemon,
                                                                           tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    a = await shared.connect(db)
    made = [await a.session_create(f"s{i}", i=i) for i in range(3)]
    start = await _on_loop(a)
    listed = await a.session_list(limit=2)
    got = [await a.session_get(s.session_id) for s in made]
    assert await _on_loop(a) == start + 4  # every one of them answered on the loop
    assert listed.total == 3 and [s.title for s in listed.sessions] == ["s2", "s1"]
    assert [g.title for g in got] == ["s0", "s1", "s2"] and [g.metadata for g in got] == [{"i": 0}, {"i": 1}, {"i": 2}]

    # the usual path answers what a quick read leaves to it, in its own words
    with pytest.raises(RpcError) as err:
        await a.session_get("no-such-session")
    assert err.value.kind == "SessionNotFound"
    with pytest.raises(RpcError) as err:
        await a.session_list(limit=-1)
    assert err.value.kind == "InvalidParams"
    many = await a.session_list(limit=500)  # past the quick bound: read in the pool, same rows
    assert many.total == 3 and [s.session_id for s in many.sessions] == [s.session_id for s in
                                                                         (await a.session_list()).sessions]
    assert await _on_loop(a) == start + 5  # only the last, default-window list was quick


async def test_a_quick_read_is_answered_after_the_ordered_requests_sent_before_it(shared: SharedDaemon,
                                                                                 tmp_path: Path) -> None:
    db = str(tmp_path / "order.db")
    a = await shared.connect(db)
    s = await a.session_create("long")
    nodes, prev = [], s.head
    for i in range(400):
        nodes.append({"role": "user" if i % 2 == 0 else "llm", "id": f"n{i}", "output": f"turn {i} " + "word " * 200,
                      "predecessor": prev})
        prev = f"n{i}"
    assert len((await a.append_batch(s.session_id, nodes)).nodes) == 400
    before = (await a.session_get(s.session_id)).node_count
    # through a forwarder, as every client talks: the two requests in one write, the
    # answers read off the wire in the order they come
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "dagctx.cli", "serve", "--db", db, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, limit=1 << 26)
    assert proc.stdin is not None and proc.stdout is not None

    def frame(msg_id: int, method: str, params: dict[str, Any]) -> bytes:
        body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}).encode()
        return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    async def answer() -> dict[str, Any]:
        header = await proc.stdout.readuntil(b"\r\n\r\n")  # type: ignore[union-attr]
        n = int(header.split(b":")[1].split(b"\r\n")[0])
        return json.loads(await proc.stdout.readexactly(n))  # type: ignore[union-attr]

    try:
        proc.stdin.write(frame(1, "initialize", {"processId": None, "capabilities": {},
                                                 "initializationOptions": {"database": db}}))
        assert (await answer())["id"] == 1
        head = "n399"
        for k in range(3):
            first = 10 + 4 * k
            # an ordered read of the whole branch, then a quick read, in one write
            proc.stdin.write(frame(first, "session/history", {"sessionId": s.session_id})
                             + frame(first + 1, "session/list", {}))
            got = [await answer(), await answer()]
            assert [g["id"] for g in got] == [first, first + 1]  # answers in arrival order (SPEC §1.4)
            assert len(got[0]["result"]["nodes"]) == 400 + k and got[1]["result"]["total"] == 1
            # an append, then a quick read that must see it
            proc.stdin.write(frame(first + 2, "node/append", {"sessionId": s.session_id, "node": {
                                 "role": "user", "output": f"more {k}", "predecessor": head}})
                             + frame(first + 3, "session/get", {"sessionId": s.session_id}))
            got = [await answer(), await answer()]
            assert [g["id"] for g in got] == [first + 2, first + 3]
            head = got[0]["result"]["node"]["id"]
            assert got[1]["result"]["head"] == head and got[1]["result"]["nodeCount"] == before + k + 1
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_quick_read_sees_every_commit_of_any_process(shared: SharedDaemon, tmp_path: Path) -> None:
    db = str(tmp_path / "fresh.db")
    a = await shared.connect(db)
    s = await a.session_create("mine")
    assert (await a.session_list()).total == 1 and (await a.session_get(s.session_id)).title == "mine"
    start = await _on_loop(a)
    # this daemon's own write, from another connection
    b = await shared.connect(db)
    await b.session_rename(s.session_id, "renamed by b")
    assert (await a.session_get(s.session_id)).title == "renamed by b"
    # another process's write, behind the daemon's back
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("UPDATE sessions SET title='by hand' WHERE id=?", (s.session_id,))
    raw.close()
    assert (await a.session_get(s.session_id)).title == "by hand"
    assert [x.title for x in (await a.session_list()).sessions] == ["by hand"]
    await b.session_create("second")
    listed = await a.session_list()
    assert listed.total == 2 and {x.title for x in listed.sessions} == {"by hand", "second"}
    assert await _on_loop(a) >= start + 4
