"""``DagctxContextEngine``: Hermes Agent's ``ContextEngine`` backed by the dagctx daemon.

Hermes owns the loop and the message list; dagctx owns the record and the decision:

* every message Hermes shows the engine is appended to a dagctx session (``ingest.sync``),
  so nothing compaction folds away is lost — it stays searchable (``dagctx_search``);
* ``should_compress`` answers from dagctx's budget for the model Hermes runs
  (``context/prepare``: compaction is needed at ≥ 80 % of the input budget, SPEC §7);
* ``compress`` runs dagctx compaction (SPEC §8) and returns the branch as dagctx renders
  it in OpenAI format: Hermes's system prompt, the rolling summary, the verbatim tail.

Summaries come from the endpoint Hermes itself talks to (``update_model`` passes its
base URL and key): the daemon is started with ``samplingEndpoint`` pointing there and the
key in an environment variable only the daemon sees. ``structural_fallback`` opts into
dagctx's deterministic non-LLM summary when no endpoint answers.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import weakref
from typing import Any

from agent.context_engine import ContextEngine

from .bridge import ClientBridge
from .ingest import Ledger, content_text, sync

log = logging.getLogger("dagctx_hermes")

#: dagctx recommends compaction at 70 % and needs it at 80 % of the input budget (SPEC §7).
NEEDS_COMPACTION = 0.80
API_KEY_ENV = "DAGCTX_HERMES_API_KEY"

#: Hermes session id → the engine copy serving it (for the ``post_llm_call`` hook).
LIVE: weakref.WeakValueDictionary[str, DagctxContextEngine] = weakref.WeakValueDictionary()


#: The daemon connections of this process, by what they were started with (``bridge()``).
BRIDGES: dict[tuple[Any, ...], ClientBridge] = {}


def engine_for(session_id: str | None) -> DagctxContextEngine | None:
    return LIVE.get(session_id) if session_id else None


def _command_from_env() -> list[str] | None:
    """``DAGCTX_COMMAND`` (a JSON array), as the TypeScript client reads it."""
    raw = os.environ.get("DAGCTX_COMMAND", "").strip()
    if not raw:
        return None
    argv = json.loads(raw)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"DAGCTX_COMMAND must be a non-empty JSON array of strings, got {raw}")
    return argv


class DagctxContextEngine(ContextEngine):
    """A Hermes context engine whose record and compaction are dagctx's."""

    threshold_percent = NEEDS_COMPACTION

    def __init__(
        self,
        database: str | None = None,
        *,
        command: list[str] | None = None,
        structural_fallback: bool = False,
        keep_recent_tokens: int | None = None,
        bridge: ClientBridge | None = None,
    ) -> None:
        self.database = database if database is not None else (os.environ.get("DAGCTX_DB") or None)
        self.command = command if command is not None else _command_from_env()
        self.structural_fallback = structural_fallback
        self.keep_recent_tokens = keep_recent_tokens
        self.model = ""
        self.base_url = ""
        self._api_key = ""
        self._bridge = bridge
        self._bridge_key: tuple[Any, ...] | None = None
        self._ledger: Ledger | None = None
        self._hermes_session = ""
        self.last_compaction: Any = None

    # ------------------------------------------------------------ identity

    @property
    def name(self) -> str:
        return "dagctx"

    def is_available(self) -> bool:
        return True

    def __deepcopy__(self, memo: dict[int, Any]) -> DagctxContextEngine:
        """Hermes deep-copies a plugin engine per agent: share the connection, copy the state."""
        twin = copy.copy(self)
        twin._ledger = copy.deepcopy(self._ledger, memo)
        return twin

    # ------------------------------------------------------------ the daemon

    def _options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if self.model and self.context_length:
            out = min(16384, self.context_length // 4)
            opts["models"] = {self.model: {"contextWindow": self.context_length, "maxOutput": out}}
            opts["defaultModel"] = self.model
        if self.base_url and self.model:
            opts["samplingEndpoint"] = {"baseUrl": self.base_url, "model": self.model, "apiKeyEnv": API_KEY_ENV}
        return opts

    def bridge(self) -> ClientBridge:
        """The daemon connection for the current model and endpoint.

        Connections are shared by every engine copy (Hermes deep-copies the plugin engine
        for each agent and subagent) and keyed by what the daemon is started with, so a
        subagent on another model gets its own daemon and never closes its parent's.
        """
        key = (self.database, tuple(self.command or ()), self.model, self.context_length, self.base_url,
               self._api_key)
        if self._bridge is not None and self._bridge_key is None:  # given by the caller
            return self._bridge
        bridge = BRIDGES.get(key)
        if bridge is None or bridge.closed:
            bridge = BRIDGES[key] = self._new_bridge()
        self._bridge, self._bridge_key = bridge, key
        return bridge

    def _new_bridge(self) -> ClientBridge:
        from dagctx.client import DagctxClient

        opts = self._options()
        env = dict(os.environ)
        if self._api_key:
            env[API_KEY_ENV] = self._api_key
        database, command = self.database, self.command

        async def connect() -> Any:
            return await DagctxClient.spawn(database, command=command, env=env, initialization_options=opts)

        return ClientBridge(connect)

    def close(self) -> None:
        """Close every daemon connection of this process (they reopen on the next use)."""
        for bridge in list(BRIDGES.values()):
            bridge.close()
        BRIDGES.clear()
        if self._bridge is not None:
            self._bridge.close()
        self._bridge = None

    def ledger(self) -> Ledger:
        if self._ledger is None:
            self.on_session_start(self._hermes_session or "hermes")
        assert self._ledger is not None
        return self._ledger

    @property
    def session_id(self) -> str | None:
        """The dagctx session this engine records into."""
        return self._ledger.session_id if self._ledger else None

    # ------------------------------------------------------------ lifecycle

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        """Open (or resume) the dagctx session of a Hermes session.

        A compaction boundary (``boundary_reason="compression"``) may give the Hermes
        session a new id; the dagctx session — the whole record — continues.
        """
        LIVE[session_id] = self
        same = self._ledger is not None and session_id == self._hermes_session
        if same or (kwargs.get("boundary_reason") == "compression" and self._ledger is not None):
            self._hermes_session = session_id
            return
        self._hermes_session = session_id
        model = self.model or None

        async def open_session(client: Any) -> Ledger:
            offset = 0
            while True:
                page = await client.session_list(limit=200, offset=offset)
                for s in page.sessions:
                    if s.metadata.get("hermesSessionId") == session_id:
                        # Resume: Hermes's list should continue the branch as dagctx renders it;
                        # if it does not match, what differs is appended as a fork (ingest.sync).
                        led = Ledger(s.session_id, s.root_id)
                        r = await client.render(s.session_id, model=model, format="openai", include_system=False)
                        led.adopt(list(r.messages), s.head)
                        return led
                offset += len(page.sessions)
                if not page.sessions or offset >= page.total:
                    break
            s = await client.session_create(f"hermes {session_id}", hermesSessionId=session_id)
            info = await client.session_get(s.session_id)
            return Ledger(s.session_id, info.root_id)

        self._ledger = self.bridge().run(open_session)

    def on_session_end(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        if self._ledger is not None and messages:
            self.ingest(messages)

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self._ledger = None

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "") -> None:
        super().update_model(model, context_length, base_url, api_key, provider, api_mode)
        self.model, self.base_url, self._api_key = model, base_url, api_key

    # ------------------------------------------------------------ turns

    def ingest(self, messages: list[dict[str, Any]]) -> int:
        """Record what ``messages`` has that dagctx has not seen; returns how many were new."""
        led, model = self.ledger(), self.model
        return self.bridge().run(lambda c: sync(c, led, messages, model))

    def update_from_response(self, usage: dict[str, Any]) -> None:
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        self.last_prompt_tokens = prompt
        self.last_completion_tokens = completion
        self.last_total_tokens = int(usage.get("total_tokens") or prompt + completion)
        if self._ledger is not None and prompt:
            # SPEC §7: report OpenAI's prompt_tokens − cached as input and cached as cacheRead.
            cached = int(usage.get("cache_read_tokens") or 0)
            self._ledger.pending_usage = {"input": max(0, prompt - cached), "output": completion,
                                          "cache_read": cached,
                                          "cache_write": int(usage.get("cache_write_tokens") or 0)}

    def budget(self) -> Any:
        """``context/prepare`` for the session's HEAD (promptMode none: it only measures)."""
        led, model = self.ledger(), self.model or None
        prep = self.bridge().run(lambda c: c.prepare(led.session_id, model=model, prompt_mode="none",
                                                     format="openai"))
        self.context_length = prep.budget.context_window
        self.threshold_tokens = int(prep.budget.input_budget * NEEDS_COMPACTION)
        return prep

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        prep = self.budget()
        used = prompt_tokens if prompt_tokens and prompt_tokens > 0 else self.last_prompt_tokens
        return bool(prep.needs_compaction or (used > 0 and used >= self.threshold_tokens))

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        self.ingest(messages)
        return bool(self.budget().needs_compaction)

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        return sum(1 for m in messages if m.get("role") == "user") > 1

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False, memory_context: str = "") -> list[dict[str, Any]]:
        """dagctx compaction of the branch; the rendered branch (summary + verbatim tail)."""
        self.ingest(messages)
        led, model = self.ledger(), self.model or None
        instructions = "\n\n".join(x for x in (focus_topic and f"Focus on: {focus_topic}", memory_context) if x) or None
        kw: dict[str, Any] = {"model": model, "instructions": instructions,
                              "fallback": "structural" if self.structural_fallback else "none"}
        if self.keep_recent_tokens:
            kw["keep_recent_tokens"] = self.keep_recent_tokens

        async def compact_and_render(c: Any) -> tuple[Any, Any, str]:
            res = await c.compact(led.session_id, **kw)
            r = await c.render(led.session_id, model=model, format="openai", include_system=False)
            head = (await c.session_get(led.session_id)).head
            return res, r, head

        res, render, head = self.bridge().run(compact_and_render)
        self.last_compaction = res
        if not res.ok or not res.summary_id:
            log.warning("dagctx compaction did not write a summary (%s); the messages stay as they are",
                        getattr(res, "reason", None) or "nothing to cover")
            return messages
        system = [m for m in messages[:1] if m.get("role") == "system"]
        out = system + list(render.messages)
        led.adopt(out, head)
        self.compression_count += 1
        self.last_prompt_tokens = render.tokens.total
        return out

    # ------------------------------------------------------------ tools

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [{
            "name": "dagctx_search",
            "description": "Search everything this and earlier sessions recorded, including what compaction "
                           "summarised away (full tool outputs too). Returns snippets with node ids.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "words, identifiers, \"phrases\""},
                "allSessions": {"type": "boolean", "description": "search every session, not just this one"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
                "required": ["query"]},
        }]

    def handle_tool_call(self, name: str, args: dict[str, Any], **kwargs: Any) -> str:
        from dagctx.client import RpcError

        if name != "dagctx_search":
            return super().handle_tool_call(name, args, **kwargs)
        if kwargs.get("messages"):
            self.ingest(kwargs["messages"])
        query = str(args.get("query", ""))
        sid = None if args.get("allSessions") else self.ledger().session_id
        limit = int(args.get("limit") or 10)
        try:
            res = self.bridge().run(lambda c: c.search(query, session_id=sid, limit=limit))
        except RpcError as exc:
            return json.dumps({"error": exc.message, "kind": exc.kind}, ensure_ascii=False)
        return json.dumps({"hits": [{"sessionId": h.session_id, "nodeId": h.node_id, "role": h.role,
                                     "snippet": h.snippet} for h in res.hits]}, ensure_ascii=False)

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status["engine"] = "dagctx"
        status["dagctx_session"] = self.session_id
        return status


__all__ = ["DagctxContextEngine", "content_text"]
