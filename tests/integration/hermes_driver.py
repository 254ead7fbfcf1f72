# pyright: reportMissingImports=false
# (runs inside the Hermes test virtualenv, where hermes-agent is installed)
"""Run inside a virtualenv that has the real ``hermes-agent`` and ``dagctx-hermes``.

Loads the dagctx engine the way Hermes does (plugin manager → entry point → ``register(ctx)``
→ ``get_plugin_context_engine()`` → ``copy.deepcopy``, as ``agent_init`` does), then drives
it through Hermes's ``ContextEngine`` lifecycle: ``update_model``, ``on_session_start``,
per turn ``update_from_response`` and ``should_compress``, ``compress`` when it says so,
one more turn, ``handle_tool_call``, ``on_session_end``. Prints one JSON line of facts
for the pytest side to check (it also reads the database itself).
"""

from __future__ import annotations

import copy
import json
import os
import sys


def main() -> int:
    from agent.context_engine import ContextEngine
    from hermes_cli.plugins import get_plugin_context_engine, get_plugin_manager

    facts: dict = {}
    registered = get_plugin_context_engine()
    loaded = get_plugin_manager()._plugins.get("dagctx")
    facts["plugin_loaded"] = bool(loaded and loaded.enabled and not loaded.error)
    facts["plugin_error"] = getattr(loaded, "error", None)
    facts["is_context_engine"] = isinstance(registered, ContextEngine)
    facts["engine_class"] = type(registered).__name__
    engine = copy.deepcopy(registered)  # what agent_init does with a plugin engine
    facts["name"] = engine.name

    window = 16000
    engine.update_model(model="stub-model", context_length=window, base_url=os.environ["STUB_URL"],
                        api_key="hermes-key", provider="custom", api_mode="chat_completions")
    engine.on_session_start("hermes-session-1", platform="cli")

    system = {"role": "system", "content": "You are Hermes, a coding agent."}
    messages: list[dict] = [system]
    fired_at = None
    for turn in range(14):
        messages.append({"role": "user", "content": f"Turn {turn}: refactor src/pkg/module_{turn}.py "
                                                    + "please keep the public API stable " * 40})
        call_id = f"call_{turn}"
        messages.append({"role": "assistant", "content": f"Reading module_{turn}.",
                         "tool_calls": [{"id": call_id, "type": "function", "function": {
                             "name": "read_file", "arguments": json.dumps({"path": f"src/pkg/module_{turn}.py"})}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": f"def handler_{turn}(x):\n    return x\n" * 30})
        engine.update_from_response({"prompt_tokens": 900 * (turn + 1), "completion_tokens": 40,
                                     "total_tokens": 900 * (turn + 1) + 40})
        messages.append({"role": "assistant", "content": f"Refactored module_{turn}.py; tests pass."})
        engine.ingest(messages)
        if engine.should_compress(900 * (turn + 1)):
            fired_at = turn
            break
    facts["fired_at"] = fired_at
    facts["threshold_tokens"] = engine.threshold_tokens
    facts["context_length"] = engine.context_length
    facts["before"] = len(messages)
    facts["tail_user"] = messages[-4]["content"]
    out = engine.compress(messages, current_tokens=engine.last_prompt_tokens)
    facts["after"] = len(out)
    facts["out"] = out
    facts["compression_count"] = engine.compression_count
    facts["last_prompt_tokens"] = engine.last_prompt_tokens
    facts["compaction_ok"] = bool(engine.last_compaction and engine.last_compaction.ok
                                 and engine.last_compaction.summary_id)
    facts["compaction_reason"] = getattr(engine.last_compaction, "reason", None)
    facts["session_id"] = engine.session_id

    # Hermes continues from the compressed list.
    messages = out + [{"role": "user", "content": "Now rename handler_0 everywhere."},
                      {"role": "assistant", "content": "Renamed handler_0 to handle_zero."}]
    facts["new_nodes"] = engine.ingest(messages)
    # /retry: the last reply replaced — a fork from its user message, which becomes HEAD
    messages = messages[:-1] + [{"role": "assistant", "content": "Renamed it (retry)."}]
    facts["retry_nodes"] = engine.ingest(messages)
    facts["search"] = json.loads(engine.handle_tool_call("dagctx_search", {"query": "module_0"}, messages=messages))
    facts["tool_names"] = [t["name"] for t in engine.get_tool_schemas()]
    facts["status"] = engine.get_status()
    engine.on_session_end("hermes-session-1", messages)

    # A restarted Hermes: a new engine resumes the session; the same list records nothing twice.
    from dagctx_hermes import engine_from_env

    fresh = engine_from_env()
    fresh.update_model(model="stub-model", context_length=window, base_url=os.environ["STUB_URL"],
                       api_key="hermes-key")
    fresh.on_session_start("hermes-session-1", platform="cli")
    facts["resumed_session"] = fresh.session_id
    facts["resumed_new"] = fresh.ingest(messages)
    facts["resumed_next"] = fresh.ingest(messages + [{"role": "user", "content": "One more thing."}])

    # select_context (Hermes's per-request seam): a request that fits stays as it is (None);
    # one over the budget gets Hermes's system prompt + the branch as dagctx renders it
    history = messages + [{"role": "user", "content": "One more thing."}]
    request = [system] + history
    facts["select_fits"] = fresh.select_context(request, conversation_messages=history, budget_tokens=window)
    big = [system] + [{"role": "user", "content": "old context " * 4000}] + history
    chosen = fresh.select_context(big, conversation_messages=history, budget_tokens=2000)
    facts["select_over"] = chosen

    # carry-over: /new with context carried — the new session's record starts with the summary
    fresh.on_session_reset()
    fresh.on_session_start("hermes-session-2", platform="cli")
    facts["carried"] = fresh.carry_over_new_session_context("hermes-session-1", "hermes-session-2")
    facts["carried_session"] = fresh.session_id
    facts["carried_next"] = fresh.ingest([system, {"role": "user", "content": "Second session, first turn."}])
    sid2 = fresh.session_id
    hist2 = fresh.bridge().run(lambda c: c.history(sid2)).nodes
    facts["carried_nodes"] = [{"name": n.name, "role": n.role, "output": n.output,
                               "carriedFrom": n.metadata.get("carriedFrom")} for n in hist2]

    # dagctx errs (another client deleted the session under us): every engine call falls back
    # to Hermes's built-in compressor for that call, one warning, no exception
    import asyncio
    import logging

    from dagctx.client import DagctxClient

    caught: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                caught.append(record.getMessage())

    logging.getLogger("dagctx_hermes").addHandler(Catch())

    async def delete(sid: str) -> None:
        c = await DagctxClient.spawn(os.environ["DAGCTX_DB"], command=json.loads(os.environ["DAGCTX_COMMAND"]))
        try:
            await c.session_delete(sid)
        finally:
            await c.close()

    asyncio.run(delete(fresh.session_id))
    long = [system] + [m for t in range(12) for m in (
        {"role": "user", "content": f"Question {t}: " + "why is the sky blue " * 60},
        {"role": "assistant", "content": f"Answer {t}: " + "scattering " * 60})]
    fresh.update_from_response({"prompt_tokens": 200_000, "completion_tokens": 10, "total_tokens": 200_010})
    facts["err_should"] = fresh.should_compress(200_000)
    facts["err_preflight"] = fresh.should_compress_preflight(long)
    out2 = fresh.compress(long, current_tokens=200_000)
    facts["err_compressed"] = [len(long), len(out2)]
    facts["err_ingest"] = fresh.ingest(long)
    facts["err_select"] = fresh.select_context(long, conversation_messages=long[1:], budget_tokens=1000)
    facts["err_search"] = json.loads(fresh.handle_tool_call("dagctx_search", {"query": "sky"}))
    facts["err_status"] = fresh.get_status()
    facts["warnings"] = caught
    engine.close()
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
