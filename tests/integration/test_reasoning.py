"""Reasoning kept per provider, through the real daemon (SPEC §4 ``metadata.reasoning``, §6).

* Claude Code: thinking and redacted-thinking blocks are imported whole, signatures
  included; an Anthropic render sends the signed blocks of the current tool loop's
  assistant turns unchanged and first in their message; OpenAI Chat Completions none;
  ``reasoning: "all" | "none"`` override; their tokens are counted.
* Codex: reasoning items keep their ``encrypted_content``.
* Agents record reasoning through ``node/append``; a malformed one writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.context.formats import check_pairs
from dagctx.protocol.nodes import Call

from rawdb import RawDb


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


CLAUDE = "claude-code/general-tool-calls.jsonl"


def source_thinking(path: Path) -> list[tuple[str, str]]:
    """(thinking, signature) of every signed thinking block in a Claude Code file."""
    out = []
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        msg = obj.get("message")
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            for b in msg["content"]:
                if isinstance(b, dict) and b.get("type") == "thinking" and b.get("signature"):
                    out.append((b.get("thinking") or "", b["signature"]))
    return out


def all_nodes(database: str, sid: str) -> list[Call]:
    dec = msgspec.msgpack.Decoder(Call)
    with RawDb(database) as db:
        rows = db.execute("SELECT body FROM nodes WHERE session_id=? ORDER BY seq", (sid,))
    return [dec.decode(bytes(r[0])) for r in rows]


def current_loop(chain: list[Call]) -> list[Call]:
    """The top-level llm nodes after the branch's newest user message."""
    out: list[Call] = []
    for n in chain:
        if n.role == "user":
            out = []
        elif n.role == "llm" and n.name != "context/summary":
            out.append(n)
    return out


def thinking_blocks(messages: list[dict]) -> list[tuple[int, int, dict]]:
    return [(i, k, b) for i, m in enumerate(messages) if isinstance(m.get("content"), list)
            for k, b in enumerate(m["content"]) if b.get("type") in ("thinking", "redacted_thinking")]


async def test_claude_code_signed_thinking_is_kept_and_sent_by_the_anthropic_rule(corpus: Path, tmp_path: Path) -> None:
    database = str(tmp_path / "cc.db")
    src = corpus / CLAUDE
    signed = source_thinking(src)
    assert len(signed) >= 50
    c = await DagctxClient.spawn(database)
    try:
        res = await c.import_path(str(src))
        kept: list[tuple[str, str]] = []
        for sess in res.sessions:
            for n in all_nodes(database, sess.session_id):
                for b in n.metadata.get("reasoning") or ():
                    if b["type"] == "thinking" and b.get("signature"):
                        assert n.role == "llm"
                        kept.append((b["text"], b["signature"]))
        # every signed block of the file is stored, byte for byte (none were before)
        assert sorted(kept) == sorted(signed)

        checked = 0
        for sess in res.sessions:
            for br in (await c.branches(sess.session_id)).branches:
                chain = (await c.history(sess.session_id, head=br.head)).nodes
                # heads in the middle of a tool loop: each llm node that made tool calls
                for k, node in enumerate(chain):
                    if node.role != "llm" or not node.metadata.get("reasoning"):
                        continue
                    head_chain = chain[: k + 1]
                    loop = current_loop(head_chain)
                    want = [b for n in loop for b in n.metadata.get("reasoning") or ()
                            if (b["type"] == "thinking" and b.get("signature")) or b["type"] == "redacted_thinking"]
                    r = await c.render(sess.session_id, head=node.id, format="anthropic", model="claude-opus-4-5")
                    assert check_pairs(r.messages, "anthropic") == []
                    got = thinking_blocks(r.messages)
                    assert [(b["thinking"], b["signature"]) for _, _, b in got] == [
                        (b["text"], b["signature"]) for b in want]
                    for i, pos, b in got:  # first in their message: only thinking before it
                        assert r.messages[i]["role"] == "assistant"
                        assert all(x["type"] in ("thinking", "redacted_thinking") for x in r.messages[i]["content"][:pos])
                    # OpenAI Chat Completions: none; "none": none; "all": every signed block of the branch
                    o = await c.render(sess.session_id, head=node.id, format="openai", model="claude-opus-4-5")
                    assert "thinking" not in json.dumps(o.messages) and not any("reasoning_content" in m for m in o.messages)
                    nothing = await c.render(sess.session_id, head=node.id, format="anthropic",
                                             model="claude-opus-4-5", reasoning="none")
                    assert thinking_blocks(nothing.messages) == []
                    every = await c.render(sess.session_id, head=node.id, format="anthropic",
                                           model="claude-opus-4-5", reasoning="all")
                    on_branch = [b for n in head_chain if n.role == "llm" for b in n.metadata.get("reasoning") or ()
                                 if b.get("signature")]
                    assert len(thinking_blocks(every.messages)) == len(on_branch)
                    # counted: the difference is the thinking text's tokens
                    if want:
                        assert r.tokens.total > nothing.tokens.total
                        assert every.tokens.total >= r.tokens.total
                    else:
                        assert r.tokens.total == nothing.tokens.total
                    checked += bool(want)
                    # replay of a call sent this render gives the same bytes
                    if checked == 1 and want:
                        rep_head = node.id
                        rid = r.render_id
        assert checked >= 10, checked
        # a budgeted prepare mid-loop counts them and hands them out
        sid = res.sessions[0].session_id
        prep = await c.prepare(sid, head=rep_head, model="claude-opus-4-5", format="anthropic", prompt_mode="none")
        none = await c.prepare(sid, head=rep_head, model="claude-opus-4-5", format="anthropic", prompt_mode="none",
                               reasoning="none")
        assert thinking_blocks(prep.messages) and not thinking_blocks(none.messages)
        assert prep.budget.input_used > none.budget.input_used
        assert prep.manifest["reasoning"] == "provider" and rid
    finally:
        await c.close()


async def test_codex_encrypted_reasoning_is_kept(corpus: Path, tmp_path: Path) -> None:
    database = str(tmp_path / "codex.db")
    files = sorted((corpus / "codex").glob("*.jsonl"))
    want = []
    for f in files:
        for line in f.read_text().splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            p = obj.get("payload")
            if obj.get("type") == "response_item" and isinstance(p, dict) and p.get("type") == "reasoning" \
                    and p.get("encrypted_content"):
                want.append(p["encrypted_content"])
    assert want
    c = await DagctxClient.spawn(database)
    try:
        res = await c.import_path(str(corpus / "codex"))
        got = [b["encryptedContent"] for s in res.sessions for n in all_nodes(database, s.session_id)
               for b in n.metadata.get("reasoning") or () if b.get("encryptedContent")]
        assert sorted(got) == sorted(want)
        sid = res.sessions[0].session_id
        # OpenAI Chat Completions takes no reasoning back; neutral "all" carries the items as stored
        o = await c.render(sid, format="openai", model="gpt-5")
        assert not any("reasoning_content" in m for m in o.messages) and want[0] not in json.dumps(o.messages)
        n = await c.render(sid, format="neutral", model="gpt-5", reasoning="all")
        blocks = [b for m in n.messages for b in m["content"] if b.get("type") == "reasoning"]
        assert {b.get("encryptedContent") for b in blocks} >= set(want) - {None}
        assert check_pairs(n.messages, "neutral") == []
    finally:
        await c.close()


async def test_agents_record_reasoning_through_node_append(database: str) -> None:
    c = await DagctxClient.spawn(database)
    try:
        s = await c.session_create("agent with thinking")
        u = await c.append(s.session_id, "user", output="What is in src/?", predecessor=s.head)
        blocks = [{"type": "thinking", "text": "List the folder first.", "signature": "c2lnbmVkLWJ5LWFudGhyb3BpYw=="},
                  {"type": "redacted_thinking", "data": "ZW5jcnlwdGVkLXJlYXNvbmluZw=="}]
        llm = await c.append(s.session_id, "llm", name="claude-sonnet-4-5", output="Listing.", predecessor=u.head,
                             metadata={"reasoning": blocks})
        assert llm.node.metadata["reasoning"] == blocks
        await c.append(s.session_id, "code", name="ls", input={"path": "src"}, output="app.py",
                       caller=llm.node.id, metadata={"toolCallId": "toolu_1"})
        r = await c.render(s.session_id, format="anthropic", model="claude-sonnet-4-5")
        assistant = [m for m in r.messages if m["role"] == "assistant"][0]
        assert assistant["content"][:3] == [
            {"type": "thinking", "thinking": "List the folder first.", "signature": "c2lnbmVkLWJ5LWFudGhyb3BpYw=="},
            {"type": "redacted_thinking", "data": "ZW5jcnlwdGVkLXJlYXNvbmluZw=="},
            {"type": "text", "text": "Listing."}]
        # the next user message ends the tool loop: its thinking is no longer sent by default
        reply = await c.append(s.session_id, "llm", name="claude-sonnet-4-5", output="src/ holds app.py.",
                               predecessor=llm.head)
        await c.append(s.session_id, "user", output="thanks", predecessor=reply.head)
        later = await c.render(s.session_id, format="anthropic", model="claude-sonnet-4-5")
        assert thinking_blocks(later.messages) == []
        assert len(thinking_blocks((await c.render(s.session_id, format="anthropic", reasoning="all")).messages)) == 2
        # malformed, or on a node that is no llm call: refused, nothing written
        before = (await c.session_get(s.session_id)).node_count
        for bad in ({"role": "llm", "metadata": {"reasoning": [{"type": "thinking", "signature": 5}]}},
                    {"role": "llm", "metadata": {"reasoning": "thought"}},
                    {"role": "llm", "metadata": {"reasoning": [{"type": "musing", "text": "x"}]}},
                    {"role": "code", "metadata": {"reasoning": [{"type": "reasoning", "text": "x"}]}}):
            with pytest.raises(RpcError) as err:
                await c.append(s.session_id, bad["role"], output="x",
                               **({"predecessor": later.manifest["head"]} if bad["role"] == "llm"
                                  else {"caller": llm.node.id}), metadata=bad["metadata"])
            assert err.value.kind == "InvalidParams" and "reasoning" in err.value.message
        assert (await c.session_get(s.session_id)).node_count == before
    finally:
        await c.close()


async def test_reduction_within_the_turn_never_alters_reasoning(tmp_path: Path) -> None:
    """A long tool loop with signed thinking at a 32k window: tool results are summarized,
    no checkpoint covers a step with signed reasoning, and every block of the loop is sent
    unchanged (SPEC §4, §8)."""
    from sampling_stub import ScriptedSampler

    sampler = ScriptedSampler(lambda params: "condensed: " + " ".join(
        "\n".join(m.content.text for m in params.messages).split()[:30]))
    c = await DagctxClient.spawn(tmp_path / "loop.db", capabilities={"sampling": {}},
                                 initialization_options={"models": {"small-32k": {"contextWindow": 32000,
                                                                                  "maxOutput": 4000}}})
    c.on_request("sampling/createMessage", sampler)
    try:
        s = await c.session_create("thinking loop")
        prev = (await c.append(s.session_id, "user", output="Fix every failing test under src/pkg",
                               predecessor=s.head)).node.id
        stored: list[dict] = []
        for i in range(60):
            block = {"type": "thinking", "text": f"Step {i}: read module {i} next.", "signature": f"sig-{i:03d}=="}
            stored.append(block)
            llm = await c.append(s.session_id, "llm", name="claude-sonnet-4-5", output=f"Reading mod_{i}.py.",
                                 predecessor=prev, metadata={"reasoning": [block]})
            body = "\n".join(f"line {k}: total_{i} = accumulate(values, step={k % 7})" for k in range(60))
            await c.append(s.session_id, "code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"},
                           output=body, caller=llm.node.id, metadata={"toolCallId": f"toolu_{i:03d}"})
            prev = llm.node.id
        p = await c.prepare(s.session_id, model="small-32k", format="anthropic", prompt_mode="none")
        assert p.reduction is not None and p.reduction.results, p.decision_path
        assert p.reduction.checkpoint is None
        sent = [b for m in p.messages if m["role"] == "assistant" for b in m["content"] if b["type"] == "thinking"]
        assert sent == [{"type": "thinking", "thinking": b["text"], "signature": b["signature"]} for b in stored]
        assert p.budget.input_used <= p.budget.input_budget - p.budget.safety_margin
        assert check_pairs(p.messages, "anthropic") == []
    finally:
        await c.close()


async def test_signed_reasoning_blocks_a_checkpoint_only_where_it_is_sent(tmp_path: Path) -> None:
    """A long tool loop whose replies carry signed thinking and long texts, with small tool
    results (nothing to summarize): only a request checkpoint makes it fit a 32k window.
    Chat Completions (and reasoning "none") send none of the blocks, so the checkpoint
    covers those steps; Anthropic and neutral send the loop's signed blocks byte for byte,
    so no checkpoint may drop them and the request is refused, writing nothing (SPEC §6, §8)."""
    from sampling_stub import ScriptedSampler

    sampler = ScriptedSampler(lambda params: "condensed: " + " ".join(
        "\n".join(m.content.text for m in params.messages).split()[:30]))
    c = await DagctxClient.spawn(tmp_path / "signed.db", capabilities={"sampling": {}},
                                 initialization_options={"models": {"small-32k": {"contextWindow": 32000,
                                                                                  "maxOutput": 4000}}})
    c.on_request("sampling/createMessage", sampler)
    try:
        s = await c.session_create("signed loop")
        sid = s.session_id
        prev = (await c.append(sid, "user", output="Refactor every module under src/pkg", predecessor=s.head)).node.id
        for i in range(80):
            block = {"type": "thinking", "text": f"Module {i} next.", "signature": f"c2lnLXt7aX19-{i:03d}=="}
            text = f"Step {i}: " + " ".join(f"module_{i} function_{k} returns value_{k} after check_{k};"
                                            for k in range(40))
            llm = await c.append(sid, "llm", name="claude-sonnet-4-5", output=text, predecessor=prev,
                                 metadata={"reasoning": [block]})
            await c.append(sid, "code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"},
                           output=f"ok {i}", caller=llm.node.id, metadata={"toolCallId": f"toolu_{i:03d}"})
            prev = llm.node.id
        # Chat Completions takes no reasoning back: the steps may be checkpointed
        p = await c.prepare(sid, model="small-32k", format="openai", prompt_mode="none")
        assert p.reduction is not None and p.reduction.checkpoint is not None, p.decision_path
        assert len(p.reduction.checkpoint.covers_ids) >= 8
        assert p.budget.input_used <= p.budget.input_budget - p.budget.safety_margin
        assert check_pairs(p.messages, "openai") == []
        # Anthropic with reasoning "none" sends no block either
        n = await c.prepare(sid, model="small-32k", format="anthropic", prompt_mode="none", reasoning="none")
        assert n.reduction is not None and n.reduction.checkpoint is not None
        assert thinking_blocks(n.messages) == []
        # Anthropic and neutral send the loop's signed blocks: no checkpoint may drop them
        count = (await c.session_get(sid)).node_count
        for fmt in ("anthropic", "neutral"):
            with pytest.raises(RpcError) as err:
                await c.prepare(sid, model="small-32k", format=fmt, prompt_mode="none")
            assert err.value.kind == "BudgetExceeded"
            assert any("signedReasoning" in f for f in err.value.data["details"]["failures"]), err.value.data
        assert (await c.session_get(sid)).node_count == count
    finally:
        await c.close()
