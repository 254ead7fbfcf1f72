"""Shared fixtures: a real daemon subprocess over stdio on a real SQLite file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagctx.client import DagctxClient

REPO = Path(__file__).resolve().parents[1]


def corpus_dir() -> Path | None:
    env = os.environ.get("DAGCTX_CORPUS")
    path = Path(env) if env else REPO.parent / "shared" / "corpus"
    return path if path.is_dir() else None


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "dagctx.db"


@pytest.fixture
async def daemon(db_path: Path):
    """An initialized client of a fresh daemon; closed (shutdown + exit) afterwards."""
    client = await DagctxClient.spawn(db_path, initialization_options={"observeNodes": True})
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def corpus() -> Path:
    path = corpus_dir()
    if path is None:
        pytest.skip("the shared corpus is not present (set DAGCTX_CORPUS)")
    return path
