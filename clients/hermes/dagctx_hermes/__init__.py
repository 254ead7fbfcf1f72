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

import logging
import os
from typing import Any

from .engine import DagctxContextEngine, engine_for

__all__ = ["DagctxContextEngine", "register"]


def engine_from_env() -> DagctxContextEngine:
    keep = os.environ.get("DAGCTX_HERMES_KEEP_RECENT_TOKENS", "").strip()
    return DagctxContextEngine(
        structural_fallback=os.environ.get("DAGCTX_HERMES_FALLBACK", "").strip() == "structural",
        keep_recent_tokens=int(keep) if keep else None,
    )


def record_turn(session_id: str | None = None, conversation_history: list[dict[str, Any]] | None = None,
                **_: Any) -> None:
    """``post_llm_call`` hook: Hermes's engine ABC hands over messages only when it compresses,
    so each finished turn is recorded here, by the engine copy serving that session."""
    engine = engine_for(session_id)
    if engine is not None and conversation_history:
        try:
            engine.ingest(conversation_history)
        except Exception:  # noqa: BLE001 - a hook must never break the agent loop
            logging.getLogger("dagctx_hermes").warning("recording the turn in dagctx failed", exc_info=True)


def register(ctx: Any) -> None:
    """Hermes plugin entry: register the dagctx context engine (and the per-turn recorder,
    where the context is a full plugin context; the context-engine directory loader's is not)."""
    ctx.register_context_engine(engine_from_env())
    if hasattr(ctx, "register_hook"):
        ctx.register_hook("post_llm_call", record_turn)
