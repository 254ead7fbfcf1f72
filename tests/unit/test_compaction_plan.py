"""Compaction planning and validation (SPEC §8: covered ⊆ summarized)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from dagctx.context.compaction_plan import (
    BELOW_THRESHOLD,
    NOTHING_TO_COMPACT,
    cut_decision,
    keep_target,
    select_cut,
    summary_node_input,
    with_candidate,
)
from dagctx.context.summarizer_input import (
    SECTIONS,
    covered_in_input,
    retry_messages,
    split_stages,
    stage_plan,
    summarized_ids,
    summarizer_messages,
    transcript_entry,
)
from dagctx.context.summary_check import (
    fidelity_terms,
    structural_summary,
    validate_summary,
)
from dagctx.protocol.nodes import SUMMARY_MARKER
from dagctx.context.content import json_text
from dagctx.context.render import render_view
from dagctx.context.view import Item
from dagctx.ledger.graph import is_summary
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SUMMARY_NAME

from graph_builder import GraphBuilder


def count(text: str) -> int:
    return math.ceil(len(text) / 4)


def tok(item: Item) -> int:
    body = item.text if item.kind != "tool_call" else json_text(item.input)
    return count(body) + 4


class Session(GraphBuilder):
    def turn(self, i: int, *, result_chars: int = 400, user: str | None = None, reply: str | None = None, tools: int = 1) -> None:
        u = self.add(f"u{i}", "user", output=user or f"request {i}: fix module_{i}.py", caller="root", predecessor=self.tip)
        a = self.add(f"a{i}", "llm", name="m", output=f"looking at step {i}", caller=u, predecessor=u)
        for k in range(tools):
            self.add(
                f"t{i}_{k}",
                "code",
                name="Read",
                input={"file_path": f"src/pkg/module_{i}.py"},
                output=f"contents {i}.{k} " + "x" * result_chars,
                caller=a,
                metadata={"toolCallId": f"c{i}_{k}"},
            )
        self.tip = self.add(f"b{i}", "llm", name="m", output=reply or f"done with step {i}", caller=u, predecessor=a)

    def summary(self, id: str, covers: list[str], text: str) -> str:
        return self.add(
            id,
            "llm",
            name=SUMMARY_NAME,
            output=f"{SUMMARY_MARKER}\n{text}",
            predecessor=self.g.nodes[covers[0]].predecessor,
            metadata={"covers_ids": covers, "compaction": True},
        )


def session(n: int, **kw: Any) -> Session:
    s = Session()
    for i in range(1, n + 1):
        s.turn(i, **kw)
    return s


def plan_of(s: Session, *, keep: int | None = None, window: int = 200_000, head: str | None = None):
    v = render_view(s.g, head or s.tip)
    return select_cut(v, s.g, tok, window=window, keep_recent_tokens=keep), v


def chain_ids(s: Session, head: str | None = None) -> list[str]:
    return [n.id for n in s.g.chain(head or s.tip)]


# ---------------------------------------------------------------- target and threshold


def test_keep_target_clamps():
    assert keep_target(200_000) == 10_000
    assert keep_target(1_000_000) == 20_000
    assert keep_target(128_000) == 6_400
    assert keep_target(64_000) == 4_000
    assert keep_target(32_000) == 3_200  # small-window cap: a tenth of the window, room to grow
    assert keep_target(16_000) == 1_600
    assert keep_target(8_000) == 800
    assert keep_target(200_000, 1234) == 1234
    with pytest.raises(DagctxError):
        keep_target(1000, -1)


def test_below_threshold_is_none_without_llm():
    s = session(5)
    v = render_view(s.g, s.tip)
    plan, reason = cut_decision(v, s.g, tok, window=200_000)
    assert plan is None and reason == BELOW_THRESHOLD
    assert select_cut(v, s.g, tok, window=200_000) is None


def test_single_huge_turn_has_nothing_to_compact():
    s = session(1, result_chars=200_000)
    v = render_view(s.g, s.tip)
    plan, reason = cut_decision(v, s.g, tok, window=32_000)
    assert plan is None and reason == NOTHING_TO_COMPACT


# ---------------------------------------------------------------- where the cut goes


@pytest.mark.parametrize("keep", [1, 50, 200, 333, 700, 1000, 1250])
def test_cut_only_at_user_boundaries_and_pairs_never_split(keep: int):
    s = session(12)
    plan, v = plan_of(s, keep=keep)
    assert plan is not None
    assert s.g.nodes[plan.kept_from].role == "user"
    assert v.items[plan.cut_index].kind == "user" and v.items[plan.cut_index].node_id == plan.kept_from
    covered_items = {(i.kind, i.node_id) for i in plan.input_items}
    kept_items = {(i.kind, i.node_id) for i in v.items[plan.cut_index :]}
    for it in v.items:
        if it.kind == "tool_call":
            pair = {("tool_call", it.node_id), ("tool_result", it.node_id)}
            assert pair <= covered_items or pair <= kept_items
    # the cut is a turn boundary: the kept part starts with a whole turn
    assert plan.covered_ids == chain_ids(s)[: chain_ids(s).index(plan.kept_from)]


def quiet_session(n: int, big: int | None = None) -> Session:
    """Turns with one conversation message each: a user request, then only tool traffic."""
    s = Session()
    for i in range(1, n + 1):
        u = s.add(f"u{i}", "user", output=f"request {i}: fix module_{i}.py", caller="root", predecessor=s.tip)
        a = s.add(f"a{i}", "llm", name="m", output=None, caller=u, predecessor=u)
        s.add(f"t{i}", "code", name="Read", input={"file_path": f"m{i}.py"}, output="y" * (40_000 if i == big else 400),
              caller=a, metadata={"toolCallId": f"c{i}"})
        s.tip = a
    return s


def conversation_messages(items: list[Item]) -> int:
    return sum(1 for i in items if i.kind in ("user", "assistant") and i.depth == 0 and i.text.strip())


def test_keeps_at_least_four_conversation_messages_when_possible():
    s = quiet_session(12)
    per_turn = sum(tok(i) for i in render_view(s.g, s.tip).items if i.turn == 12)
    target = int(per_turn * 2.2)  # the tokens alone would keep two turns
    plan, v = plan_of(s, keep=target)
    assert plan is not None and plan.kept_from == "u9"
    assert conversation_messages(v.items[plan.cut_index :]) == 4
    assert plan.tokens_kept <= 2 * target
    # "when possible": never more than twice the target for the message minimum
    s2 = quiet_session(12, big=10)
    plan2, v2 = plan_of(s2, keep=target)
    assert plan2 is not None and plan2.kept_from == "u11"
    # the usual case: the last two turns fit and hold four messages
    s3 = session(12)
    plan3, v3 = plan_of(s3, keep=320)
    assert plan3 is not None and plan3.kept_from == "u11"
    assert conversation_messages(v3.items[plan3.cut_index :]) == 6
    assert plan3.tokens_covered + plan3.tokens_kept == plan3.tokens_before


def test_last_two_turns_over_target_keep_only_the_newest_turn():
    s = session(12)  # ~150 tokens a turn, three conversation messages each
    plan, v = plan_of(s, keep=200)
    assert plan is not None and plan.kept_from == "u12"
    assert conversation_messages(v.items[plan.cut_index :]) == 3


def test_newest_user_turn_stays_verbatim_even_when_huge():
    s = session(6)
    s.turn(7, result_chars=400_000)
    plan, v = plan_of(s, keep=2_000)
    assert plan is not None
    assert plan.kept_from == "u7"
    assert plan.tokens_kept > 100_000 > plan.target_tokens
    assert "t7_0" not in {i.node_id for i in plan.input_items}


def test_last_two_turns_over_target_advance_the_cut_to_the_newest_user_message():
    s = session(6)
    s.turn(7, result_chars=6_000)
    s.turn(8, result_chars=6_000)
    plan, _ = plan_of(s, keep=2_000)  # each of the last two turns alone is ~1,500 tokens
    assert plan is not None and plan.kept_from == "u8"
    assert "u7" in plan.covered_ids


def test_frame_views_are_refused():
    s = session(3)
    v = render_view(s.g, s.tip)
    v.frame = "t1_0"
    with pytest.raises(DagctxError):
        select_cut(v, s.g, tok, window=8_000)


# ---------------------------------------------------------------- what is covered


def test_covered_ids_are_real_chain_ids_and_predecessor_is_the_splice_point():
    s = session(10)
    plan, _ = plan_of(s, keep=300)
    assert plan is not None
    ids = chain_ids(s)
    assert plan.covered_ids == ids[: ids.index(plan.kept_from)]
    assert plan.covered_ids[0] == "u1" and plan.summary_predecessor == "root"
    assert plan.previous_summary_id is None and plan.previous_summary_text is None
    assert plan.new_covered_ids == plan.covered_ids
    assert all(not is_summary(s.g.nodes[c]) for c in plan.covered_ids)
    assert plan.covered_turns == sum(1 for c in plan.covered_ids if c.startswith("u"))


def test_recompaction_extends_the_old_segment_and_never_names_a_summary():
    s = session(6)
    first = chain_ids(s, "b3")
    s.summary("S1", first, "User fixed module_1.py to module_3.py.")
    for i in range(7, 13):
        s.turn(i)
    plan, v = plan_of(s, keep=300)
    assert v.summary_id == "S1" and plan is not None
    assert plan.previous_summary_id == "S1"
    assert plan.previous_summary_text == "User fixed module_1.py to module_3.py."
    assert plan.covered_ids[: len(first)] == first
    assert plan.covered_ids == chain_ids(s)[: chain_ids(s).index(plan.kept_from)]
    assert "S1" not in plan.covered_ids
    assert plan.new_covered_ids == plan.covered_ids[len(first) :]
    assert plan.input_items[0].kind == "summary"
    assert "u1" not in {i.node_id for i in plan.input_items}  # the old turns come in as the summary
    _, msgs = summarizer_messages(plan, instructions=None, update=True)
    text = msgs[0]["content"]["text"]
    assert "<previous-summary>\nUser fixed module_1.py to module_3.py.\n</previous-summary>" in text
    assert covered_in_input(plan, msgs)


def test_summary_on_another_branch_does_not_leak_into_the_plan():
    s = session(6)
    s.summary("S1", chain_ids(s, "b3"), "branch A summary")
    # branch B forks after turn 1 and grows
    s.tip = "b1"
    for i in range(20, 28):
        s.turn(i)
    plan, v = plan_of(s, keep=300)
    assert v.summary_id is None and plan is not None
    assert plan.previous_summary_id is None
    assert plan.covered_ids[:4] == ["u1", "a1", "b1", "u20"]


# ---------------------------------------------------------------- defect 1: covered ⊆ summarized


def test_everything_covered_was_in_the_summarizer_input():
    s = Session()
    s.turn(1, user="TASK-ALPHA: migrate the billing service to postgres")
    s.turn(2, user="also keep the port :5432 and the schema billing_v2")
    s.turn(3, user="and rename the queue to invoices_q")
    for i in range(4, 12):
        s.turn(i)
    plan, _ = plan_of(s, keep=300)
    assert plan is not None
    system, msgs = summarizer_messages(plan, instructions=None, update=False)
    assert msgs == [{"role": "user", "content": {"type": "text", "text": msgs[0]["content"]["text"]}}]
    text = msgs[0]["content"]["text"]
    for needle in ("TASK-ALPHA", ":5432", "billing_v2", "invoices_q", "contents 1.0"):
        assert needle in text
    assert covered_in_input(plan, msgs)
    assert set(plan.covered_ids) <= summarized_ids(plan, msgs)
    # upstream's bug: summarize messages[3:cut] but cover messages[:cut]
    naive = replace(plan, input_items=plan.input_items[3:], input_groups=plan.input_groups[3:])
    _, naive_msgs = summarizer_messages(naive, instructions=None, update=False)
    assert not covered_in_input(plan, naive_msgs)
    missing = set(plan.covered_ids) - summarized_ids(plan, naive_msgs)
    assert {"u1", "a1"} <= missing


def test_callees_and_exposed_insides_belong_to_their_turn():
    s = session(8)
    plan, _ = plan_of(s, keep=300)
    assert plan is not None
    groups = dict(zip((i.node_id for i in plan.input_items), plan.input_groups))
    assert groups["t1_0"] == "a1"
    # dropping a tool result from the input makes its owning chain node unsummarized
    dropped = [i for i in plan.input_items if not (i.kind == "tool_result" and i.node_id == "t2_0")]
    _, msgs = summarizer_messages(replace(plan, input_items=dropped, input_groups=[groups[i.node_id] for i in dropped]), update=False)
    seen = summarized_ids(plan, msgs)
    assert "a2" not in seen and "t2_0" not in seen and "a1" in seen


def test_media_is_a_placeholder_in_the_input():
    s = Session()
    s.add("u1", "user", output=[{"type": "text", "text": "what is in this picture?"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA" * 500}}], caller="root", predecessor="root")
    s.tip = s.add("b1", "llm", name="m", output="a cat", caller="u1", predecessor="u1")
    for i in range(2, 10):
        s.turn(i)
    plan, _ = plan_of(s, keep=300)
    _, msgs = summarizer_messages(plan)
    text = msgs[0]["content"]["text"]
    assert "[image: image/png]" in text and "AAAA" not in text


# ---------------------------------------------------------------- prompts


def test_instructions_have_five_sections_and_keep_identifiers():
    s = session(10)
    plan, _ = plan_of(s, keep=300)
    system, msgs = summarizer_messages(plan, instructions="focus on the database work", update=False, max_chars=4000)
    text = msgs[0]["content"]["text"]
    for head, _ in SECTIONS:
        assert f"## {head}" in text
    assert "verbatim" in text and "identifier" in system
    assert text.index("<conversation>") < text.index("## 1. User intent")
    assert "focus on the database work" in text and "under 4000 characters" in text
    assert "[tool call: Read]\n" + json_text({"file_path": "src/pkg/module_1.py"}) in text


def test_retry_prompt_lists_missing_identifiers():
    msgs = [{"role": "user", "content": {"type": "text", "text": "summarize"}}]
    out = retry_messages(msgs, ["src/app.py", "3f2a9c1d"])
    assert msgs[0]["content"]["text"] == "summarize"
    assert "- src/app.py\n- 3f2a9c1d" in out[-1]["content"]["text"]
    assert out[-1]["content"]["text"].startswith("summarize")


# ---------------------------------------------------------------- validation


def _good_summary(plan) -> str:
    idents = fidelity_terms(plan)
    return "## 1. User intent\nFix modules.\n## 3. Work completed\n" + "\n".join(f"- {i}" for i in idents)


def test_validation_reasons():
    s = session(10)
    plan, _ = plan_of(s, keep=300)
    idents = fidelity_terms(plan)
    assert idents and "src/pkg/module_1.py" in idents
    kw = dict(tokens_before=1000, candidate_tokens_after=400, max_chars=10_000, identifiers=idents)
    assert validate_summary(_good_summary(plan), plan, **kw).ok
    assert validate_summary("   \n", plan, **kw).reason == "empty"
    assert validate_summary(SUMMARY_MARKER + "\n  ", plan, **kw).reason == "empty"
    assert validate_summary(None, plan, **kw).reason == "empty"
    assert validate_summary("x" * 10_001, plan, **kw).reason == "tooLong"
    assert validate_summary(_good_summary(plan), plan, **{**kw, "candidate_tokens_after": 1000}).reason == "notSmaller"
    ready = validate_summary("I'm ready to help", plan, **kw)
    assert not ready.ok and ready.reason == "lowFidelity" and ready.retention == 0.0
    assert ready.missing == idents
    half = validate_summary(" ".join(idents[: len(idents) // 2]), plan, **kw)
    assert half.ok and half.retention == 0.5
    assert validate_summary(" ".join(idents[: len(idents) // 2 - 1]), plan, **kw).reason == "lowFidelity"


def test_plain_chat_non_answer_still_fails():
    s = Session()
    topics = ["itinerary", "temples", "bullet", "lodging", "budget"]
    for i in range(1, 10):
        s.add(f"u{i}", "user", output=f"Please extend the itinerary with temples and lodging, day {i}", caller="root", predecessor=s.tip)
        s.tip = s.add(f"b{i}", "llm", name="m", output="The itinerary now covers temples, gardens and lodging near stations.", caller=f"u{i}", predecessor=f"u{i}")
    plan, _ = plan_of(s, keep=60)
    assert plan is not None
    terms = fidelity_terms(plan)
    assert "itinerary" in terms and "temples" in terms
    kw = dict(tokens_before=1000, candidate_tokens_after=100, max_chars=None, identifiers=terms)
    assert validate_summary("I'm ready to help", plan, **kw).reason == "lowFidelity"
    assert validate_summary("The itinerary covers temples, gardens and lodging near stations.", plan, **kw).ok
    del topics


# ---------------------------------------------------------------- stages


def test_huge_prefix_is_split_into_stages_that_together_cover_everything():
    s = session(30, result_chars=2_000)
    s.turn(31, result_chars=30_000)  # one result larger than a whole stage
    s.turn(32)
    s.turn(33)
    plan, _ = plan_of(s, keep=300)
    assert plan is not None and "t31_0" in {i.node_id for i in plan.input_items}
    stages = split_stages(plan, 3_000, count)
    assert len(stages) > 5
    flat = [i for st in stages for i in st]
    assert [i.node_id for i in flat if not i.text.startswith("(part ")] == [
        i.node_id for i in plan.input_items if i.node_id != "t31_0" or i.kind != "tool_result"
    ]
    parts = [i for i in flat if i.node_id == "t31_0" and i.kind == "tool_result"]
    assert len(parts) >= 3 and parts[0].text.startswith(f"(part 1 of {len(parts)})")
    for st in stages:
        assert sum(count(transcript_entry(i)) + 2 for i in st) <= 3_000 + 50
    sent = []
    prev = None
    for k, st in enumerate(stages, 1):
        sp = stage_plan(plan, st, index=k, total=len(stages), previous_text=prev)
        _, msgs = summarizer_messages(sp, update=True)
        if k > 1:
            assert f"part {k} of {len(stages)}" in msgs[0]["content"]["text"]
        sent.append(msgs)
        prev = f"summary through stage {k}"
    assert covered_in_input(plan, sent)
    assert not covered_in_input(plan, sent[1:])


def test_stages_keep_the_previous_summary_first():
    s = session(4)
    s.summary("S1", chain_ids(s, "b2"), "earlier work on module_1.py")
    for i in range(5, 12):
        s.turn(i)
    plan, _ = plan_of(s, keep=300)
    stages = split_stages(plan, 200, count)
    assert stages[0][0].kind == "summary"
    first = stage_plan(plan, stages[0], index=1, total=len(stages))
    assert first.previous_summary_text == "earlier work on module_1.py"
    second = stage_plan(plan, stages[1], index=2, total=len(stages), previous_text="so far")
    _, msgs = summarizer_messages(second, update=True)
    assert "<previous-summary>\nso far\n</previous-summary>" in msgs[0]["content"]["text"]


# ---------------------------------------------------------------- fallback and the node


def test_structural_summary_is_deterministic_and_labelled():
    s = session(10)
    plan, _ = plan_of(s, keep=300)
    text = structural_summary(plan)
    assert text == structural_summary(plan)
    assert text.startswith("[Structural summary")
    assert "1. request 1: fix module_1.py" in text
    assert "- Read(file_path='src/pkg/module_1.py')" in text
    assert "src/pkg/module_1.py" in text.split("Files, identifiers and key terms mentioned:")[1]
    v = validate_summary(text, plan, tokens_before=plan.tokens_before, candidate_tokens_after=plan.tokens_kept + count(text),
                         max_chars=20_000, identifiers=fidelity_terms(plan))
    assert v.ok, v


def test_summary_node_input_and_candidate_render():
    s = session(10)
    plan, v = plan_of(s, keep=300)
    node = summary_node_input(plan, f"{SUMMARY_MARKER}\nthe work so far", model="m-small", stats={"tokensBefore": 1})
    assert node["output"] == f"{SUMMARY_MARKER}\nthe work so far"  # marker not doubled
    assert node["role"] == "llm" and node["name"] == SUMMARY_NAME
    assert node["predecessor"] == plan.summary_predecessor == "root"
    meta = node["metadata"]
    assert meta["covers_ids"] == plan.covered_ids and meta["compaction"] is True
    assert meta["previous_summary"] is None and meta["stats"] == {"tokensBefore": 1}
    assert node["reads"] == plan.input_ids
    g2 = with_candidate(s.g, node)
    assert "summary_candidate" not in s.g.nodes  # the original is untouched
    v2 = render_view(g2, s.tip)
    assert v2.summary_id == "summary_candidate"
    assert v2.reads[0] == "summary_candidate" and v2.reads[1] == plan.kept_from
    assert v2.turn_count == v.turn_count
    after = sum(tok(i) for i in v2.items)
    assert after < plan.tokens_before
    assert after == count(f"{SUMMARY_MARKER}\nthe work so far") + 4 + plan.tokens_kept
