"""dagctx as Hermes Agent's context engine.

Install next to Hermes (``pip install dagctx-hermes``), then in ``~/.hermes/config.yaml``::

    plugins:
      enabled: [dagctx]
    context:
      engine: dagctx

Hermes discovers the plugin through the ``hermes_agent.plugins`` entry point and calls
``register(ctx)``, which registers one ``DagctxContextEngine``. Environment: ``DAGCTX_DB``
(the database), ``DAGCTX_COMMAND`` (the daemon's argv, a JSON array),
``DAGCTX_HERMES_FALLBACK=structural`` (a deterministic summary when no LLM answers),
``DAGCTX_HERMES_KEEP_RECENT_TOKENS`` (the verbatim tail's size).
"""

from __future__ import annotations

import os
from typing import Any

from .engine import DagctxContextEngine

__all__ = ["DagctxContextEngine", "register"]


def engine_from_env() -> DagctxContextEngine:
    keep = os.environ.get("DAGCTX_HERMES_KEEP_RECENT_TOKENS", "").strip()
    return DagctxContextEngine(
        structural_fallback=os.environ.get("DAGCTX_HERMES_FALLBACK", "").strip() == "structural",
        keep_recent_tokens=int(keep) if keep else None,
    )


def register(ctx: Any) -> None:
    """Hermes plugin entry: register the dagctx context engine."""
    ctx.register_context_engine(engine_from_env())
