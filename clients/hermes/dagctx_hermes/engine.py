"""``DagctxContextEngine``: Hermes Agent's ``ContextEngine`` backed by the dagctx daemon.

Hermes owns the loop and the message list; dagctx owns the record and the decision:

* every message Hermes shows the engine is appended to a dagctx session (``ingest.sync``),
  so nothing compaction folds away is lost — it stays searchable (``dagctx_search``);
* ``should_compress`` answers from dagctx's budget for the model Hermes runs
  (``context/prepare``: compaction is needed at ≥ 80 % of the input budget, SPEC §7);
* ``compress`` runs dagctx compaction (SPEC §8) and returns the branch as dagctx renders
  it in OpenAI format: Hermes's system prompt, the rolling summary, the verbatim tail;
* ``select_context`` (Hermes's per-request seam) leaves a request that fits untouched and
  swaps in dagctx's rendered branch for one that would not fit;
* ``carry_over_new_session_context`` starts the new session's record with the old one's
  rolling summary.

dagctx is never a reason for Hermes to fail: every engine method that needs the daemon
catches its failures (not reachable, timed out, an error answer) and hands that call to
Hermes's built-in ``ContextCompressor``, with ONE warning per outage; after a connection
failure dagctx is left alone for ``RETRY_AFTER`` seconds (a dead daemon costs a turn
nothing), then tried again — and what Hermes said meanwhile is recorded then, since the
ledger syncs by prefix.

Rooms: this module decides, per Hermes call, what dagctx does and what Hermes's own
compressor does instead; ``outage.py`` is whether dagctx is failing (one warning per
outage, across engine copies and processes); ``connection.py`` is how the daemon is
reached (shared connections, options, the auxiliary model's answers to sampling);
``ingest.py`` records Hermes's messages; ``bridge.py`` runs the asyncio client on a
private loop thread.

Summaries: when Hermes has an auxiliary model for compression (``auxiliary.compression``
in its config.yaml), the engine declares the ``sampling`` capability and answers the
daemon's ``sampling/createMessage`` with Hermes's own auxiliary client (SPEC §9);
otherwise the daemon calls the endpoint Hermes itself talks to (``update_model`` passes
its base URL and key: ``samplingEndpoint``, the key in an environment variable only the
daemon sees). ``structural_fallback`` opts into dagctx's deterministic non-LLM summary
when no model answers.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from agent.context_engine import ContextEngine

from .bridge import ClientBridge
from .connection import BRIDGES, auxiliary_compression, command_from_env, daemon_options, find_session, hermes_config
from .connection import new_bridge
from .ingest import Ledger, content_text, sync
from .outage import OUTAGE

log = logging.getLogger("dagctx_hermes")
T = TypeVar("T")

#: dagctx recommends compaction at 70 % and needs it at 80 % of the input budget (SPEC §7).
NEEDS_COMPACTION = 0.80
#: How long a compaction waits for the daemon (other calls: ``connection.CALL_TIMEOUT``).
COMPACT_TIMEOUT = 180.0

#: Hermes session id → the engine copy serving it (for the ``post_llm_call`` hook).
LIVE: weakref.WeakValueDictionary[str, DagctxContextEngine] = weakref.WeakValueDictionary()


def engine_for(session_id: str | None) -> DagctxContextEngine | None:
    return LIVE.get(session_id) if session_id else None


def rough_tokens(messages: list[dict[str, Any]]) -> int:
    """A request's size the way Hermes estimates it before it has usage: characters / 4."""
    return len(json.dumps(messages, ensure_ascii=False, default=str)) // 4


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
        auxiliary_summaries: bool | None = None,
    ) -> None:
        self.database = database if database is not None else (os.environ.get("DAGCTX_DB") or None)
        self.command = command if command is not None else command_from_env()
        self.structural_fallback = structural_fallback
        self.keep_recent_tokens = keep_recent_tokens
        #: None: use Hermes's auxiliary model for summaries when its config names one
        self.auxiliary_summaries = auxiliary_summaries
        self.model = ""
        self.base_url = ""
        self._api_key = ""
        self._provider = ""
        self._api_mode = ""
        self._bridge = bridge
        self._bridge_key: tuple[Any, ...] | None = None
        self._ledger: Ledger | None = None
        self._hermes_session = ""
        self._previous: tuple[str, str] | None = None  # (Hermes session, dagctx session) before a reset
        self._builtin_engine: Any = None
        self.last_compaction: Any = None
        self.summaries_by = ""  # "hermes-auxiliary" | "endpoint" | "" (none configured)
        self.fallback_calls = 0

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
        twin._builtin_engine = None  # each copy builds its own when it needs one
        return twin

    # ------------------------------------------------------------ dagctx or Hermes's own

    def _dagctx(self, what: str, call: Callable[[], T], fallback: Callable[[], T]) -> T:
        """``call()`` through dagctx; on any dagctx failure ``fallback()`` for this call.
        While a connection failure is recent, dagctx is not tried (``outage.RETRY_AFTER``)."""
        if OUTAGE.paused():
            self.fallback_calls += 1
            return fallback()
        try:
            out = call()
        except Exception as exc:  # noqa: BLE001 - dagctx must never break Hermes's loop
            OUTAGE.failed(what, exc)
            self.fallback_calls += 1
            return fallback()
        OUTAGE.recovered()
        return out

    def builtin(self) -> Any:
        """Hermes's own ``ContextCompressor`` for this agent, as ``agent_init`` would build it
        (Hermes's ``compression`` settings), made when dagctx first fails."""
        if self._builtin_engine is None:
            from agent.context_compressor import ContextCompressor

            comp = hermes_config().get("compression") or {}
            kw: dict[str, Any] = {}
            for key, arg in (("threshold", "threshold_percent"), ("protect_first_n", "protect_first_n"),
                             ("protect_last_n", "protect_last_n"), ("target_ratio", "summary_target_ratio")):
                if isinstance(comp, dict) and comp.get(key) is not None:
                    kw[arg] = comp[key]
            fb = ContextCompressor(model=self.model or "unknown", base_url=self.base_url, api_key=self._api_key,
                                   config_context_length=self.context_length or None, provider=self._provider,
                                   api_mode=self._api_mode, quiet_mode=True, **kw)
            if self._hermes_session:
                try:
                    fb.on_session_start(self._hermes_session)
                except Exception:  # noqa: BLE001 - its own session state is optional
                    log.debug("the built-in compressor's on_session_start failed", exc_info=True)
            fb.last_prompt_tokens = self.last_prompt_tokens
            fb.last_completion_tokens = self.last_completion_tokens
            fb.last_total_tokens = self.last_total_tokens
            self._builtin_engine = fb
        return self._builtin_engine

    def _from_builtin(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn`` on the built-in compressor and show its numbers as this engine's."""
        fb = self.builtin()
        count = fb.compression_count
        out = fn(fb)
        self.compression_count += max(0, fb.compression_count - count)
        self.threshold_tokens = fb.threshold_tokens
        self.last_prompt_tokens = fb.last_prompt_tokens
        return out

    # ------------------------------------------------------------ the daemon

    def _use_auxiliary(self) -> bool:
        if self.auxiliary_summaries is not None:
            return self.auxiliary_summaries
        return auxiliary_compression() is not None

    def bridge(self) -> ClientBridge:
        """The daemon connection for the current model and endpoint.

        Connections are shared by every engine copy (Hermes deep-copies the plugin engine
        for each agent and subagent) and keyed by what the daemon is started with, so a
        subagent on another model gets its own daemon and never closes its parent's.
        """
        aux = self._use_auxiliary()
        self.summaries_by = "hermes-auxiliary" if aux else ("endpoint" if self.base_url and self.model else "")
        key = (self.database, tuple(self.command or ()), self.model, self.context_length, self.base_url,
               self._api_key, aux)
        if self._bridge is not None and self._bridge_key is None:  # given by the caller
            return self._bridge
        bridge = BRIDGES.get(key)
        if bridge is None or bridge.closed:
            bridge = BRIDGES[key] = self._new_bridge(aux)
        self._bridge, self._bridge_key = bridge, key
        return bridge

    def _new_bridge(self, aux: bool) -> ClientBridge:
        opts = daemon_options(self.model, self.context_length, self.base_url, client_sampling=aux)
        runtime = {"model": self.model, "provider": self._provider, "base_url": self.base_url,
                   "api_key": self._api_key, "api_mode": self._api_mode}
        return new_bridge(self.database, self.command, opts, api_key=self._api_key, runtime=runtime, aux=aux)

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
            self._open_session(self._hermes_session or "hermes")
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

        def builtin_start() -> None:
            if self._builtin_engine is not None:
                self._builtin_engine.on_session_start(session_id, **kwargs)

        self._dagctx("on_session_start", lambda: self._open_session(session_id), builtin_start)

    def _open_session(self, session_id: str) -> None:
        model = self.model or None

        async def open_session(client: Any) -> Ledger:
            s = await find_session(client, session_id)
            if s is not None:
                # Resume: Hermes's list should continue the branch as dagctx renders it;
                # if it does not match, what differs is appended as a fork (ingest.sync).
                led = Ledger(s.session_id, s.root_id)
                r = await client.render(s.session_id, model=model, format="openai", include_system=False)
                led.adopt(list(r.messages), s.head)
                return led
            s = await client.session_create(f"hermes {session_id}", hermesSessionId=session_id)
            info = await client.session_get(s.session_id)
            return Ledger(s.session_id, info.root_id)

        self._ledger = self.bridge().run(open_session)

    def on_session_end(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        if messages:
            self._dagctx("on_session_end", lambda: self._ingest(messages),
                         lambda: self.builtin().on_session_end(session_id, messages)
                         if self._builtin_engine is not None else None)

    def on_session_reset(self) -> None:
        super().on_session_reset()
        if self._ledger is not None:
            self._previous = (self._hermes_session, self._ledger.session_id)
        self._ledger = None
        if self._builtin_engine is not None:
            self._builtin_engine.on_session_reset()

    def carry_over_new_session_context(self, old_session_id: str, new_session_id: str) -> int:
        """Hermes starts a new session carrying the old one's context forward: the new dagctx
        session begins with the old session's rolling summary (a user node named
        ``context/carry-over``, ``metadata.carriedFrom``), so what dagctx renders for the new
        session — and so what ``select_context``/``compress`` give Hermes — holds it. Returns
        how many nodes were carried (0: the old session has no summary, or dagctx failed)."""
        return self._dagctx("carry_over_new_session_context",
                            lambda: self._carry_over(old_session_id, new_session_id), lambda: 0)

    def _carry_over(self, old_session_id: str, new_session_id: str) -> int:
        if self._hermes_session != new_session_id or self._ledger is None:
            self.on_session_start(new_session_id)
        led = self.ledger()
        known = self._previous[1] if self._previous and self._previous[0] == old_session_id else None
        model = self.model or None

        async def carry(client: Any) -> int:
            old = known
            if old is None:
                found = await find_session(client, old_session_id)
                old = found.session_id if found else None
            if old is None or old == led.session_id:
                return 0
            prep = await client.prepare(old, model=model, prompt_mode="none", format="openai")
            if not prep.summary_id:
                return 0
            summary = (await client.get_nodes(old, [prep.summary_id])).nodes[0]
            text = ("[Carried over from the previous session]\n" + content_text(summary.output)).strip()
            r = await client.append(led.session_id, "user", name="context/carry-over", output=text,
                                    predecessor=led.tip(len(led.prints)),
                                    metadata={"carriedFrom": {"sessionId": old, "summaryId": prep.summary_id,
                                                              "hermesSessionId": old_session_id}})
            if not led.prints:  # Hermes's messages follow the carried summary
                led.root = r.node.id
            return 1

        return self.bridge().run(carry)

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "") -> None:
        super().update_model(model, context_length, base_url, api_key, provider, api_mode)
        self.model, self.base_url, self._api_key = model, base_url, api_key
        self._provider, self._api_mode = provider, api_mode
        if self._builtin_engine is not None:
            self._builtin_engine.update_model(model, context_length, base_url, api_key, provider, api_mode)

    # ------------------------------------------------------------ turns

    def ingest(self, messages: list[dict[str, Any]]) -> int:
        """Record what ``messages`` has that dagctx has not seen; returns how many were new
        (0 when dagctx failed: the next call that reaches it records them)."""
        return self._dagctx("recording the turn", lambda: self._ingest(messages), lambda: 0)

    def _ingest(self, messages: list[dict[str, Any]]) -> int:
        led, model = self.ledger(), self.model
        return self.bridge().run(lambda c: sync(c, led, messages, model))

    def update_from_response(self, usage: dict[str, Any]) -> None:
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        self.last_prompt_tokens = prompt
        self.last_completion_tokens = completion
        self.last_total_tokens = int(usage.get("total_tokens") or prompt + completion)
        if self._builtin_engine is not None:
            self._builtin_engine.update_from_response(usage)
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
        def ask() -> bool:
            prep = self.budget()
            used = prompt_tokens if prompt_tokens and prompt_tokens > 0 else self.last_prompt_tokens
            return bool(prep.needs_compaction or (used > 0 and used >= self.threshold_tokens))

        return self._dagctx("should_compress", ask,
                            lambda: self._from_builtin(lambda fb: fb.should_compress(prompt_tokens)))

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        def ask() -> bool:
            self._ingest(messages)
            return bool(self.budget().needs_compaction)

        return self._dagctx("should_compress_preflight", ask,
                            lambda: self._from_builtin(lambda fb: fb.should_compress_preflight(messages)))

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        return sum(1 for m in messages if m.get("role") == "user") > 1

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False, memory_context: str = "") -> list[dict[str, Any]]:
        """dagctx compaction of the branch; the rendered branch (summary + verbatim tail).
        When dagctx fails, Hermes's built-in compressor compresses this list instead."""
        def builtin() -> list[dict[str, Any]]:
            return self._from_builtin(lambda fb: fb.compress(messages, current_tokens=current_tokens,
                                                             focus_topic=focus_topic, force=force,
                                                             memory_context=memory_context))

        return self._dagctx("compress", lambda: self._compress(messages, focus_topic, memory_context), builtin)

    def _compress(self, messages: list[dict[str, Any]], focus_topic: str | None,
                  memory_context: str) -> list[dict[str, Any]]:
        self._ingest(messages)
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

        res, render, head = self.bridge().run(compact_and_render, timeout=COMPACT_TIMEOUT)
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

    def select_context(self, request_messages: list[dict[str, Any]], *,
                       conversation_messages: list[dict[str, Any]] | None = None,
                       incoming_message: dict[str, Any] | None = None,
                       budget_tokens: int = 0) -> list[dict[str, Any]] | None:
        """Hermes's per-request seam (before every provider request). The conversation is
        recorded; a request that fits ``budget_tokens`` stays byte-identical (None: its cache
        prefix is kept); one that would not fit gets, instead, Hermes's system prompt and the
        branch as dagctx renders it (rolling summary, aged tool outputs, verbatim tail) when
        that is smaller. On a dagctx failure the request is left as it is."""
        def select() -> list[dict[str, Any]] | None:
            history = conversation_messages if conversation_messages is not None else request_messages
            self._ingest(history)
            if not budget_tokens or rough_tokens(request_messages) <= budget_tokens * NEEDS_COMPACTION:
                return None
            led, model = self.ledger(), self.model or None
            render = self.bridge().run(lambda c: c.render(led.session_id, model=model, format="openai",
                                                          include_system=False))
            system = [m for m in request_messages[:1] if m.get("role") == "system"]
            chosen = system + list(render.messages)
            return chosen if rough_tokens(chosen) < rough_tokens(request_messages) else None

        return self._dagctx("select_context", select, lambda: None)

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
        query = str(args.get("query", ""))
        limit = int(args.get("limit") or 10)

        def search() -> str:
            if kwargs.get("messages"):
                self._ingest(kwargs["messages"])
            sid = None if args.get("allSessions") else self.ledger().session_id
            try:
                res = self.bridge().run(lambda c: c.search(query, session_id=sid, limit=limit))
            except RpcError as exc:
                if exc.kind not in ("InvalidQuery", "InvalidParams"):
                    raise  # dagctx's trouble, not the query's
                return json.dumps({"error": exc.message, "kind": exc.kind}, ensure_ascii=False)
            return json.dumps({"hits": [{"sessionId": h.session_id, "nodeId": h.node_id, "role": h.role,
                                         "snippet": h.snippet} for h in res.hits]}, ensure_ascii=False)

        return self._dagctx("dagctx_search", search, lambda: json.dumps(
            {"error": "dagctx is not available right now; the search tool answers again when it is back",
             "kind": "Unavailable"}))

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status["engine"] = "dagctx"
        status["dagctx_session"] = self.session_id
        status["dagctx_available"] = not OUTAGE.warned
        status["summaries_by"] = self.summaries_by
        status["fallback_calls"] = self.fallback_calls
        return status


__all__ = ["DagctxContextEngine", "content_text"]
