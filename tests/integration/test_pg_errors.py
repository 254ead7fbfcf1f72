"""PostgreSQL names that cannot be used, and a server connection lost under a daemon.

Each is a clear error naming what to fix; the daemon stays alive, writes nothing half,
and recovers when the server is back.
"""

from __future__ import annotations

import pytest

from dagctx.client import DagctxClient, RpcError

from rawdb import RawDb
from test_shared_daemon import shared_env  # noqa: F401 - the fixture


async def refused(url: str) -> RpcError:
    c = await DagctxClient.spawn(None, initialize=False)
    try:
        with pytest.raises(RpcError) as info:
            await c.initialize(initialization_options={"database": url})
        # The daemon is alive and still answers (initialize may be retried).
        with pytest.raises(RpcError) as again:
            await c.session_list()
        assert again.value.kind in ("ServerNotInitialized", "InvalidRequest")
        return info.value
    finally:
        await c.close()


async def test_unusable_urls_are_refused_with_what_to_fix(pg_server, pg_url: str) -> None:
    err = await refused("postgresql://[broken")
    assert err.kind == "InvalidParams"
    err = await refused("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
    assert err.kind == "StorageUnavailable" and "server is up" in err.message
    err = await refused(pg_server.url("no_such_database"))
    assert err.kind == "StorageUnavailable" and "no_such_database" in err.message
    err = await refused(pg_url.replace("user=postgres", "user=nobody_here"))
    assert err.kind == "StorageUnavailable" and "nobody_here" in err.message
    err = await refused("postgresql://u:s3cret@127.0.0.1:1/x?connect_timeout=2")
    assert "s3cret" not in err.message  # a password never appears in a message
    with RawDb(pg_url) as db:  # a `dagctx` schema that dagctx did not create is not written into
        db.execute("CREATE SCHEMA dagctx")
    err = await refused(pg_url)
    assert err.kind == "InvalidParams" and "did not create" in err.message


async def test_a_lost_connection_is_an_error_then_the_daemon_recovers(pg_server, pg_url: str) -> None:
    c = await DagctxClient.spawn(pg_url)
    try:
        init = c.initialize_result
        assert init.capabilities["storage"] == "postgresql" and init.capabilities["search"] == "fulltext-cjk"
        s = await c.session_create("lost")
        u = await c.append(s.session_id, "user", input="before", predecessor=s.head)
        db_name = pg_url.split("///", 1)[1].split("?", 1)[0]
        with RawDb(pg_server.admin_url) as admin:  # the server drops every connection of the daemon
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ? "
                          "AND pid <> pg_backend_pid()", (db_name,))
        kinds = []
        for i in range(3):
            try:
                await c.append(s.session_id, "user", input=f"after {i}", predecessor=(await c.session_get(s.session_id)).head)
            except RpcError as exc:
                kinds.append(exc.kind)
        assert set(kinds) <= {"StorageUnavailable"}
        hist = [n.input for n in (await c.history(s.session_id)).nodes]
        assert hist[0] == "before" and len(hist) == 1 + 3 - len(kinds)
        assert u.node.id == (await c.history(s.session_id)).nodes[0].id
    finally:
        await c.close()


def test_the_cli_reaches_postgresql_through_the_shared_daemon(shared_env, pg_url: str) -> None:
    """``--db postgresql://…`` through the per-user daemon: the URL is taken as it is."""
    from dagctx.ledger import Store
    from dagctx.protocol.nodes import NodeInput

    from test_cli import ok

    s = Store(pg_url)
    try:
        sid = s.create_session("shared on postgres").session_id
        s.append(sid, NodeInput(role="user", input="数据库迁移脚本", predecessor="ROOT"))
    finally:
        s.close()
    assert "shared on postgres" in ok("sessions", "--db", pg_url)
    assert "[迁移]" in ok("search", "--db", pg_url, "迁移")


async def test_a_url_names_the_database_through_the_socket_and_the_forwarder(shared_env, pg_url: str, tmp_path) -> None:
    """A client's database name reaches the shared daemon as the client meant it: a
    ``postgresql://`` URL unchanged (not made a path under the client's cwd)."""
    from dagctx.protocol import transport

    assert transport.client_database(pg_url) == pg_url
    assert transport.client_database("rel.db").startswith("/")
    c = await DagctxClient.connect(database=pg_url)
    try:
        sid = (await c.session_create("via the socket")).session_id
        assert (await c.session_get(sid)).title == "via the socket"
    finally:
        await c.close()
    # the forwarder (`dagctx serve --db URL`) names the same database
    f = await DagctxClient.spawn(pg_url)  # `dagctx serve --db URL`, forwarding
    try:
        titles = [s.title for s in (await f.session_list()).sessions]
        assert "via the socket" in titles
    finally:
        await f.close()
