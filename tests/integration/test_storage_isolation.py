"""Faults stay with their database (SPEC §1.4, §2.1): a SQLite file locked by another
process, a PostgreSQL server that accepts connections but never answers, and a PostgreSQL
schema dropped under a running daemon. Each answers a clear kind to the clients of that
database only; other clients and other databases are answered meanwhile; the database
recovers without a restart. Outcomes are asserted, never durations.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from daemon_stop import stop_daemon
from rawdb import RawDb
from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import transport


class SharedDaemon:
    """One shared daemon on a private socket; ``connect`` opens one more connection."""

    def __init__(self) -> None:
        self.run = tempfile.mkdtemp(prefix="si-", dir="/tmp")  # short: socket paths are limited
        self.socket = os.path.join(self.run, "d.sock")
        self.clients: list[DagctxClient] = []
        self.pid: int | None = None

    async def connect(self, database: str, **options: Any) -> DagctxClient:
        c = await DagctxClient.connect(database, socket_path=self.socket, initialization_options=options or None)
        self.clients.append(c)
        if self.pid is None:
            self.pid = (await c.daemon_status()).pid
        return c

    async def stop(self) -> None:
        await stop_daemon(self.pid, self.clients)
        # `dagctx serve` (a forwarder some tests start) reaches the daemon on the per-user socket
        # of this runtime folder, not on ``socket``: one it started is stopped too, not left to
        # idle out beside the next tests
        sock = transport.socket_path()
        if sock.startswith(self.run + os.sep):
            try:
                with open(transport.pid_path(sock)) as fh:
                    other = int(json.load(fh)["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                return
            await stop_daemon(other)


@pytest.fixture
async def shared(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SharedDaemon]:
    monkeypatch.delenv("DAGCTX_STANDALONE", raising=False)
    monkeypatch.setenv("DAGCTX_IDLE_TIMEOUT", "60")
    d = SharedDaemon()
    monkeypatch.setenv("XDG_RUNTIME_DIR", d.run)
    monkeypatch.setenv("DAGCTX_STATE_DIR", os.path.join(d.run, "state"))
    yield d
    await d.stop()


async def _user(c: DagctxClient, sid: str, head: str, text: str) -> str:
    return (await c.append(sid, "user", input=text, predecessor=head)).node.id


# ---------------------------------------------------------------- SQLite: a lock held elsewhere


HOLDER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
db.execute("ROLLBACK")
"""


async def test_a_sqlite_lock_held_elsewhere_delays_only_writers_of_that_file(shared: SharedDaemon,
                                                                             tmp_path: Path) -> None:
    locked_db, other_db = str(tmp_path / "locked.db"), str(tmp_path / "other.db")
    a = await shared.connect(locked_db, storageTimeoutSeconds=5)
    reader = await shared.connect(locked_db)  # another client of the locked file
    b = await shared.connect(other_db)
    sa = await a.session_create("a")
    sb = await b.session_create("b")
    first = await _user(a, sa.session_id, sa.head, "before the lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, locked_db], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        pending = asyncio.ensure_future(_user(a, sa.session_id, first, "while locked"))
        await asyncio.sleep(0.2)
        # Meanwhile: the other database reads and writes, and the locked one still reads
        # (for other connections: ``a``'s own later requests keep their order behind its write).
        assert (await b.session_list()).total == 1
        await _user(b, sb.session_id, sb.head, "the other file is writable")
        assert (await reader.session_list()).total == 1
        assert [n.id for n in (await reader.history(sa.session_id)).nodes] == [first]
        assert not pending.done(), "the locked write answered before the other clients were served"
        with pytest.raises(RpcError) as err:
            await asyncio.wait_for(pending, 60)
        assert err.value.kind == "StorageBusy"
        assert "another process" in err.value.message and "nothing of this request was written" in err.value.message
    finally:
        holder.communicate("", timeout=30)
    # the lock is gone: the same daemon writes again, no restart
    again = await _user(a, sa.session_id, first, "after the lock")
    assert [n.id for n in (await a.history(sa.session_id)).nodes] == [first, again]


# ---------------------------------------------------------------- PostgreSQL: a silent server


class FreezingProxy:
    """A loopback TCP proxy to the test server's Unix socket that can stop answering:
    while frozen it accepts connections and reads nothing, forwards nothing."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self.flowing.wait()
                data = await r.read(65536)
                if not data:
                    break
                await self.flowing.wait()
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def _client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await self.flowing.wait()  # frozen: the connection is accepted and never answered
        ur, uw = await asyncio.open_unix_connection(self.unix_path)
        for t in (self._pump(r, uw), self._pump(ur, w)):
            task = asyncio.ensure_future(t)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        self.flowing.set()
        for t in list(self.tasks):
            t.cancel()
        if self.server is not None:
            self.server.close()


def _via(proxy: FreezingProxy, pg_url: str) -> tuple[str, str]:
    """The URL of the same database through the proxy, and the server's Unix socket."""
    parts = urllib.parse.urlsplit(pg_url)
    q = dict(urllib.parse.parse_qsl(parts.query))
    sock = os.path.join(q["host"], f".s.PGSQL.{q['port']}")
    return f"postgresql://127.0.0.1:{proxy.port}{parts.path}?user={q['user']}", sock


@pytest.fixture
async def proxy(pg_url: str) -> AsyncIterator[tuple[FreezingProxy, str]]:
    parts = urllib.parse.urlsplit(pg_url)
    q = dict(urllib.parse.parse_qsl(parts.query))
    p = FreezingProxy(os.path.join(q["host"], f".s.PGSQL.{q['port']}"))
    await p.start()
    yield p, _via(p, pg_url)[0]
    await p.close()


async def test_a_silent_postgresql_server_answers_its_clients_and_stalls_nobody(shared: SharedDaemon, proxy,
                                                                                tmp_path: Path) -> None:
    px, url = proxy
    other = await shared.connect(str(tmp_path / "other.db"))
    so = await other.session_create("elsewhere")
    pg = await shared.connect(url, storageTimeoutSeconds=2)
    sp = await pg.session_create("through the proxy")
    first = await _user(pg, sp.session_id, sp.head, "before the freeze")
    px.flowing.clear()  # the server stops answering; its connections stay open
    pending = asyncio.ensure_future(_user(pg, sp.session_id, first, "while frozen"))
    await asyncio.sleep(0.2)
    # Another client, another database: answered while the server is silent.
    assert (await other.session_list()).total == 1
    await _user(other, so.session_id, so.head, "still writable")
    assert not pending.done(), "the frozen write answered before the other client was served"
    with pytest.raises(RpcError) as err:
        await asyncio.wait_for(pending, 60)
    assert err.value.kind == "StorageUnavailable", err.value.message
    # A new client naming the silent server: initialize answers StorageUnavailable too.
    late = asyncio.ensure_future(shared.connect(url + "&dagctx_pool_size=2", storageTimeoutSeconds=2))
    assert (await other.session_list()).total == 1
    with pytest.raises(RpcError) as init_err:
        await asyncio.wait_for(late, 60)
    assert init_err.value.kind == "StorageUnavailable", init_err.value.message
    # The server answers again: the same daemon and connection go on, no restart.
    px.flowing.set()
    for _ in range(3):  # a pooled connection that died while frozen may fail one more request
        try:
            again = await _user(pg, sp.session_id, first, "after the freeze")
            break
        except RpcError as e:
            assert e.kind == "StorageUnavailable", e.message
    else:
        raise AssertionError("the daemon did not recover once the server answered")
    hist = await pg.history(sp.session_id)
    assert [n.id for n in hist.nodes][-1] == again


# ---------------------------------------------------------------- PostgreSQL: a dropped schema


async def test_a_postgresql_schema_dropped_under_the_daemon_recovers(pg_url: str) -> None:
    c = await DagctxClient.spawn(pg_url)
    try:
        s = await c.session_create("doomed")
        await _user(c, s.session_id, s.head, "before the drop")
        with RawDb(pg_url) as raw:
            raw.execute("DROP SCHEMA dagctx CASCADE")
        # The first request that meets it answers a storage kind (never InternalError) or,
        # for a write, is run again on the schema created anew.
        for call in (c.session_list(), c.session_get(s.session_id), _user(c, s.session_id, s.head, "x")):
            try:
                await call
            except RpcError as err:
                assert err.kind in ("StorageUnavailable", "SessionNotFound"), (err.kind, err.message)
        assert (await c.session_list()).total == 0
        fresh = await c.session_create("after the drop")
        nid = await _user(c, fresh.session_id, fresh.head, "written")
        assert [n.id for n in (await c.history(fresh.session_id)).nodes] == [nid]
    finally:
        await c.close()


# ---------------------------------------------------------------- private by default


async def test_what_dagctx_creates_is_private_whatever_the_umask(tmp_path: Path) -> None:
    data = tmp_path / "data"  # XDG_DATA_HOME does not exist yet: dagctx creates it
    env = {**os.environ, "XDG_DATA_HOME": str(data)}
    env.pop("DAGCTX_DB", None)
    old = os.umask(0)  # the daemon inherits the most permissive umask there is
    try:
        c = await DagctxClient.spawn(None, env=env)
    finally:
        os.umask(old)
    try:
        s = await c.session_create("private")
        await _user(c, s.session_id, s.head, "a secret")
        db = data / "dagctx" / "dagctx.db"
        assert (await c.daemon_status()).warnings == []
        assert not [n for n in c.notifications if n[0] == "window/showMessage"]
        for folder in (data, data / "dagctx"):
            assert folder.stat().st_mode & 0o777 == 0o700, folder
        for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert f.stat().st_mode & 0o777 == 0o600, f
    finally:
        await c.close()
    # An existing database other users can read is served, and `daemon/status` says so.
    os.chmod(db, 0o644)
    c = await DagctxClient.spawn(db)
    try:
        warnings = (await c.daemon_status()).warnings
        assert any(str(db) in w and "chmod 600" in w for w in warnings), warnings
        # … and the user hears it as LSP's window/showMessage (a warning) when connecting
        shown = [p for name, p in c.notifications if name == "window/showMessage"]
        assert shown and {p.type for p in shown} == {2}, c.notifications  # a warning each: the file, its -wal, -shm
        assert sorted(p.message for p in shown) == sorted(warnings), (shown, warnings)
    finally:
        await c.close()


# ---------------------------------------------------------------- PostgreSQL: session/list beside a held write


async def test_a_postgresql_session_list_is_answered_while_a_write_waits_for_a_row_lock(shared: SharedDaemon,
                                                                                       pg_url: str) -> None:
    """SPEC §1.4: session/list needs none of the store's locks on PostgreSQL either. Another
    process holds a session's row FOR UPDATE (another daemon writing it); this daemon's
    write to that session waits for the row inside its transaction — and another client's
    session/list of the same database is answered meanwhile, before the write is."""
    a = await shared.connect(pg_url, storageTimeoutSeconds=120)  # the held write must outlast a loaded CI
    b = await shared.connect(pg_url)
    s = await a.session_create("held")
    await b.session_create("other")
    with RawDb(pg_url) as holder, RawDb(pg_url) as watcher:
        holder.begin()
        holder.execute("SELECT id FROM sessions WHERE id=? FOR UPDATE", (s.session_id,))
        pending = asyncio.ensure_future(_user(a, s.session_id, s.head, "waits for the row"))
        for _ in range(2400):  # until A's write waits for the row (a hang guard, not a duration)
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if waiting[0][0] >= 1 or pending.done():
                break
            await asyncio.sleep(0.05)
        assert not pending.done(), "the write did not wait for the row held elsewhere"
        listed = await asyncio.wait_for(b.session_list(limit=5), 60)  # a hang guard
        assert listed.total == 2 and {x.title for x in listed.sessions} == {"held", "other"}
        assert not pending.done(), "session/list was answered only after the held write"
        holder.commit()
    nid = await asyncio.wait_for(pending, 120)
    assert [n.id for n in (await b.history(s.session_id)).nodes] == [nid]
