"""Context engines by name: built-ins, entry-point plugins, fallback on failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dagctx.client import DagctxClient

PLUGIN = '''
from dagctx.context.system_prompt import AssembledPrompt
from dagctx.engine.lifecycle import ContextEngine


def fixed_prompt(workspace, options):
    text = "FANCY PROMPT"
    return AssembledPrompt(text=text, hash="fancy", sections=[], notes=[], files=[])


class FancyEngine(ContextEngine):
    """Replaces one component: the system-prompt assembler."""

    def __init__(self, host):
        super().__init__(host)
        self.system_prompt_assembler = fixed_prompt


class BrokenEngine(ContextEngine):
    def prepare(self, p):
        raise RuntimeError("plugin bug")


class RecordingEngine(ContextEngine):
    """Writes every lifecycle step it hears to $LIFECYCLE_LOG; its after_turn raises."""

    def _log(self, *parts):
        import os
        with open(os.environ["LIFECYCLE_LOG"], "a") as f:
            f.write(" ".join(str(p) for p in parts) + chr(10))

    def session_start(self, session_id):
        self._log("session_start", session_id)

    def ingest(self, session_id, node):
        self._log("ingest", session_id, node.role)

    def after_turn(self, session_id, node_id, usage):
        self._log("after_turn", session_id, usage.usage.input)
        raise RuntimeError("hook bug")

    def session_end(self, session_id):
        self._log("session_end", session_id)
'''


def _install_plugin(tmp_path: Path, entry_points: str) -> dict[str, str]:
    """A site folder with the plugin module and its dist-info; the env that finds it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "fancy_engine.py").write_text(PLUGIN)
    dist = site / "fancy_engine-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fancy-engine\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dagctx.engines]\n" + entry_points)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
async def plugin_daemon(tmp_path: Path):
    env = _install_plugin(
        tmp_path,
        "fancy = fancy_engine:FancyEngine\nbroken = fancy_engine:BrokenEngine\n"
        "recording = fancy_engine:RecordingEngine\nmissing-module = no_such_module:EngineCore\n",
    )
    client = await DagctxClient.spawn(tmp_path / "e.db", env=env,
                                      initialization_options={"contextEngine": "no-reduction"})
    try:
        yield client
    finally:
        await client.close()


async def _session(c: DagctxClient) -> str:
    s = await c.session_create()
    await c.append(s.session_id, "user", output="hello", predecessor=s.head)
    return s.session_id


async def test_plugin_engine_replaces_one_component(plugin_daemon) -> None:
    sid = await _session(plugin_daemon)
    res = await plugin_daemon.prepare(sid, context_engine="fancy")
    assert res.engine == "fancy"
    assert res.system == "FANCY PROMPT"


async def test_daemon_config_chooses_the_engine_when_the_profile_does_not(plugin_daemon) -> None:
    sid = await _session(plugin_daemon)
    res = await plugin_daemon.prepare(sid)
    assert res.engine == "no-reduction"


@pytest.mark.parametrize("name", ["broken", "missing-module", "never-registered"])
async def test_failing_engine_falls_back_to_default_and_daemon_lives(plugin_daemon, name: str) -> None:
    sid = await _session(plugin_daemon)
    res = await plugin_daemon.prepare(sid, context_engine=name)
    assert res.engine == "default"
    assert any(name in step and "default engine" in step for step in res.decision_path)
    assert res.messages  # the turn still prepared
    assert (await plugin_daemon.session_get(sid)).session_id == sid


async def test_lifecycle_steps_reach_the_daemons_engine(tmp_path: Path) -> None:
    env = _install_plugin(tmp_path, "recording = fancy_engine:RecordingEngine\n")
    log = tmp_path / "lifecycle.log"
    env["LIFECYCLE_LOG"] = str(log)
    c = await DagctxClient.spawn(tmp_path / "l.db", env=env, initialization_options={"contextEngine": "recording"})
    try:
        s = await c.session_create()
        u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
        llm = await c.append(s.session_id, "llm", name="gpt-4o", output="yo", predecessor=u.head)
        res = await c.usage_report(s.session_id, llm.node.id, input=42, output=2)  # its hook raises
        assert res.measured_prompt == 42
        await c.session_delete(s.session_id)
    finally:
        await c.close()
    sid = s.session_id
    assert log.read_text().splitlines() == [
        f"session_start {sid}", f"ingest {sid} user", f"ingest {sid} llm", f"after_turn {sid} 42",
        f"session_end {sid}",
    ]
