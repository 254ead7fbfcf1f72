"""The dagctx plugin inside a real OpenClaw gateway (Node ≥ 24, the pinned `openclaw`
package), installed with `openclaw plugins install` from the packed archive, against a
deterministic loopback model stub with tool calls, at a 16k window.

Eight turns, then dagctx stopped. What it proves, from the gateway's own logs, the
requests the model received, the plugin's trace and the dagctx database:

- no turn degraded to OpenClaw's legacy engine (the host logs every degraded turn) and the
  plugin reported no degraded step;
- every user turn is recorded in dagctx exactly once (and every answer);
- no request the model received was over the 16k window (prompt = messages + tool schemas,
  counted by the stub, which is what it reports as usage);
- the messages each request carried before the turn's own are exactly what dagctx
  assembled for it (the plugin's trace), in order;
- compaction happened, and its summaries were written through OpenClaw's own completion
  function (the stub received dagctx's summarizer prompt; dagctx has no other model);
- the model's call of the recall tool `dagctx_search` returned dagctx data: the text of
  turn 1, which by then no request carried any more;
- OpenClaw's own `openclaw sessions compact KEY` succeeds through the plugin (exit 0, ok);
- with dagctx stopped (its command fails, its daemon is gone) OpenClaw keeps answering:
  the plugin says DEGRADED on the host's log and OpenClaw never quarantines the engine;
- when dagctx comes back the plugin says RECOVERED, runs on dagctx again, and the turns
  answered during the outage are in dagctx, each once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import short_tempdir
from openclaw_gateway import Gateway, ModelStub, SharedDaemon, installed_and_running, node_or_skip, text_of

from dagctx.client import DagctxClient

WINDOW = 16_000
TURNS = 8
RECALL_TURN = 7  # the model searches dagctx for turn 1's marker
TOOL_TURN = 2  # the model reads a workspace file with OpenClaw's own tool
STAMP = re.compile(r"^\[[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)? [A-Z]{2,5}\] ")


def user_text(i: int) -> str:
    return (f"turn {i}: handle ticket marker-{i}-quartz for module pkg/mod{i}.py; "
            + "please keep the public names stable and the tests green while you work " * 6)


def turn_of(body: dict[str, Any]) -> int | None:
    for m in reversed(body["messages"]):
        if m.get("role") == "user":
            found = re.search(r"turn (\d+): handle ticket", text_of(m.get("content")))
            if found:
                return int(found.group(1))
    return None


def script(n: int, body: dict[str, Any]) -> dict[str, Any]:
    """The model: a tool call on turns TOOL_TURN and RECALL_TURN (first request of the turn), text otherwise."""
    turn = turn_of(body)
    msgs = body["messages"]
    if not body.get("tools"):
        # OpenClaw's own helper calls (its compaction safeguard's summarizer, titles): plain text
        return {"content": f"Summary: the conversation so far covers turns up to {turn}."}
    start = max((k for k, m in enumerate(msgs) if m.get("role") == "user" and f"turn {turn}: handle ticket" in text_of(m.get("content"))), default=0)
    results = [m for m in msgs[start:] if m.get("role") == "tool"]
    if results:
        return {"content": f"Done with turn {turn}: the tool answered {len(text_of(results[-1].get('content')))} characters."}
    names = {t["function"]["name"] for t in body.get("tools", [])}
    if turn == TOOL_TURN:
        return {"content": None, "tool_calls": [("read", {"path": "notes/alpha.txt"})]}
    if turn == RECALL_TURN:
        args = {"query": "marker-1-quartz"}
        if "dagctx_search" in names:
            return {"content": None, "tool_calls": [("dagctx_search", args)]}
        return {"content": None, "tool_calls": [("tool_call", {"id": "dagctx_search", "args": args})]}
    return {"content": f"Answer to turn {turn}: " + "the change is done and the tests pass again " * 5}


def normalized(agent_msg: dict[str, Any]) -> tuple[str, str]:
    """An AgentMessage as the provider sees its role and text."""
    role = {"toolResult": "tool"}.get(agent_msg["role"], agent_msg["role"])
    return role, STAMP.sub("", text_of(agent_msg.get("content")).strip())


def provider_view(msg: dict[str, Any]) -> tuple[str, str]:
    return msg["role"], STAMP.sub("", text_of(msg.get("content")).strip())


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory):
    node = node_or_skip()
    root = tmp_path_factory.mktemp("openclaw")
    daemon = SharedDaemon.make(root, short_tempdir("oc-"))
    stub = ModelStub(script)
    gw = Gateway(root, node, stub, window=WINDOW, dagctx_command=[str(daemon.launcher)], trace=root / "trace.jsonl",
                 env=daemon.env, daemon_env=daemon.env)
    (gw.workspace / "notes").mkdir()
    (gw.workspace / "notes" / "alpha.txt").write_text("alpha notes: the quartz module lives in pkg/quartz.py\n")
    with installed_and_running(gw, daemon):
        yield gw, stub, daemon.env, daemon.launcher


def trace_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def dagctx_record(db: Path, env: dict[str, str], extra: list[str]) -> list[Any]:
    """Every node of the gateway's dagctx session (the branch at HEAD, with tool calls), and
    the nodes ``extra`` names (summaries hang beside the branch: compaction never moves HEAD)."""
    c = await DagctxClient.spawn(db, env={**os.environ, **env})
    try:
        sessions = (await c.session_list()).sessions
        mine = [s for s in sessions if (s.metadata or {}).get("openclawSessionKey", "").endswith("dagctx-test")]
        assert len(mine) == 1, [s.metadata for s in sessions]
        chain = (await c.history(mine[0].session_id)).nodes
        got = await c.get_nodes(mine[0].session_id, [n.id for n in chain], include_callees=True)
        side = (await c.get_nodes(mine[0].session_id, extra)).nodes if extra else []
        return list(got.nodes) + list(got.callees or []) + list(side)
    finally:
        await c.close()


def test_openclaw_gateway_runs_every_turn_on_dagctx(gateway) -> None:
    gw, stub, env, launcher = gateway
    answers = []
    for i in range(1, TURNS + 1):
        out = gw.turn(user_text(i))
        answers.append(out["choices"][0]["message"]["content"])
    log = gw.log_text()

    # 0 degraded turns, nothing degraded inside the plugin.
    assert "degraded to" not in log, [line for line in log.splitlines() if "degraded to" in line][:3]
    assert "quarantin" not in log.lower(), [line for line in log.splitlines() if "uarantin" in line][:3]
    assert "[dagctx] DEGRADED" not in log, [line for line in log.splitlines() if "DEGRADED" in line][:3]
    assert all(a for a in answers), answers

    # Each user turn recorded once, each answer too.
    summary_ids = sorted({e.get("compacted") or e.get("summaryId") for e in trace_events(gw.trace)} - {None})
    nodes = asyncio.run(dagctx_record(gw.database, env, summary_ids))
    for i in range(1, TURNS + 1):
        users = [n for n in nodes if n.role == "user" and f"marker-{i}-quartz" in str(n.output)]
        assert len(users) == 1, (i, [str(n.output)[:80] for n in users])
    final_answers = [n for n in nodes if n.role == "llm" and str(n.output).startswith(("Answer to turn", "Done with turn"))]
    assert len(final_answers) == TURNS, [str(n.output)[:40] for n in final_answers]
    summaries = [n for n in nodes if n.name == "context/summary"]

    # No request over the window (what the stub reports as prompt tokens: messages + tool schemas).
    assert stub.agent, "the model stub received no request"
    over = [a["prompt"] for a in stub.agent if a["prompt"] > WINDOW]
    assert not over, over

    # The stub received exactly what dagctx assembled: the last assemble before each request
    # (the tool loop's) is the head of that request's messages, after the system prompt.
    events = trace_events(gw.trace)
    assembles = [e for e in events if e["event"] == "assemble"]
    assert assembles, "the plugin assembled nothing"
    def carries(sent: list[tuple[str, str]], assembled: list[tuple[str, str]]) -> bool:
        """The request starts with the assembled messages, in order: same roles, each text
        as dagctx rendered it (OpenClaw may decorate a user message around it)."""
        return 0 < len(assembled) <= len(sent) and all(
            r == ar and at in t for (r, t), (ar, at) in zip(sent, assembled))

    checked = 0
    candidates = [[normalized(m) for m in e["messages"]] for e in assembles]
    for req in stub.agent:
        sent = [provider_view(m) for m in req["body"]["messages"] if m["role"] != "system"]
        assert any(carries(sent, c) for c in candidates) or turn_of(req["body"]) == 1, (
            "a request's history is not what dagctx assembled", sent[:3], candidates[-1][:3])
        checked += 1
    assert checked == len(stub.agent)

    # Compaction happened, through OpenClaw's llm.complete (the only way to reach the stub).
    assert stub.summaries, "no summary request reached the model through OpenClaw's llm.complete"
    assert summaries, "dagctx recorded no compaction summary"
    assert any(e["event"] in ("assemble", "compact") and (e.get("compacted") or e.get("summaryId")) for e in events)

    # The recall tool returned dagctx data: turn 1's text, which the recall turn's request did not carry.
    recall = [a for a in stub.agent if turn_of(a["body"]) == RECALL_TURN]
    tool_msgs = [m for a in recall for m in a["body"]["messages"] if m["role"] == "tool"]
    assert tool_msgs, "the recall tool's answer never reached the model"
    answer = text_of(tool_msgs[-1]["content"])
    assert re.search(r"marker\W*1\W*quartz", answer) and "nodeId" in answer, answer[:500]
    first = recall[0]["body"]["messages"]
    assert not any("turn 1: handle ticket" in text_of(m.get("content")) for m in first), "turn 1 was still in the context"

    # OpenClaw's own tool ran in turn TOOL_TURN and dagctx recorded its result on the call.
    reads = [n for n in nodes if n.role == "code" and n.name == "read"]
    assert reads and "pkg/quartz.py" in str(reads[0].output), [str(n.output)[:100] for n in reads]

    # OpenClaw's own command asks the engine to compact the session: it succeeds (compacted,
    # or "nothing to compact": never belowThreshold with exit 1).
    key = next(e["sessionKey"] for e in assembles if e.get("sessionKey"))
    compact = gw.openclaw("sessions", "compact", key, "--json", "--url", f"ws://127.0.0.1:{gw.port}", "--token", gw.TOKEN,
                          timeout=300)
    assert compact.returncode == 0, compact.stdout[-2000:] + compact.stderr[-2000:]
    assert json.loads(compact.stdout[compact.stdout.index("{"):])["ok"] is True, compact.stdout[-2000:]

    # dagctx stopped: its command fails and its daemon is gone; OpenClaw keeps answering.
    working = launcher.read_text()
    mark = gw.log_mark()
    launcher.write_text("#!/bin/sh\necho 'dagctx is stopped (test)' >&2\nexit 1\n")
    stop = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and "stopped the dagctx daemon" in stop.stdout, stop.stdout + stop.stderr
    outage = (TURNS + 1, TURNS + 2)
    for i in outage:
        out = gw.turn(user_text(i))
        assert out["choices"][0]["message"]["content"], out
        assert turn_of(stub.agent[-1]["body"]) == i
    during = gw.log_since(mark)
    mark = gw.log_mark()
    assert "[dagctx] DEGRADED" in during, during[-3000:]
    assert "quarantin" not in during.lower(), [line for line in during.splitlines() if "uarantin" in line][:3]
    assert "degraded to" not in during, [line for line in during.splitlines() if "degraded to" in line][:3]

    # dagctx back: the plugin reconnects (at most one attempt per 5 s), says so, and the
    # outage's turns are recorded in dagctx, each once.
    launcher.write_text(working)
    time.sleep(6)
    back = (TURNS + 3, TURNS + 4)
    for i in back:
        out = gw.turn(user_text(i))
        assert out["choices"][0]["message"]["content"], out
    later = gw.log_since(mark, console_only=True)
    assert "[dagctx] RECOVERED" in later, later[-3000:]
    recovered_at = later.index("[dagctx] RECOVERED")
    assert "[dagctx] DEGRADED" not in later[recovered_at:], later[recovered_at:][:3000]
    full = gw.log_text()
    assert "quarantin" not in full.lower() and "degraded to" not in full
    nodes = asyncio.run(dagctx_record(gw.database, env, []))
    for i in (*outage, *back):
        users = [n for n in nodes if n.role == "user" and f"marker-{i}-quartz" in str(n.output)]
        assert len(users) == 1, (i, [str(n.output)[:80] for n in users])
    assert any(e["event"] == "replay" for e in trace_events(gw.trace))
    # after the recovery, the model again sees dagctx's assembly
    last = [e for e in trace_events(gw.trace) if e["event"] == "assemble"][-1]
    assert not last.get("degraded"), last
