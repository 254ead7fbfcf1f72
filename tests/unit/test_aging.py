"""Tool-result aging (SPEC §8) and the reference tracker (SPEC §8)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dagctx.context.aging import (
    CAPPED,
    HARD_CLEAR,
    SOFT_TRIM,
    AgingPolicy,
    boundary_after_commit,
    plan_aging,
    rebuild_aged,
    result_text,
)
from dagctx.context.formats import check_pairs, to_messages
from dagctx.context.references import (
    MentionIndex,
    cited_later,
    distinctive_identifiers,
    extract_references,
    occurs_in,
)
from dagctx.protocol.nodes import SUMMARY_MARKER
from dagctx.context.render import render_view
from dagctx.context.view import View
from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.nodes import SUMMARY_NAME, Call

from graph_builder import GraphBuilder

NOW = 100_000.0


def count(text: str) -> int:
    return math.ceil(len(text) / 4)


def filler(tag: str, chars: int = 8000) -> str:
    """Reference-free output text of about ``chars`` characters."""
    line = f"row {tag} lorem ipsum dolor sit amet consectetur adipiscing elit sed do\n"
    return (line * (chars // len(line) + 1))[:chars]


class Session(GraphBuilder):
    """A SessionGraph built in memory: turns of user → llm (tool call) → llm reply."""

    def turn(
        self,
        i: int,
        *,
        tool: str = "Bash",
        output: str | None = None,
        reply: str | None = None,
        user: str | None = None,
        result_created_at: float | None = None,
    ) -> None:
        u = self.add(f"u{i}", "user", output=user or f"please do step {i}", caller="root", predecessor=self.tip)
        a = self.add(f"a{i}", "llm", name="m", output=f"working on step {i}", caller=u, predecessor=u)
        self.add(
            f"t{i}",
            "code",
            name=tool,
            input={"command": f"run step {i}"},
            output=filler(str(i)) if output is None else output,
            caller=a,
            metadata={"toolCallId": f"call_{i}"},
            created_at=result_created_at,
        )
        self.tip = self.add(f"b{i}", "llm", name="m", output=reply or f"step {i} done", caller=u, predecessor=a)

    def token_of(self, node_id: str) -> int:
        return count(result_text(self.g.nodes[node_id]))


def session(n: int = 10, overrides: dict[int, dict[str, Any]] | None = None) -> Session:
    s = Session()
    for i in range(1, n + 1):
        s.turn(i, **(overrides or {}).get(i, {}))
    return s


def plan_for(s: Session, head: str | None = None, *, policy: AgingPolicy = AgingPolicy(), boundary: Any = "auto", now: float = NOW, window: int = 200_000, view: View | None = None):
    v = view or render_view(s.g, head or s.tip)
    b = boundary_after_commit(v, s.g, policy) if boundary == "auto" else boundary
    return plan_aging(v, s.g, now=now, boundary_seq=b, policy=policy, token_of=s.token_of, window=window, count=count)


# ---------------------------------------------------------------- baseline


def test_old_large_results_age_and_recent_ones_stay():
    s = session(10)
    p = plan_for(s)
    # turn distance = 10 - i: t1,t2 (≥8) hard clear, t3..t6 (4..7) soft trim, t7..t10 stay
    assert p.decisions["t1"] == HARD_CLEAR and p.decisions["t2"] == HARD_CLEAR
    assert [p.decisions[f"t{i}"] for i in range(3, 7)] == [SOFT_TRIM] * 4
    assert [p.decisions[f"t{i}"] for i in range(7, 11)] == ["recentTurn"] * 4
    assert p.stats.tool_results_aged == 6 and p.stats.soft_trimmed == 4 and p.stats.hard_cleared == 2
    assert p.stats.tokens_freed_by_aging > 0
    assert p.stats.as_dict()["toolResultsAged"] == 6


def test_replacement_texts_state_what_was_removed_and_are_deterministic():
    s = session(10)
    p = plan_for(s)
    raw = result_text(s.g.nodes["t1"])
    assert p.aged["t1"] == (
        f"[tool result aged out: Bash, {len(raw)} characters / {count(raw)} tokens removed; "
        "call the tool again if you need it]"
    )
    soft = p.aged["t4"]
    raw4 = result_text(s.g.nodes["t4"])
    assert soft.startswith(raw4[:1500]) and soft.endswith(raw4[-1500:])
    assert f"\n[… aged: {len(raw4) - 3000} of {len(raw4)} characters omitted from this old tool result …]\n" in soft
    again = plan_for(s)
    assert again.aged == p.aged and again.decisions == p.decisions
    assert rebuild_aged(s.g, p.kinds, token_of=s.token_of, window=200_000, count=count) == p.aged


def test_render_applies_the_plan_and_stays_pair_valid():
    s = session(10)
    p = plan_for(s)
    v = render_view(s.g, s.tip, aged=p.aged)
    by_id = {i.node_id: i for i in v.items if i.kind == "tool_result"}
    assert by_id["t1"].text == p.aged["t1"] and by_id["t1"].aged
    assert by_id["t9"].text == result_text(s.g.nodes["t9"])
    for fmt in ("openai", "anthropic", "neutral"):
        assert check_pairs(to_messages(v, fmt).messages, fmt) == []
    # planning on the aged view gives the same decisions (decisions read stored outputs)
    assert plan_for(s, view=v).aged == p.aged


# ---------------------------------------------------------------- each gate alone


def test_gate_exempt_tool():
    s = session(10, {4: {"tool": "TodoWrite"}})
    assert plan_for(s).decisions["t4"] == "exempt"
    s2 = session(10, {4: {"tool": "todowrite"}})  # case-insensitive
    assert plan_for(s2).decisions["t4"] == "exempt"
    custom = AgingPolicy(exempt_tools=frozenset({"Bash"}))
    assert plan_for(session(10), policy=custom).decisions["t4"] == "exempt"


def test_gate_protect_first_messages():
    s = session(10)
    # messages: u1 (0), a1 + its tool call (1), t1's result (2)
    assert plan_for(s, policy=AgingPolicy(protect_first=2)).decisions["t1"] == HARD_CLEAR
    assert plan_for(s, policy=AgingPolicy(protect_first=3)).decisions["t1"] == "protectedFirst"


def test_gate_boundary():
    s = session(10)
    t4 = s.g.nodes["t4"].seq
    assert plan_for(s, boundary=t4).decisions["t4"] == SOFT_TRIM
    p = plan_for(s, boundary=t4 - 1)
    assert p.decisions["t4"] == "boundary" and p.decisions["t3"] == SOFT_TRIM
    assert plan_for(s, boundary=None).aged == {}  # no boundary committed yet: nothing ages


def test_gate_turn_distance():
    s = session(10)
    assert plan_for(s, boundary=10_000).decisions["t6"] == SOFT_TRIM  # distance 4
    assert plan_for(s, boundary=10_000).decisions["t7"] == "recentTurn"  # distance 3
    assert plan_for(s, boundary=10_000, policy=AgingPolicy(keep_recent_turns=5)).decisions["t6"] == "recentTurn"


def test_gate_wall_clock():
    s = session(10, {4: {"result_created_at": NOW - 30}})
    p = plan_for(s)
    assert p.decisions["t4"] == "tooRecent" and p.decisions["t3"] == SOFT_TRIM
    s2 = session(10, {4: {"result_created_at": NOW - 61}})
    assert plan_for(s2).decisions["t4"] == SOFT_TRIM


def test_gate_size():
    s = session(10, {4: {"output": filler("4", 2000)}})  # 500 tokens < 800
    assert plan_for(s).decisions["t4"] == "tooSmall"
    assert plan_for(s, policy=AgingPolicy(min_tokens=400)).decisions["t4"] == "noGain"  # too short to soft-trim
    assert plan_for(s, policy=AgingPolicy(min_tokens=400, hard_clear_after_turns=6)).decisions["t4"] == HARD_CLEAR


def test_gate_cited_later_protects():
    out = filler("4") + "\ndeployed build a1b2c3d4e5f6 to staging\n"
    s = session(10, {4: {"output": out}, 7: {"reply": "build a1b2c3d4e5f6 is live"}})
    p = plan_for(s)
    assert p.decisions["t4"] == "cited"
    assert p.cited["t4"] == ["a1b2c3d4e5f6"]
    assert p.stats.references_protected == 1
    assert p.decisions["t3"] == SOFT_TRIM
    # without the later mention it ages
    s2 = session(10, {4: {"output": out}})
    assert plan_for(s2).decisions["t4"] == SOFT_TRIM


def test_cited_by_user_and_tool_arguments_but_not_by_other_results():
    out = filler("2") + "\nconfig at services/billing/settings.toml\n"
    by_user = session(10, {2: {"output": out}, 9: {"user": "open services/billing/settings.toml again"}})
    assert plan_for(by_user).decisions["t2"] == "cited"
    by_result = session(10, {2: {"output": out}, 6: {"output": filler("6") + "services/billing/settings.toml"}})
    assert plan_for(by_result).decisions["t2"] == HARD_CLEAR


def test_a_mention_cites_the_newest_result_holding_the_reference():
    shared = "\nclass SessionLinker handles session_id\n"
    s = session(12, {2: {"output": filler("2") + shared}, 5: {"output": filler("5") + shared}, 7: {"reply": "SessionLinker needs a fix"}})
    p = plan_for(s)
    assert p.decisions["t5"] == "cited" and p.cited["t5"] == ["SessionLinker"]
    assert p.decisions["t2"] == HARD_CLEAR  # the re-read at t5 took over the attribution
    # a mention between the two reads cites the first one
    s2 = session(12, {2: {"output": filler("2") + shared}, 3: {"reply": "SessionLinker it is"}, 5: {"output": filler("5") + shared}})
    p2 = plan_for(s2)
    assert p2.decisions["t2"] == "cited" and p2.decisions["t5"] == SOFT_TRIM


def test_the_gate_reads_stored_references_and_never_mines_them(monkeypatch: pytest.MonkeyPatch):
    """With ``refs_of`` (the ledger's stored lists, SPEC §8) no result text is mined: a
    plan over huge results costs what its other gates cost."""
    import dagctx.context.aging as aging_mod
    import dagctx.context.aging_policy as policy_mod
    import dagctx.context.references as refs_mod

    shared = "\nclass SessionLinker handles session_id\n"
    s = session(12, {2: {"output": filler("2") + shared}, 5: {"output": filler("5") + shared},
                     7: {"reply": "SessionLinker needs a fix"}})
    stored = {nid: aging_mod.stored_references(n.output) for nid, n in s.g.nodes.items() if n.role == "code"}
    expected = plan_for(s)

    def refuse(*_: object) -> None:
        raise AssertionError("a result was mined during the plan")

    monkeypatch.setattr(refs_mod, "_reference_counts", refuse)
    monkeypatch.setattr(policy_mod, "top_references", refuse)
    v = render_view(s.g, s.tip)
    b = boundary_after_commit(v, s.g)
    got = plan_aging(v, s.g, now=NOW, boundary_seq=b, token_of=s.token_of, window=200_000, count=count,
                     refs_of=stored.__getitem__)
    assert got.decisions == expected.decisions and got.aged == expected.aged and got.cited == expected.cited
    # what is stored is what counts: without t5's list the re-read no longer takes over
    got = plan_aging(v, s.g, now=NOW, boundary_seq=b, token_of=s.token_of, window=200_000, count=count,
                     refs_of=lambda nid: [] if nid == "t5" else stored[nid])
    assert got.decisions["t2"] == "cited" and got.decisions["t5"] == SOFT_TRIM


def test_a_policy_cannot_check_more_references_than_are_stored():
    from dagctx.context.references import STORED_REFERENCES

    assert AgingPolicy(max_refs_per_result=STORED_REFERENCES).max_refs_per_result == 256
    with pytest.raises(ValueError, match="max_refs_per_result"):
        AgingPolicy(max_refs_per_result=STORED_REFERENCES + 1)


def test_current_turn_model_mentions_count_from_the_next_turn():
    out = filler("2") + "\nrelease tag 9f8e7d6c5b4a\n"
    s = session(10, {2: {"output": out}, 10: {"reply": "using 9f8e7d6c5b4a"}})
    # the mention is in the current (newest) turn's model output: no flip within the turn
    assert plan_for(s).decisions["t2"] == HARD_CLEAR
    s.turn(11)
    assert plan_for(s).decisions["t2"] == "cited"
    # a new user message cites immediately
    s2 = session(10, {2: {"output": out}, 10: {"user": "what was 9f8e7d6c5b4a?"}})
    assert plan_for(s2).decisions["t2"] == "cited"


# ---------------------------------------------------------------- soft trim, hard clear, cap


def test_soft_trim_before_hard_clear_for_the_same_result():
    s = session(8)
    assert plan_for(s).decisions["t3"] == SOFT_TRIM  # distance 5
    for i in range(9, 12):
        s.turn(i)
    assert plan_for(s).decisions["t3"] == HARD_CLEAR  # distance 8


def test_single_result_cap_applies_regardless_of_gates():
    big = filler("x", 40_000)  # 10,000 tokens
    s = session(6, {6: {"output": big, "tool": "TodoWrite"}, 1: {"output": big}})
    window = 8_000
    p = plan_for(s, window=window, policy=AgingPolicy(protect_first=10))
    assert p.decisions["t6"] == CAPPED  # newest turn, exempt tool
    assert p.decisions["t1"] == CAPPED  # protected first messages
    assert count(p.aged["t6"]) <= window // 2
    assert "[… truncated:" in p.aged["t6"] and "at most 50 % of the context window" in p.aged["t6"]
    assert p.aged["t6"].startswith(big[:100]) and p.aged["t6"].endswith(big[-100:])
    assert p.stats.capped == 2
    # a result that passes the aging gates gets the smaller aging replacement
    q = plan_for(s, window=window)
    assert q.decisions["t1"] == SOFT_TRIM
    # within the window share nothing is capped
    assert plan_for(s, window=200_000).decisions["t6"] == "exempt"


# ---------------------------------------------------------------- boundary and turns


def test_boundary_after_commit_is_a_ratchet():
    s = session(10)
    v10 = render_view(s.g, "b10")
    b10 = boundary_after_commit(v10, s.g)
    assert b10 == s.g.nodes["b6"].seq  # last node of the turn 4 turns back
    v8 = render_view(s.g, "b8")
    assert boundary_after_commit(v8, s.g) == s.g.nodes["b4"].seq
    assert boundary_after_commit(v8, s.g, previous=b10) == b10  # never goes back
    assert boundary_after_commit(render_view(s.g, "b3"), s.g) == 0  # nothing old enough
    assert boundary_after_commit(render_view(s.g, "b3"), s.g, previous=7) == 7
    s.turn(11)
    assert boundary_after_commit(render_view(s.g, s.tip), s.g, previous=b10) == s.g.nodes["b7"].seq


def test_boundary_freezes_aging_within_a_turn():
    s = session(10)
    committed = boundary_after_commit(render_view(s.g, "b10"), s.g)  # turn 10 committed
    s.turn(11, output=filler("11") + " mentions 3f2a9c1d", reply="about 3f2a9c1d")
    # every prepare within turn 11 (user message, after the tool call, final reply) agrees
    plans = [plan_for(s, head=h, boundary=committed, now=NOW + k) for k, h in enumerate(("u11", "a11", "b11"))]
    assert plans[0].aged == plans[1].aged == plans[2].aged
    assert plans[0].aged  # and something did age
    after = plan_for(s, boundary=boundary_after_commit(render_view(s.g, "b11"), s.g, previous=committed))
    assert after.boundary_seq > committed
    s.turn(12)
    nxt = plan_for(s, boundary=boundary_after_commit(render_view(s.g, "b11"), s.g, previous=committed))
    assert set(nxt.aged) > set(plans[0].aged)


def _with_summary(s: Session, covers: list[str]) -> None:
    pred = s.g.nodes[covers[0]].predecessor
    s.add(
        "S1",
        "llm",
        name=SUMMARY_NAME,
        output=f"{SUMMARY_MARKER}\nturns 1-3 happened",
        predecessor=pred,
        metadata={"covers_ids": covers, "compaction": True},
    )


def test_summary_node_is_not_a_turn():
    s = session(12)
    covered = [n.id for n in s.g.chain("b3")]
    _with_summary(s, covered)
    with_summary = render_view(s.g, s.tip)
    raw = render_view(s.g, s.tip, summary_policy="none")
    assert with_summary.summary_id == "S1" and with_summary.turn_count == raw.turn_count == 12
    p_sum = plan_for(s, view=with_summary)
    p_raw = plan_for(s, view=raw)
    for i in range(4, 13):
        assert p_sum.decisions[f"t{i}"] == p_raw.decisions[f"t{i}"], i
    assert p_sum.decisions["t8"] == SOFT_TRIM and p_sum.decisions["t9"] == "recentTurn"
    assert boundary_after_commit(with_summary, s.g) == boundary_after_commit(raw, s.g)


def test_running_and_missing_results_are_left_alone():
    s = session(10)
    s.g.nodes["t2"] = Call(**{**{f: getattr(s.g.nodes["t2"], f) for f in s.g.nodes["t2"].__struct_fields__}, "output": None, "status": "running"})
    p = plan_for(s)
    assert p.decisions["t2"] == "noResult" and "t2" not in p.aged


def autonomous(steps: int) -> Session:
    """One user request, then ``steps`` model calls that each read a large file."""
    s = Session()
    u = s.add("u1", "user", output="refactor the package", caller="root", predecessor="root")
    pred = u
    for i in range(1, steps + 1):
        a = s.add(f"a{i}", "llm", name="m", output=f"step {i}", caller=u, predecessor=pred)
        s.add(f"t{i}", "code", name="Read", input={"n": i}, output=filler(str(i)), caller=a, metadata={"toolCallId": f"c{i}"})
        pred = a
    s.tip = pred
    return s


def test_step_unit_ages_inside_one_long_user_turn():
    s = autonomous(12)
    assert set(plan_for(s).decisions.values()) == {"recentTurn"}  # one user turn: nothing ages
    step = AgingPolicy(turn_unit="step", protect_first=0)
    p = plan_for(s, policy=step)
    # step distance = 12 - i: t1..t4 hard (>=8), t5..t8 soft (4..7), t9..t12 recent
    assert [p.decisions[f"t{i}"] for i in range(1, 13)] == [HARD_CLEAR] * 4 + [SOFT_TRIM] * 4 + ["recentTurn"] * 4
    assert boundary_after_commit(render_view(s.g, s.tip), s.g, step) == s.g.nodes["t8"].seq
    with pytest.raises(ValueError):
        AgingPolicy(turn_unit="assistant")


def test_step_unit_is_not_shifted_by_a_summary():
    s = autonomous(14)
    s.add("S1", "llm", name=SUMMARY_NAME, output="[Previous conversation summary]\nsteps 1-3",
          predecessor="root", metadata={"covers_ids": ["u1", "a1", "a2", "a3"], "compaction": True})
    step = AgingPolicy(turn_unit="step", protect_first=0)
    with_summary = render_view(s.g, s.tip)
    raw = render_view(s.g, s.tip, summary_policy="none")
    assert with_summary.summary_id == "S1"
    p_sum, p_raw = plan_for(s, view=with_summary, policy=step), plan_for(s, view=raw, policy=step)
    for i in range(4, 15):
        assert p_sum.decisions[f"t{i}"] == p_raw.decisions[f"t{i}"], i
    assert boundary_after_commit(with_summary, s.g, step) == boundary_after_commit(raw, s.g, step)


def test_policy_as_dict_is_camel_case():
    d = AgingPolicy().as_dict()
    assert d["keepRecentTurns"] == 4 and d["minTokens"] == 800 and d["maxSingleResultShare"] == 0.5
    assert "TodoWrite" in d["exemptTools"]


# ---------------------------------------------------------------- reference tracker


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("edit src/app.py now", "src/app.py"),
        ("see /etc/x.conf", "/etc/x.conf"),
        ("cd ./a/b", "./a/b"),
        ("commit 3f2a9c1d", "3f2a9c1d"),
        ("run 0ccf1a04-1b4c-43b6-8aa5-79e41db43a68", "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"),
        ("order 1234567", "1234567"),
        ("call `foo_bar()` first", "foo_bar()"),
        ("the SessionGraph class", "SessionGraph"),
        ("docs at https://example.com/docs/x.html.", "https://example.com/docs/x.html"),
        ("serve on localhost:8080", "localhost:8080"),
        ("postgres listens on :5432", ":5432"),
        ("请修改src/app.py文件", "src/app.py"),
        ("the render_view function", "render_view"),
    ],
)
def test_extract_references(text: str, ref: str):
    assert ref in extract_references(text)


@pytest.mark.parametrize(
    "text", ["and/or", "2024/01/02", "at 12:30", "deadbeef", "1234", "True or None", "The Word", "`name` on GitHub"]
)
def test_not_references(text: str):
    assert extract_references(text) == set()


def test_occurs_in_respects_word_edges():
    assert occurs_in("src/app.py", "open /work/src/app.py:42")
    assert occurs_in("12345", "id=12345.")
    assert not occurs_in("12345", "123456")
    assert occurs_in(":5432", "localhost:5432")
    assert not occurs_in("abc1234f", "xabc1234f")


def test_cited_later():
    result = "wrote src/app.py (commit 3f2a9c1d) and build/out.txt"
    assert cited_later(result, ["then I checked 3f2a9c1d", "nothing else"]) == {"3f2a9c1d"}
    assert cited_later(result, ["unrelated"]) == set()
    idx = MentionIndex(["a src/app.py", "b", "c src/app.py"])
    assert idx.last_mention("src/app.py") == 2
    assert idx.last_mention("src/app.py", after=2) is None
    assert idx.mentioned_after("src/app.py", after=1)


def test_distinctive_identifiers_order_and_trivia():
    texts = [
        "Read README.md and src/app.py; SessionGraph lives in src/app.py",
        "SessionGraph again, src/app.py again, commit 3f2a9c1d, TODO",
    ]
    ids = distinctive_identifiers(texts)
    assert ids[:3] == ["src/app.py", "SessionGraph", "3f2a9c1d"]
    assert "README.md" not in ids and "TODO" not in ids
    assert len(distinctive_identifiers([f"file{i}.py" for i in range(50)], top=20)) == 20


def test_identifier_mining_reads_an_even_sample_of_long_prefixes() -> None:
    from dagctx.context.references import _even_sample, distinctive_identifiers

    texts = ["a" * 10, "b" * 1000, "c" * 1000]
    cut = _even_sample(texts, 610)
    assert cut[0] == "a" * 10 and len(cut[1]) == len(cut[2]) == 300
    assert _even_sample(texts, 10_000) == texts
    # the most frequent identifier of a long transcript survives sampling
    many = [f"edit src/core/engine.py then run job {i:06d} " + "filler text " * 200 for i in range(400)]
    assert distinctive_identifiers(many, top=1, sample_chars=50_000) == ["src/core/engine.py"]
    assert distinctive_identifiers(many, top=1, sample_chars=None) == ["src/core/engine.py"]


def test_top_references_of_a_huge_result_come_from_its_head_and_tail():
    """The citation gate's cost per result is bounded (SPEC §8): a 1 MB log is mined in
    its first and last 32 KiB, so an identifier only in the middle is not among them."""
    from dagctx.context.references import TOP_REFERENCE_SCAN_CHARS, top_references

    filler = "plain words and more plain words\n" * (1_000_000 // 34)
    mid = len(filler) // 2
    text = "see src/head_module.py\n" + filler[:mid] + "middle/only_here.py\n" + filler[mid:] + "tail/last_file.py\n"
    assert len(text) > 10 * TOP_REFERENCE_SCAN_CHARS
    refs = top_references(text, 32)
    assert "src/head_module.py" in refs and "tail/last_file.py" in refs
    assert "middle/only_here.py" not in refs
    # below the bound every occurrence counts, wherever it is
    small = "a " * 10_000 + "middle/only_here.py " + "b " * 10_000
    assert "middle/only_here.py" in top_references(small, 32)


def test_paths_inside_many_urls_are_not_paths():
    """Thousands of URLs in one result: a path inside any of them is part of the URL."""
    from dagctx.context.references import top_references

    text = " ".join(f"https://example.org/docs/page{i}.html" for i in range(3000)) + " real/file_name.py"
    refs = top_references(text, 5000)
    assert "real/file_name.py" in refs
    assert not any(r.startswith("/docs/") or r == "docs/page1.html" for r in refs)


def test_mention_texts_read_only_when_a_result_passes_every_gate(monkeypatch: pytest.MonkeyPatch):
    """Whether an item is a mention is known without its text (``_is_mention``); the texts
    (a tool call's arguments as JSON) are built only when some result passes every gate,
    and the plan is then the one built from every mention's text."""
    import dataclasses

    import dagctx.context.aging as aging_mod

    shared = "\nclass SessionLinker handles session_id\n"
    s = session(12, {2: {"output": filler("2") + shared}, 3: {"reply": "SessionLinker it is"},
                     5: {"output": filler("5") + shared}, 9: {"user": "open services/billing/settings.toml"}})
    items = list(render_view(s.g, s.tip).items)
    assert {"user", "assistant", "tool_call", "tool_result"} <= {it.kind for it in items}
    probes = items + [dataclasses.replace(it, text=None) for it in items]  # no text: no mention
    probes += [dataclasses.replace(items[0], kind=k) for k in ("summary", "text_pair", "system")]
    for it in probes:
        assert aging_mod._is_mention(it) == (aging_mod._mention_text(it) is not None)
    built: list[int] = []
    mention_text = aging_mod._mention_text

    def counted(item: Any) -> str | None:
        built.append(1)
        return mention_text(item)

    monkeypatch.setattr(aging_mod, "_mention_text", counted)
    p = plan_for(s)
    assert p.decisions["t2"] == "cited" and built  # texts read: a result passed the gates
    # every result too young: no text built, the same decisions as before
    built.clear()
    young = plan_for(s, policy=AgingPolicy(min_age_seconds=10 * NOW))
    assert not built and young.decisions and not young.cited
    assert not {SOFT_TRIM, HARD_CLEAR, CAPPED} & set(young.decisions.values())


def _ordinals_as_before(items: list[Any]) -> list[int]:
    """``_message_ordinals`` as it was written before (the previous item kept whole)."""
    out: list[int] = []
    n = -1
    prev = None
    for it in items:
        if it.kind == "tool_call" and n >= 0:
            pass
        elif it.kind == "tool_result" and prev is not None and prev.kind == "tool_result" \
                and prev.owner == it.owner and n >= 0:
            pass
        else:
            n += 1
        out.append(n)
        prev = it
    return out


def test_results_and_mentions_equal_the_per_item_tests():
    """The plan's first loop classifies each item in line (``_results_and_mentions``): the
    same results (each once, with the mentions before it) and mentions as the three
    per-item tests give (``_is_result``, ``_is_mention``, ``_is_user_authored``), for every
    kind of item and node — an ask-user answer, results of missing or non-code nodes,
    items without text, turns before and after the current one; and ``_message_ordinals``
    as before."""
    import dataclasses

    import dagctx.context.aging as aging_mod
    from test_render import Builder

    b = Builder()
    b.user("u1", "deploy services/billing", "root")
    b.llm("l1", "calling", "u1")
    b.tool("t1", "l1", "read", {"p": "a.py"}, "data")
    b.tool("t2", "l1", "read", {"p": "b.py"}, "more data")
    b.fn("dep", None, "deploy", {}, "deployed", pred="l1", expose="full")
    b.node("ask", "user", input="Which region?", output="eu-west", caller="dep")
    b.fn("sub", "dep", "helper", {"n": 1}, "helper out")
    b.user("u2", "again", "dep")
    b.llm("l2", "reply", "u2")
    b.tool("t3", "l2", "grep", {"q": "x"}, "found")
    b.summary("S", ["u1", "l1"], "summary text")
    head = b.llm("l3", "last", "l2")
    g = b.g
    items = list(render_view(g, head, expose_default="full", summary_policy="none").items)
    items += list(render_view(g, head).items)
    assert {"user", "assistant", "tool_call", "tool_result", "text_pair", "summary"} <= {it.kind for it in items}
    probes = items + [dataclasses.replace(it, text=None) for it in items]
    probes += [dataclasses.replace(it, node_id="ghost") for it in items]  # no such node
    probes += [dataclasses.replace(it, kind="tool_result") for it in items if it.kind == "text_pair"]
    probes += [dataclasses.replace(items[0], kind=k) for k in ("system", "text_pair")]
    for current in (0, 1, 2, 3):
        units = [k % 4 for k in range(len(probes))]
        results, mentioned = aging_mod._results_and_mentions(probes, g, units, current)
        want_results: list[tuple[int, Any, int]] = []
        want_mentioned: list[Any] = []
        seen: set[str] = set()
        for idx, it in enumerate(probes):
            if aging_mod._is_result(it, g):
                if it.node_id not in seen:
                    seen.add(it.node_id)
                    want_results.append((idx, it, len(want_mentioned)))
                continue
            if aging_mod._is_mention(it) and (aging_mod._is_user_authored(it, g) or units[idx] < current):
                want_mentioned.append(it)
        assert results == want_results and results
        assert [id(it) for it in mentioned] == [id(it) for it in want_mentioned] and mentioned
    assert aging_mod._message_ordinals(probes) == _ordinals_as_before(probes)
