"""The Python client leaves no task behind when a connection is closed (SPEC §1.2): its
reader (and, for a spawned daemon, its stderr drain) has finished when ``close()`` returns,
so a caller's loop can end without asyncio's "Task was destroyed but it is pending"."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_shared_daemon import shared_env  # noqa: F401 - the fixture is used by name

from dagctx.client import DagctxClient


def _left(before: set[asyncio.Task]) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() - before if not t.done()]


async def test_a_spawned_daemons_client_leaves_no_task_pending(tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    c = await DagctxClient.spawn(tmp_path / "a.db")
    await c.session_list()
    assert _left(before), "the client reads in a task of its own while open"
    await c.close()
    assert _left(before) == []


async def test_a_socket_client_leaves_no_task_pending(shared_env, tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    c = await DagctxClient.connect(tmp_path / "b.db")
    await c.session_list()
    await c.close()
    assert _left(before) == []
    # the daemon lives on for the next client
    d = await DagctxClient.connect(tmp_path / "b.db")
    try:
        assert (await d.session_list()).total == 0
    finally:
        await d.close()
