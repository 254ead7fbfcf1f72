"""The Hermes context engine (clients/hermes) inside the real ``hermes-agent``.

hermes-agent pins versions that conflict with ours, so it gets its own virtualenv under
the user cache directory, built once and reused between runs: hermes-agent at the
version tested, msgspec, dagctx (no deps: the engine only needs the client and the
protocol; the daemon runs from this test's interpreter via ``DAGCTX_COMMAND``) and
dagctx-hermes (editable). Locally a venv that cannot be built is a skip with the
reason; in CI (``CI`` set) it is a failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from chat_stub import ChatStub

from dagctx.client import DagctxClient

REPO = Path(__file__).resolve().parents[2]
HERMES_VERSION = "0.19.0"
MARKER = f"hermes-agent=={HERMES_VERSION} dagctx-hermes=editable v1 {REPO}"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dagctx-tests"


def _fail_or_skip(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the Hermes virtualenv is required in CI: {why}")
    pytest.skip(f"hermes-agent {HERMES_VERSION} could not be installed into its own virtualenv: {why}")


def hermes_python() -> Path:
    """The cached virtualenv's interpreter, building the venv when it is missing or stale."""
    # one venv per checkout: its editable installs point into this repository
    tag = hashlib.sha1(str(REPO).encode()).hexdigest()[:8]
    root = _cache_root() / f"hermes-venv-{HERMES_VERSION}-{tag}"
    py = root / "bin" / "python"
    marker = root / "dagctx-ready"
    if py.exists() and marker.exists() and marker.read_text() == MARKER:
        return py
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(root)
            pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        except (subprocess.CalledProcessError, OSError):
            # no ensurepip (Debian without python3-venv): this pip installs into the venv
            venv.EnvBuilder(with_pip=False, clear=True).create(root)
            pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--disable-pip-version-check"]
        for args in ([f"hermes-agent=={HERMES_VERSION}", "msgspec>=0.19"],
                     ["--no-deps", "-e", str(REPO)],
                     ["--no-deps", "-e", str(REPO / "clients" / "hermes")]):
            proc = subprocess.run(pip + args, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                _fail_or_skip(f"pip install {' '.join(args)} failed: {proc.stderr[-1500:]}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        _fail_or_skip(str(exc))
    marker.write_text(MARKER)
    return py


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


def test_a_real_hermes_agent_compacts_through_dagctx(tmp_path: Path) -> None:
    """hermes-agent's own AIAgent, its own tools and loop, with ``context.engine: dagctx``."""
    py = hermes_python()
    home = tmp_path / "hermes-home"
    home.mkdir()
    (home / "config.yaml").write_text("plugins:\n  enabled: [dagctx]\ncontext:\n  engine: dagctx\n")
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
    assert stub.summary_requests and "Bearer hermes-key" in stub.auth
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
