"""Hermes's own CLI with the dagctx engine, and with dagctx unreachable (SPEC §9).

Apart from test_hermes.py so that the two files run on different test workers. The per-turn
latency against Hermes's default engine is measured by bench/bench_hermes.py, not here: no
test times anything.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from hermes_cli_turns import CLI_TURNS, run_turns
from hermes_venv import hermes_python

from dagctx.client import DagctxClient


def test_hermes_cli_turns_with_dagctx_and_with_dagctx_unreachable(tmp_path: Path) -> None:
    """Hermes's own CLI (``hermes chat -q``, a process per turn, ``--continue``) for 4 turns
    against a loopback model, two ways side by side, turn by turn: dagctx, and dagctx
    unreachable (its daemon command dies at once). Every turn completes each way; with dagctx
    every turn is recorded once; unreachable, the built-in compressor serves and Hermes logs
    ONE warning for the 4 turns. Hermes's own MCP client reaches ``dagctx mcp`` (mcp 1.26) in
    every run."""
    py = hermes_python()
    mcp_db = tmp_path / "mcp.db"

    async def seed() -> None:
        c = await DagctxClient.spawn(mcp_db)
        try:
            s = await c.session_create("earlier work")
            await c.append(s.session_id, "user", output="We named the release quasar-7 last week.", predecessor=s.head)
        finally:
            await c.close()

    asyncio.run(seed())
    db = tmp_path / "hermes.db"
    ways = {
        # a loaded test machine can take longer than the default 30 s to start a daemon: this
        # way must be served by dagctx, not fall back
        "dagctx": {"DAGCTX_DB": str(db), "DAGCTX_HERMES_TIMEOUT": "600"},
        "unreachable": {"DAGCTX_DB": str(tmp_path / "never.db"),
                        "DAGCTX_COMMAND": json.dumps([sys.executable, "-c", "import sys; sys.exit('dagctx is down')"])},
    }
    _seconds, outputs, stubs, homes = run_turns(tmp_path, py, mcp_db, ways, {way: "dagctx" for way in ways})

    for way in ways:
        # every turn answered: the loopback model's reply reached the user
        for turn, out in enumerate(outputs[way]):
            assert f"Reply {turn + 1}." in out, (way, turn, out[-1500:])
        # Hermes's own MCP client called dagctx's tool, and the model got dagctx's answer
        results = [m for r in stubs[way].agent_requests for m in r["messages"] if m.get("role") == "tool"]
        assert any("# search_history" in str(m.get("content")) and "quasar" in str(m.get("content"))
                   for m in results), (way, results)

    # Hermes's own log (errors.log repeats its warnings)
    logs = {way: (homes[way] / "logs" / "agent.log").read_text(errors="replace") for way in ways}
    # unreachable: one warning for the whole outage, and no compaction crashed a turn
    warnings = [ln for ln in logs["unreachable"].splitlines() if "WARNING" in ln and "dagctx failed in" in ln]
    assert len(warnings) == 1, warnings
    assert "built-in compressor handles the context" in warnings[0]
    assert "dagctx failed" not in logs["dagctx"]

    async def check() -> None:
        c = await DagctxClient.spawn(db)
        try:
            sessions = (await c.session_list()).sessions
            assert len(sessions) == 1, [s.title for s in sessions]
            hist = (await c.history(sessions[0].session_id)).nodes
            users = [n.output for n in hist if n.role == "user"]
            assert users == CLI_TURNS, "each turn recorded once, in order"
            replies = [n.output for n in hist if n.role == "llm" and n.output.startswith("Reply")]
            assert replies == [f"Reply {i + 1}." for i in range(len(CLI_TURNS))]
            # the MCP tool call is recorded like any other, completed with dagctx's answer
            hits = (await c.search("quasar", session_id=sessions[0].session_id, roles=["code"])).hits
            nodes = (await c.get_nodes(sessions[0].session_id, [h.node_id for h in hits])).nodes
            assert [n.name for n in nodes] == ["mcp__dagctx__search_history"], nodes
            assert nodes[0].status == "completed" and "# search_history" in str(nodes[0].output)
        finally:
            await c.close()

    asyncio.run(check())
