"""Hermes's own CLI (``hermes chat -q``, a process per turn, ``--continue``) against a loopback
model: the turns, the model's script, a Hermes home per way, and the runner that
tests/integration/test_hermes_cli.py and bench/bench_hermes.py share.

(Not named ``hermes_cli``: that is hermes-agent's own package, which the drivers import.)"""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from chat_stub import ChatStub

#: what the loopback model answers, turn by turn; the third turn calls dagctx's MCP tool
#: through Hermes's own MCP client
#: (four: a turn before the tool call has history, the call, a turn after it; each turn is a
#: whole Hermes process, ~12 s of its start-up on a loaded machine)
CLI_TURNS = ["Start: the parser handles token_1.", "Now the lexer, token_2.", "What did we say about quasar?",
             "Add a test for token_4."]


#: the turn whose model reply calls dagctx's MCP tool, and the tool's name as Hermes offers it
TOOL_TURN = 2
MCP_TOOL = "mcp__dagctx__search_history"


def cli_script() -> list[dict]:
    out: list[dict] = []
    for i in range(len(CLI_TURNS)):
        if i == TOOL_TURN:
            out.append({"content": "Searching the history.", "tool_calls": [(MCP_TOOL, {"query": "quasar"})]})
        out.append({"content": f"Reply {i + 1}."})
    return out


def cli_home(root: Path, way: str, engine: str, stub_url: str, py: Path, mcp_db: Path) -> Path:
    home = root / f"home-{way}"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(
        "model:\n  default: stub-model\n  provider: custom\n"
        f"  base_url: {stub_url}\n  api_key: hermes-key\n"
        "security:\n  tirith_enabled: false\n"
        # a loaded machine starts `dagctx mcp` slower than Hermes's 1.5 s default wait
        "mcp_discovery_timeout: 600\n"
        "plugins:\n  enabled: [dagctx]\n"
        f"context:\n  engine: {engine}\n"
        # Hermes's own MCP client (mcp 1.26) starts `dagctx mcp` with its minimal environment
        f"mcp_servers:\n  dagctx:\n    command: {py}\n"
        f"    args: [\"-P\", \"-m\", \"dagctx.cli\", \"mcp\", \"--db\", \"{mcp_db}\", \"--standalone\"]\n")
    return home


def run_turns(tmp_path: Path, py: Path, mcp_db: Path, ways: dict[str, dict[str, str]],
              engines: dict[str, str]) -> tuple[dict[str, list[float]], dict[str, list[str]], dict[str, ChatStub],
                                                dict[str, Path]]:
    """Every turn of CLI_TURNS, turn by turn, the ways at the same time (the machine's load
    hits every way alike). ``ways`` maps a way to its extra environment, ``engines`` to its
    Hermes context engine. Returns the wall seconds and the stdout of each turn, the stubs
    (closed) and the Hermes homes, per way. A turn that fails raises AssertionError."""
    stubs = {way: ChatStub(cli_script()) for way in ways}
    homes = {way: cli_home(tmp_path, way, engines[way], stubs[way].base_url, py, mcp_db) for way in ways}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    outputs: dict[str, list[str]] = {way: [] for way in ways}

    def one(way: str, turn: int, prompt: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        env = {**os.environ, "HERMES_HOME": str(homes[way]), "PYTHONPATH": "", **ways[way]}
        argv = [str(py.parent / "hermes"), "chat", "-Q", "-t", "file,dagctx", "-q", prompt]
        if turn:
            argv.append("--continue")
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        return time.perf_counter() - start, proc

    def offered_mcp(way: str, since: int) -> bool:
        """Whether the turn's first request to the model offered dagctx's MCP tool."""
        reqs = stubs[way].agent_requests[since:]
        return bool(reqs) and any((t.get("function") or {}).get("name") == MCP_TOOL for t in reqs[0].get("tools") or [])

    try:
        with ThreadPoolExecutor(len(ways)) as pool:
            for turn, prompt in enumerate(CLI_TURNS):
                sent = {way: len(stubs[way].agent_requests) for way in ways}
                script = {way: list(stubs[way].script) for way in ways}
                done = {way: pool.submit(one, way, turn, prompt) for way in ways}
                for way, fut in done.items():
                    took, proc = fut.result()
                    if turn == TOOL_TURN and proc.returncode == 0 and not offered_mcp(way, sent[way]):
                        # Hermes 0.19's one-shot CLI sometimes snapshots its tools before its
                        # background MCP discovery has started any server (seen once in a loaded
                        # full run: no `dagctx mcp` was started in that process at all, so the model
                        # was not offered the tool). Not dagctx's doing: the turn runs again, once,
                        # with the same script, and must then be offered and served the tool.
                        used = len(script[way]) - len(stubs[way].script)
                        stubs[way].script[:0] = script[way][:used]
                        sent[way] = len(stubs[way].agent_requests)
                        took, proc = one(way, turn, prompt)
                        assert offered_mcp(way, sent[way]), (way, "Hermes offered no dagctx MCP tool twice")
                    seconds[way].append(took)
                    assert proc.returncode == 0, (way, turn, proc.stdout[-2000:], proc.stderr[-3000:])
                    outputs[way].append(proc.stdout)
    finally:
        for stub in stubs.values():
            stub.close()
    return seconds, outputs, stubs, homes
