"""Issue 13's findings, each over a real daemon subprocess: every request answered, the
daemon alive afterwards, nothing written by a refused request, no read outside what
was asked (SPEC §1, §2, §3, §7, §8).

Raw-frame tests reuse ``Raw`` from ``test_protocol_abuse``; the rest use the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError
from test_protocol_abuse import Raw, err, frame, jbody, snapshot
from test_sampling_endpoint import long_session

pytestmark = pytest.mark.asyncio


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def nested_json(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


async def raw_daemon(tmp_path: Path, *extra: str) -> tuple[Raw, dict[str, Any]]:
    d = await Raw.start(tmp_path / "h.db", *extra)
    await d.initialize()
    s = await d.ok("session/create", {"title": "h"})
    u = await d.ok("node/append", {"sessionId": s["sessionId"],
                                    "node": {"role": "user", "input": "hi", "predecessor": s["head"]}})
    await d.ok("node/append", {"sessionId": s["sessionId"],
                               "node": {"role": "llm", "output": "hello", "predecessor": u["node"]["id"]}})
    d.db = tmp_path / "h.db"  # type: ignore[attr-defined]
    return d, s


async def stop(d: Raw) -> None:
    await d.resync()
    await d.send_msg({"jsonrpc": "2.0", "id": "bye", "method": "shutdown"})
    assert "error" not in await d.read_response("bye")
    await d.send_msg({"jsonrpc": "2.0", "method": "exit"})
    assert await d.exit_code() == 0


# ---------------------------------------------------------------- 1. deep nesting


async def test_deep_nesting_is_refused_at_the_door_and_the_next_frame_is_answered(tmp_path: Path) -> None:
    d, s = await raw_daemon(tmp_path)
    try:
        before = snapshot(d.db)  # type: ignore[attr-defined]
        sid = s["sessionId"]
        # deep params and a valid frame in the same write
        deep = '{"jsonrpc": "2.0", "id": 11, "method": "node/append", "params": {"sessionId": "%s", ' \
               '"node": {"role": "user", "predecessor": "ROOT", "input": %s}}}' % (sid, nested_json(2000))
        ok = jbody({"jsonrpc": "2.0", "id": 12, "method": "session/list", "params": {"limit": 1}})
        await d.send(frame(deep) + frame(ok))
        e = err(await d.read_response(11), -32602, "InvalidParams")
        assert "100 levels" in e["message"] and e["data"]["path"] == "params"
        assert (await d.read_response(12))["result"]["total"] == 1
        # an id nested deep cannot be echoed: InvalidRequest with a null id, and the next frame lives
        await d.send(frame('{"jsonrpc": "2.0", "id": %s, "method": "session/list"}' % nested_json(3000)) + frame(ok))
        err(await d.read_response(), -32600, "InvalidRequest", null_id=True)
        assert (await d.read_response(12))["result"]["total"] == 1
        # the id after deep params is found too
        await d.send(frame('{"jsonrpc": "2.0", "method": "session/list", "params": %s, "id": "late"}'
                           % nested_json(5000)))
        err(await d.read_response("late"), -32602, "InvalidParams")
        # just past the limit (101 levels in all) is refused; node output too
        for field in ("input", "output"):
            msg = {"jsonrpc": "2.0", "id": 13, "method": "node/append",
                   "params": {"sessionId": sid, "node": {"role": "user", "predecessor": "ROOT", field: nested(98)}}}
            await d.send_msg(msg)
            err(await d.read_response(13), -32602, "InvalidParams")
        assert snapshot(d.db) == before  # type: ignore[attr-defined]
        # at the limit it is accepted, counted, rendered and exported (no RecursionError)
        hist = await d.ok("session/history", {"sessionId": sid})
        r = await d.ok("node/append", {"sessionId": sid, "node": {"role": "user", "predecessor": hist["head"],
                                                                 "input": nested(96), "output": nested(96)}})
        assert r["node"]["input"] == nested(96)
        await d.ok("context/render", {"sessionId": sid, "format": "openai"})
        out = await d.ok("session/export", {"sessionId": sid, "format": "openai"})
        assert out["lines"] >= 1
        spawned = await d.ok("session/spawn", {"sessionId": sid, "callerId": r["node"]["id"], "output": nested(94)})
        assert spawned["node"]["output"] == nested(94)
        await d.ok("session/export", {"sessionId": sid})
        await stop(d)
    finally:
        await d.kill()


# ---------------------------------------------------------------- 2. undecodable names


async def test_undecodable_file_names_are_answered_and_the_daemon_lives(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path)
    ws = tmp_path / "ws"
    (ws / "skills" / "good").mkdir(parents=True)
    (ws / "skills" / "good" / "SKILL.md").write_text("---\nname: good\ndescription: fine\n---\n")
    os.makedirs(os.path.join(root, b"ws", b"skills", b"bad\xff"))
    with open(os.path.join(root, b"ws", b"skills", b"bad\xff", b"SKILL.md"), "w") as fh:
        fh.write("---\nname: bad\ndescription: undecodable folder\n---\n")
    imp = tmp_path / "imp"
    imp.mkdir()
    line = {"type": "user", "sessionId": "s-ff", "uuid": "u1", "timestamp": "2026-01-01T00:00:00Z",
            "message": {"role": "user", "content": "hello from a badly named file"}}
    with open(os.path.join(root, b"imp", b"sess\xff.jsonl"), "w") as fh:
        fh.write(json.dumps(line) + "\n")
    with open(os.path.join(root, b"imp", b"junk\xfe.jsonl"), "w") as fh:
        fh.write("this is not json\n")
    # SWE-agent titles a session by its file name
    traj = {"trajectory": [{"action": "ls", "observation": "a", "thought": "t"}],
            "history": [{"role": "system", "content": "s"}, {"role": "user", "content": "do it"}]}
    with open(os.path.join(root, b"imp", b"run\xff.traj"), "w") as fh:
        fh.write(json.dumps(traj))
    c = await DagctxClient.spawn(tmp_path / "n.db")
    try:
        s = await c.session_create("names")
        u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
        p = await c.prepare(s.session_id, workspace=str(ws), head=u.node.id)
        assert "good" in p.system
        assert any("\\xff" in n and "UTF-8" in n for n in p.notes), p.notes
        res = await c.import_path(str(imp))
        assert len(res.sessions) == 2 and all(x.nodes >= 1 for x in res.sessions), res
        assert "run\\xff" in [x.title for x in res.sessions], res.sessions
        # the undecodable names are reported escaped (``\xff``), never as raw surrogates
        files = [s.file or "" for s in res.skipped]
        assert any(f.endswith("junk\\xfe.jsonl") for f in files), files
        assert (await c.session_list()).total == 3  # alive and answering
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 3. configFile


async def test_config_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "models.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_bytes(b'{"models": {}, "pad": "' + b"x" * (2 << 20) + b'"}')
    good = tmp_path / "models.json"
    good.write_text(json.dumps({"models": {"tiny-1k": {"contextWindow": 1000, "maxOutput": 100}}}))
    c = await DagctxClient.spawn(tmp_path / "c.db", initialize=False)
    try:
        for path, words in (("/dev/zero", "character device"), (str(fifo), "FIFO"), (str(tmp_path), "directory"),
                            (str(big), "at most")):
            # answered at all means not read forever (/dev/zero, a FIFO nobody writes); how
            # fast is not asserted (CI is loaded): the request's own timeout is the hang guard
            with pytest.raises(RpcError) as info:
                await asyncio.wait_for(c.initialize(initialization_options={"configFile": path}), 60)
            assert info.value.code == -32602 and words in info.value.message, info.value.message
            assert info.value.data["path"] == "initializationOptions.configFile"
        await c.initialize(initialization_options={"configFile": str(good)})
        s = await c.session_create()
        r = await c.render(s.session_id, model="tiny-1k")
        assert r.tokens.total == 0
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 4. framing and ids


async def test_huge_and_duplicate_content_length_and_bool_ids(tmp_path: Path) -> None:
    d, _ = await raw_daemon(tmp_path, "--max-frame-bytes", "16384")
    try:
        before = snapshot(d.db)  # type: ignore[attr-defined]
        ok = jbody({"jsonrpc": "2.0", "id": 21, "method": "session/list", "params": {"limit": 1}})
        await d.send(b"Content-Length: 99999999999999999999\r\n\r\n" + b'{"junk": 1}' + frame(ok))
        first = await d.read_response()
        err(first, -32600, "FrameTooLarge", null_id=True)
        while True:  # the junk body may be reported before the frame behind it is answered
            resp = await d.read_response()
            if resp.get("id") == 21:
                break
            err(resp, -32700, "ParseError", null_id=True)
        assert resp["result"]["total"] == 1
        # two Content-Length headers: the frame is refused, the next one answered
        dup = b"Content-Length: 5\r\nContent-Length: %d\r\n\r\n" % len(ok) + ok
        await d.send(dup + frame(ok))
        e = err(await d.read_response(), -32700, "ParseError", null_id=True)
        assert "twice" in e["message"]
        while True:
            resp = await d.read_response()
            if resp.get("id") == 21:
                break
            err(resp, -32700, "ParseError", null_id=True)
        # ids must be strings, numbers or null
        for bad in ("true", "false", "[1]", '{"a": 1}', "1.5"):
            await d.send(frame('{"jsonrpc": "2.0", "id": %s, "method": "session/list"}' % bad))
            err(await d.read_response(), -32600, "InvalidRequest", null_id=True)
        assert snapshot(d.db) == before  # type: ignore[attr-defined]
        await stop(d)
    finally:
        await d.kill()


# ---------------------------------------------------------------- 8. values answered InvalidParams


async def test_out_of_range_values_are_invalid_params_naming_the_field(tmp_path: Path) -> None:
    d, s = await raw_daemon(tmp_path)
    try:
        before = snapshot(d.db)  # type: ignore[attr-defined]
        sid = s["sessionId"]
        hist = await d.ok("session/history", {"sessionId": sid})
        head = hist["head"]
        big = 2**64
        cases = [
            ("session/list", {"limit": 2**63}, "params.limit"),
            ("session/list", {"offset": -(2**70)}, "params.offset"),
            ("usage/report", {"sessionId": sid, "nodeId": head, "usage": {"input": big}}, "params.usage.input"),
            ("usage/report", {"sessionId": sid, "nodeId": head, "usage": {"cacheRead": -1}}, "params.usage.cacheRead"),
            ("node/append", {"sessionId": sid, "node": {"role": "user", "predecessor": head, "output": big}},
             "params.node.output"),
            ("node/append", {"sessionId": sid, "node": {"role": "user", "predecessor": head,
                                                        "metadata": {"n": [1, -(2**80)]}}},
             "params.node.metadata.n[1]"),
            ("node/get", {"sessionId": sid, "ids": [head], "range": {"offset": big}}, "params.range.offset"),
            ("session/rewind", {"sessionId": sid, "steps": big}, "params.steps"),
            ("search/query", {"query": "hi", "limit": big}, "params.limit"),
            ("context/compact", {"sessionId": sid, "timeoutSeconds": 1e300}, "params.timeoutSeconds"),
            ("context/compact", {"sessionId": sid, "minIdentifierRetention": 7}, "params.minIdentifierRetention"),
            ("context/prepare", {"sessionId": sid, "maxOutputTokens": 0}, "params.maxOutputTokens"),
            ("session/import", {"path": "/tmp/a\u0000b"}, "params.path"),
            ("session/export", {"sessionId": sid, "path": "/tmp/x\u0000.jsonl"}, "params.path"),
            ("context/prepare", {"sessionId": sid, "workspace": "/tmp/\u0000"}, "params.workspace"),
        ]
        for method, params, path in cases:
            e = err(await d.call(method, params), -32602, "InvalidParams")
            assert e["data"]["path"] == path, (method, params, e)
            assert snapshot(d.db) == before, (method, params)
        await stop(d)
    finally:
        await d.kill()


@pytest.mark.parametrize(("options", "path"), [
    ({"aging": {"keepRecentTurns": "x"}}, "params.initializationOptions.aging.keepRecentTurns"),
    ({"aging": {"maxSingleResultShare": 3}}, "params.initializationOptions.aging.maxSingleResultShare"),
    ({"aging": {"noSuchOption": 1}}, "params.initializationOptions.aging"),
    ({"database": "/tmp/a\u0000.db"}, "params.initializationOptions.database"),
    ({"configFile": "\u0000"}, "params.initializationOptions.configFile"),
    ({"models": {"m": {"contextWindow": 2**64, "maxOutput": 1}}}, "params.initializationOptions.models.m.contextWindow"),
    ({"samplingEndpoint": {"baseUrl": "file:///etc/passwd", "model": "m"}},
     "params.initializationOptions.samplingEndpoint.baseUrl"),
    ({"samplingEndpoint": {"baseUrl": "http://127.0.0.1:9", "model": "m", "timeoutSeconds": -1}},
     "params.initializationOptions.samplingEndpoint.timeoutSeconds"),
])
async def test_bad_initialization_options_are_refused_at_initialize(tmp_path: Path, options: dict, path: str) -> None:
    c = await DagctxClient.spawn(tmp_path / "i.db", initialize=False)
    try:
        with pytest.raises(RpcError) as info:
            await c.initialize(initialization_options=options)
        assert info.value.code == -32602 and info.value.data["path"] == path, (info.value.message, info.value.data)
        # the same connection initializes with good options and renders (nothing was half-applied)
        await c.initialize(initialization_options={"aging": {"keepRecentTurns": 2, "turnUnit": "step"}})
        s = await c.session_create()
        await c.render(s.session_id)
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


async def test_hostile_transcripts_and_folders_are_skipped_entries(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    good = {"type": "user", "sessionId": "s-ok", "uuid": "u1", "timestamp": "2026-01-01T00:00:00Z",
            "message": {"role": "user", "content": "a normal line"}}
    deep_line = '{"type": "user", "sessionId": "s-ok", "uuid": "u2", "message": %s}' % nested_json(100_000)
    (folder / "deep.jsonl").write_text(json.dumps(good) + "\n" + deep_line + "\n")
    (folder / "deep.json").write_text(nested_json(50_000))
    c = await DagctxClient.spawn(tmp_path / "t.db")
    try:
        res = await c.import_path(str(folder))
        reasons = " ".join(s.reason for s in res.skipped)
        assert "nested deeper than 100 levels" in reasons, res.skipped
        assert all(s.nodes >= 1 for s in res.sessions)
        # /proc: unreadable corners are skipped entries, never InternalError
        try:
            res = await c.request("session/import", {"path": "/proc"}, timeout=60)
            assert isinstance(res.sessions, list)
        except RpcError as exc:
            assert exc.code in (-32602, -32001) and exc.data["kind"] != "InternalError", exc
        assert (await c.session_list()).total >= 1
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 9. head names a tool call


async def test_head_naming_a_tool_call_is_invalid_params_not_corruption(tmp_path: Path) -> None:
    c = await DagctxClient.spawn(tmp_path / "head.db", initialization_options={"samplingEndpoint": {
        "baseUrl": "http://127.0.0.1:9", "model": "m"}})
    try:
        s = await c.session_create()
        u = await c.append(s.session_id, "user", output="list files", predecessor=s.head)
        llm = await c.append(s.session_id, "llm", output="calling ls", predecessor=u.node.id)
        tool = await c.append(s.session_id, "code", name="ls", input={}, output="a b", caller=llm.node.id,
                              metadata={"toolCallId": "c1"})
        calls = [
            ("session/history", {"sessionId": s.session_id, "head": tool.node.id}),
            ("context/render", {"sessionId": s.session_id, "head": tool.node.id}),
            ("context/prepare", {"sessionId": s.session_id, "head": tool.node.id}),
            ("context/compact", {"sessionId": s.session_id, "head": tool.node.id}),
        ]
        for method, params in calls:
            with pytest.raises(RpcError) as info:
                await c.request(method, params)
            e = info.value
            assert e.code == -32602 and e.data["kind"] == "InvalidParams", (method, e.message)
            assert f"head must be a conversation node; this is a tool call of {llm.node.id}" in e.message, e.message
            assert e.data["path"] == "head"
        assert (await c.history(s.session_id, head=llm.node.id)).head == llm.node.id
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 13. workspace reads


async def test_hard_linked_workspace_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-TOKEN-123")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.link(secret, ws / "AGENTS.md")
    (ws / "SOUL.md").write_text("be kind")
    c = await DagctxClient.spawn(tmp_path / "w.db")
    try:
        s = await c.session_create()
        u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
        p = await c.prepare(s.session_id, workspace=str(ws), head=u.node.id)
        assert "TOP-SECRET" not in p.system and "be kind" in p.system
        assert any("AGENTS.md" in n and "hard links" in n for n in p.notes), p.notes
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 14. the sampling endpoint


class _Trickle:
    """A loopback HTTP endpoint: ``trickle`` sends a valid answer a few bytes at a time,
    ``short`` promises more body than it sends and closes."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
                while len(rest) < length:
                    rest += conn.recv(65536)
                body = json.dumps({"model": "m", "choices": [{"message": {"role": "assistant",
                                   "content": "Summary: " + "words " * 40}}]}).encode()
                if self.mode == "short":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % len(body) + body[: len(body) // 2])
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % len(body))
                for i in range(0, len(body), 4):
                    if self.stop.is_set():
                        return
                    conn.sendall(body[i : i + 4])
                    time.sleep(0.1)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.mark.parametrize("mode", ["trickle", "short"])
async def test_sampling_endpoint_total_deadline_and_cut_short_body(tmp_path: Path, mode: str) -> None:
    stub = _Trickle(mode)
    c = await DagctxClient.spawn(tmp_path / "e.db", initialization_options={
        "samplingEndpoint": {"baseUrl": stub.url, "model": "m", "timeoutSeconds": 1.5}})
    try:
        sid = await long_session(c)
        before = (await c.session_get(sid)).node_count
        started = time.monotonic()
        res = await c.compact(sid, model="gpt-4o", keep_recent_tokens=800)
        took = time.monotonic() - started
        assert not res.ok and res.reason == "failed", res
        if mode == "trickle":
            assert took < 6, took  # the trickle would take ~10 s
            assert "within 1.5 s" in (res.error or ""), res.error
        else:
            assert "IncompleteRead" in (res.error or "") or "broken" in (res.error or ""), res.error
        assert (await c.session_get(sid)).node_count == before
        assert await c.close() == 0
    finally:
        stub.close()
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 15. tiktoken's cache


async def test_tiktoken_cache_lives_under_the_daemons_cache_dir(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    c = await DagctxClient.spawn(tmp_path / "k.db", env=env)
    try:
        s = await c.session_create()
        await c.append(s.session_id, "user", output="count me", predecessor=s.head)
        assert (tmp_path / "xdg-cache" / "dagctx" / "tiktoken").is_dir()
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()
    # a user's own setting is kept: nothing is made under the daemon's folder
    env2 = {**env, "XDG_CACHE_HOME": str(tmp_path / "xdg2"), "TIKTOKEN_CACHE_DIR": str(tmp_path / "mine")}
    c = await DagctxClient.spawn(tmp_path / "k2.db", env=env2)
    try:
        assert not (tmp_path / "xdg2" / "dagctx" / "tiktoken").exists()
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


async def test_a_client_answer_nested_too_deep_fails_the_sampling_at_once(tmp_path: Path) -> None:
    """The door check also guards the client's answers to the daemon's own requests:
    the waiting compaction fails now (SamplingFailed), it does not wait for its timeout."""
    c = await DagctxClient.spawn(tmp_path / "s.db", capabilities={"sampling": {}})

    async def deep_answer(params: Any) -> Any:
        return {"role": "assistant", "content": {"type": "text", "text": "x"}, "model": "m", "extra": nested(200)}

    c.on_request("sampling/createMessage", deep_answer)
    try:
        sid = await long_session(c)
        before = (await c.session_get(sid)).node_count
        started = time.monotonic()
        res = await c.compact(sid, model="gpt-4o", keep_recent_tokens=800, timeout_seconds=60)
        assert time.monotonic() - started < 15
        assert not res.ok and res.reason == "failed" and "refused" in (res.error or ""), res
        assert (await c.session_get(sid)).node_count == before
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()


# ---------------------------------------------------------------- 15. paths too long to name a file


async def test_a_5000_character_path_is_invalid_params_naming_the_field(tmp_path: Path) -> None:
    """A path no file can have (PATH_MAX, or a name over NAME_MAX) is the caller's mistake:
    InvalidParams naming the field and the limit, nothing written, the daemon answers on."""
    long_path = "/" + "/".join(["d" * 200] * 25)  # 5,025 characters, every name legal
    long_name = str(tmp_path / ("n" * 300))  # one name over 255 bytes
    c = await DagctxClient.spawn(tmp_path / "p.db", initialization_options={"workspace": long_path})
    try:
        s = await c.session_create()
        u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
        before = await c.history(s.session_id)
        for params, path, what in [
            ({"workspace": long_path}, "workspace", "bytes long"),
            ({"workspace": long_name}, "workspace", "name of 300 bytes"),
            ({}, "initializationOptions.workspace", "bytes long"),  # the connection's own setting
        ]:
            with pytest.raises(RpcError) as exc:
                await c.request("context/prepare", {"sessionId": s.session_id, "head": u.node.id,
                                                    "model": "gpt-4o", **params})
            assert exc.value.kind == "InvalidParams" and exc.value.data.get("path") == path, (exc.value.data, params)
            assert what in str(exc.value) and "shorter path" in str(exc.value)
        for method, params in [("session/import", {"path": long_path}),
                               ("session/export", {"sessionId": s.session_id, "format": "claude-code",
                                                   "path": long_path})]:
            with pytest.raises(RpcError) as exc:
                await c.request(method, params)
            assert exc.value.kind == "InvalidParams" and "bytes long" in str(exc.value), (method, exc.value)
        after = await c.history(s.session_id)
        assert [n.id for n in after.nodes] == [n.id for n in before.nodes]  # nothing written
        assert (await c.session_list()).total == 1
        assert await c.close() == 0
    finally:
        if c.process and c.process.returncode is None:
            c.process.kill()
