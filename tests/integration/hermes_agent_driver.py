# pyright: reportMissingImports=false
# (runs inside the Hermes test virtualenv, where hermes-agent is installed)
"""Run inside the Hermes virtualenv: a real ``AIAgent`` conversation with the dagctx engine.

``context.engine: dagctx`` in ``$HERMES_HOME/config.yaml`` makes ``agent_init`` select the
plugin engine (plugin manager → entry point → ``register(ctx)`` → deep copy →
``update_model``). The agent talks to the loopback chat stub (``STUB_URL``, streaming),
runs its own tools, and decides by itself when to compress; the engine records each turn
(``post_llm_call``) and compresses through dagctx. Prints one JSON line of facts.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    from run_agent import AIAgent

    agent = AIAgent(base_url=os.environ["STUB_URL"], api_key="hermes-key", model="stub-model", provider="custom",
                    quiet_mode=True, skip_context_files=True, skip_memory=True, enabled_toolsets=["file"],
                    max_iterations=6, session_id="hermes-real-1")
    engine = agent.context_compressor
    facts: dict = {"engine": type(engine).__name__, "threshold_tokens": engine.threshold_tokens,
                   "context_length": engine.context_length}
    replies, history = [], None
    for task in sys.argv[1:]:
        res = agent.run_conversation(task, conversation_history=history)
        replies.append(res["final_response"])
        history = res.get("messages")
    facts["replies"] = replies
    facts["final_messages"] = history
    facts["compression_count"] = engine.compression_count
    facts["session_id"] = engine.session_id
    facts["status"] = engine.get_status()
    compaction = engine.last_compaction
    facts["summary_id"] = getattr(compaction, "summary_id", None)
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
