"""Where the database lives and what the daemon was started with.

A database is named the same way everywhere (``--db``, ``DAGCTX_DB``,
``initializationOptions.database``; SPEC §2.1): a ``postgresql://`` (or ``postgres://``)
URL is a PostgreSQL server, anything else is a SQLite file path.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


def default_database() -> str:
    """``dagctx.db`` under the user's data directory (created when missing)."""
    return str(Path(platformdirs.user_data_dir("dagctx", appauthor=False)) / "dagctx.db")


def env_database() -> str | None:
    """``DAGCTX_DB``, when set: a path or URL the user named."""
    return os.environ.get("DAGCTX_DB") or None


#: initialize's ``capabilities.search``: the query language of search/query (SPEC §5), the
#: same on every backend — not the name of any engine's full-text extension.
SEARCH_CAPABILITY = "fulltext-cjk"


def redact_database(name: str) -> str:
    """A database name fit for a message: a URL loses its password."""
    if "://" not in name:
        return name
    try:
        parts = urllib.parse.urlsplit(name)
        if parts.password is None:
            return name
    except ValueError:  # not even a URL: show no more than its scheme
        return name.split("://", 1)[0] + "://…"
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


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
