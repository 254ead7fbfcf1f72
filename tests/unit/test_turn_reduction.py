"""Planning of reduction within a turn (SPEC §8): pure functions over in-memory graphs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dagctx.context import turn_reduction as tr
from dagctx.context.aging import AgingPolicy, long_turn_cap, plan_aging, result_text
from dagctx.context.budget import compute_budget
from dagctx.context.formats import check_pairs, to_messages
from dagctx.context.models import ModelInfo
from dagctx.context.render import render_view
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call

from graph_builder import GraphBuilder


def count(text: str) -> int:
    return math.ceil(len(text) / 4)


def body(i: int, lines: int = 60) -> str:
    return f"# src/pkg/mod_{i}.py\n" + "\n".join(f"    line {k}: total_{i} = f(x, {k})" for k in range(lines))


class Turn(GraphBuilder):
    """One user message, then ``steps`` model calls, each with one tool call."""

    def user(self, text: str = "Fix every failing test") -> str:
        self.tip = self.add(f"u{self.seq + 1}", "user", output=text, caller="root", predecessor=self.tip)
        return self.tip

    def step(self, i: int, *, output: Any = None, status: str = "completed", llm_output: Any = None,
             tool_status: str | None = None) -> str:
        a = self.add(f"a{i}", "llm", name="m", output=llm_output or f"Step {i}.", caller="root", predecessor=self.tip)
        self.add(f"t{i}", "code", name="read_file", input={"path": f"src/pkg/mod_{i}.py"},
                 output=body(i) if output is None else output, caller=a, status=tool_status or status,  # type: ignore[arg-type]
                 metadata={"toolCallId": f"call_{i}"})
        self.tip = a
        return a

    def token_of(self, nid: str) -> int:
        return count(result_text(self.g.nodes[nid]))


def long_turn(n: int, **kw: Any) -> Turn:
    t = Turn()
    t.user()
    for i in range(n):
        t.step(i, **kw)
    return t


def budget(window: int = 32_000, used: int = 10_000, reserve: int | None = None) -> Any:
    import msgspec

    info = ModelInfo(name="m", context_window=window, max_output=4_000, tokenizer="estimate")
    b = compute_budget(info, 100, used - 100, 0, requested_output=reserve)
    return msgspec.structs.replace(b, safety_margin=tr.safety_margin(window))


# ---------------------------------------------------------------- the check


def test_safety_margin_and_limit() -> None:
    assert tr.safety_margin(8_000) == tr.SAFETY_MARGIN_MIN
    assert tr.safety_margin(32_000) == 640 and tr.safety_margin(128_000) == 2_560
    b = budget(32_000, used=27_000)
    assert b.output_reserve == 4_000 and tr.input_limit(b) == 32_000 - 4_000 - 640
    assert tr.fits(b) and not tr.fits(budget(32_000, used=27_400))
    # an explicit cap is never shrunk: it is the reserve as given
    assert budget(32_000, used=1_000, reserve=20_000).output_reserve == 20_000


def test_turn_shape_and_protected_parts() -> None:
    t = long_turn(5)
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    assert shape.user == "u1" and shape.steps == ("a0", "a1", "a2", "a3", "a4")
    _, msgs, ids = to_messages(view, "neutral")
    per = [10 * (k + 1) for k in range(len(msgs))]
    parts = tr.protected_parts(t.g, shape, ids, per, system=7, tools=5)
    # message 0 is the user's; the newest step is its assistant message and its tool message
    assert parts.user_messages == per[0]
    # its finished tool result may be summarized last: protected at about a summary's size
    assert parts.newest_step == per[-2] + min(per[-1], tr.result_summary_cap(per[-1]) + 40)
    assert parts.total == 7 + 5 + per[0] + parts.newest_step


def test_budget_exceeded_carries_the_numbers() -> None:
    b = budget(8_000, used=9_000)
    parts = tr.ProtectedParts(system=100, tools=50, user_messages=7_000, newest_step=200)
    err = tr.budget_exceeded(b, parts, input_used=9_000, model="m")
    assert isinstance(err, DagctxError) and err.kind == "BudgetExceeded"
    d = err.details
    assert d["protectedTokens"] == 7_350 and d["limit"] == tr.input_limit(b) and d["overBy"] == 7_350 - d["limit"]
    assert d["userMessages"] == 7_000 and d["newestStep"] == 200 and d["safetyMargin"] == tr.SAFETY_MARGIN_MIN
    assert "protected part" in err.message and "maxOutputTokens" in err.message
    small = tr.ProtectedParts(system=100, tools=0, user_messages=50, newest_step=50)
    err = tr.budget_exceeded(b, small, input_used=9_000, model="m", summary_calls=32, failures=["callLimit"])
    assert "still needs 9,000" in err.message and "callLimit" in err.message
    assert err.details["overBy"] == 9_000 - tr.input_limit(b) and err.details["summaryCalls"] == 32


# ---------------------------------------------------------------- result candidates


def test_candidates_are_returned_plain_text_results_outside_the_newest_step() -> None:
    t = long_turn(4)
    t.g.nodes["t1"] = Call(**{**_fields(t.g.nodes["t1"]), "output": [{"type": "image", "url": "x.png"},
                                                                    {"type": "text", "text": body(1)}]})
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    cands = tr.result_candidates(view, t.g, shape, t.token_of, aged={"t2": "aged"})
    ids = [c.node_id for c in cands]
    # t1 multimodal, t2 already aged, t3 in the newest step
    assert ids == ["t0"]
    assert cands[0].tool_call_id == "call_0" and cands[0].text == body(0)
    assert tr.result_candidates(view, t.g, shape, t.token_of, aged={}, min_tokens=10**6) == []


def test_unfinished_group_and_small_results_are_not_candidates() -> None:
    t = Turn()
    t.user()
    t.step(0)
    a = t.step(1)
    t.add("t1b", "code", name="bash", input={"cmd": "make"}, output=None, caller=a, status="running",
          metadata={"toolCallId": "call_1b"})
    t.step(2, output="ok")  # too small
    t.step(3)
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    ids = [c.node_id for c in tr.result_candidates(view, t.g, shape, t.token_of, aged={})]
    assert ids == ["t0"]


def test_reduced_result_keeps_call_id_and_error_status() -> None:
    t = long_turn(3)
    t.g.nodes["t0"] = Call(**{**_fields(t.g.nodes["t0"]), "status": "error"})
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    cand = tr.result_candidates(view, t.g, shape, t.token_of, aged={})[0]
    red = tr.Reductions()
    text = tr.reduced_result_text(cand, "condensed")
    red.results["t0"] = tr.ReducedText("t0", "call_0", text, "k", cand.tokens, count(text))
    after = render_view(t.g, t.tip, aged=red.aged_overlay({}))
    _, msgs, _ = to_messages(after, "neutral")
    res = [b for m in msgs for b in m["content"] if b["type"] == "tool_result"]
    assert res[0]["toolCallId"] == "call_0" and res[0]["isError"] is True
    assert res[0]["content"].startswith("[error] [tool result summarized for this request: read_file")
    assert check_pairs(msgs, "neutral") == []
    # a chosen summary replaces what aging made of the result (only the newest step's
    # results are chosen while aged, SPEC §8)
    assert red.aged_overlay({"t0": "aged", "t9": "other"}) == {"t0": red.results["t0"].text, "t9": "other"}
    assert red.manifest()["results"] == {"t0": "k"}
    assert red.tokens_saved({}) == cand.tokens - count(text) and red.tokens_saved({"t0": "x"}) == 0


def test_expected_saving_and_caps() -> None:
    assert tr.result_summary_cap(100) == 64 and tr.result_summary_cap(10_000) == 600
    c = tr.ResultCandidate("n", "bash", "c", 3_000, "x", "", "completed")
    assert tr.expected_saving(c) == 3_000 - 600 - 40
    system, user = tr.result_messages(c, "the text", previous="earlier")
    assert "condensed-so-far" in user and "<result>\nthe text\n</result>" in user and "at most" in user


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_steps_stop_at_blockers_and_keep_the_newest() -> None:
    t = long_turn(10)
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    steps, why = tr.checkpoint_steps(t.g, view, shape)
    assert steps == [f"a{i}" for i in range(10 - tr.KEEP_RECENT_STEPS)] and why is None
    # thinking blocks in a reply's output are never sent: they bind nothing
    t.g.nodes["a4"] = Call(**{**_fields(t.g.nodes["a4"]), "output": [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "Step 4."}]})
    view = render_view(t.g, t.tip)
    steps, why = tr.checkpoint_steps(t.g, view, tr.turn_shape(view, t.g),
                                     tr.signed_reasoning_sent(view, "anthropic", "provider"))
    assert len(steps) == 10 - tr.KEEP_RECENT_STEPS and why is None


@pytest.mark.parametrize("fmt, mode, block, stops", [
    ("anthropic", "provider", {"type": "thinking", "text": "hmm", "signature": "sig"}, True),
    ("anthropic", "all", {"type": "redacted_thinking", "data": "ZW5j"}, True),
    ("neutral", "provider", {"type": "reasoning", "text": "", "encryptedContent": "gAAA"}, True),
    ("anthropic", "none", {"type": "thinking", "text": "hmm", "signature": "sig"}, False),
    ("openai", "provider", {"type": "thinking", "text": "hmm", "signature": "sig"}, False),
    ("openai", "all", {"type": "reasoning", "text": "t", "encryptedContent": "gAAA"}, False),
    # unsigned thinking never goes to Anthropic; Codex encrypted reasoning neither
    ("anthropic", "provider", {"type": "thinking", "text": "hmm"}, False),
    ("anthropic", "provider", {"type": "reasoning", "text": "", "encryptedContent": "gAAA"}, False),
])
def test_signed_reasoning_stops_a_checkpoint_only_when_the_render_sends_it(
        fmt: str, mode: str, block: dict[str, Any], stops: bool) -> None:
    """SPEC §6, §8: a step's stored signed or encrypted reasoning stops a checkpoint only
    when this format and reasoning mode send it (it must go out byte for byte)."""
    t = long_turn(10)
    t.g.nodes["a4"] = Call(**{**_fields(t.g.nodes["a4"]), "metadata": {"reasoning": [block]}})
    view = render_view(t.g, t.tip)
    signed = tr.signed_reasoning_sent(view, fmt, mode)
    steps, why = tr.checkpoint_steps(t.g, view, tr.turn_shape(view, t.g), signed)
    if stops:
        assert signed == {"a4"} and steps == ["a0", "a1", "a2", "a3"] and why == "signedReasoning"
    else:
        assert signed == frozenset() and len(steps) == 10 - tr.KEEP_RECENT_STEPS and why is None


@pytest.mark.parametrize("blocker, why", [("image", "multimodal"), ("running", "unfinished"), ("ask", "userMessage")])
def test_checkpoint_blockers(blocker: str, why: str) -> None:
    t = Turn()
    t.user()
    for i in range(6):
        if i == 2 and blocker == "image":
            t.step(i, output=[{"type": "image", "url": "shot.png"}])
        elif i == 2 and blocker == "running":
            t.step(i, output=None, tool_status="running")
        else:
            a = t.step(i)
            if i == 2:
                t.add("ask", "user", input="Which file?", output="src/pkg/mod_9.py", caller=a)
    view = render_view(t.g, t.tip)
    steps, got = tr.checkpoint_steps(t.g, view, tr.turn_shape(view, t.g))
    assert steps == ["a0", "a1"] and got == why


def test_choose_checkpoint_is_quantized_and_monotone() -> None:
    eligible = [f"a{i}" for i in range(40)]
    tokens = dict.fromkeys(eligible, 500)
    k = tr.choose_checkpoint(eligible, tokens, need=2_000, summary_tokens=300)
    assert k == tr.CHECKPOINT_QUANTUM  # 5 steps needed, rounded up to the quantum
    assert tr.choose_checkpoint(eligible, tokens, need=10**9, summary_tokens=300) == 40
    assert tr.choose_checkpoint(eligible, tokens, need=1, summary_tokens=0, already=16) == 16


def test_settled_checkpoint_holds_while_the_turn_fits_and_jumps_far_when_it_does_not() -> None:
    steps = [f"a{i}" for i in range(60)]
    tokens = dict.fromkeys(steps, 500)
    base, limit, cap = 2_000, 12_000, 300
    seen = []
    for n in range(1, len(steps) + 1):
        before, k = tr.settled_checkpoint(steps[:n], max(0, n - tr.KEEP_RECENT_STEPS), tokens, base, limit, cap)
        if seen:
            assert before == seen[-1]  # the previous request's checkpoint, replayed from this one
        assert k % tr.CHECKPOINT_QUANTUM == 0 or k == n - tr.KEEP_RECENT_STEPS
        size = base + 500 * (n - k) + (cap if k else 0)
        assert size <= limit  # every request of the turn fits with its settled checkpoint
        seen.append(k)
    # the checkpoint only grows, and every move lands at about half the limit
    moves = [n for n in range(1, len(seen)) if seen[n] != seen[n - 1]]
    assert all(seen[n] > seen[n - 1] for n in moves)
    for n in moves:
        assert base + 500 * (n + 1 - seen[n]) + cap <= limit * tr.TARGET_SHARE
    # a move that only just fits would come back every step or two; these last
    assert len(moves) <= len(steps) * 500 // (limit * tr.TARGET_SHARE - base - cap) + 1
    assert min(b - a for a, b in zip(moves, moves[1:])) >= 8
    # nothing to cover: a turn that fits keeps no checkpoint
    assert tr.settled_checkpoint(steps[:5], 3, tokens, base, limit, cap) == (0, 0)


def test_apply_checkpoint_keeps_the_user_message_and_pairs() -> None:
    t = long_turn(12)
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    steps, _ = tr.checkpoint_steps(t.g, view, shape)
    text = tr.steps_text(view, shape, steps[:8])
    assert "call read_file" in text and "src/pkg/mod_7.py" in text and "mod_8.py" not in text
    # each step's text in one pass: the same as each step's steps_text
    assert tr.step_texts(view, shape, steps) == {st: tr.steps_text(view, shape, [st]) for st in steps}
    assert tr.task_text(view, shape) == "Fix every failing test"
    cp = tr.Checkpoint(id="checkpoint-x", covers=tuple(steps[:8]), summary="did 8 steps", key="k")
    after = tr.apply_checkpoint(view, t.g, cp)
    for fmt in ("neutral", "openai", "anthropic"):
        _, msgs, ids = to_messages(after, fmt)  # type: ignore[arg-type]
        assert check_pairs(msgs, fmt) == [], fmt  # type: ignore[arg-type]
    _, msgs, ids = to_messages(after, "neutral")
    assert msgs[0]["content"][0]["text"] == "Fix every failing test"
    assert msgs[1]["nodeIds"] == ["checkpoint-x"] and msgs[1]["content"][0]["text"] == cp.text
    assert cp.text.startswith("[Checkpoint: summary of the 8 earlier steps")
    assert not any(i.startswith("t") and int(i[1:]) < 8 for m in ids for i in m if i[1:].isdigit())
    assert view.reads == after.reads  # provenance: the covered nodes still contributed
    back = tr.checkpoint_from_manifest({"turnReduction": tr.Reductions(checkpoint=cp).manifest()})
    assert back is not None and back.covers == cp.covers and back.text == cp.text


def test_step_tokens() -> None:
    t = long_turn(3)
    view = render_view(t.g, t.tip)
    shape = tr.turn_shape(view, t.g)
    _, msgs, ids = to_messages(view, "neutral")
    per = [1] * len(msgs)
    assert tr.step_tokens(shape, t.g, ids, per) == {"a0": 2, "a1": 2, "a2": 2}


# ---------------------------------------------------------------- segments, keys, overflow


def test_split_segments() -> None:
    text = "\n".join(f"line {i} " + "x" * 40 for i in range(200))
    segs = tr.split_segments(text, 300, count)
    assert len(segs) > 1 and all(count(s) <= 300 for s in segs)
    assert "\n".join(segs) == text
    huge = "y" * 10_000
    parts = tr.split_segments(huge, 200, count)
    assert "".join(parts) == huge and all(count(p) <= 200 for p in parts)
    assert tr.split_segments("short", 300, count) == ["short"]


def test_summary_key_depends_on_content_and_model_configuration() -> None:
    cfg = {"summarizer": "client", "model": "m", "window": 32_000}
    k = tr.summary_key("result", "abc", cfg)
    assert k == tr.summary_key("result", "abc", dict(reversed(list(cfg.items()))))
    assert k != tr.summary_key("result", "abd", cfg)
    assert k != tr.summary_key("checkpoint", "abc", cfg)
    assert k != tr.summary_key("result", "abc", {**cfg, "model": "other"})


@pytest.mark.parametrize("msg, overflow", [
    ("the client answered with error -32603: ValueError: context length exceeded", True),
    ("This model's maximum context length is 8192 tokens", True),
    ("prompt is too long: 210000 tokens > 200000 maximum", True),
    ("HTTP 400 context_length_exceeded", True),
    ("the client answered with error -32603: RuntimeError: summarizer down", False),
    ("", False),
])
def test_context_overflow_detection(msg: str, overflow: bool) -> None:
    assert tr.is_context_overflow(msg) is overflow


# ---------------------------------------------------------------- aging within a long turn


def test_long_turn_cap_moves_in_quanta() -> None:
    policy = AgingPolicy(long_turn_steps=24, step_quantum=16)
    assert long_turn_cap(long_turn(23).g, "a22", policy) is None
    caps = []
    t = long_turn(60)
    for i in range(24, 60):
        steps, cap, step_id = long_turn_cap(t.g, f"a{i - 1}", policy)  # type: ignore[misc]
        assert steps == i
        caps.append(cap)
    assert sorted(set(caps)) == [16, 32, 48]
    assert caps.count(16) == 32 - 24 and caps.count(32) == 16
    assert long_turn_cap(t.g, "a59", AgingPolicy(long_turn_steps=0)) is None
    assert long_turn_cap(t.g, "a59", AgingPolicy(turn_unit="step")) is None
    with pytest.raises(ValueError):
        AgingPolicy(step_quantum=0)


def test_capped_step_plan_is_the_same_within_a_quantum() -> None:
    policy = AgingPolicy(turn_unit="step", keep_recent_turns=4, min_age_seconds=0, min_tokens=50,
                         soft_trim_head_chars=100, soft_trim_tail_chars=50, hard_clear_after_turns=8)
    t = long_turn(40)
    kinds = []
    for head in ("a33", "a36", "a39"):
        view = render_view(t.g, head)
        plan = plan_aging(view, t.g, now=1e9, boundary_seq=10**6, policy=policy, token_of=t.token_of,
                          window=200_000, count=count, current_cap=32)
        kinds.append(plan.kinds)
    assert kinds[0] == kinds[1] == kinds[2] and kinds[0]
    free = plan_aging(render_view(t.g, "a39"), t.g, now=1e9, boundary_seq=10**6, policy=policy,
                      token_of=t.token_of, window=200_000, count=count)
    assert len(free.kinds) > len(kinds[0])  # uncapped, the newer steps would age too


def _fields(node: Call) -> dict[str, Any]:
    return {f: getattr(node, f) for f in node.__struct_fields__}


# ---------------------------------------------------------------- the derived summary table


def test_reduction_summaries_are_kept_by_key(database: str) -> None:
    """On both backends (the table is a backend primitive)."""
    from dagctx.ledger import Store

    store = Store(database)
    try:
        assert store.reduction_summaries(["a", "b"]) == {} and store.reduction_summaries([]) == {}
        store.put_reduction_summaries([("a", "result", "short", 900, 12), ("b", "checkpoint", "cp", 9000, 40)])
        store.put_reduction_summaries([])
        assert store.reduction_summaries(["a", "b", "c", "a"]) == {"a": ("short", 900, 12), "b": ("cp", 9000, 40)}
        many = [(f"k{i}", "result", f"t{i}", i, 1) for i in range(1200)]
        store.put_reduction_summaries(many)
        got = store.reduction_summaries([k for k, *_ in many])
        assert len(got) == 1200 and got["k1199"] == ("t1199", 1199, 1)
        assert store.list_sessions()[1] == 0  # derived data: no session, no node
    finally:
        store.close()
    again = Store(database)  # survives a restart
    try:
        assert again.reduction_summaries(["a"]) == {"a": ("short", 900, 12)}
    finally:
        again.close()


# ---------------------------------------------------------------- inside a running function


def _frame_turn(inner: int, *, nested: bool = False) -> tuple[Turn, str, list[str]]:
    """User, A, A's tool call F (running, or G running → K → F when ``nested``), and
    ``inner`` inner calls of F, each with one finished tool call."""
    t = Turn()
    t.user()
    a = t.add("A", "llm", name="m", output="Delegating.", caller="root", predecessor=t.tip)
    t.tip = a
    top = t.add("G" if nested else "F", "code", name="agent", input={"task": "port"}, status="running",
                caller=a, metadata={"toolCallId": "call_top"})
    fn = top
    if nested:
        k = t.add("K", "llm", name="m", output="Planning.", caller=top)
        t.add("Kt", "code", name="read_file", input={"path": "plan.md"}, output=body(99), caller=k,
              metadata={"toolCallId": "call_k"})
        fn = t.add("F", "code", name="worker", input={"part": "lexer"}, status="running", caller=k,
                   metadata={"toolCallId": "call_f"})
    calls = []
    for i in range(inner):
        li = t.add(f"L{i}", "llm", name="m", output=f"Inner {i}.", caller=fn)
        t.add(f"T{i}", "code", name="read_file", input={"path": f"p{i}.py"}, output=body(i), caller=li,
              metadata={"toolCallId": f"call_in_{i}"})
        calls.append(li)
    return t, fn, calls


@pytest.mark.parametrize("nested", [False, True])
def test_a_frame_s_steps_are_the_function_s_inner_calls(nested: bool) -> None:
    """SPEC §8: in a frame the running function's inner calls are the steps; only its
    newest and the open call stack are protected; a checkpoint covers the oldest."""
    t, fn, calls = _frame_turn(10, nested=nested)
    view = render_view(t.g, t.tip, frame=fn)
    shape = tr.turn_shape(view, t.g)
    assert shape.frame == fn and shape.steps == tuple(calls) and shape.user == "u1"
    assert shape.stack == ({"A", "G", "K", "F"} if nested else {"A", "F"})
    # results outside the newest inner call are candidates (the planner's too when nested)
    cands = tr.result_candidates(view, t.g, shape, t.token_of, aged={})
    assert [x.node_id for x in cands] == (["Kt"] if nested else []) + [f"T{i}" for i in range(9)]
    # the protected part: the user's message, the open calls and the newest inner call
    rendered = to_messages(view, "neutral")
    per = [count(json_dumps(m)) for m in rendered.messages]
    parts = tr.protected_parts(t.g, shape, rendered.node_ids, per, system=0, tools=0)
    assert parts.newest_step < sum(per) // 3
    steps, why = tr.checkpoint_steps(t.g, view, shape)
    assert steps == calls[:-tr.KEEP_RECENT_STEPS] and why is None
    cp = tr.Checkpoint(id="cp", covers=tuple(steps), summary="did the first eight", key="k")
    out = tr.apply_checkpoint(view, t.g, cp)
    ids = [it.node_id for it in out.items]
    assert not {f"L{i}" for i in range(8)} & set(ids) and not {f"T{i}" for i in range(8)} & set(ids)
    assert {"u1", "A", fn, "L8", "T8", "L9", "T9"} <= set(ids) and "cp" in ids
    assert ids.index("cp") < ids.index("L8") and ids.index(fn) < ids.index("cp")
    assert check_pairs(to_messages(out, "anthropic").messages, "anthropic") == []
    assert "worker" in tr.task_text(view, shape, t.g) if nested else "agent" in tr.task_text(view, shape, t.g)


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value)
