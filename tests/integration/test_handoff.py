"""The forwarder hands the client's stdio to the daemon (SPEC §1.3): when stdin and stdout
are pipes, the daemon reads and writes them itself and the forwarder holds neither; with
``DAGCTX_HANDOFF=0`` it relays bytes. Either way the client sees the same answers, in
order, every answer before the stream ends, and the exit codes of a standalone daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SERVE = [sys.executable, "-P", "-m", "dagctx.cli", "serve"]


@pytest.fixture
def shared(tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("DAGCTX_STANDALONE", raising=False)
    monkeypatch.delenv("DAGCTX_DAEMON_TAG", raising=False)
    monkeypatch.delenv("DAGCTX_HANDOFF", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    monkeypatch.setenv("DAGCTX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "120")
    yield
    for pid_file in short_dir.rglob("*.pid"):  # every daemon of this test stopped
        try:
            pid = json.loads(pid_file.read_text())["pid"]
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, KeyError):
            pass


def frame(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def request(i: int, method: str, params: Any = None) -> bytes:
    return frame({"jsonrpc": "2.0", "id": i, "method": method, "params": params or {}})


def read_frame(out: Any) -> dict[str, Any] | None:
    length = None
    while True:
        line = out.readline()
        if not line:
            return None
        if line == b"\r\n":
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    assert length is not None
    return json.loads(out.read(length))


def answers(out: Any, n: int) -> list[dict[str, Any]]:
    got = []
    while len(got) < n:
        msg = read_frame(out)
        assert msg is not None, f"the stream ended after {len(got)} of {n} answers"
        if "id" in msg:
            got.append(msg)
    return got


def spawn(db: Path, handoff: bool) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DAGCTX_HANDOFF="1" if handoff else "0")
    return subprocess.Popen([*SERVE, "--db", str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def fd_target(pid: int, fd: int) -> str:
    return os.readlink(f"/proc/{pid}/fd/{fd}")


@pytest.mark.parametrize("handoff", [True, False], ids=["handed-off", "relayed"])
def test_answers_in_order_the_last_before_the_end_and_exit_code_0(shared: None, tmp_path: Path,
                                                                   handoff: bool) -> None:
    proc = spawn(tmp_path / "h.db", handoff)
    assert proc.stdin is not None and proc.stdout is not None
    big = "x" * 3_000_000  # several pipe buffers: the daemon's queue drains into the client's pipe
    proc.stdin.write(request(1, "initialize", {"capabilities": {}}) + request(2, "session/create", {"title": "h"}))
    proc.stdin.flush()
    init, created = answers(proc.stdout, 2)
    assert init["id"] == 1 and "result" in init
    sid = created["result"]["sessionId"]
    # one write of many requests and shutdown: every answer arrives, in order
    root = created["result"]["rootId"]
    batch = [request(3, "node/append", {"sessionId": sid, "node": {"role": "user", "input": big,
                                                                   "predecessor": root}})]
    batch += [request(i, "session/get", {"sessionId": sid}) for i in range(4, 60)]
    batch += [request(60, "session/history", {"sessionId": sid}), request(61, "shutdown")]
    proc.stdin.write(b"".join(batch))
    proc.stdin.flush()
    got = answers(proc.stdout, 59)
    proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit"}))
    proc.stdin.flush()
    assert [a["id"] for a in got] == list(range(3, 62))
    assert all("result" in a for a in got), [a for a in got if "error" in a][:1]
    node_id = got[0]["result"]["node"]["id"]
    assert [n["id"] for n in got[-2]["result"]["nodes"]] == [node_id]
    assert read_frame(proc.stdout) is None  # the stream ends after the last answer
    assert proc.wait(30) == 0
    # the forwarder held the client's pipes only when it relayed
    assert proc.stderr is not None
    assert b"unexpectedly" not in proc.stderr.read()


def test_the_forwarder_holds_neither_pipe_once_handed_off(shared: None, tmp_path: Path) -> None:
    handed, relayed = spawn(tmp_path / "a.db", True), spawn(tmp_path / "a.db", False)
    try:
        for proc in (handed, relayed):
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(request(1, "initialize", {"capabilities": {}}))
            proc.stdin.flush()
            assert answers(proc.stdout, 1)[0]["id"] == 1
        assert fd_target(handed.pid, 0) == fd_target(handed.pid, 1) == os.devnull
        assert fd_target(relayed.pid, 0).startswith("pipe:") and fd_target(relayed.pid, 1).startswith("pipe:")
        # ``exit`` without ``shutdown`` is exit code 1 either way
        for proc in (handed, relayed):
            assert proc.stdin is not None
            proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit"}))
            proc.stdin.flush()
            assert proc.wait(30) == 1
    finally:
        for proc in (handed, relayed):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_clients_stdin_ending_ends_the_connection(shared: None, tmp_path: Path) -> None:
    proc = spawn(tmp_path / "e.db", True)
    watcher = spawn(tmp_path / "e.db", True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert watcher.stdin is not None and watcher.stdout is not None
        for p in (proc, watcher):
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(request(1, "initialize", {"capabilities": {}}))
            p.stdin.flush()
            answers(p.stdout, 1)
        watcher.stdin.write(request(2, "daemon/status"))
        watcher.stdin.flush()
        assert len(answers(watcher.stdout, 1)[0]["result"]["clients"]) == 2
        proc.stdin.close()  # the client goes away: EOF, like a closed editor
        assert proc.wait(30) == 0
        assert read_frame(proc.stdout) is None
        deadline = time.monotonic() + 30
        while True:
            watcher.stdin.write(request(3, "daemon/status"))
            watcher.stdin.flush()
            clients = answers(watcher.stdout, 1)[0]["result"]["clients"]
            if len(clients) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(clients) == 1
    finally:
        for p in (proc, watcher):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("way", ["handed-off", "relayed", "standalone"])
def test_answers_written_by_the_workers_stay_in_order(shared: None, tmp_path: Path, way: str) -> None:
    """Reads answered straight from the worker that ran them (SPEC §1.4) stay in arrival
    order with the answers the loop writes: big answers the pipe takes only in part,
    writes and small reads, interleaved with requests refused at the door."""
    if way == "standalone":
        proc = subprocess.Popen([*SERVE, "--standalone", "--db", str(tmp_path / "o.db")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    else:
        proc = spawn(tmp_path / "o.db", way == "handed-off")
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(request(1, "initialize", {"capabilities": {}}) + request(2, "session/create", {"title": "o"}))
    proc.stdin.flush()
    _, created = answers(proc.stdout, 2)
    sid, root = created["result"]["sessionId"], created["result"]["rootId"]
    proc.stdin.write(request(3, "node/append", {"sessionId": sid, "node": {"role": "user", "input": "y" * 1_500_000,
                                                                           "predecessor": root}}))
    proc.stdin.flush()
    head = answers(proc.stdout, 1)[0]["result"]["head"]
    batch, kinds = [], {}
    for i in range(4, 64):
        k = i % 5
        if k == 0:
            batch.append(request(i, "session/history", {"sessionId": sid}))  # ~1.5 MB answer
        elif k == 1:
            batch.append(request(i, "session/get", {"sessionId": 42}))  # refused at the door
        elif k == 2:
            batch.append(request(i, "node/append", {"sessionId": sid, "node": {
                "role": "llm", "output": f"o{i}", "predecessor": head}}))
        else:
            batch.append(request(i, "session/get" if k == 3 else "session/list", {"sessionId": sid} if k == 3 else {}))
        kinds[i] = k
    proc.stdin.write(b"".join(batch) + request(64, "shutdown"))
    proc.stdin.flush()
    got = answers(proc.stdout, 61)
    proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit"}))
    proc.stdin.flush()
    # a request refused at the door is answered at once; every other answer in arrival order
    assert sorted(a["id"] for a in got) == list(range(4, 65))
    assert [a["id"] for a in got if kinds.get(a["id"]) != 1] == [i for i in range(4, 65) if kinds.get(i) != 1]
    for a in got[:-1]:
        k = kinds[a["id"]]
        if k == 1:
            assert a["error"]["data"]["kind"] == "InvalidParams"
        else:
            assert "result" in a, a.get("error")
        if k == 0:
            assert len(a["result"]["nodes"][0]["input"]) == 1_500_000
    assert read_frame(proc.stdout) is None
    assert proc.wait(30) == 0
