"""The Hermes context engine (clients/hermes) inside the real ``hermes-agent``, in its own
virtualenv (tests/integration/hermes_venv.py). Hermes's own CLI is driven by
test_hermes_cli.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_stub import ChatStub
from hermes_venv import HERMES_VERSION, REPO, hermes_python

from dagctx.client import DagctxClient


def test_dagctx_engine_inside_hermes(tmp_path: Path) -> None:
    py = hermes_python()
    home = tmp_path / "hermes-home"
    home.mkdir()
    (home / "config.yaml").write_text("plugins:\n  enabled: [dagctx]\ncontext:\n  engine: dagctx\n")
    db = tmp_path / "hermes.db"
    stub = ChatStub([])
    try:
        env = {**os.environ, "HERMES_HOME": str(home), "DAGCTX_DB": str(db), "STUB_URL": stub.base_url,
               "DAGCTX_COMMAND": json.dumps([sys.executable, "-P", "-m", "dagctx.cli", "serve"]),
               "PYTHONPATH": "", "DAGCTX_HERMES_KEEP_RECENT_TOKENS": "2500"}
        proc = subprocess.run([str(py), str(Path(__file__).with_name("hermes_driver.py"))], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        stub.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])

    # Hermes's own plugin loading found and registered the engine.
    assert facts["plugin_loaded"], facts["plugin_error"]
    assert facts["is_context_engine"] and facts["engine_class"] == "DagctxContextEngine"
    assert facts["name"] == "dagctx"

    # should_compress answered from dagctx's budget: 80 % of (16,000 − 4,000 reserve).
    assert facts["context_length"] == 16000 and facts["threshold_tokens"] == 9600
    assert facts["fired_at"] is not None and facts["fired_at"] < 13

    # compress: Hermes's system prompt, dagctx's summary, the verbatim tail; summary written by
    # the endpoint Hermes uses, with Hermes's key.
    out = facts["out"]
    assert facts["compaction_ok"] and facts["compression_count"] == 1
    assert facts["after"] < facts["before"], json.dumps(out, ensure_ascii=False)[:3000]
    assert out[0] == {"role": "system", "content": "You are Hermes, a coding agent."}
    assert "[Previous conversation summary]" in json.dumps(out[1], ensure_ascii=False)
    assert any(m.get("role") == "user" and m.get("content") == facts["tail_user"] for m in out), "newest turn verbatim"
    assert any(m.get("tool_calls") for m in out[2:]) and any(m.get("role") == "tool" for m in out[2:])
    assert stub.summary_requests and stub.summary_requests[0]["model"] == "stub-model"
    assert "Bearer hermes-key" in stub.auth
    assert 0 < facts["last_prompt_tokens"] < 9600

    # after compression only the new messages are recorded; search reaches the folded turns
    assert facts["new_nodes"] == 2 and facts["retry_nodes"] == 1
    assert any("module_0" in h["snippet"] for h in facts["search"]["hits"])
    assert facts["tool_names"] == ["dagctx_search"]
    assert facts["status"]["compression_count"] == 1 and facts["status"]["dagctx_session"] == facts["session_id"]
    # a restarted Hermes resumes the same dagctx session and records only what is new
    assert facts["resumed_session"] == facts["session_id"]
    assert facts["resumed_new"] == 0 and facts["resumed_next"] == 1

    # select_context: a request that fits is left alone (byte-identical: its cache prefix stays);
    # one over the budget is Hermes's system prompt + what dagctx renders (the summary, the tail)
    assert facts["select_fits"] is None
    over = facts["select_over"]
    assert over and over[0] == {"role": "system", "content": "You are Hermes, a coding agent."}
    assert "[Previous conversation summary]" in json.dumps(over[1], ensure_ascii=False)
    assert not any("old context old context" in str(m.get("content")) for m in over)
    assert over[-1] == {"role": "user", "content": "One more thing."}

    # carry-over into a new Hermes session: its record starts with the old session's summary
    assert facts["carried"] == 1 and facts["carried_next"] == 1
    assert facts["carried_session"] != facts["session_id"]
    carried = facts["carried_nodes"]
    assert carried[0]["name"] == "context/carry-over" and carried[0]["role"] == "user"
    assert carried[0]["output"].startswith("[Carried over from the previous session]\n")
    assert "module_0" in carried[0]["output"], "the old summary's content came along"
    assert carried[0]["carriedFrom"]["sessionId"] == facts["session_id"]
    assert carried[0]["carriedFrom"]["hermesSessionId"] == "hermes-session-1"
    assert [n["output"] for n in carried[1:]] == ["Second session, first turn."]

    # dagctx erring (its session deleted under the engine): each call fell back to Hermes's
    # built-in compressor, nothing raised, ONE warning
    assert facts["err_should"] is True, "200k tokens: the built-in compressor says compress"
    assert isinstance(facts["err_preflight"], bool)
    before, after = facts["err_compressed"]
    assert 0 < after <= before
    assert facts["err_ingest"] == 0 and facts["err_select"] is None
    assert facts["err_search"]["kind"] == "Unavailable"
    assert facts["err_status"]["fallback_calls"] >= 5 and facts["err_status"]["dagctx_available"] is False
    assert len([w for w in facts["warnings"] if "dagctx failed in" in w]) == 1, facts["warnings"]
    assert "built-in compressor handles the context" in facts["warnings"][0]

    # the record, read back by a plain client
    async def check() -> None:
        c = await DagctxClient.spawn(db)
        try:
            s = await c.session_get(facts["session_id"])
            assert s.metadata.get("hermesSessionId") == "hermes-session-1"
            hist = (await c.history(s.session_id)).nodes
            assert hist[-1].output == "One more thing."
            assert hist[-2].output == "Renamed it (retry)."
            assert hist[-3].output == "Now rename handler_0 everywhere."
            tips = [b.head for b in (await c.branches(s.session_id)).branches]
            first = (await c.get_nodes(s.session_id, tips)).nodes
            assert sorted(n.output for n in first) == ["One more thing.", "Renamed handler_0 to handle_zero."]
            users = [n for n in hist if n.role == "user"]
            assert users[0].output.startswith("Turn 0: refactor src/pkg/module_0.py")
            codes = (await c.search("read_file", session_id=s.session_id, roles=["code"], limit=50)).hits
            assert codes
            nodes = (await c.get_nodes(s.session_id, [h.node_id for h in codes])).nodes
            assert all(n.status == "completed" and n.metadata.get("toolCallId") for n in nodes)
            assert all("def handler_" in n.output for n in nodes)
        finally:
            await c.close()

    asyncio.run(check())


@pytest.mark.parametrize("auxiliary", [False, True], ids=["endpoint-summaries", "auxiliary-model-summaries"])
def test_a_real_hermes_agent_compacts_through_dagctx(tmp_path: Path, auxiliary: bool) -> None:
    """hermes-agent's own AIAgent, its own tools and loop, with ``context.engine: dagctx``.
    Summaries come from the endpoint Hermes talks to — or, when Hermes's config names an
    auxiliary model for compression, from that model through Hermes's own auxiliary client
    (the engine answers the daemon's ``sampling/createMessage``)."""
    py = hermes_python()
    home = tmp_path / "hermes-home"
    home.mkdir()
    config = "plugins:\n  enabled: [dagctx]\ncontext:\n  engine: dagctx\n"
    notes = tmp_path / "notes.txt"
    notes.write_text("".join(f"line {i}: the parser handles token_{i}\n" for i in range(400)))
    db = tmp_path / "hermes.db"
    stub = ChatStub([
        {"content": "Reading.", "tool_calls": [("read_file", {"path": str(notes)})]},
        {"content": "The notes list 400 parser lines."},
        {"content": "Reading again.", "tool_calls": [("read_file", {"path": str(notes)})]},
        {"content": "Still 400 lines."},
        {"content": "Third answer."},
    ], prompt_tokens=[1000, 1200, 200_000, 1500, 2000])  # the third call reports a nearly full window
    if auxiliary:
        config += (f"auxiliary:\n  compression:\n    provider: custom\n    model: aux-model\n"
                   f"    base_url: {stub.base_url}\n    api_key: aux-key\n")
    (home / "config.yaml").write_text(config)
    try:
        env = {**os.environ, "HERMES_HOME": str(home), "DAGCTX_DB": str(db), "STUB_URL": stub.base_url,
               "DAGCTX_COMMAND": json.dumps([sys.executable, "-P", "-m", "dagctx.cli", "serve"]),
               "DAGCTX_HERMES_KEEP_RECENT_TOKENS": "300", "PYTHONPATH": ""}
        proc = subprocess.run([str(py), str(Path(__file__).with_name("hermes_agent_driver.py")),
                               "Read notes.txt", "Read it again", "And now?"],
                              env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        stub.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["engine"] == "DagctxContextEngine", "agent_init selected the plugin engine"
    assert facts["replies"] == ["The notes list 400 parser lines.", "Still 400 lines.", "Third answer."]
    # threshold from dagctx's budget for the window Hermes resolved: 80 % of (window − reserve)
    window = facts["status"]["context_length"]
    assert facts["status"]["threshold_tokens"] == int((window - min(16384, window // 4)) * 0.8)

    # Hermes decided to compress after the 200k report; dagctx wrote the summary with the stub
    assert facts["compression_count"] == 1 and facts["summary_id"]
    assert stub.summary_requests
    if auxiliary:  # Hermes's auxiliary client made the summary request, with its model and key
        assert facts["status"]["summaries_by"] == "hermes-auxiliary"
        assert {r["model"] for r in stub.summary_requests} == {"aux-model"}
        assert "Bearer aux-key" in stub.auth
    else:
        assert facts["status"]["summaries_by"] == "endpoint"
        assert {r["model"] for r in stub.summary_requests} == {"stub-model"} and "Bearer aux-key" not in stub.auth
        assert "Bearer hermes-key" in stub.auth
    after = stub.agent_requests[3]["messages"]
    assert after[0]["role"] == "system"
    assert after[1]["role"] == "user" and after[1]["content"].startswith("[Previous conversation summary]")
    assert after[1]["content"].endswith("Read it again"), "the newest user turn stays verbatim"
    assert not any(m.get("content") == "Read notes.txt" for m in after), "turn one was folded"
    assert after[2]["role"] == "assistant" and after[3]["role"] == "tool"

    async def check() -> None:
        c = await DagctxClient.spawn(db)
        try:
            s = await c.session_get(facts["session_id"])
            assert s.metadata.get("hermesSessionId") == "hermes-real-1"
            hist = (await c.history(s.session_id)).nodes
            users = [n.output for n in hist if n.role == "user"]
            assert users == ["Read notes.txt", "Read it again", "And now?"], "every turn recorded (post_llm_call)"
            assert hist[-1].output == "Third answer."
            codes = (await c.search("read_file", session_id=s.session_id, roles=["code"])).hits
            nodes = (await c.get_nodes(s.session_id, [h.node_id for h in codes])).nodes
            assert len(nodes) == 2 and all(n.status == "completed" and "token_399" in n.output for n in nodes)
        finally:
            await c.close()

    asyncio.run(check())


def test_dagctx_mcp_on_the_mcp_hermes_pins(tmp_path: Path) -> None:
    """The MCP face's whole test file, run in the Hermes virtualenv — on ``mcp`` 1.26, the SDK
    ``hermes-agent[mcp]`` pins (this suite's own venv has 2.x): both SDK generations served."""
    py = hermes_python()
    versions = subprocess.run([str(py), "-c", "import importlib.metadata as m; "
                               "print(m.version('mcp'), m.version('hermes-agent'))"],
                              capture_output=True, text=True, timeout=60)
    assert versions.stdout.split() == ["1.26.0", HERMES_VERSION], versions.stdout + versions.stderr
    proc = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                           f"--basetemp={tmp_path / 'pt'}", str(REPO / "tests" / "integration" / "test_mcp.py")],
                          env={**os.environ, "PYTHONPATH": ""}, cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "failed" not in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_the_engine_call_timeout_is_read_from_the_environment() -> None:
    """``DAGCTX_HERMES_TIMEOUT`` sets how long an engine call waits for the daemon; a value
    that is not a positive number of seconds keeps the default (clients/hermes/README.md)."""
    py = hermes_python()
    script = ("import json, os, sys\n"
              "from dagctx_hermes import connection as c\n"
              "out = []\n"
              "for v in sys.argv[1:]:\n"
              "    os.environ['DAGCTX_HERMES_TIMEOUT'] = v\n"
              "    out.append(c.call_timeout())\n"
              "os.environ.pop('DAGCTX_HERMES_TIMEOUT')\n"
              "out.append(c.call_timeout())\n"
              "print(json.dumps(out))\n")
    proc = subprocess.run([str(py), "-c", script, "600", "2.5", "0", "-3", "soon", "inf", "nan"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [600.0, 2.5, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0]
