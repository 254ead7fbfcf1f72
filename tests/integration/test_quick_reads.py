"""The quick reads (SPEC §1.4) through a real shared daemon: ``session/list`` and
``session/get`` of a SQLite file answered on the event loop when nothing the connection
sent before them is unanswered — the same answers as the pool's, in arrival order, fresh
after any process's write, and what they cannot answer (an unknown session, a window past
their bound) answered by the usual path in its words."""

from __future__ import annotations

import asyncio
import json
import os
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
    settled = await _on_loop(a)  # (a server-handled request waits for the ones before it)
    assert settled == start + 4  # neither the errors nor the long window were answered quick
    default = await a.session_list()
    assert many.total == 3 and [s.session_id for s in many.sessions] == [s.session_id for s in default.sessions]
    assert await _on_loop(a) == settled + 1  # the default window was


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


class Wire:
    """A client speaking raw frames to ``dagctx serve`` (a forwarder that hands its stdio to
    the shared daemon) or to ``serve --standalone``: what arrives is read in wire order."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, db: str, *, standalone: bool) -> Wire:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "dagctx.cli", "serve", "--db", db, *(["--standalone"] if standalone else []),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 26)
        return cls(proc)

    @staticmethod
    def frame(msg_id: Any, method: str, params: Any = None, *, body: bytes | None = None) -> bytes:
        if body is None:
            msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params if params is not None else {}}
            if msg_id is not None:
                msg["id"] = msg_id
            body = json.dumps(msg).encode()
        return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    def send(self, *frames: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(frames))

    async def answer(self) -> dict[str, Any]:
        out = self.proc.stdout
        assert out is not None
        while True:
            header = await asyncio.wait_for(out.readuntil(b"\r\n\r\n"), 60)
            n = int(header.split(b":")[1].split(b"\r\n")[0])
            msg = json.loads(await out.readexactly(n))
            if "id" in msg:  # notifications (none are asked for here) are skipped
                return msg

    async def call(self, msg_id: int, method: str, params: Any = None) -> Any:
        self.send(self.frame(msg_id, method, params))
        got = await self.answer()
        assert got["id"] == msg_id and "result" in got, got
        return got["result"]

    async def close(self) -> int:
        self.send(self.frame(900, "shutdown"), self.frame(None, "exit"))
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), 30)


@pytest.mark.parametrize("standalone", [False, True], ids=["serve", "standalone"])
async def test_a_mixed_run_in_one_write_is_answered_in_arrival_order(shared: SharedDaemon, tmp_path: Path,
                                                                      standalone: bool) -> None:
    db = str(tmp_path / "mixed.db")
    w = await Wire.start(db, standalone=standalone)
    await w.call(1, "initialize", {"processId": None, "capabilities": {}, "initializationOptions": {"database": db}})
    s = await w.call(2, "session/create", {"title": "mixed"})
    sid = s["sessionId"]
    n1 = (await w.call(3, "node/append", {"sessionId": sid, "node": {"role": "user", "output": "one",
                                                                      "predecessor": s["head"]}}))["node"]["id"]
    f = Wire.frame
    # quick reads first (the daemon's reader answers them), then everything else, in one write
    w.send(f(10, "session/list", {}), f(11, "session/get", {"sessionId": sid}),
           f(None, "", body=b"{not json"),
           f(12, "node/append", {"sessionId": sid, "node": {"role": "llm", "output": "two", "predecessor": n1}}),
           f(13, "session/get", {"sessionId": sid}),
           f(None, "$/cancelRequest", {"id": 999}),
           f(14, "session/history", {"sessionId": sid}),
           f(15, "session/list", {}),
           f(17, "session/get", {"sessionId": "no-such-session"}),
           f(18, "session/get", {"sessionId": sid}))
    got = [await w.answer() for _ in range(9)]
    assert [g["id"] for g in got] == [10, 11, None, 12, 13, 14, 15, 17, 18]
    assert got[0]["result"]["total"] == 1 and got[1]["result"]["nodeCount"] == 2  # the root and "one"
    assert got[2]["error"]["data"]["kind"] == "ParseError"
    n2 = got[3]["result"]["node"]["id"]
    assert got[4]["result"]["head"] == n2 and got[4]["result"]["nodeCount"] == 3  # sees the append before it
    assert [n["id"] for n in got[5]["result"]["nodes"]] == [n1, n2]
    assert got[6]["result"]["total"] == 1
    assert got[7]["error"]["data"]["kind"] == "SessionNotFound"
    assert got[8]["result"]["head"] == n2
    # a big body (decoded in the pool, the frames behind it held) between quick reads
    big = "x" * (3 << 20)
    w.send(f(30, "session/get", {"sessionId": sid}),
           f(31, "node/append", {"sessionId": sid, "node": {"role": "user", "output": big, "predecessor": n2}}),
           f(32, "session/get", {"sessionId": sid}), f(33, "session/list", {}))
    got = [await w.answer() for _ in range(4)]
    assert [g["id"] for g in got] == [30, 31, 32, 33]
    n3 = got[1]["result"]["node"]["id"]
    assert got[0]["result"]["nodeCount"] == 3 and got[2]["result"]["nodeCount"] == 4
    assert got[2]["result"]["head"] == n3 and got[3]["result"]["total"] == 1
    # a pipelining client: every answer in order
    w.send(*(f(100 + i, "session/get" if i % 2 else "session/list", {"sessionId": sid} if i % 2 else {})
             for i in range(200)))
    got = [await w.answer() for _ in range(200)]
    assert [g["id"] for g in got] == list(range(100, 300))
    assert all("result" in g for g in got)
    if not standalone:
        await w.call(500, "daemon/stop")  # the shared daemon its forwarder started
    await w.close()


def _readers(pid: int) -> int:
    """The daemon's connection readers: threads the OS knows as ``dagctx-in-…``
    (``pipe_reader.name_os_thread``). Counting every thread was flaky: a pool worker or the
    tokenizers' warm-up may start or end meanwhile."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                n += fh.read().startswith("dagctx-in-")
        except OSError:
            pass  # the thread ended meanwhile
    return n


async def test_a_connections_reader_thread_ends_with_it(shared: SharedDaemon, tmp_path: Path) -> None:
    db = str(tmp_path / "threads.db")
    first = await Wire.start(db, standalone=False)  # the shared daemon its forwarder reaches
    await first.call(1, "initialize", {"processId": None, "capabilities": {}, "initializationOptions": {"database": db}})
    await first.call(2, "session/create", {"title": "s"})
    pid = (await first.call(3, "daemon/status"))["pid"]
    before = _readers(pid)
    assert before >= 1  # the first connection's
    for _ in range(3):
        wires = [await Wire.start(db, standalone=False) for _ in range(4)]
        for w in wires:
            await w.call(1, "initialize", {"processId": None, "capabilities": {},
                                           "initializationOptions": {"database": db}})
            assert (await w.call(2, "session/list", {}))["total"] == 1
        assert _readers(pid) == before + 4  # a reader each
        for w in wires:
            assert await w.close() == 0
    for _ in range(200):
        if _readers(pid) <= before:
            break
        await asyncio.sleep(0.05)
    assert _readers(pid) == before
    assert (await first.call(4, "session/list", {}))["total"] == 1
    await first.call(5, "daemon/stop")
    await first.close()


async def test_repeated_quick_reads_echo_each_id_with_the_same_result_until_a_commit(shared: SharedDaemon,
                                                                                     tmp_path: Path) -> None:
    """A quick read answered again with nothing committed reuses its result's encoding
    (SPEC §1.4): every answer still carries its own id, whatever its type, and a commit in
    between shows at once."""
    db = str(tmp_path / "again.db")
    a = await shared.connect(db)
    s = await a.session_create("first")
    w = await Wire.start(db, standalone=False)
    await w.call(1, "initialize", {"processId": None, "capabilities": {}, "initializationOptions": {"database": db}})
    ids: list[Any] = [2, "two", 'q"u\\ote ✓', 3, -4, "", 5]
    for title in ("first", "second", "third"):
        for msg_id in ids:  # one at a time, and then all in one write
            w.send(w.frame(msg_id, "session/get", {"sessionId": s.session_id}))
            got = await w.answer()
            assert got["id"] == msg_id and got["result"]["title"] == title
        w.send(*(w.frame(i, "session/list", {"limit": 5}) for i in ids))
        got_all = [await w.answer() for _ in ids]
        assert [g["id"] for g in got_all] == ids
        assert all(g["result"]["sessions"][0]["title"] == title for g in got_all)
        await a.session_rename(s.session_id, {"first": "second", "second": "third", "third": "x"}[title])
    assert await w.close() == 0


async def test_a_polled_read_sees_every_commit_and_a_replaced_file_at_once(shared: SharedDaemon, tmp_path: Path) -> None:
    """The same ``session/list`` body sent again and again (a client polling, answered from
    what the reader thread kept, SPEC §1.4): each answer is what the file holds when the
    request is read — after another connection's write, another process's commit, and the file
    replaced by a rename — and carries its own id."""
    db, other = tmp_path / "poll.db", tmp_path / "other.db"
    a = await shared.connect(str(db))
    await a.session_create("first")
    w = await Wire.start(str(db), standalone=False)
    await w.call(1, "initialize", {"processId": None, "capabilities": {}, "initializationOptions": {"database": str(db)}})
    n = iter(range(100, 10_000))

    async def titles() -> list[str]:
        msg_id = next(n)
        w.send(w.frame(msg_id, "session/list", {"limit": 10}))
        got = await w.answer()
        assert got["id"] == msg_id
        return sorted(s["title"] for s in got["result"]["sessions"])

    start = (await w.call(2, "daemon/status"))["queue"]["answeredOnLoop"]
    for _ in range(5):
        assert await titles() == ["first"]
    await a.session_create("second")  # a write from another connection
    assert await titles() == ["first", "second"]
    raw = sqlite3.connect(db, isolation_level=None)  # another process's commit
    raw.execute("UPDATE sessions SET title='by hand' WHERE title='first'")
    raw.close()
    assert await titles() == ["by hand", "second"]
    assert await titles() == ["by hand", "second"]
    o = sqlite3.connect(other)  # another file, renamed over the one in use
    src = sqlite3.connect(db)
    src.backup(o)
    src.close()
    o.execute("UPDATE sessions SET title='replaced'")
    o.commit()
    o.close()
    os.replace(other, db)
    assert await titles() == ["replaced", "replaced"]
    assert await titles() == ["replaced", "replaced"]
    assert (await w.call(3, "daemon/status"))["queue"]["answeredOnLoop"] >= start + 8  # the polls were quick reads
    assert await w.close() == 0
