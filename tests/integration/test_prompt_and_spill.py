"""What is stored whole and what is spilled, through the real daemon on both backends.

* SPEC §4, §7: a ``context/system_prompt`` node keeps its whole text however long (a
  37k-character prompt of a 200-line AGENTS.md and 120 skills); the budget counts the
  prompt that is sent; replay returns it byte for byte; a prompt that alone does not fit
  is ``BudgetExceeded`` naming its layers.
* SPEC §7: a refused ``context/prepare`` writes nothing — the new prompt node is written
  only with a request that is handed out.
* SPEC §4: spill by size — a 50 MB output on one line is stored once (in the blob),
  read by range, never echoed whole by ``node/append`` nor rendered whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.context.tokens import TokenCounter
from dagctx.protocol import messages as m

from rawdb import RawDb


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


SMALL = {"small-model": {"contextWindow": 8_000, "maxOutput": 1_000}}


def big_workspace(root: Path) -> Path:
    """A 200-line AGENTS.md and 120 skills: a prompt of about 37k characters."""
    ws = root / "ws"
    (ws / "skills").mkdir(parents=True)
    (ws / "AGENTS.md").write_text("".join(
        f"{i:03d}. Run `make check-{i}` before touching module_{i}; keep its public API stable.\n"
        for i in range(200)))
    for i in range(120):
        d = ws / "skills" / f"skill-{i:03d}"
        d.mkdir()
        (d / "SKILL.md").write_text(
            f"---\nname: skill-{i:03d}\ndescription: Handles task family {i}: migrations, fixtures and "
            f"release notes for component_{i} of the monorepo, with its own test matrix\n---\nBody of skill {i}.\n")
    return ws


async def node_count(c: DagctxClient, sid: str) -> int:
    return (await c.session_get(sid)).node_count


def prompt_nodes(database: str, sid: str) -> list[tuple[str, int]]:
    with RawDb(database) as db:
        return db.execute("SELECT id, length(body) FROM nodes WHERE session_id=? AND name=? ORDER BY seq",
                          (sid, "context/system_prompt"))


async def test_a_long_system_prompt_is_stored_sent_counted_and_replayed_whole(database: str, tmp_path: Path) -> None:
    ws = big_workspace(tmp_path)
    c = await DagctxClient.spawn(database)
    try:
        s = await c.session_create("long prompt")
        u = await c.append(s.session_id, "user", output="Add a changelog entry.", predecessor=s.head)
        prep = await c.prepare(s.session_id, model="gpt-4o", format="openai", workspace=str(ws))
        system = prep.system
        assert 36_000 < len(system) < 40_000, len(system)
        assert "omitted here" not in system
        assert "truncated" not in system and "skill-119" in system and "199. Run `make check-199`" in system
        # sent whole, as the first message
        assert prep.messages[0] == {"role": "system", "content": system}
        # stored whole: node/get gives the very text, no spill record
        sp_id = prep.manifest["systemNode"]
        node = (await c.get_nodes(s.session_id, [sp_id])).nodes[0]
        assert node.output == system and "spill" not in node.metadata
        # counted whole: the budget's system part is the count of the text sent
        tokens = TokenCounter().count(system, prep.manifest["tokenizer"])
        assert prep.budget.system_prompt == tokens and tokens > 7_000
        # replayed byte for byte, also in the Anthropic format
        llm = await c.append(s.session_id, "llm", name="gpt-4o", output="Done.", predecessor=u.head,
                             render_id=prep.render_id)
        rep = await c.replay(s.session_id, llm.node.id)
        assert rep.exact and rep.messages == prep.messages and rep.messages[0]["content"] == system
        r = await c.render(s.session_id, format="anthropic", model="claude-sonnet-4-5")
        assert r.system == system
        # the same prompt again: no second node
        await c.prepare(s.session_id, model="gpt-4o", format="openai", workspace=str(ws))
        assert [i for i, _ in prompt_nodes(database, s.session_id)] == [sp_id]
    finally:
        await c.close()


async def test_a_prompt_that_alone_does_not_fit_is_refused_by_layer_and_writes_nothing(
        database: str, tmp_path: Path) -> None:
    ws = big_workspace(tmp_path)
    c = await DagctxClient.spawn(database, initialization_options={"models": SMALL})
    try:
        s = await c.session_create("prompt too big")
        await c.append(s.session_id, "user", output="hello", predecessor=s.head)
        before = await node_count(c, s.session_id)
        for _ in range(3):
            with pytest.raises(RpcError) as err:
                await c.prepare(s.session_id, model="small-model", format="openai", workspace=str(ws))
            assert err.value.kind == "BudgetExceeded"
        details = err.value.data["details"]
        layers = {x["name"]: x for x in details["systemPromptLayers"]}
        assert {"identity", "AGENTS.md", "skills"} <= set(layers), layers
        assert layers["skills"]["source"] == "skills" and layers["AGENTS.md"]["source"] == "AGENTS.md"
        assert sum(x["tokens"] for x in layers.values()) == pytest.approx(details["systemPrompt"], rel=0.02)
        assert details["systemPrompt"] > details["limit"]
        msg = err.value.message
        assert "system prompt alone" in msg and "skills" in msg and "AGENTS.md" in msg and "never cut" in msg
        # three refusals wrote nothing: no prompt node, the same node count
        assert await node_count(c, s.session_id) == before
        assert prompt_nodes(database, s.session_id) == []
        # the same prompt fits a larger model: handed out, so now (and only now) it is written
        ok = await c.prepare(s.session_id, model="gpt-4o", format="openai", workspace=str(ws))
        assert await node_count(c, s.session_id) == before + 1
        assert [i for i, _ in prompt_nodes(database, s.session_id)] == [ok.manifest["systemNode"]]
    finally:
        await c.close()


async def test_a_request_refused_after_reduction_writes_no_prompt_node(database: str, tmp_path: Path) -> None:
    """Protected part fits, history does not, nobody can summarize: refused, nothing written."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("Keep answers short.\n")
    c = await DagctxClient.spawn(database, initialization_options={"models": SMALL})
    try:
        s = await c.session_create("history too big")
        u = await c.append(s.session_id, "user", output="read the logs", predecessor=s.head)
        llm = await c.append(s.session_id, "llm", name="small-model", output="reading", predecessor=u.head)
        for k in range(4):
            await c.append(s.session_id, "code", name="cat", input={"path": f"log{k}"},
                           output=" ".join(f"line{k}-{i} ok" for i in range(1_500)), caller=llm.node.id,
                           metadata={"toolCallId": f"call_{k}"})
        l2 = await c.append(s.session_id, "llm", name="small-model", output="still reading", predecessor=llm.head)
        await c.append(s.session_id, "code", name="cat", input={"path": "last"}, output="short",
                       caller=l2.node.id, metadata={"toolCallId": "call_last"})
        before = await node_count(c, s.session_id)
        with pytest.raises(RpcError) as err:
            await c.prepare(s.session_id, model="small-model", format="openai", workspace=str(ws))
        assert err.value.kind == "BudgetExceeded"
        assert err.value.data["details"]["systemPrompt"] < err.value.data["details"]["limit"]
        assert await node_count(c, s.session_id) == before
        assert prompt_nodes(database, s.session_id) == []
    finally:
        await c.close()


async def test_a_50_mb_single_line_output_is_spilled_by_size(database: str, tmp_path: Path) -> None:
    # Writing 50 MB to PostgreSQL on a loaded machine can take longer than the default storage
    # time limit (10 s counts the whole statement, not silence): this test is about spilling
    c = await DagctxClient.spawn(database, initialization_options={"observeNodes": True, "storageTimeoutSeconds": 120})
    try:
        s = await c.session_create("huge line")
        u = await c.append(s.session_id, "user", output="minify the bundle", predecessor=s.head)
        llm = await c.append(s.session_id, "llm", name="gpt-4o", output="running", predecessor=u.head)
        piece = "function(a,b){return a+b};var x_0=1;"
        text = (piece * (50_000_000 // len(piece) + 1))[:50_000_000]
        text = text[:25_000_000] + "MIDDLE_MARK" + text[25_000_000 + 11:]
        assert len(text) == 50_000_000 and "\n" not in text
        out = await c.request("node/append", m.NodeAppendParams(
            session_id=s.session_id,
            node=m.NodeInput(role="code", name="bash", input={"cmd": "cat bundle.min.js"}, output=text,
                             caller=llm.node.id, metadata={"toolCallId": "call_1"})), timeout=300)
        node = out.node
        # not echoed whole: the answer (and the notification) carry head + marker + tail
        spill = node.metadata["spill"]
        assert spill["chars"] == 50_000_000 and spill["lines"] == 1
        assert len(node.output) < 10_000 and "omitted here" in node.output
        assert node.output.startswith(text[:spill["headChars"]]) and node.output.endswith(text[-spill["tailChars"]:])
        seen = [p.node for meth, p in c.notifications if meth == "node/didAppend" and p.node.id == node.id]
        assert seen and len(seen[0].output) < 10_000
        # stored once: the node's row keeps head + tail, the blob the whole text
        with RawDb(database) as db:
            (body,), = db.execute("SELECT length(body) FROM nodes WHERE session_id=? AND id=?",
                                  (s.session_id, node.id))
            (whole,), = db.execute("SELECT length(data) FROM blobs WHERE session_id=? AND node_id=?",
                                   (s.session_id, node.id))
        assert body < 20_000 and whole >= 50_000_000
        # read by range
        mid = (await c.get_nodes(s.session_id, [node.id], range=m.OutputRange(offset=25_000_000, length=11))).nodes[0]
        assert mid.output == "MIDDLE_MARK"
        # rendered as what the node keeps, never whole
        r = await c.render(s.session_id, format="openai", model="gpt-4o", aging=False)
        tool = [msg for msg in r.messages if msg["role"] == "tool"]
        assert len(tool) == 1 and tool[0]["content"] == node.output
        assert r.tokens.total < 10_000
    finally:
        await c.close()
