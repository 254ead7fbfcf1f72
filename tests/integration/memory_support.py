"""What the memory tests share (SPEC §5.1): the daemon they drive, on the ``database``
fixture's backend (SQLite and PostgreSQL), and the workspaces they write."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest_asyncio

from dagctx.client import DagctxClient


@pytest_asyncio.fixture
async def client(database: str) -> AsyncIterator[DagctxClient]:
    """A standalone daemon on the test's database (both backends), closed afterwards."""
    c = await DagctxClient.spawn(database)
    try:
        yield c
    finally:
        await c.close()


def write(ws: Path, rel: str, text: str | bytes) -> Path:
    """``ws/rel`` with this content (folders made); bytes as given, text as UTF-8."""
    p = ws / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def workspace(tmp_path: Path, files: Mapping[str, str | bytes], name: str = "ws") -> Path:
    """A workspace folder ``tmp_path/name`` holding ``files`` (relative path → content)."""
    ws = tmp_path / name
    ws.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        write(ws, rel, text)
    return ws
