"""Raw bytes at a real daemon: whatever a client sends, the daemon answers and lives.

These tests do not use the Python client: they write frames (and non-frames) to
``python3 -P -m dagctx.cli serve`` themselves and parse every answer themselves. After each
abuse the daemon must answer a normal request, and the database file must be
exactly what it was.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rawdb import RawDb

MAX_FRAME = 16_384
#: a hang guard, never a speed bound: a loaded machine takes seconds to start a daemon
TIMEOUT = 300.0


def frame(body: bytes | str, header: str = "Content-Length: {n}\r\n\r\n") -> bytes:
    if isinstance(body, str):
        body = body.encode()
    return header.format(n=len(body)).encode() + body


def jbody(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, ensure_ascii=False).encode()


class Raw:
    """A daemon subprocess spoken to in bytes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.inbox: list[dict[str, Any]] = []
        self.raw_bodies: list[bytes] = []
        self.stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        self._next_id = 1000

    @classmethod
    async def start(cls, db: Path, *extra: str) -> Raw:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "dagctx.cli", "serve", "--db", str(db), *extra,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr += chunk

    # ---- writing

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def send_msg(self, msg: dict[str, Any], header: str = "Content-Length: {n}\r\n\r\n") -> None:
        await self.send(frame(jbody(msg), header))

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # ---- reading

    async def read_one(self) -> dict[str, Any]:
        """One message from stdout, parsed by hand: headers, blank line, exactly N bytes."""
        assert self.proc.stdout is not None
        header = await asyncio.wait_for(self.proc.stdout.readuntil(b"\r\n\r\n"), TIMEOUT)
        fields = {}
        for line in header[:-4].split(b"\r\n"):
            name, sep, value = line.partition(b":")
            assert sep, f"the daemon wrote a bad header line {line!r}"
            fields[name.strip().lower()] = value.strip()
        n = int(fields[b"content-length"])
        body = await asyncio.wait_for(self.proc.stdout.readexactly(n), TIMEOUT)
        self.raw_bodies.append(body)
        assert b"Traceback" not in body
        msg = json.loads(body)
        assert msg.get("jsonrpc") == "2.0"
        return msg

    async def read_response(self, msg_id: Any = ...) -> dict[str, Any]:
        """The next response (any id if ``msg_id`` is omitted); notifications are kept aside."""
        while True:
            msg = await self.read_one()
            if "method" in msg:
                self.inbox.append(msg)
                continue
            assert "result" in msg or "error" in msg
            if msg_id is ... or msg.get("id") == msg_id:
                return msg
            raise AssertionError(f"expected a response to {msg_id!r}, got {msg}")

    async def call(self, method: str, params: Any = ..., **extra: Any) -> dict[str, Any]:
        msg_id = self.new_id()
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not ...:
            msg["params"] = params
        msg.update(extra)
        await self.send_msg(msg)
        return await self.read_response(msg_id)

    async def ok(self, method: str, params: Any = ...) -> Any:
        resp = await self.call(method, params)
        assert "error" not in resp, resp
        return resp["result"]

    async def initialize(self) -> Any:
        result = await self.ok("initialize", {"processId": None, "capabilities": {}})
        await self.send_msg({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        return result

    async def resync(self) -> None:
        """Discard anything still unread, up to the answer of a fresh marker request."""
        marker = f"resync-{self.new_id()}"
        await self.send_msg({"jsonrpc": "2.0", "id": marker, "method": "session/list", "params": {"limit": 1}})
        while True:
            msg = await self.read_one()
            if msg.get("id") == marker:
                return

    # ---- ending

    async def exit_code(self) -> int:
        code = await asyncio.wait_for(self.proc.wait(), TIMEOUT)
        await asyncio.wait_for(self._stderr_task, TIMEOUT)
        assert b"Traceback" not in self.stderr, self.stderr.decode(errors="replace")
        return code

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._stderr_task.cancel()


def snapshot(db: Path) -> dict[str, Any]:
    with RawDb(db) as con:
        return {
            "sessions": con.execute(
                "SELECT id, title, head, rev, node_count, next_seq, updated_at FROM sessions ORDER BY id"
            ),
            "nodes": con.execute("SELECT session_id, id, seq, rev, status FROM nodes ORDER BY session_id, seq"),
            "search": con.execute("SELECT count(*) FROM search")[0][0],
            "blobs": con.execute("SELECT count(*) FROM blobs")[0][0],
        }


def err(resp: dict[str, Any], code: int, kind: str | None = None, *, null_id: bool = False) -> dict[str, Any]:
    assert "error" in resp and "result" not in resp, resp
    e = resp["error"]
    assert e["code"] == code, resp
    assert isinstance(e["message"], str) and e["message"] and "Traceback" not in e["message"]
    if kind is not None:
        assert e["data"]["kind"] == kind, resp
    if null_id:
        assert resp["id"] is None, resp
    return e


# The abuse tests share one daemon (startup is most of their cost); every test
# resynchronises first, so a failed test cannot leave answers for the next one.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_raw(tmp_path_factory: pytest.TempPathFactory):
    """An initialized raw daemon with a small frame limit and one session with two turns."""
    db_path = tmp_path_factory.mktemp("abuse") / "abuse.db"
    d = await Raw.start(db_path, "--max-frame-bytes", str(MAX_FRAME))
    try:
        await d.initialize()
        s = await d.ok("session/create", {"title": "abuse"})
        u = await d.ok("node/append", {"sessionId": s["sessionId"],
                                        "node": {"role": "user", "input": "hi", "predecessor": s["head"]}})
        await d.ok("node/append", {"sessionId": s["sessionId"],
                                   "node": {"role": "llm", "output": "hello", "predecessor": u["node"]["id"]}})
        d.session = s  # type: ignore[attr-defined]
        d.db = db_path  # type: ignore[attr-defined]
        yield d
        await d.resync()
        await d.send_msg({"jsonrpc": "2.0", "id": 1, "method": "shutdown"})
        assert "error" not in await d.read_response(1)
        await d.send_msg({"jsonrpc": "2.0", "method": "exit"})
        assert await d.exit_code() == 0
    finally:
        await d.kill()


@pytest_asyncio.fixture(loop_scope="module")
async def raw(shared_raw: Raw) -> Raw:
    await shared_raw.resync()
    return shared_raw


async def healthy(d: Raw, before: dict[str, Any]) -> None:
    """The daemon answers a normal request and the file is unchanged."""
    result = await d.ok("session/list", {"limit": 1})
    assert result["total"] == len(before["sessions"])
    got = await d.ok("session/get", {"sessionId": d.session["sessionId"]})  # type: ignore[attr-defined]
    assert got["nodeCount"] == 3
    assert snapshot(d.db) == before  # type: ignore[attr-defined]


# ---------------------------------------------------------------- params and headers


async def test_params_absent_or_null_and_header_spellings(raw: Raw) -> None:
    before = snapshot(raw.db)
    r = await raw.call("session/list")
    assert r["result"]["total"] == 1
    r = await raw.call("session/list", None)
    assert r["result"]["total"] == 1
    r = await raw.call("shutdown_not_yet", None)  # unknown method with null params
    err(r, -32601, "MethodNotFound")

    for header in (
        "content-length: {n}\r\n\r\n",
        "CONTENT-LENGTH: {n}\r\n\r\n",
        "Content-Length:{n}\r\n\r\n",
        "Content-Length: {n}\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n",
        "Content-Type: application/vscode-jsonrpc; charset=utf-8\r\nContent-Length: {n}\r\n\r\n",
    ):
        i = raw.new_id()
        await raw.send_msg({"jsonrpc": "2.0", "id": i, "method": "session/list", "params": {"limit": 1}}, header)
        resp = await raw.read_response(i)
        assert resp["result"]["total"] == 1, header
    # A literal 7-byte body without the space is framed right (and is an invalid request).
    await raw.send(b'Content-Length:7\r\n\r\n{"a":1}')
    err(await raw.read_response(), -32600, "InvalidRequest", null_id=True)
    # Unknown fields are ignored.
    r = await raw.call("session/list", {"limit": 1, "someFutureField": [1, 2]})
    assert r["result"]["total"] == 1
    await healthy(raw, before)


async def test_malformed_headers_and_garbage_then_recovery(raw: Raw) -> None:
    before = snapshot(raw.db)
    cases = [
        b"Content-Length: abc\r\n\r\n",
        b"Content-Length: -4\r\n\r\n",
        b"Content-Type: text/plain\r\n\r\n",
        b"hello, this is not a frame at all\r\n\r\n",
        b"\x00\xff\xfe\xfd binary junk",
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    ]
    for junk in cases:
        await raw.send(junk)
        i = raw.new_id()
        await raw.send_msg({"jsonrpc": "2.0", "id": i, "method": "session/list", "params": {"limit": 1}})
        first = await raw.read_response()
        err(first, -32700, "ParseError", null_id=True)
        while True:  # a junk run may be reported in more than one piece, never by skipping the frame
            resp = await raw.read_response()
            if resp.get("id") == i:
                break
            err(resp, -32700, "ParseError", null_id=True)
        assert resp["result"]["total"] == 1, junk
    await healthy(raw, before)


async def test_frame_larger_than_the_limit(raw: Raw) -> None:
    before = snapshot(raw.db)
    sid = raw.session["sessionId"]  # type: ignore[attr-defined]
    huge = jbody({"jsonrpc": "2.0", "id": 77, "method": "node/append",
                  "params": {"sessionId": sid, "node": {"role": "user", "input": "x" * (MAX_FRAME * 2),
                                                        "predecessor": "ROOT"}}})
    data = frame(huge)
    # Delivered in pieces, as a pipe would.
    for i in range(0, len(data), 5000):
        await raw.send(data[i : i + 5000])
    e = err(await raw.read_response(), -32600, "FrameTooLarge", null_id=True)
    assert str(MAX_FRAME) in e["message"].replace(",", "")
    await healthy(raw, before)  # the oversized append was never executed
    # Just under the limit is served.
    ok = await raw.call("session/list", {"limit": 1, "pad": "p" * (MAX_FRAME - 200)})
    assert ok["result"]["total"] == 1


async def test_json_rpc_level_errors(raw: Raw) -> None:
    before = snapshot(raw.db)
    sid = raw.session["sessionId"]  # type: ignore[attr-defined]

    err(await raw.call("no/such/method", {}), -32601, "MethodNotFound")
    err(await raw.call("node/didAppend", {}), -32601, "MethodNotFound")  # server→client only
    err(await raw.call("sampling/createMessage", {}), -32601, "MethodNotFound")

    cases = [
        ("session/list", {"limit": "ten"}, "params.limit"),
        ("session/get", {"sessionId": 42}, "params.sessionId"),
        ("session/get", {}, "params.sessionId"),
        ("node/append", {"sessionId": sid, "node": {"role": "robot", "predecessor": "ROOT"}}, "params.node.role"),
        ("node/append", {"sessionId": sid, "node": {"input": "no role"}}, "params.node.role"),
        ("node/append", {"sessionId": sid, "node": {"role": "user", "reads": "a"}}, "params.node.reads"),
        ("node/get", {"sessionId": sid, "ids": [1]}, "params.ids[0]"),
        ("node/update", {"sessionId": sid, "nodeId": "x", "status": "running"}, "params.status"),
        ("session/rewind", {"sessionId": sid, "steps": "2"}, "params.steps"),
        ("search/query", {"query": ["a"]}, "params.query"),
    ]
    for method, params, path in cases:
        e = err(await raw.call(method, params), -32602, "InvalidParams")
        assert e["data"]["path"] == path, (method, params, e)
    e = err(await raw.call("session/get", [sid]), -32602, "InvalidParams")  # positional params
    assert e["data"]["path"] == "params"
    err(await raw.call("session/get", "text"), -32602, "InvalidParams")

    # Application-level invalid params keep -32602 with a path too.
    e = err(await raw.call("node/get", {"sessionId": sid, "ids": []}), -32602, "InvalidParams")
    assert e["data"]["path"] == "ids"
    err(await raw.call("session/get", {"sessionId": "nope"}), -32001, "SessionNotFound")

    # Invalid JSON: -32700 with a null id, and the next request is answered.
    for body in (b'{"jsonrpc": "2.0", "id": 5, "method": ', b"{'single': 'quotes'}", b"\xff\xfe{}", b"nul"):
        await raw.send(frame(body))
        err(await raw.read_response(), -32700, "ParseError", null_id=True)
    # A batch (JSON array) is refused as a whole: -32600, nothing executed.
    batch = [
        {"jsonrpc": "2.0", "id": 61, "method": "session/create", "params": {"title": "batched"}},
        {"jsonrpc": "2.0", "id": 62, "method": "session/list"},
    ]
    await raw.send(frame(jbody(batch)))  # type: ignore[arg-type]
    err(await raw.read_response(), -32600, "InvalidRequest", null_id=True)
    await raw.send(frame(b"[]"))
    err(await raw.read_response(), -32600, "InvalidRequest", null_id=True)
    for body in (b"42", b'"str"', b"null"):
        await raw.send(frame(body))
        err(await raw.read_response(), -32600, "InvalidRequest", null_id=True)

    # Envelope problems.
    err(await raw.call("session/list", {}, jsonrpc="1.0"), -32600, "InvalidRequest")
    await raw.send_msg({"id": 71, "method": "session/list"})  # no jsonrpc member
    err(await raw.read_response(71), -32600, "InvalidRequest")
    await raw.send_msg({"jsonrpc": "2.0", "id": {"an": "object"}, "method": "session/list"})
    err(await raw.read_response(), -32600, "InvalidRequest", null_id=True)
    await raw.send_msg({"jsonrpc": "2.0", "id": 72, "method": 7})
    err(await raw.read_response(72), -32600, "InvalidRequest")
    await raw.send_msg({"jsonrpc": "2.0", "id": 73})
    err(await raw.read_response(73), -32600, "InvalidRequest")
    # A second initialize on the same connection is refused.
    err(await raw.call("initialize", {"capabilities": {}}), -32600, "InvalidRequest")
    # String ids are echoed back as strings.
    await raw.send_msg({"jsonrpc": "2.0", "id": "abc", "method": "session/list", "params": {"limit": 1}})
    assert (await raw.read_response("abc"))["result"]["total"] == 1
    # Notifications never get an answer, known or not, well-formed or not.
    await raw.send_msg({"jsonrpc": "2.0", "method": "no/such/notification", "params": {}})
    await raw.send_msg({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 999999}})
    await raw.send_msg({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": "bad"})
    await raw.send_msg({"jsonrpc": "2.0", "method": "$/setTrace", "params": {"value": "off"}})
    # A response to a request the daemon never made is ignored.
    await raw.send_msg({"jsonrpc": "2.0", "id": "dagctx-999", "result": {}})
    await healthy(raw, before)
    assert [m for m in raw.inbox if m.get("method") not in ("window/logMessage",)] == []


async def test_bad_requests_write_nothing(raw: Raw) -> None:
    before = snapshot(raw.db)
    sid = raw.session["sessionId"]  # type: ignore[attr-defined]
    got = await raw.ok("session/history", {"sessionId": sid})
    head = got["head"]
    first = got["nodes"][0]["id"]
    bad = [
        ({"sessionId": sid, "node": {"role": "user", "input": "no predecessor"}}, "PredecessorMissing", -32001),
        ({"sessionId": sid, "node": {"role": "user", "id": first, "predecessor": head}}, "DuplicateNode", -32001),
        ({"sessionId": sid, "node": {"role": "user", "predecessor": "ghost"}}, "NodeNotFound", -32001),
        ({"sessionId": sid, "node": {"role": "llm", "predecessor": head, "reads": ["ghost"]}}, "NodeNotFound", -32001),
        ({"sessionId": sid, "node": {"role": "code", "caller": head, "predecessor": head}}, "InvalidEdge", -32001),
        ({"sessionId": sid, "node": {"role": "code", "caller": head}, "moveHead": True}, "InvalidEdge", -32001),
        ({"sessionId": sid, "node": {"role": "user", "predecessor": head,
                                     "metadata": {"spawn_branch_root": True}}}, "InvalidEdge", -32001),
        ({"sessionId": sid, "node": {"role": "user", "id": "", "predecessor": head}}, "InvalidParams", -32602),
        ({"sessionId": "ghost-session", "node": {"role": "user", "predecessor": "ROOT"}}, "SessionNotFound", -32001),
    ]
    for params, kind, code in bad:
        err(await raw.call("node/append", params), code, kind)
        assert snapshot(raw.db) == before, (params, kind)
    err(await raw.call("node/update", {"sessionId": sid, "nodeId": head, "status": "error"}), -32001, "NotRunning")
    err(await raw.call("session/checkout", {"sessionId": sid, "nodeId": "ghost"}), -32001, "NodeNotFound")
    err(await raw.call("session/rename", {"sessionId": sid, "title": "  "}), -32602, "InvalidParams")
    err(await raw.call("session/spawn", {"sessionId": sid, "callerId": "ghost"}), -32001, "NodeNotFound")
    await healthy(raw, before)


async def test_invalid_search_syntax(raw: Raw) -> None:
    before = snapshot(raw.db)
    for q in ("foo AND (", "AND", "foo NOT", ")", "a AND AND b", "NEAR("):
        e = err(await raw.call("search/query", {"query": q}), -32602, "InvalidQuery")
        assert e["data"]["path"] == "query"
    err(await raw.call("search/query", {"query": "   "}), -32602, "InvalidQuery")
    assert (await raw.ok("search/query", {"query": "hello"}))["hits"]
    await healthy(raw, before)


async def test_requests_pipelined_in_one_write_are_answered_in_order(raw: Raw) -> None:
    before = snapshot(raw.db)
    ids = list(range(5000, 5050))
    data = b"".join(
        frame(jbody({"jsonrpc": "2.0", "id": i, "method": "session/list", "params": {"limit": 1}})) for i in ids
    )
    await raw.send(data)
    got = [(await raw.read_response())["id"] for _ in ids]
    assert got == ids
    await healthy(raw, before)


# ---------------------------------------------------------------- lifecycle


async def test_requests_before_initialize(db_path: Path) -> None:
    d = await Raw.start(db_path)
    try:
        err(await d.call("session/list", {}), -32002, "ServerNotInitialized")
        err(await d.call("session/create", {"title": "early"}), -32002, "ServerNotInitialized")
        err(await d.call("shutdown"), -32002, "ServerNotInitialized")
        init = await d.initialize()
        assert "session/list" in init["methods"] and init["protocolVersion"]
        assert (await d.ok("session/list"))["total"] == 0  # the early create wrote nothing
        assert await d.ok("shutdown") is None
        e = err(await d.call("session/list", {}), -32600, "ShutdownInProgress")
        assert "exit" in e["message"]
        err(await d.call("session/create", {}), -32600, "ShutdownInProgress")
        await d.send_msg({"jsonrpc": "2.0", "method": "exit"})
        assert await d.exit_code() == 0
    finally:
        await d.kill()


async def test_exit_without_shutdown_is_code_1(db_path: Path) -> None:
    d = await Raw.start(db_path)
    try:
        await d.initialize()
        await d.ok("session/create", {})
        await d.send_msg({"jsonrpc": "2.0", "method": "exit"})
        assert await d.exit_code() == 1
    finally:
        await d.kill()
    assert len(snapshot(db_path)["sessions"]) == 1


async def test_eof_on_stdin_is_a_clean_exit(db_path: Path) -> None:
    d = await Raw.start(db_path)
    try:
        await d.initialize()
        await d.ok("session/create", {"title": "kept"})
        # Half a frame, then the client goes away.
        await d.send(b"Content-Length: 100\r\n\r\n{\"jsonrpc\"")
        assert d.proc.stdin is not None
        d.proc.stdin.close()
        assert await d.exit_code() == 0
    finally:
        await d.kill()
    assert [row[1] for row in snapshot(db_path)["sessions"]] == ["kept"]


async def test_eof_before_initialize(tmp_path: Path) -> None:
    d = await Raw.start(tmp_path / "never.db")
    try:
        assert d.proc.stdin is not None
        d.proc.stdin.close()
        assert await d.exit_code() == 0
    finally:
        await d.kill()


async def test_unopenable_database_is_an_error_not_a_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    d = await Raw.start(tmp_path / "ok.db")
    try:
        e = err(await d.call("initialize", {"capabilities": {},
                                            "initializationOptions": {"database": str(blocker / "x.db")}}),
                -32602, "InvalidParams")
        assert e["data"]["path"] == "initializationOptions.database"
        # Not initialized: the client may try again with a good path.
        err(await d.call("session/list", {}), -32002, "ServerNotInitialized")
        await d.initialize()
        assert (await d.ok("session/list"))["total"] == 0
        await d.send_msg({"jsonrpc": "2.0", "id": 1, "method": "shutdown"})
        await d.read_response(1)
        await d.send_msg({"jsonrpc": "2.0", "method": "exit"})
        assert await d.exit_code() == 0
    finally:
        await d.kill()
