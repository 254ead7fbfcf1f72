"""Where the database comes from, and what initialize says when it cannot be opened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagctx.client import DagctxClient, RpcError


async def test_named_database_in_a_missing_folder_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "folder"
    c = await DagctxClient.spawn(initialize=False)
    try:
        with pytest.raises(RpcError) as err:
            await c.initialize(initialization_options={"database": str(missing / "x.db")})
        assert err.value.kind == "InvalidParams"
        assert "does not exist" in err.value.message
        assert err.value.data.get("path") == "initializationOptions.database"
        assert not (tmp_path / "no").exists()
        # the daemon is still there and can be initialized properly
        ok = await c.initialize(initialization_options={"database": str(tmp_path / "ok.db")})
        assert ok.database == str(tmp_path / "ok.db")
    finally:
        await c.close()


async def test_precedence_options_then_cli_then_env(tmp_path: Path) -> None:
    env = {**os.environ, "DAGCTX_DB": str(tmp_path / "env.db")}
    c = await DagctxClient.spawn(tmp_path / "cli.db", env=env,
                                 initialization_options={"database": str(tmp_path / "opt.db")})
    assert c.initialize_result.database == str(tmp_path / "opt.db")
    await c.close()
    c = await DagctxClient.spawn(tmp_path / "cli.db", env=env)
    assert c.initialize_result.database == str(tmp_path / "cli.db")
    await c.close()
    c = await DagctxClient.spawn(env=env)
    assert c.initialize_result.database == str(tmp_path / "env.db")
    await c.close()


async def test_default_database_lives_in_the_user_data_dir(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DAGCTX_DB"}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env["HOME"] = str(tmp_path / "home")
    c = await DagctxClient.spawn(env=env)
    try:
        db = Path(c.initialize_result.database)
        assert db.name == "dagctx.db" and db.exists()
        assert str(db).startswith(str(tmp_path))
    finally:
        await c.close()


async def test_initialize_speaks_lsps_types(tmp_path: Path) -> None:
    """The LSP part of initialize is LSP's: a capability LSP defines, sent in another shape, is
    -32602 naming it; the answer's capabilities are a ServerCapabilities (dagctx's own under
    ``experimental``, and where its clients read them) and its serverInfo a ServerInfo."""
    c = await DagctxClient.spawn(initialize=False)
    try:
        with pytest.raises(RpcError) as err:
            await c.initialize(initialization_options={"database": str(tmp_path / "a.db")},
                               capabilities={"window": "yes please"})
        assert err.value.kind == "InvalidParams" and err.value.data.get("path") == "capabilities.window"
        assert "WindowClientCapabilities" in err.value.message
        assert not (tmp_path / "a.db").exists()  # refused at the door: nothing opened
        ok = await c.initialize(initialization_options={"database": str(tmp_path / "a.db")},
                                capabilities={"window": {"workDoneProgress": True}})
        assert ok.capabilities["experimental"]["storage"] == ok.capabilities["storage"] == "sqlite"
        assert ok.server_info.name == "dagctx"
    finally:
        await c.close()

