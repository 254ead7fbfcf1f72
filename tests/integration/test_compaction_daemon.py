"""``context/compact`` through a real daemon subprocess, with a scripted sampler.

The client answers the daemon's ``sampling/createMessage`` requests with a
``Sampler``: it records every request it was sent and answers as each test says
(a deterministic extractive summary that keeps the session's identifiers, an
error, nothing, too much, a non-answer, a slow answer). Sessions are built through
the protocol: user turns, llm replies with tool calls (code nodes whose caller is
the llm node, ``metadata.toolCallId``).

Covers SPEC §8, the branch scenario (the scenario: chat → fork → checkout → compact → chat →
compact → chat → restart → load, with HEAD and the rendered ids checked at every
step), the compaction rules of SPEC §8, and every failure path of SPEC §8
§4: a failed, timed-out, empty, too long, low-fidelity, cancelled or conflicting
summary writes nothing and says why.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from dagctx.client import DagctxClient, RpcError
from dagctx.context.formats import check_pairs
from dagctx.context.references import reference_counts
from dagctx.protocol import context_messages as pc

from sampling_stub import ScriptedSampler, request_text

BIG = "big-128k"
SMALL = "small-32k"
MODELS = {
    BIG: {"contextWindow": 128000, "maxOutput": 8000},
    SMALL: {"contextWindow": 32000, "maxOutput": 4000},
}
MARKER = "[Previous conversation summary]"
STRUCTURAL = "[Structural summary"
WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "iris", "juniper",
         "kelp", "larch", "maple", "nectar", "onyx", "poplar", "quartz", "rowan", "sorrel", "thyme"]

CC_COMPACT = "claude-code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
CODEX = "codex/rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl"


# ---------------------------------------------------------------- the scripted sampler



def transcript_part(text: str) -> str:
    """The part of a summarizer request that holds the conversation (not the task)."""
    ends = [text.rfind(tag) for tag in ("</conversation>", "</new-messages>")]
    end = max(ends)
    return text if end < 0 else text[: end]


def extractive(params: Any) -> str:
    """A deterministic extractive "summary": the five headings and the identifiers of
    the transcript (paths, ids, names), most frequent first."""
    counts, pos = reference_counts(transcript_part(request_text(params)))
    idents = sorted(counts, key=lambda r: (-counts[r], pos[r]))[:150]
    return (
        "## 1. User intent\nWork through the modules listed below.\n"
        "## 2. Decisions and constraints\nnone\n"
        "## 3. Work completed\n" + "\n".join(f"- {i}" for i in idents) + "\n"
        "## 4. Outstanding\nnone\n## 5. Active context\nnone"
    )


class Sampler(ScriptedSampler):
    def __init__(self) -> None:
        super().__init__(extractive)


async def spawn(db: Path, sampler: Sampler | None, **options: Any) -> DagctxClient:
    caps = {"sampling": {}} if sampler is not None else {}
    client = await DagctxClient.spawn(db, capabilities=caps,
                                      initialization_options={"models": MODELS, **options})
    if sampler is not None:
        client.on_request("sampling/createMessage", sampler)
    return client


# One daemon serves the tests that take ``sc`` (each test builds its own sessions and
# gets a fresh Sampler); tests that need a restart, other options or a client that
# cannot sample spawn their own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("compaction") / "shared.db"
    client = await spawn(db, Sampler())
    try:
        yield client, db
    finally:
        await client.close()


@pytest.fixture
def sampler():
    s = Sampler()
    try:
        yield s
    finally:
        s.release.set()


@pytest_asyncio.fixture(loop_scope="module")
async def sc(shared: tuple[DagctxClient, Path], sampler: Sampler):
    """The shared daemon, its client sampling with this test's ``sampler``."""
    client, _ = shared
    client.on_request("sampling/createMessage", sampler)
    client.notifications.clear()
    try:
        yield client
    finally:
        sampler.release.set()


@pytest.fixture
def sc_db(shared: tuple[DagctxClient, Path]) -> Path:
    return shared[1]


# ---------------------------------------------------------------- building sessions


def tool_body(tag: str, i: int, lines: int) -> str:
    word = WORDS[i % len(WORDS)]
    return (f"# src/{tag}/mod_{i}.py\nnote: body of {tag} turn {i} ({word} {word})\n"
            + "\n".join(f"    line {k}: total = accumulate(values, step={k % 7})" for k in range(lines)))


async def chat(c: DagctxClient, sid: str, head: str, n: int, *, start: int = 0, tag: str = "pkg",
               lines: int = 60, move_head: bool | None = None,
               abandoned: bool = False) -> tuple[str, list[dict[str, str]]]:
    """``n`` turns after ``head``: user → llm with a read_file tool call → llm reply.
    Returns the new tip and, per turn, the ids of its nodes. ``abandoned``: each turn
    also gets a discarded sibling reply (a retry), so seqs along the branch have gaps."""
    turns = []
    for i in range(start, start + n):
        issue = f"ISSUE-{4100 + i}"
        path = f"src/{tag}/mod_{i}.py"
        u = await c.append(sid, "user", output=f"Turn {i} ({tag}): fix {issue} in {path}", predecessor=head,
                           move_head=move_head if i == start else None)
        l1 = await c.append(sid, "llm", name=BIG, output=f"Reading {path} for {issue}.", predecessor=u.node.id)
        t = await c.append(sid, "code", name="read_file", input={"path": path}, output=tool_body(tag, i, lines),
                           caller=l1.node.id, metadata={"toolCallId": f"call_{tag}_{i}"})
        l2 = await c.append(sid, "llm", name=BIG, output=f"Fixed {issue} in {path}; tests pass.",
                            predecessor=l1.node.id)
        if abandoned:
            await c.append(sid, "llm", name=BIG, output="(abandoned attempt)", predecessor=u.node.id,
                           move_head=False)
        head = l2.node.id
        turns.append({"user": u.node.id, "llm": l1.node.id, "tool": t.node.id, "reply": l2.node.id})
    return head, turns


async def state(c: DagctxClient, sid: str, head: str | None = None, model: str = BIG) -> dict[str, Any]:
    """What "nothing was written" compares: node count, HEAD and the render."""
    info = await c.session_get(sid)
    r = await c.render(sid, head=head, model=model, format="openai")
    return {"nodes": info.node_count, "head": info.head, "messages": r.messages, "reads": r.reads,
            "tokens": r.tokens.total}


def progress_of(c: DagctxClient, token: str) -> list[str]:
    out = []
    for method, p in c.notifications:
        if method == "$/progress":
            p = p if isinstance(p, dict) else msgspec.to_builtins(p)
            if p["token"] == token:
                out.append(p["value"]["kind"])
    return out


def cancels_sent(c: DagctxClient) -> list[Any]:
    return [p for method, p in c.notifications if method == "$/cancelRequest"]


# ---------------------------------------------------------------- coverage (defect 1)


def _segments(text: str) -> list[str]:
    out = []
    for line in text.split("\n"):
        out.extend(line[i:i + 1000] for i in range(0, max(len(line), 1), 1000))
    return [s for s in out if s.strip()]


def contained(text: str, hay: str) -> bool:
    """``text`` was sent: whole, or (an item split across summary stages) line by line."""
    text = text.strip()
    return not text or text in hay or all(s in hay for s in _segments(text))


def block_texts(block: dict[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "text":
        t = block["text"]
        return [t[len(MARKER):] if t.startswith(MARKER) else t]
    if kind == "tool_call":
        inp = block.get("input")
        return [] if inp is None else [inp if isinstance(inp, str) else msgspec.json.encode(inp).decode()]
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, str):
            return [content]
        return [b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
    return []


async def check_coverage(c: DagctxClient, sid: str, before: Any, after: Any, res: Any, sent: str,
                         old_covers: list[str]) -> None:
    """Everything the new summary covers was in what the sampler received.

    ``before``/``after`` are neutral renders of the same head around the compaction.
    Every message that left the render (a covered turn, its tool traffic, the old
    summary) left whole, and each of its texts is in ``sent``; every covered id is
    gone from the render; what left is the covered segment and its callees.
    """
    dropped = set(before.reads) - set(after.reads)
    covers = set(res.covers_ids)
    assert res.summary_id not in covers
    assert not covers & set(after.reads), "a covered id is still rendered"
    assert set(old_covers) <= covers
    for msg in before.messages:
        ids = set(msg["nodeIds"])
        if not ids & dropped:
            continue
        assert ids <= dropped, f"a turn was split by the cut: {msg['nodeIds']}"
        for block in msg["content"]:
            for text in block_texts(block):
                assert contained(text, sent), f"covered content not sent to the summarizer: {text[:200]!r}"
    # what left the render is the covered segment, its callees and the old summary
    extra = dropped - covers
    if extra:
        nodes = {n.id: n for n in (await c.get_nodes(sid, sorted(extra))).nodes}
        for nid in extra:
            node = nodes[nid]
            if node.name == "context/summary":
                continue
            owner = node
            while owner.caller is not None and owner.id not in covers:
                owner = (await c.get_nodes(sid, [owner.caller])).nodes[0]
            assert owner.id in covers, f"{nid} left the render but belongs to no covered turn"


# ---------------------------------------------------------------- 1. the scenario (SPEC §8, the branch scenario)


async def test_scenario_chat_fork_compact_recompact_restart(db_path: Path, sampler: Sampler) -> None:
    c = await spawn(db_path, sampler)
    try:
        s = await c.session_create("scenario")
        sid = s.session_id
        # chat
        main_tip, main = await chat(c, sid, s.head, 6)
        assert (await c.session_get(sid)).head == main_tip
        # fork from the end of turn 1 (inside what will be covered); HEAD follows the fork
        fork_tip, _ = await chat(c, sid, main[1]["reply"], 2, start=20, tag="fork", move_head=True)
        assert (await c.session_get(sid)).head == fork_tip
        fork_before = await state(c, sid, head=fork_tip)
        # checkout the main branch
        assert (await c.checkout(sid, main_tip)).head == main_tip
        before = await c.render(sid, model=BIG, format="neutral")

        # compact
        n0 = (await c.session_get(sid)).node_count
        r1 = await c.compact(sid, model=BIG, keep_recent_tokens=2500)
        assert r1.ok and r1.summary_id and r1.reason == "manual", r1
        s1 = r1.summary_id
        assert (await c.session_get(sid)).head == main_tip, "compaction moved HEAD"
        assert (await c.session_get(sid)).node_count == n0 + 1, "compaction writes exactly one node"
        after = await c.render(sid, model=BIG, format="neutral")
        assert after.reads[0] == s1, "the summary renders first: [S, kept tail…]"
        assert not set(r1.covers_ids) & set(after.reads)
        assert after.reads[1:] == [i for i in before.reads if i not in set(r1.covers_ids) | _callees(main, r1)]
        assert r1.covers_ids == [t[k] for t in main[: _kept_turn(main, r1)] for k in ("user", "llm", "reply")]
        assert 1 <= _kept_turn(main, r1) <= 4 and r1.superseded_summary is None
        assert after.messages[0]["content"][0]["text"].startswith(MARKER)
        assert after.manifest["summaryId"] == s1 and after.manifest["coversIds"] == r1.covers_ids
        summary = (await c.get_nodes(sid, [s1])).nodes[0]
        assert (summary.role, summary.name) == ("llm", "context/summary")
        assert summary.metadata["covers_ids"] == r1.covers_ids
        assert summary.predecessor == s.root_id  # spliced where the covered segment starts
        # the fork does not contain the whole covered segment: it renders raw, unchanged
        assert await state(c, sid, head=fork_tip) == {**fork_before, "nodes": n0 + 1, "head": main_tip}

        # chat on the compacted branch; a call is prepared and recorded with its render
        main_tip, more = await chat(c, sid, main_tip, 3, start=6)
        assert (await c.session_get(sid)).head == main_tip
        mid = await c.render(sid, model=BIG, format="neutral")
        assert mid.reads[0] == s1
        assert mid.reads[-len(more) * 4:] == [t[k] for t in more for k in ("user", "llm", "tool", "reply")]
        prep = await c.prepare(sid, model=BIG, format="openai")
        assert prep.summary_id == s1 and prep.manifest["summaryId"] == s1
        call = await c.append(sid, "llm", name=BIG, output="Noted.", predecessor=main_tip, render_id=prep.render_id)
        main_tip = call.node.id

        # compact again: the rolling summary absorbs the old one
        sent_before = len(sampler.requests)
        before2 = await c.render(sid, model=BIG, format="neutral")
        r2 = await c.compact(sid, model=BIG, keep_recent_tokens=2500)
        assert r2.ok and r2.summary_id and r2.summary_id != s1, r2
        s2 = r2.summary_id
        assert (await c.session_get(sid)).head == main_tip
        assert r2.superseded_summary == s1 and r2.used_previous_summary
        assert set(r1.covers_ids) <= set(r2.covers_ids) and r2.covers_ids[: len(r1.covers_ids)] == r1.covers_ids
        assert len(r2.covers_ids) > len(r1.covers_ids)
        assert s1 not in r2.covers_ids and s2 not in r2.covers_ids
        after2 = await c.render(sid, model=BIG, format="neutral")
        assert after2.reads[0] == s2 and s1 not in after2.reads
        assert s1 in after2.manifest["supersededSummaries"]
        # the re-compaction saw the old summary, not the raw turns it had covered
        sent2 = "\n".join(request_text(p) for p in sampler.requests[sent_before:])
        old_text = (await c.get_nodes(sid, [s1])).nodes[0].output
        assert old_text[len(MARKER):].strip() in sent2
        assert "body of pkg turn 0" not in sent2 and "body of pkg turn 0" in sampler.text()
        await check_coverage(c, sid, before2, after2, r2, sent2, r1.covers_ids)
        # the fork still renders raw
        fork_now = await state(c, sid, head=fork_tip)
        assert fork_now["messages"] == fork_before["messages"] and fork_now["reads"] == fork_before["reads"]
        # the call prepared between the two compactions replays with the summary it saw
        rep = await c.replay(sid, call.node.id)
        assert rep.exact and rep.messages == prep.messages and rep.manifest["summaryId"] == s1

        # chat once more
        main_tip, _ = await chat(c, sid, main_tip, 1, start=9)
        final = await state(c, sid)
        assert final["head"] == main_tip and final["reads"][0] == s2
        branches = (await c.branches(sid)).branches
    finally:
        await c.close()

    # restart the daemon and load: HEAD, summaries and renders survive
    c = await spawn(db_path, sampler)
    try:
        assert (await c.session_get(sid)).head == main_tip
        assert await state(c, sid) == final
        assert (await c.branches(sid)).branches == branches
        assert (await state(c, sid, head=fork_tip))["messages"] == fork_before["messages"]
        rep2 = await c.replay(sid, call.node.id)
        assert rep2.exact and rep2.messages == prep.messages
        again = await c.render(sid, model=BIG, format="neutral")
        assert again.manifest["summaryId"] == s2 and s1 in again.manifest["supersededSummaries"]
    finally:
        await c.close()


def _kept_turn(turns: list[dict[str, str]], res: Any) -> int:
    """Index of the first turn the compaction kept."""
    covered = set(res.covers_ids)
    return next(i for i, t in enumerate(turns) if t["user"] not in covered)


def _callees(turns: list[dict[str, str]], res: Any) -> set[str]:
    covered = set(res.covers_ids)
    return {t["tool"] for t in turns if t["llm"] in covered}


# ---------------------------------------------------------------- 2. defect regressions


async def test_covered_turns_were_all_in_the_summarizer_input(sc: DagctxClient, sampler: Sampler) -> None:
    """Defect 1: a summary covers nothing its summarizer did not see (also across stages)."""
    s = await sc.session_create("coverage")
    sid = s.session_id
    await chat(sc, sid, s.head, 8, lines=80)
    before = await sc.render(sid, model="gpt-4", format="neutral")
    res = await sc.compact(sid, model="gpt-4", keep_recent_tokens=1500)  # 8k window: several stages
    assert res.ok, res
    assert len(sampler.requests) >= 2, "the prefix is larger than one summarizer stage"
    after = await sc.render(sid, model="gpt-4", format="neutral")
    await check_coverage(sc, sid, before, after, res, sampler.text(), [])
    # and concretely: every covered turn's user text, replies and whole tool outputs
    sent = sampler.text()
    nodes = (await sc.get_nodes(sid, res.covers_ids)).nodes
    assert {n.role for n in nodes} == {"user", "llm"} and len(nodes) >= 12
    for n in nodes:
        assert n.output in sent, n.id
    covered_llms = {n.id for n in nodes if n.role == "llm"}
    tools = [t for t in await _tool_nodes(sc, sid, before) if t.caller in covered_llms]
    assert len(tools) == sum(1 for n in nodes if n.role == "user")
    for t in tools:
        assert t.output in sent and t.id not in after.reads, t.id


async def _tool_nodes(c: DagctxClient, sid: str, render: Any) -> list[Any]:
    ids = [i for m in render.messages if m["role"] == "tool" for i in m["nodeIds"]]
    return (await c.get_nodes(sid, ids)).nodes


async def test_compacting_one_branch_leaves_the_other_byte_identical(sc: DagctxClient) -> None:
    """Defect 2: summaries are active per branch."""
    s = await sc.session_create("branches")
    sid = s.session_id
    a_tip, a = await chat(sc, sid, s.head, 6, tag="alpha")
    # branch B forks early (after turn 0 of A) and grows; HEAD stays on A
    b_tip, b = await chat(sc, sid, a[0]["reply"], 6, start=10, tag="beta", move_head=False)
    assert (await sc.session_get(sid)).head == a_tip
    ra = {fmt: await sc.render(sid, head=a_tip, model=BIG, format=fmt) for fmt in ("openai", "anthropic", "neutral")}
    res = await sc.compact(sid, head=b_tip, model=BIG, keep_recent_tokens=2000)
    assert res.ok and res.summary_id, res
    # B's summary covers A's turn 0 (shared history) and B's own early turns: not wholly on A
    rb = await sc.render(sid, head=b_tip, model=BIG, format="neutral")
    assert rb.reads[0] == res.summary_id
    assert set(res.covers_ids) > {a[0]["user"], a[0]["llm"], a[0]["reply"]}
    for fmt, old in ra.items():
        new = await sc.render(sid, head=a_tip, model=BIG, format=fmt)
        assert new.messages == old.messages and new.reads == old.reads, fmt
        assert new.tokens.total == old.tokens.total and new.manifest["summaryId"] is None
        assert res.summary_id not in new.reads
    assert (await sc.session_get(sid)).head == a_tip
    # compacting A now gives A its own summary; B keeps rendering with its own
    res_a = await sc.compact(sid, head=a_tip, model=BIG, keep_recent_tokens=2000)
    assert res_a.ok and res_a.superseded_summary is None, "B's summary is not A's previous summary"
    assert (await sc.render(sid, head=b_tip, model=BIG, format="neutral")).reads == rb.reads
    assert (await sc.render(sid, head=a_tip, model=BIG)).reads[0] == res_a.summary_id


@pytest.mark.parametrize(("model", "usage"), [(BIG, False), ("gpt-4o", False), (BIG, True)])
async def test_tokens_after_is_the_rendered_result(sc: DagctxClient, model: str, usage: bool) -> None:
    """Defect 3: tokensBefore/After are the totals ``context/render`` reports for the
    head before and after (also once a usage report calibrates the estimates)."""
    s = await sc.session_create("tokens")
    sid = s.session_id
    head, _ = await chat(sc, sid, s.head, 6)
    if usage:
        u = await sc.append(sid, "user", output="Turn 6: go on", predecessor=head)
        prep = await sc.prepare(sid, model=model, format="openai")
        call = await sc.append(sid, "llm", name=model, output="ok", predecessor=u.node.id, render_id=prep.render_id)
        await sc.usage_report(sid, call.node.id, model=model, input=prep.manifest["tokens"] * 2, output=3)
        head = call.node.id
    fresh_before = await sc.render(sid, model=model)
    assert fresh_before.tokens.source == ("calibrated" if usage else "estimate")
    res = await sc.compact(sid, model=model, keep_recent_tokens=1500)
    assert res.ok, res
    assert res.tokens_after < res.tokens_before
    assert res.tokens_before == fresh_before.tokens.total
    fresh_after = await sc.render(sid, head=head, model=model)
    assert res.tokens_after == fresh_after.tokens.total
    assert res.summarised_count == len(res.covers_ids)


async def test_summary_is_not_a_turn_and_old_calls_replay_unchanged(db_path: Path, sampler: Sampler) -> None:
    """Defect 4: the summary node is no turn (aging decisions on the kept tail do not
    move); defect 8: a call made before the compaction replays exactly."""
    c = await spawn(db_path, sampler, aging={"minAgeSeconds": 0, "keepRecentTurns": 2, "minTokens": 200})
    try:
        s = await c.session_create("turns")
        sid = s.session_id
        head, turns = await chat(c, sid, s.head, 7, lines=80, abandoned=True)
        u = await c.append(sid, "user", output="Turn 7: summarize progress", predecessor=head)
        prep = await c.prepare(sid, model=BIG, format="anthropic")
        call = await c.append(sid, "llm", name=BIG, output="Progress: all modules fixed.", predecessor=u.node.id,
                              render_id=prep.render_id)
        rep_before = await c.replay(sid, call.node.id)
        assert rep_before.exact and rep_before.messages == prep.messages
        before = await c.render(sid, model=BIG, format="neutral")
        prep_before = await c.prepare(sid, model=BIG, format="neutral")
        res = await c.compact(sid, model=BIG, keep_recent_tokens=4000)
        assert res.ok and res.summary_id, res
        after = await c.render(sid, model=BIG, format="neutral")
        kept = set(after.reads) - {res.summary_id}
        assert kept and kept < set(before.reads)
        # same boundary, and the same aging decision for every result still rendered
        assert after.manifest["agingBoundary"] == before.manifest["agingBoundary"]
        kinds_before = {k: v for k, v in before.manifest["agingKinds"].items() if k in kept}
        assert after.manifest["agingKinds"] == kinds_before
        # the kept turns still count as the same turns: the newest two are untouched,
        # an older kept one (distance 2) is aged exactly as before
        kept_turns = [t for t in turns if t["user"] in kept]
        assert kept_turns, "the keep target keeps at least one full earlier turn"
        for t in kept_turns:
            assert (t["tool"] in after.manifest["agingKinds"]) == (t["tool"] in before.manifest["agingKinds"])
        assert turns[-1]["tool"] not in after.manifest["agingKinds"]
        assert [m for m in after.messages if m["role"] == "user"][-len(kept_turns) - 1:] == \
               [m for m in before.messages if m["role"] == "user"][-len(kept_turns) - 1:]
        prep_after = await c.prepare(sid, model=BIG, format="neutral")
        assert prep_after.summary_id == res.summary_id
        kept_aged = sum(1 for k in before.manifest["agingKinds"] if k in kept)
        assert prep_after.tool_results_aged == kept_aged <= prep_before.tool_results_aged
        # replay of the call made before the compaction: the same messages, exactly
        rep_after = await c.replay(sid, call.node.id)
        assert rep_after.exact and rep_after.messages == rep_before.messages == prep.messages
        assert rep_after.reads == rep_before.reads and res.summary_id not in rep_after.reads
    finally:
        await c.close()


# ---------------------------------------------------------------- 3. failure paths


def _raise(params: Any) -> Any:
    raise RuntimeError("the model provider is down (HTTP 503)")


def _long(params: Any) -> str:
    return request_text(params) * 2


FAILURES = {
    # mode: (answer, compact kwargs, expected reasons, words in error)
    "error": (_raise, {}, {"failed"}, "503"),
    "empty": (lambda p: "   ", {}, {"empty"}, "empty"),
    "long": (_long, {}, {"tooLong", "notSmaller"}, "summary"),
    "marker-only": (lambda p: MARKER + "\n", {}, {"empty"}, "empty"),
}


@pytest.mark.parametrize("mode", list(FAILURES))
async def test_a_failed_summary_writes_nothing(sc: DagctxClient, sampler: Sampler, mode: str) -> None:
    answer, kw, reasons, word = FAILURES[mode]
    sampler.answer = answer
    s = await sc.session_create(mode)
    sid = s.session_id
    await chat(sc, sid, s.head, 6)
    before = await state(sc, sid)
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500, **kw)
    assert not res.ok and res.reason in reasons, res
    assert res.error and word in res.error, res.error
    assert res.summary_id is None and res.covers_ids == []
    assert res.tokens_after == res.tokens_before
    assert sampler.requests, "the sampler was asked"
    assert await state(sc, sid) == before


async def test_sampler_timeout_writes_nothing(sc: DagctxClient, sampler: Sampler) -> None:
    sampler.answer = lambda p: sampler.slow(30)
    s = await sc.session_create("timeout")
    sid = s.session_id
    await chat(sc, sid, s.head, 6)
    before = await state(sc, sid)
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500, timeout_seconds=1)
    assert not res.ok and res.reason == "failed", res
    assert "within 1 s" in res.error
    assert await state(sc, sid) == before
    # the daemon told the client to stop working on every timed-out sampling request
    await asyncio.sleep(0.1)
    assert len(cancels_sent(sc)) == len(sampler.requests) >= 1


async def test_summary_without_identifiers_is_low_fidelity_after_one_retry(sc: DagctxClient, sampler: Sampler) -> None:
    sampler.answer = lambda p: "I'm ready to help! What would you like me to do?"
    s = await sc.session_create("fidelity")
    sid = s.session_id
    await chat(sc, sid, s.head, 6)
    before = await state(sc, sid)
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert not res.ok and res.reason == "lowFidelity", res
    assert len(sampler.requests) == 2, "exactly one retry"
    assert res.identifier_retention is not None and res.identifier_retention < 0.5
    assert "missing" in res.error and "src/pkg/mod_0.py" in res.error
    first, retry = (request_text(p) for p in sampler.requests)
    assert retry.startswith(first) and len(retry) > len(first)
    listed = [line[2:] for line in retry[len(first):].splitlines() if line.startswith("- ")]
    assert "src/pkg/mod_0.py" in listed and len(listed) >= 5
    assert all(ident in transcript_part(first) for ident in listed)
    assert await state(sc, sid) == before


async def test_retry_that_keeps_the_identifiers_is_written(sc: DagctxClient, sampler: Sampler) -> None:
    sampler.answer = lambda p: "I'm ready to help." if len(sampler.requests) == 1 else extractive(p)
    s = await sc.session_create("fidelity-retry")
    sid = s.session_id
    await chat(sc, sid, s.head, 6)
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert res.ok and res.summary_id and len(sampler.requests) == 2, res
    assert res.identifier_retention is not None and res.identifier_retention >= 0.5
    node = (await sc.get_nodes(sid, [res.summary_id])).nodes[0]
    assert "ready to help" not in node.output and "src/pkg/mod_0.py" in node.output


async def test_cancel_mid_run_answers_32800_and_writes_nothing(sc: DagctxClient, sampler: Sampler) -> None:
    sampler.answer = lambda p: sampler.slow(30)
    s = await sc.session_create("cancel")
    sid = s.session_id
    await chat(sc, sid, s.head, 6)
    before = await state(sc, sid)
    msg_id, fut = sc.send_request("context/compact", pc.CompactParams(
        session_id=sid, model=BIG, keep_recent_tokens=1500, work_done_token="cancel-me"))
    await asyncio.wait_for(sampler.called.wait(), 10)
    sc.cancel(msg_id)
    with pytest.raises(RpcError) as err:
        await asyncio.wait_for(fut, 10)
    assert err.value.code == -32800 and err.value.kind == "RequestCancelled"
    # the daemon withdrew its sampling request; the late answer is ignored
    await asyncio.sleep(0.1)
    assert cancels_sent(sc)
    sampler.answer = extractive
    sampler.release.set()
    await asyncio.sleep(0.2)
    assert await state(sc, sid) == before
    assert progress_of(sc, "cancel-me")[0] == "begin"
    # the daemon is fine: the same compaction now succeeds
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert res.ok and res.summary_id


async def test_new_turn_while_sampling_is_a_conflict(sc: DagctxClient, sampler: Sampler) -> None:
    s = await sc.session_create("conflict")
    sid = s.session_id
    head, _ = await chat(sc, sid, s.head, 6)
    appended: list[str] = []

    async def append_then_answer(p: Any) -> str:
        r = await sc.append(sid, "user", output="one more thing: also check src/pkg/extra.py", predecessor=head)
        appended.append(r.node.id)
        return extractive(p)

    sampler.answer = append_then_answer
    before = await state(sc, sid)
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert not res.ok and res.reason == "conflict", res
    assert "nothing was saved" in res.error and res.summary_id is None
    now = await state(sc, sid)
    assert now["nodes"] == before["nodes"] + 1 and now["head"] == appended[0]  # only the user's turn
    assert now["reads"] == before["reads"] + appended
    assert not any(n.name == "context/summary" for n in (await sc.history(sid)).nodes)
    # retrying on the new state works
    sampler.answer = extractive
    again = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert again.ok and (await sc.session_get(sid)).head == appended[0]


async def test_running_tool_call_of_a_covered_turn_completed_while_sampling_is_a_conflict(
    sc: DagctxClient, sampler: Sampler
) -> None:
    """A tool call under a covered llm node, still running when the summarizer was
    asked, is completed by node/update before the summary comes back: the summary
    would describe a result it never saw, so nothing is written (SPEC §8)."""
    s = await sc.session_create("conflict-update")
    sid = s.session_id
    u = await sc.append(sid, "user", output="Turn A: run the slow test suite for ISSUE-4999", predecessor=s.head)
    llm = await sc.append(sid, "llm", name=BIG, output="Running it.", predecessor=u.node.id)
    running = await sc.append(sid, "code", name="bash", input={"cmd": "pytest -q"}, status="running",
                              caller=llm.node.id, metadata={"toolCallId": "call_slow"})
    head, _ = await chat(sc, sid, llm.node.id, 6)

    async def complete_then_answer(p: Any) -> str:
        await sc.update(sid, running.node.id, "completed", output="412 passed in 81 s")
        return extractive(p)

    sampler.answer = complete_then_answer
    before_nodes = (await sc.session_get(sid)).node_count
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert not res.ok and res.reason == "conflict", res
    assert res.summary_id is None and "nothing was saved" in (res.error or "")
    assert (await sc.session_get(sid)).node_count == before_nodes
    assert not any(n.name == "context/summary" for n in (await sc.history(sid)).nodes)
    got = (await sc.get_nodes(sid, [running.node.id])).nodes[0]
    assert got.status == "completed" and got.output == "412 passed in 81 s"
    # on the new state the same compaction succeeds and covers the finished call's turn
    sampler.answer = extractive
    again = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
    assert again.ok and again.summary_id and u.node.id in again.covers_ids, again


async def test_turn_appended_by_another_process_while_sampling_is_a_conflict(
    sc_db: Path, sc: DagctxClient, sampler: Sampler
) -> None:
    s = await sc.session_create("conflict-2")
    sid = s.session_id
    head, _ = await chat(sc, sid, s.head, 6)
    other = await spawn(sc_db, None)
    try:
        async def other_appends(p: Any) -> str:
            await other.append(sid, "user", output="from another editor", predecessor=head)
            return extractive(p)

        sampler.answer = other_appends
        before = await state(sc, sid)
        res = await sc.compact(sid, model=BIG, keep_recent_tokens=1500)
        assert not res.ok and res.reason == "conflict", res
        now = await state(sc, sid)
        assert now["nodes"] == before["nodes"] + 1
        assert (await other.session_get(sid)).node_count == now["nodes"]
    finally:
        await other.close()


async def test_two_concurrent_compactions_write_one_summary(sc: DagctxClient, sampler: Sampler) -> None:
    """The second summary was written for a branch that meanwhile got one: conflict."""
    s = await sc.session_create("concurrent")
    sid = s.session_id
    await chat(sc, sid, s.head, 6)
    gate = asyncio.Event()

    async def wait_for_both(p: Any) -> str:
        await gate.wait()
        return extractive(p)

    sampler.answer = wait_for_both
    n0 = (await sc.session_get(sid)).node_count
    futs = [sc.send_request("context/compact", pc.CompactParams(session_id=sid, model=BIG, keep_recent_tokens=1500))[1]
            for _ in range(2)]
    while len(sampler.requests) < 2:
        await asyncio.sleep(0.02)
    gate.set()
    results = [await asyncio.wait_for(f, 10) for f in futs]
    assert sorted(r.reason for r in results) == ["conflict", "manual"], results
    written = next(r for r in results if r.ok)
    assert (await sc.session_get(sid)).node_count == n0 + 1
    r = await sc.render(sid, model=BIG, format="neutral")
    assert r.reads[0] == written.summary_id and r.manifest["supersededSummaries"] == []


async def test_fork_inside_the_kept_tail_inherits_the_summary(sc: DagctxClient) -> None:
    """A branch that holds the whole covered segment renders with the summary; its own
    re-compaction supersedes it there only."""
    s = await sc.session_create("inherit")
    sid = s.session_id
    a_tip, a = await chat(sc, sid, s.head, 6, tag="alpha")
    res = await sc.compact(sid, model=BIG, keep_recent_tokens=2500)
    assert res.ok and a[-2]["user"] not in res.covers_ids, res
    # fork from the second-to-last turn (kept verbatim) and grow the fork
    b_tip, _ = await chat(sc, sid, a[-2]["reply"], 5, start=10, tag="beta", move_head=False)
    rb = await sc.render(sid, head=b_tip, model=BIG, format="neutral")
    assert rb.reads[0] == res.summary_id and not set(res.covers_ids) & set(rb.reads)
    ra = await sc.render(sid, head=a_tip, model=BIG, format="openai")
    res_b = await sc.compact(sid, head=b_tip, model=BIG, keep_recent_tokens=2500)
    assert res_b.ok and res_b.superseded_summary == res.summary_id, res_b
    assert set(res.covers_ids) < set(res_b.covers_ids)
    assert (await sc.render(sid, head=b_tip, model=BIG)).reads[0] == res_b.summary_id
    again = await sc.render(sid, head=a_tip, model=BIG, format="openai")
    assert again.messages == ra.messages and again.reads == ra.reads
    assert again.manifest["summaryId"] == res.summary_id
    assert (await sc.session_get(sid)).head == a_tip


async def test_small_session_is_below_threshold(sc: DagctxClient, sampler: Sampler) -> None:
    s = await sc.session_create("small")
    sid = s.session_id
    await chat(sc, sid, s.head, 2, lines=5)
    before = await state(sc, sid)
    res = await sc.compact(sid, model=BIG)
    assert res.ok and res.reason == "belowThreshold" and res.summary_id is None, res
    assert res.tokens_after == res.tokens_before == before["tokens"]
    assert sampler.requests == []
    assert await state(sc, sid) == before
    empty = await sc.session_create("empty")
    res = await sc.compact(empty.session_id, model=BIG)
    assert res.ok and res.reason == "belowThreshold" and res.tokens_before == 0
    assert sampler.requests == [] and (await sc.session_get(empty.session_id)).node_count == 1


async def test_client_that_cannot_sample(db_path: Path) -> None:
    c = await spawn(db_path, None)
    try:
        s = await c.session_create("no-sampling")
        sid = s.session_id
        head, turns = await chat(c, sid, s.head, 6)
        before = await state(c, sid)
        res = await c.compact(sid, model=BIG, keep_recent_tokens=1500)
        assert not res.ok and res.reason == "failed", res
        assert "no summarizer" in res.error and "structural" in res.error
        assert await state(c, sid) == before
        # explicit opt-in: the deterministic structural summary, clearly labelled
        res = await c.compact(sid, model=BIG, keep_recent_tokens=1500, fallback="structural")
        assert res.ok and res.summary_id, res
        node = (await c.get_nodes(sid, [res.summary_id])).nodes[0]
        assert node.output.startswith(MARKER) and STRUCTURAL in node.output
        assert "src/pkg/mod_0.py" in node.output and "read_file" in node.output
        after = await c.render(sid, model=BIG, format="neutral")
        assert after.reads[0] == res.summary_id and (await c.session_get(sid)).head == head
        assert res.tokens_after == after.tokens.total < res.tokens_before
    finally:
        await c.close()


async def test_bad_keep_recent_tokens_is_invalid_params(sc: DagctxClient) -> None:
    s = await sc.session_create("bad")
    with pytest.raises(RpcError) as err:
        await sc.compact(s.session_id, keep_recent_tokens=-5)
    assert err.value.code == -32602
    with pytest.raises(RpcError) as err:
        await sc.compact("no-such-session")
    assert err.value.kind == "SessionNotFound"


# ---------------------------------------------------------------- 4. auto compaction


async def _big_session(c: DagctxClient) -> tuple[str, str]:
    s = await c.session_create("auto")
    head, _ = await chat(c, s.session_id, s.head, 12, lines=200)
    return s.session_id, head


async def test_prepare_compacts_automatically_above_80_percent(sc: DagctxClient, sampler: Sampler) -> None:
    sid, head = await _big_session(sc)
    plain = await sc.prepare(sid, model=SMALL, format="openai")
    # over its limit, the plain request was reduced within the turn (SPEC §8); the
    # session still needs compaction, measured on the unreduced request
    assert plain.reduction is not None and plain.reduction.tokens_before >= 0.8 * plain.budget.input_budget
    assert plain.needs_compaction, plain.budget
    assert plain.compaction is None
    assert all(r.metadata["purpose"].startswith("dagctx/turn-") for r in sampler.requests)
    res = await sc.prepare(sid, model=SMALL, format="openai", allow_compaction=True)
    assert res.compaction and res.compaction["ok"], res.compaction
    sid_summary = res.compaction["summaryId"]
    assert sid_summary and res.summary_id == sid_summary
    assert any("auto-compaction wrote" in line and sid_summary in line for line in res.decision_path)
    assert res.reads[0] == sid_summary and not res.needs_compaction
    assert res.budget.input_used < plain.reduction.tokens_before
    assert check_pairs(res.messages, "openai") == []
    node = (await sc.get_nodes(sid, [sid_summary])).nodes[0]
    assert node.metadata["trigger"] == "auto"
    assert (await sc.session_get(sid)).head == head


async def test_auto_compaction_pauses_after_three_failures(sc: DagctxClient, sampler: Sampler) -> None:
    sid, head = await _big_session(sc)
    sampler.answer = _raise
    for _ in range(3):
        res = await sc.prepare(sid, model=SMALL, format="openai", allow_compaction=True)
        assert res.compaction is not None and not res.compaction["ok"] and res.compaction["reason"] == "failed"
        assert any("auto-compaction wrote nothing" in line for line in res.decision_path)
        assert res.needs_compaction and res.summary_id is None
    asked = len(sampler.requests)
    fourth = await sc.prepare(sid, model=SMALL, format="openai", allow_compaction=True)
    assert len(sampler.requests) == asked, "a paused auto-compaction does not call the sampler"
    assert fourth.compaction is None
    paused = [line for line in fourth.decision_path if "auto-compaction paused" in line]
    assert paused and "3 consecutive failures" in paused[0], fourth.decision_path
    # a manual compaction still runs (and succeeds once the sampler is back)
    sampler.answer = extractive
    assert (await sc.compact(sid, model=SMALL)).ok
    assert (await sc.session_get(sid)).head == head


# ---------------------------------------------------------------- 5. progress


async def test_progress_notifications(sc: DagctxClient, sampler: Sampler) -> None:
    s = await sc.session_create("progress")
    sid = s.session_id
    await chat(sc, sid, s.head, 8, lines=80)
    res = await sc.compact(sid, model="gpt-4", keep_recent_tokens=1500, work_done_token="tok-7")
    assert res.ok
    await asyncio.sleep(0.05)
    kinds = progress_of(sc, "tok-7")
    assert kinds[0] == "begin" and kinds[-1] == "end"
    assert kinds.count("begin") == 1 and kinds.count("end") == 1
    assert kinds.count("report") == len(sampler.requests) >= 2  # one report per stage
    # no token, no progress; a below-threshold run still begins and ends
    small = await sc.session_create("progress-small")
    await chat(sc, small.session_id, small.head, 1, lines=3)
    assert (await sc.compact(small.session_id, work_done_token=99)).reason == "belowThreshold"
    await asyncio.sleep(0.05)
    assert progress_of(sc, 99) == ["begin", "end"]


# ---------------------------------------------------------------- 6. real sessions


@pytest.mark.parametrize("rel", [CC_COMPACT, CODEX])
async def test_real_sessions_compact_at_32k(sc: DagctxClient, sampler: Sampler, corpus: Path, rel: str) -> None:
    imported = (await sc.import_path(str(corpus / rel))).sessions[0]
    sid = imported.session_id
    head = (await sc.session_get(sid)).head
    before = await sc.render(sid, model=SMALL, format="neutral")
    old_summary = before.manifest["summaryId"]
    old_covers = list(before.manifest["coversIds"])
    if rel == CC_COMPACT:
        assert old_summary and old_covers, "the transcript carries a Claude Code compaction"
    n0 = (await sc.session_get(sid)).node_count
    res = await sc.compact(sid, model=SMALL)
    assert res.ok or res.reason in ("belowThreshold", "nothingToCompact"), res
    assert (await sc.session_get(sid)).head == head
    if not res.ok or res.summary_id is None:
        assert (await sc.session_get(sid)).node_count == n0
        return
    assert (await sc.session_get(sid)).node_count == n0 + 1
    assert res.tokens_after < res.tokens_before == before.tokens.total
    after = await sc.render(sid, model=SMALL, format="neutral")
    assert after.reads[0] == res.summary_id and res.tokens_after == after.tokens.total
    for fmt in ("openai", "anthropic"):
        r = await sc.render(sid, model=SMALL, format=fmt)
        assert check_pairs(r.messages, fmt) == [], fmt
    if old_summary:
        assert res.superseded_summary == old_summary and res.used_previous_summary
        assert set(old_covers) <= set(res.covers_ids) and len(res.covers_ids) > len(old_covers)
        assert old_summary not in res.covers_ids and old_summary not in after.reads
    await check_coverage(sc, sid, before, after, res, sampler.text(), old_covers)


async def test_tokens_after_is_measured_in_the_requested_format(db_path: Path) -> None:
    """SPEC §8: tokensBefore/tokensAfter are the render of the format the caller names
    (an openai render has a message per tool result, so it differs from neutral)."""
    c = await spawn(db_path, None)
    try:
        s = await c.session_create("formats")
        sid = s.session_id
        head = s.head
        for t in range(8):  # each reply makes three tool calls: openai has a message per result
            u = await c.append(sid, "user", output=f"turn {t}: read the three modules of src/pkg", predecessor=head)
            a = await c.append(sid, "llm", name=BIG, output=f"Reading them ({t}).", predecessor=u.node.id)
            for k in range(3):
                await c.append(sid, "code", name="read_file", input={"path": f"src/pkg/mod_{t}_{k}.py"},
                               output="\n".join(f"line {i} of mod_{t}_{k}" for i in range(60)),
                               caller=a.node.id, metadata={"toolCallId": f"call_{t}_{k}"})
            head = a.node.id
        before = {f: (await c.render(sid, model=BIG, format=f)).tokens.total for f in ("neutral", "openai")}
        res = await c.compact(sid, model=BIG, keep_recent_tokens=1500, fallback="structural", format="openai")
        assert res.ok and res.summary_id and res.format == "openai", res
        after = {f: (await c.render(sid, model=BIG, format=f)).tokens.total for f in ("neutral", "openai")}
        assert before["openai"] != before["neutral"]
        assert (res.tokens_before, res.tokens_after) == (before["openai"], after["openai"])
    finally:
        await c.close()


# ---------------------------------------------------------------- the prompt cache (SPEC §7)


async def test_a_compaction_breaks_the_prompt_cache_and_says_so(db_path: Path) -> None:
    tiny = "tiny-8k"
    c = await spawn(db_path, None, models={**MODELS, tiny: {"contextWindow": 8000, "maxOutput": 1000}})
    try:
        s = await c.session_create("cache")
        sid, head = s.session_id, s.head

        async def prepare() -> pc.PrepareResult:
            return await c.prepare(sid, model=tiny, format="anthropic", prompt_mode="none")

        i = 0
        p = await prepare()
        assert p.cache_break is None  # nothing before it
        while not p.recommend_compaction:  # when it pays, at the latest at 80 % (SPEC §7)
            assert p.budget.percent_used < 80
            head, _ = await chat(c, sid, head, 1, start=i, lines=12)
            i += 1
            p = await prepare()
            # a request that only adds to the previous one breaks nothing
            assert p.cache_break is None, p.cache_break
        res = await c.compact(sid, model=tiny, fallback="structural", format="anthropic")
        assert res.ok and res.summary_id, res
        after = await prepare()
        brk = after.cache_break
        assert brk is not None and brk.causes == ["compaction"] and brk.previous_render_id == p.render_id
        # the summary leads the request now: nothing of the previous one is read from the cache
        assert brk.at_message == after.stable_prefix.messages == 0
        before_tokens, after_tokens = p.manifest["tokens"], after.manifest["tokens"]
        assert (brk.invalidated_tokens, brk.rewritten_tokens) == (before_tokens, after_tokens)
        assert after_tokens < before_tokens
        assert brk.estimated_cost == round(1.25 * after_tokens - 0.1 * before_tokens, 1)
        assert any(line.startswith("prompt cache break at message 0 (compaction)") for line in after.decision_path)
        # the same request again extends it: no break
        again = await prepare()
        assert again.cache_break is None and again.messages == after.messages
    finally:
        await c.close()
