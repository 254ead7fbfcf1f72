"""How the engine reaches the daemon and what it reads of Hermes to do so: the shared
connections (``BRIDGES``), the daemon's options for Hermes's model and endpoint, the
daemon's command from the environment, Hermes's own configuration, the session recorded
for a Hermes session, and the answer to the daemon's ``sampling/createMessage`` through
Hermes's auxiliary model (SPEC §9).

Kept apart from the engine (``engine.py``), which decides per Hermes call what dagctx
does: this module is the plumbing every one of those calls shares.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from .bridge import ClientBridge

API_KEY_ENV = "DAGCTX_HERMES_API_KEY"
#: How long one engine call waits for the daemon (compaction: ``engine.COMPACT_TIMEOUT``);
#: ``DAGCTX_HERMES_TIMEOUT`` (seconds) overrides it.
CALL_TIMEOUT = 30.0
TIMEOUT_ENV = "DAGCTX_HERMES_TIMEOUT"


def call_timeout() -> float:
    """``DAGCTX_HERMES_TIMEOUT`` when it is a positive number of seconds, else CALL_TIMEOUT.

    A machine that starts the daemon slowly (a loaded CI runner) needs longer than the
    default before Hermes falls back to its own compressor; a bad value is not worth failing
    a Hermes turn over, so it keeps the default."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return CALL_TIMEOUT
    return value if 0 < value < float("inf") else CALL_TIMEOUT

#: The daemon connections of this process, by what they were started with
#: (``DagctxContextEngine.bridge``).
BRIDGES: dict[tuple[Any, ...], ClientBridge] = {}


def command_from_env() -> list[str] | None:
    """``DAGCTX_COMMAND`` (a JSON array), as the TypeScript client reads it."""
    raw = os.environ.get("DAGCTX_COMMAND", "").strip()
    if not raw:
        return None
    argv = json.loads(raw)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"DAGCTX_COMMAND must be a non-empty JSON array of strings, got {raw}")
    return argv


def hermes_config() -> dict[str, Any]:
    """Hermes's config.yaml as Hermes loads it ({} when it cannot be read)."""
    try:
        from hermes_cli.config import load_config

        cfg = load_config()
        return cfg if isinstance(cfg, dict) else {}
    except Exception:  # noqa: BLE001 - an engine outside a Hermes install
        return {}


def auxiliary_compression() -> dict[str, Any] | None:
    """Hermes's ``auxiliary.compression`` settings when a model is configured there (a
    provider, model or base URL other than ``auto``); None when Hermes has none."""
    task = ((hermes_config().get("auxiliary") or {}).get("compression") or {})
    if not isinstance(task, dict):
        return None
    configured = any(str(task.get(k) or "").strip().lower() not in ("", "auto") for k in ("provider", "model", "base_url"))
    return task if configured else None


def daemon_options(model: str, context_length: int, base_url: str, *, client_sampling: bool) -> dict[str, Any]:
    """``initializationOptions`` for Hermes's model: its window, and the endpoint Hermes talks
    to as the summary source unless the client answers sampling itself."""
    opts: dict[str, Any] = {}
    if model and context_length:
        out = min(16384, context_length // 4)
        opts["models"] = {model: {"contextWindow": context_length, "maxOutput": out}}
        opts["defaultModel"] = model
    if base_url and model and not client_sampling:
        opts["samplingEndpoint"] = {"baseUrl": base_url, "model": model, "apiKeyEnv": API_KEY_ENV}
    return opts


def new_bridge(database: str | None, command: list[str] | None, opts: dict[str, Any], *, api_key: str,
               runtime: dict[str, Any], aux: bool) -> ClientBridge:
    """A connection to a daemon started with ``opts``; with ``aux`` it declares ``sampling``
    and answers it through Hermes's auxiliary model, else the endpoint's key goes to the
    daemon in ``API_KEY_ENV`` only."""
    from dagctx.client import DagctxClient

    env = dict(os.environ)
    if api_key and not aux:
        env[API_KEY_ENV] = api_key

    async def connect() -> Any:
        client = await DagctxClient.spawn(database, command=command, env=env, initialization_options=opts,
                                          capabilities={"sampling": {}} if aux else None)
        if aux:
            client.on_request("sampling/createMessage", lambda params: auxiliary_sample(params, runtime))
        return client

    return ClientBridge(connect, timeout=call_timeout())


async def find_session(client: Any, hermes_session: str) -> Any:
    """The dagctx session recorded for a Hermes session id (``metadata.hermesSessionId``)."""
    offset = 0
    while True:
        page = await client.session_list(limit=200, offset=offset)
        for s in page.sessions:
            if s.metadata.get("hermesSessionId") == hermes_session:
                return s
        offset += len(page.sessions)
        if not page.sessions or offset >= page.total:
            return None


async def auxiliary_sample(params: Any, runtime: dict[str, Any]) -> dict[str, Any]:
    """Answer the daemon's ``sampling/createMessage`` (SPEC §9) with Hermes's auxiliary
    client for the ``compression`` task — the model Hermes itself summarises with."""
    messages: list[dict[str, Any]] = []
    if getattr(params, "system_prompt", None):
        messages.append({"role": "system", "content": params.system_prompt})
    messages += [{"role": m.role, "content": m.content.text} for m in params.messages]

    def call() -> Any:
        from agent.auxiliary_client import call_llm

        return call_llm(task="compression", main_runtime=runtime, messages=messages,
                        max_tokens=int(params.max_tokens))

    response = await asyncio.to_thread(call)
    message = response.choices[0].message
    text = message.get("content") if isinstance(message, dict) else getattr(message, "content", "")
    return {"role": "assistant", "content": {"type": "text", "text": str(text or "")},
            "model": str(getattr(response, "model", "") or "hermes-auxiliary"), "stopReason": "endTurn"}


__all__ = ["API_KEY_ENV", "BRIDGES", "CALL_TIMEOUT", "TIMEOUT_ENV", "auxiliary_compression", "auxiliary_sample",
           "call_timeout", "command_from_env", "daemon_options", "find_session", "hermes_config", "new_bridge"]
