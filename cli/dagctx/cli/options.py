"""Options every command reads from the environment (standard library only: the
``dagctx serve`` fast path imports this)."""

from __future__ import annotations

import os


def standalone_requested(argv: list[str] | None = None) -> bool:
    """``--standalone`` on the command line or ``DAGCTX_STANDALONE=1`` in the environment."""
    if argv is not None and "--standalone" in argv:
        return True
    return os.environ.get("DAGCTX_STANDALONE", "").strip().lower() in ("1", "true", "yes", "on")
