"""Where the database lives and what the daemon was started with."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


def default_database() -> str:
    """``dagctx.db`` under the user's data directory (created when missing)."""
    return str(Path(platformdirs.user_data_dir("dagctx", appauthor=False)) / "dagctx.db")


def env_database() -> str | None:
    """``DAGCTX_DB``, when set: a path the user named."""
    return os.environ.get("DAGCTX_DB") or None


@dataclass
class DaemonConfig:
    """Settings fixed when the process starts (command line); ``initialize`` may add more."""

    database: str | None = None
    max_frame_bytes: int = 64 * 1024 * 1024
    log_level: str = "WARNING"
    #: True in the per-user daemon: the client's environment reaches it only through
    #: the forwarder, so ``DAGCTX_DB`` of the daemon's own environment is ignored
    shared: bool = False
    extra: dict[str, object] = field(default_factory=dict)
