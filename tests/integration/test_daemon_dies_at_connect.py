"""A daemon that dies between a client's connect and its answer to ``initialize`` (SPEC §1.2,
§1.3): the client ends up on a new daemon, with no error.

The kernel queues connections to a listening socket until its process is torn down, so a
client that connects right after its daemon was killed reaches the dying daemon. Here that
moment is made to last: the daemon is stopped (SIGSTOP: its socket still takes connections
into its backlog), the client connects, and only then is the daemon killed (SIGKILL). The
Python client connecting to the socket itself and ``dagctx serve`` (both its modes: handing
the client's stdio to the daemon, and relaying it) must each start a new daemon and
initialize on it. Each test knows the client has connected from a wrapper of
``transport.connect_or_start`` — never from a sleep. A listener that drops connections and
lives on is connected to once only: a client retries only when the daemon it reached is gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

from dagctx.client import DagctxClient
from dagctx.protocol import transport
from daemon_stop import daemon_pids, exited

pytestmark = pytest.mark.asyncio

#: ``dagctx serve`` with ``connect_or_start`` wrapped: a line in the file ``$DAGCTX_TEST_MARK``
#: once each connection is made (the test then kills the daemon it reached).
MARKED_SERVE = """
import os, sys
from dagctx.protocol import transport
real = transport.connect_or_start
def marked(*args, **kw):
    s = real(*args, **kw)
    with open(os.environ["DAGCTX_TEST_MARK"], "a") as f:
        f.write("connected\\n")
    return s
transport.connect_or_start = marked
from dagctx.cli import main
sys.exit(main())
"""


@pytest.fixture
def shared(tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A private runtime folder (its own daemon); every daemon started here stopped after."""
    monkeypatch.delenv("DAGCTX_STANDALONE", raising=False)
    monkeypatch.delenv("DAGCTX_DAEMON_TAG", raising=False)
    monkeypatch.delenv("DAGCTX_HANDOFF", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    monkeypatch.setenv("DAGCTX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "120")
    started: set[int] = set()
    yield started
    pids = set(daemon_pids(short_dir)) | started
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in pids:
            if not exited(pid):
                os.kill(pid, sig)
    for pid in pids:
        for _ in range(500):
            if exited(pid):
                break
            threading.Event().wait(0.01)


async def _stopped_daemon(db: Path, started: set[int]) -> int:
    """Start the shared daemon (through a client that then leaves) and stop it: SIGSTOP."""
    first = await DagctxClient.connect(db)
    pid = (await first.daemon_status()).pid
    started.add(pid)
    await first.close()
    os.kill(pid, signal.SIGSTOP)
    return pid


async def _works_on_a_new_daemon(client: DagctxClient, killed: int, started: set[int]) -> None:
    assert client.initialize_result is not None
    status = await client.daemon_status()
    started.add(status.pid)
    assert status.pid != killed and not exited(status.pid)
    s = await client.session_create("after the kill")
    node = await client.append(s.session_id, "user", predecessor=s.head, output="hello again")
    assert node.node.seq == 1 and node.head == node.node.id
    await client.close()


async def _until(condition, what: str) -> None:
    for _ in range(3000):  # a bound against a hang, not a duration the test checks
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_the_python_client_reaches_a_new_daemon_when_the_one_it_reached_dies(
        shared: set[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "c.db"
    pid = await _stopped_daemon(db, shared)
    connected = threading.Event()
    real = transport.connect_or_start

    def marked(*args, **kw):
        s = real(*args, **kw)
        connected.set()
        return s

    monkeypatch.setattr(transport, "connect_or_start", marked)
    connecting = asyncio.ensure_future(DagctxClient.connect(db))
    await _until(connected.is_set, "the client connected to the stopped daemon")
    os.kill(pid, signal.SIGKILL)
    client = await asyncio.wait_for(connecting, 60)
    await _works_on_a_new_daemon(client, pid, shared)


@pytest.mark.parametrize("handoff", ["1", "0"], ids=["handoff", "relay"])
async def test_dagctx_serve_reaches_a_new_daemon_when_the_one_it_reached_dies(
        shared: set[int], tmp_path: Path, handoff: str) -> None:
    db = tmp_path / "s.db"
    pid = await _stopped_daemon(db, shared)
    mark = tmp_path / "mark"
    env = {**os.environ, "DAGCTX_TEST_MARK": str(mark), "DAGCTX_HANDOFF": handoff}
    client = await DagctxClient.spawn(db, command=[sys.executable, "-P", "-c", MARKED_SERVE, "serve"], env=env,
                                      initialize=False)
    initializing = asyncio.ensure_future(client.initialize())
    await _until(mark.exists, "dagctx serve connected to the stopped daemon")
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(initializing, 60)
    assert mark.read_text().count("connected") == 2  # one connection more: to the new daemon
    await _works_on_a_new_daemon(client, pid, shared)


class _Dropper:
    """A listener on the daemon's socket that closes every connection unanswered, and lives
    on (it is this test's process): no client may connect to it twice."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.recv(1 << 16)
            conn.close()

    def close(self) -> None:
        self.sock.close()


async def test_a_live_daemon_that_drops_the_handshake_is_never_connected_to_again(
        shared: set[int], tmp_path: Path) -> None:
    dropper = _Dropper(transport.socket_path())
    try:
        with pytest.raises(ConnectionError) as e:
            await DagctxClient.connect(tmp_path / "a.db")
        assert f"(pid {os.getpid()}) closed the connection before answering `initialize` and still runs" in str(e.value)
        assert dropper.accepted == 1
        with pytest.raises(ConnectionError) as e:
            await DagctxClient.spawn(tmp_path / "a.db")
        assert "dagctx serve: the dagctx daemon on" in str(e.value) and "still runs" in str(e.value)
        assert dropper.accepted == 2  # once each: the forwarder did not connect again either
    finally:
        dropper.close()
