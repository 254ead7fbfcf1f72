"""The per-user shared daemon with real processes (SPEC §1): forwarders, sockets, fan-out.

Every test gets its own runtime folder (``XDG_RUNTIME_DIR``) and state folder, so it
has its own daemon, and ``shared_env`` stops every daemon the test started (SIGTERM,
then SIGKILL) — none outlives a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import codec, transport
from daemon_stop import daemon_pids

REPO = Path(__file__).resolve().parents[2]
TS = REPO / "clients" / "typescript"
SERVE = [sys.executable, "-P", "-m", "dagctx.cli", "serve"]
CLI = [sys.executable, "-P", "-m", "dagctx.cli"]

pytestmark = pytest.mark.asyncio


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our child) counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return not _alive(pid)


@pytest.fixture
def shared_env(tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """The shared path: no standalone, a private runtime dir (short: socket paths are
    limited); every daemon stopped after."""
    run = short_dir
    monkeypatch.delenv("DAGCTX_STANDALONE", raising=False)
    monkeypatch.delenv("DAGCTX_DAEMON_TAG", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.setenv("DAGCTX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "120")
    started: list[int] = []
    yield started
    pids = set(daemon_pids(run)) | set(started)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in pids:
        if not _wait_dead(pid, 5):
            os.kill(pid, signal.SIGKILL)
            _wait_dead(pid, 5)


def claude_code_transcript(path: Path, turns: int, result_chars: int,
                           sid: str = "0e9d2a54-7f3c-4b51-9a43-5b3d1c0f7a11") -> None:
    """A Claude Code JSONL of ``turns`` tool-using turns, each tool result ``result_chars`` long
    (``sid``: its session id; an import of the same id again is the same session)."""
    body = " ".join(f"w{k} src/mod_{k % 50}.py total {k * 7}" for k in range(result_chars // 30))
    parent = None
    n = 0

    def line(kind: str, message: dict[str, Any]) -> str:
        nonlocal parent, n
        n += 1
        uid = f"00000000-0000-4000-8000-{n:012d}"
        rec = {"type": kind, "uuid": uid, "parentUuid": parent, "sessionId": sid, "isSidechain": False,
               "timestamp": f"2026-01-01T00:{(n // 60) % 60:02d}:{n % 60:02d}.000Z", "message": message}
        parent = uid
        return json.dumps(rec)

    with open(path, "w", encoding="utf-8") as f:
        for i in range(turns):
            f.write(line("user", {"role": "user", "content": f"turn {i}: check src/mod_{i % 50}.py"}) + "\n")
            f.write(line("assistant", {"role": "assistant", "id": f"msg_{i}a", "content": [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"cat f{i}"}}]}) + "\n")
            f.write(line("user", {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{body} {i}"}]}) + "\n")
            f.write(line("assistant", {"role": "assistant", "id": f"msg_{i}b",
                                       "content": [{"type": "text", "text": f"done {i}"}]}) + "\n")


def heavy_transcript(path: Path, turns: int = 2_500) -> None:
    """A transcript whose cold render (aging on) is heavy whatever the spill rule: a view's
    cost grows with the nodes it walks, so many turns of small tool results (measured on
    the shared machine: 3,000 turns render cold in ~2.8 s, 300 results of 31,000
    characters in ~0.4 s), and they import in seconds."""
    claude_code_transcript(path, turns=turns, result_chars=300, sid="5b0c3e1d-2a4f-4c6b-8d7e-9f1a2b3c4d5e")


async def status(client: DagctxClient) -> Any:
    st = await client.daemon_status()
    return st


async def spawn(db: Path, **kw: Any) -> DagctxClient:
    """A client through its own forwarder process (``dagctx serve``)."""
    return await DagctxClient.spawn(db, stderr=asyncio.subprocess.PIPE, **kw)


async def wait_for(pred, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def appended(client: DagctxClient, node_id: str) -> list[Any]:
    return [p for meth, p in client.notifications if meth == "node/didAppend" and p.node.id == node_id]


# ---------------------------------------------------------------- two languages, one daemon


async def test_python_and_typescript_clients_share_one_daemon_live(shared_env, tmp_path: Path) -> None:
    """A (Python, forwarder) appends; B (TypeScript, its own forwarder) hears each append,
    named as A's (its origin) even though the daemon's poller looks for new nodes meanwhile."""
    if not (TS / "dist" / "index.js").exists():
        pytest.skip("the TypeScript client is not built (npm run build)")
    db = tmp_path / "live.db"
    a = await spawn(db, initialization_options={"observeNodes": True})
    try:
        s = await a.session_create("live")
        env = dict(os.environ, DAGCTX_COMMAND=json.dumps(SERVE))
        node = await asyncio.create_subprocess_exec(
            "node", str(TS / "scripts" / "watch-session.mjs"), s.session_id, "--db", str(db),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        try:
            ready = json.loads(await asyncio.wait_for(node.stdout.readline(), 30))
            assert ready["ready"] and ready["connectionId"] != a.connection_id
            st = await status(a)
            assert len(st.clients) == 2 and st.mode == "shared"
            assert {c.name for c in st.clients} == {"dagctx-python", "watch-session.mjs"}
            watcher = next(c for c in st.clients if c.name == "watch-session.mjs")
            assert watcher.sessions == [s.session_id]
            head = s.head
            lat = []
            for i in range(12):  # the poller (every 100 ms) runs between many of them
                sent = time.time()
                r = await a.append(s.session_id, "user", output=f"turn {i}", predecessor=head)
                head = r.head
                while True:
                    ev = json.loads(await asyncio.wait_for(node.stdout.readline(), 10))
                    if ev["method"] == "node/didAppend":
                        break
                assert ev["params"]["node"]["id"] == r.node.id
                assert ev["params"]["origin"] == a.connection_id  # names the writer
                lat.append(ev["t"] / 1000 - sent)
            # a HEAD move is a session/didChange
            await a.checkout(s.session_id, s.root_id)
            ev = json.loads(await asyncio.wait_for(node.stdout.readline(), 10))
            assert ev["method"] == "session/didChange" and ev["params"]["change"] == "head"
            assert ev["params"]["origin"] == a.connection_id
            # latencies are bench material (bench/bench_shared.py), never asserted: CI is loaded
            print(f"notification latency median {statistics.median(lat):.3f} s, worst {max(lat):.3f} s")
        finally:
            node.stdin.close()
            await asyncio.wait_for(node.wait(), 15)
    finally:
        await a.close()


async def test_subscriber_hears_another_connection_and_a_standalone_process(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    a = await spawn(db)
    b = await spawn(db)
    ci = None
    try:
        s = await a.session_create("watched")
        sub = await b.subscribe(s.session_id)
        assert sub.subscribed and sub.head == s.head
        head = s.head
        for i in range(10):  # the poller (every 100 ms) looks for new nodes meanwhile
            r = await a.append(s.session_id, "user", output=f"from A {i}", predecessor=head)
            head = r.node.id
            await wait_for(lambda: appended(b, r.node.id), 10.0, "B to hear A's append")
            heard = appended(b, r.node.id)
            assert len(heard) == 1 and heard[0].origin == a.connection_id, heard  # once, named as A's
            assert not appended(a, r.node.id)  # A did not subscribe nor ask for observeNodes
            await asyncio.sleep(0.03 * (i % 4))
        # a standalone daemon (a CI run) writing the same file reaches B too
        ci = await DagctxClient.spawn(db, standalone=True)
        r2 = await ci.append(s.session_id, "llm", name="gpt-4o", output="from CI", predecessor=r.node.id)
        # found by the poller (SPEC §1.5: within 250 ms; how fast is bench material, CI is loaded)
        await wait_for(lambda: appended(b, r2.node.id), 10.0, "B to hear the standalone append")
        assert [n.origin for n in appended(b, r2.node.id)] == [None]
        # rename, summary-less delete: session/didChange
        await a.request("session/rename", {"sessionId": s.session_id, "title": "renamed"})
        await wait_for(lambda: any(m == "session/didChange" and p.change == "renamed" for m, p in b.notifications))
        await b.unsubscribe(s.session_id)
        r3 = await a.append(s.session_id, "user", output="after unsubscribe", predecessor=r2.node.id)
        await asyncio.sleep(0.3)
        assert not appended(b, r3.node.id)
        assert (await status(a)).databases == [os.path.realpath(db)]  # one open store for both
    finally:
        for c in (a, b, ci):
            if c is not None:
                await c.close()


# ---------------------------------------------------------------- sampling goes to the requester


def _summary(params: Any) -> dict[str, Any]:
    text = "\n".join(m.content.text for m in params.messages)
    idents = sorted({w for w in text.replace("\n", " ").split() if w.startswith(("src/", "ISSUE-"))})
    body = ("## 1. User intent\nfix issues\n## 2. Decisions and constraints\nnone\n## 3. Work completed\n"
            + "\n".join(f"- {i}" for i in idents) + "\n## 4. Outstanding\nnone\n## 5. Active context\nnone")
    return {"role": "assistant", "content": {"type": "text", "text": body}, "model": "scripted", "stopReason": "endTurn"}


async def test_compaction_asks_only_the_client_that_requested_it(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    models = {"small-32k": {"contextWindow": 32000, "maxOutput": 4000}}
    asked: dict[str, int] = {"a": 0, "b": 0}

    def sampler(name: str):
        async def answer(params: Any) -> Any:
            asked[name] += 1
            return _summary(params)
        return answer

    a = await spawn(db, capabilities={"sampling": {}}, initialization_options={"models": models})
    b = await spawn(db, capabilities={"sampling": {}}, initialization_options={"models": models})
    a.on_request("sampling/createMessage", sampler("a"))
    b.on_request("sampling/createMessage", sampler("b"))
    try:
        s = await a.session_create("compact me")
        head = s.head
        body = "\n".join(f"    line {k}: total = accumulate(values, step={k % 7})" for k in range(80))
        for i in range(14):
            u = await a.append(s.session_id, "user", output=f"Turn {i}: fix ISSUE-{4100 + i} in src/m{i}.py",
                               predecessor=head)
            l1 = await a.append(s.session_id, "llm", name="small-32k", output=f"Reading src/m{i}.py",
                                predecessor=u.node.id)
            await a.append(s.session_id, "code", name="read_file", input={"path": f"src/m{i}.py"}, output=body,
                           caller=l1.node.id, metadata={"toolCallId": f"call_{i}"})
            l2 = await a.append(s.session_id, "llm", name="small-32k", output=f"Fixed ISSUE-{4100 + i}.",
                                predecessor=l1.node.id)
            head = l2.node.id
        await b.subscribe(s.session_id)
        res = await b.compact(s.session_id, model="small-32k", keep_recent_tokens=2000)
        assert res.ok and res.summary_id, res
        assert asked == {"a": 0, "b": 1}
        # and the other way round, on a fresh branch head: only A is asked
        res2 = await a.compact(s.session_id, model="small-32k", keep_recent_tokens=500, head=head)
        assert asked["b"] == 1
        assert asked["a"] == (1 if res2.summary_id else asked["a"])
        # B (subscribed) heard the summary as a node and a session/didChange
        await wait_for(lambda: any(m == "session/didChange" and p.change == "summary" for m, p in b.notifications))
    finally:
        await a.close()
        await b.close()


# ---------------------------------------------------------------- starting, sockets, trust


async def test_racing_forwarders_start_exactly_one_daemon(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "race.db"
    clients = await asyncio.gather(*(spawn(db) for _ in range(4)))
    try:
        sts = [await status(c) for c in clients]
        assert len({st.pid for st in sts}) == 1
        assert len(sts[-1].clients) == 4
        assert len(list((Path(os.environ["XDG_RUNTIME_DIR"]) / "dagctx").glob("*.sock"))) == 1
    finally:
        for c in clients:
            assert await c.close() == 0  # shutdown + exit through a forwarder: exit code 0


async def test_kill9_leaves_a_stale_socket_that_the_next_serve_replaces(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "stale.db"
    a = await spawn(db)
    pid = (await status(a)).pid
    os.kill(pid, signal.SIGKILL)
    assert _wait_dead(pid, 5)
    await asyncio.wait_for(a.closed, 5)  # the forwarder ended A's stream
    assert await a.wait(5) == 1
    err = (await a.process.stderr.read()).decode()
    assert "closed the connection unexpectedly" in err
    sock = transport.socket_path()
    assert os.path.exists(sock)  # stale
    b = await spawn(db)
    try:
        assert (await status(b)).pid != pid
    finally:
        await b.close()


async def test_a_socket_owned_by_another_uid_is_refused(shared_env, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a socket to another uid")
    sock = transport.socket_path()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock)
    srv.listen(1)
    os.chown(sock, 4242, 4242)
    try:
        proc = subprocess.run(SERVE + ["--db", str(tmp_path / "u.db")], input=b"", capture_output=True, timeout=30)
        assert proc.returncode == 1
        assert b"owned by uid 4242" in proc.stderr and b"refusing" in proc.stderr
    finally:
        srv.close()


async def test_a_different_build_hash_gets_its_own_daemon(shared_env, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "h.db"
    a = await spawn(db)
    monkeypatch.setenv("DAGCTX_DAEMON_TAG", "other-build")
    b = await spawn(db)
    try:
        sa, sb = await status(a), await status(b)
        assert sa.pid != sb.pid and sa.socket != sb.socket
        shared_env.extend([sa.pid, sb.pid])
    finally:
        await a.close()
        await b.close()


async def test_idle_exit_removes_the_socket(shared_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "0.5")
    a = await spawn(tmp_path / "idle.db")
    pid = (await status(a)).pid
    await a.close()
    assert _wait_dead(pid, 10)
    assert not os.path.exists(transport.socket_path())


# ---------------------------------------------------------------- isolation between clients


async def test_a_client_that_never_reads_does_not_block_the_other(shared_env, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGCTX_MAX_QUEUE_BYTES", "65536")
    db = tmp_path / "slow.db"
    b = await spawn(db)
    try:
        s = await b.session_create("flood")
        # A: a raw connection that subscribes and then never reads a byte
        raw = transport.connect_or_start()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for i, (method, params) in enumerate([
            ("initialize", {"capabilities": {}, "initializationOptions": {"database": str(db)}}),
            ("session/subscribe", {"sessionId": s.session_id}),
        ]):
            raw.sendall(codec.encode_message(codec.Request(method=method, id=i + 1, params=params)))
        for _ in range(200):  # A is initialized and subscribed
            st0 = await status(b)
            if any(c.sessions == [s.session_id] for c in st0.clients):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the raw client never subscribed")
        big = "x" * 20_000
        head = s.head
        t0 = time.monotonic()
        for i in range(80):
            r = await b.append(s.session_id, "user", output=f"{i} {big}", predecessor=head)
            head = r.head
        took = time.monotonic() - t0
        assert took < 20, took
        st = await status(b)
        assert len(st.clients) == 1, st.clients  # A was disconnected
        log = Path(st.log).read_text()
        assert "stopped reading" in log and "disconnecting" in log
        raw.close()
    finally:
        await b.close()


async def test_one_clients_exit_leaves_the_other_working(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "exit.db"
    a = await spawn(db)
    b = await spawn(db)
    try:
        a.notify("exit")  # without shutdown: that connection (and its forwarder) ends with 1
        assert await a.wait(10) == 1
        s = await b.session_create("still here")
        r = await b.append(s.session_id, "user", output="ok", predecessor=s.head)
        assert r.head == r.node.id
        st = await status(b)
        assert len(st.clients) == 1
    finally:
        assert await b.close() == 0


async def test_kill9_mid_request_ends_both_streams_and_loses_no_acknowledged_write(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    a = await spawn(db)
    b = await spawn(db)
    s = await a.session_create("durable")
    head, acked = s.head, []
    for i in range(40):
        r = await a.append(s.session_id, "user", output=f"write {i}", predecessor=head)
        head = r.head
        acked.append(r.node.id)
    pid = (await status(a)).pid
    # requests in flight on both clients when the daemon dies
    _, fa = a.send_request("context/render", {"sessionId": s.session_id, "model": "gpt-4o"})
    _, fb = b.send_request("session/list", {})
    pending = [a.send_request("node/append", {"sessionId": s.session_id, "node": {
        "role": "user", "output": f"late {i}", "predecessor": head}})[1] for i in range(5)]
    os.kill(pid, signal.SIGKILL)
    for c in (a, b):
        await asyncio.wait_for(c.closed, 5)
        assert await c.wait(5) == 1
        assert b"closed the connection unexpectedly" in await c.process.stderr.read()
    # every request in flight is answered or fails: none hangs
    for f in [fa, fb, *pending]:
        try:
            res = await asyncio.wait_for(f, 5)
        except (ConnectionError, RpcError):
            continue
        if f in pending:
            acked.append(res.node.id)  # answered before the kill: it must survive
    c = await spawn(db)
    try:
        hist = await c.history(s.session_id)
        ids = [n.id for n in hist.nodes]
        assert all(i in ids for i in acked)
    finally:
        await c.close()


# ---------------------------------------------------------------- operating it


async def test_cli_uses_the_shared_daemon_and_daemon_status_and_stop(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    env = dict(os.environ)
    # opting out starts no shared daemon
    p = subprocess.run(CLI + ["sessions", "--db", str(db), "--standalone"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(SERVE + ["--db", str(db)], input="", capture_output=True, text=True, timeout=60,
                       env={**env, "DAGCTX_STANDALONE": "1"})
    assert p.returncode == 0, p.stderr
    assert not os.path.exists(transport.socket_path())
    for _ in range(2):
        p = subprocess.run(CLI + ["sessions", "--db", str(db)], capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stderr
    p = subprocess.run(CLI + ["daemon", "status", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    assert {"pid", "version", "socket", "databases", "clients"} <= set(st)
    assert st["databases"] == [os.path.realpath(db)]
    p = subprocess.run(CLI + ["daemon", "status"], capture_output=True, text=True, timeout=60, env=env)
    assert f"pid {st['pid']}" in p.stdout and "clients" in p.stdout
    p = subprocess.run(CLI + ["daemon", "stop"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert _wait_dead(st["pid"], 10)
    assert not os.path.exists(st["socket"])
    p = subprocess.run(CLI + ["daemon", "status"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "no dagctx daemon" in p.stderr


async def test_sigterm_finishes_and_removes_the_socket(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "term.db"
    a = await spawn(db)
    s = await a.session_create("t")
    st = await status(a)
    r = await a.append(s.session_id, "user", output="kept", predecessor=s.head)
    os.kill(st.pid, signal.SIGTERM)
    assert _wait_dead(st.pid, 10)
    assert not os.path.exists(st.socket)
    assert await a.wait(5) == 1
    assert b"the dagctx daemon stopped (signal SIGTERM)" in await a.process.stderr.read()
    c = await DagctxClient.spawn(db, standalone=True)
    try:
        assert r.node.id in [n.id for n in (await c.history(s.session_id)).nodes]
    finally:
        await c.close()


async def test_relative_database_is_the_clients(shared_env, tmp_path: Path) -> None:
    """The daemon runs in /; a relative --db means the client's folder."""
    work = tmp_path / "work"
    work.mkdir()
    sub = subprocess.run(CLI + ["sessions", "--db", "rel2.db"], cwd=work, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    assert (work / "rel2.db").exists()


# ---------------------------------------------------------------- heavy work stays off the loop


async def _heavy_session(c: DagctxClient, tmp_path: Path) -> str:
    """A session whose cold render with aging is heavy (``heavy_transcript``)."""
    src = tmp_path / "heavy.jsonl"
    heavy_transcript(src)
    return (await c.import_path(str(src))).sessions[0].session_id


async def test_session_list_is_answered_while_a_heavy_render_runs(shared_env, tmp_path: Path) -> None:
    """SPEC §1.4: a render with aging runs in the worker; other requests — of this and of
    other connections — keep being answered while it runs (how fast: bench/bench_isolation.py)."""
    db = tmp_path / "heavy.db"
    a = await spawn(db)
    b = await spawn(db)
    try:
        sid = await _heavy_session(a, tmp_path)
        # cold: a model and format nothing asked for yet
        _, render = a.send_request("context/render", {"sessionId": sid, "model": "claude-sonnet-4", "aging": True,
                                                      "format": "anthropic"})
        during_b = during_a = 0
        while not render.done():
            await b.session_list(limit=5)
            during_b += not render.done()
            await a.session_list(limit=5)  # the same connection is not held back either
            during_a += not render.done()
        res = await render
        assert res.messages
        # an order of events, not a count or a duration (CI is loaded): the other connection
        # was answered while the one render still ran (how many answers of each fit in is
        # the machine's load: printed, never asserted)
        print(f"answered during the render: B {during_b}, A {during_a}")
        assert during_b >= 1, (during_a, during_b)
    finally:
        await a.close()
        await b.close()


async def test_a_cancelled_heavy_render_stops_and_frees_the_worker(shared_env, tmp_path: Path) -> None:
    """SPEC §1.4: ``$/cancelRequest`` of a RUNNING render: it stops at its next checkpoint and
    answers RequestCancelled (a render that ran to its end would answer its result), and the
    connection's next view runs. How soon is measured in bench/bench_isolation.py."""
    db = tmp_path / "cancel.db"
    a = await spawn(db)
    try:
        sid = await _heavy_session(a, tmp_path)
        rid, render = a.send_request("context/render", {"sessionId": sid, "model": "claude-sonnet-4", "aging": True,
                                                        "format": "anthropic"})
        for _ in range(2_000):  # until the render runs in a worker (a hang guard, not a duration)
            if (await a.daemon_status()).queue.running >= 1 or render.done():
                break
            await asyncio.sleep(0.01)
        a.cancel(rid)
        with pytest.raises(RpcError) as exc:
            await asyncio.wait_for(render, 120)
        assert exc.value.kind == "RequestCancelled"
        # the worker is free: the connection's next view (same background lane) is answered
        quick = await a.render(sid, model="gpt-4o", aging=False)
        assert quick.messages
        st = await a.daemon_status()
        assert st.queue.queued == 0
    finally:
        await a.close()


async def test_a_slow_database_server_at_initialize_never_stalls_other_connections(shared_env, tmp_path: Path) -> None:
    """``initialize`` opens its database in the worker (SPEC §1.4): a PostgreSQL address that
    accepts but never answers keeps that client waiting, never the others."""
    import socket as socketlib

    silent = socketlib.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel does) and never says a word
    port = silent.getsockname()[1]
    try:
        b = await spawn(tmp_path / "b.db")
        try:
            a = await spawn(None, initialize=False)
            try:
                url = f"postgresql://dagctx@127.0.0.1:{port}/x?connect_timeout=3"
                slow = asyncio.ensure_future(a.initialize(initialization_options={"database": url}))
                await asyncio.sleep(0.3)  # A is now inside its connect
                started = time.monotonic()
                for _ in range(5):
                    await b.session_list()
                assert time.monotonic() - started < 1.0, "B waited for A's database"
                with pytest.raises(RpcError) as err:
                    await slow
                assert err.value.kind in ("StorageUnavailable", "InvalidParams")
            finally:
                a.notify("exit")
                await a.wait(10)
        finally:
            await b.close()
    finally:
        silent.close()
