"""The view function (SPEC §6) and the regressions SPEC §6 and §8 rule out."""

from __future__ import annotations

from typing import Any

import pytest

from dagctx.context.render import render_view
from dagctx.context.view import IN_PROGRESS, NO_RESULT, View
from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SUMMARY_MARKER, SUMMARY_NAME, SYSTEM_PROMPT_NAME, Call


class Builder:
    """Build a SessionGraph in memory; every node gets the next seq."""

    def __init__(self) -> None:
        self.g = SessionGraph("s1", "root")
        self.seq = 0
        self.g.add(Call(id="root", seq=0, created_at=0.0, role="user", metadata={"display": "root"}))

    def node(
        self,
        id: str,
        role: str,
        *,
        name: str = "",
        input: Any = None,
        output: Any = None,
        status: str = "completed",
        caller: str | None = None,
        predecessor: str | None = None,
        **metadata: Any,
    ) -> str:
        self.seq += 1
        self.g.add(
            Call(
                id=id,
                seq=self.seq,
                created_at=float(self.seq),
                role=role,  # type: ignore[arg-type]
                name=name,
                input=input,
                output=output,
                status=status,  # type: ignore[arg-type]
                caller=caller,
                predecessor=predecessor,
                metadata=metadata,
            )
        )
        return id

    def user(self, id: str, text: Any, pred: str, **meta: Any) -> str:
        return self.node(id, "user", output=text, caller="root", predecessor=pred, **meta)

    def llm(self, id: str, text: Any, pred: str, *, caller: str | None = None, status: str = "completed", **meta: Any) -> str:
        return self.node(id, "llm", name="m", output=text, caller=caller or pred, predecessor=pred, status=status, **meta)

    def tool(self, id: str, owner: str, name: str, input: Any, output: Any, *, tcid: str | None = None, status: str = "completed", **meta: Any) -> str:
        return self.node(id, "code", name=name, input=input, output=output, caller=owner, status=status, toolCallId=tcid or f"tc_{id}", **meta)

    def fn(self, id: str, caller: str | None, name: str, input: Any, output: Any, *, pred: str | None = None, status: str = "completed", **meta: Any) -> str:
        return self.node(id, "code", name=name, input=input, output=output, caller=caller, predecessor=pred, status=status, **meta)

    def inner_llm(self, id: str, caller: str, prompt: Any, reply: Any, *, status: str = "completed") -> str:
        return self.node(id, "llm", name="m", input=prompt, output=reply, caller=caller, status=status)

    def summary(self, id: str, covers: list[str], text: str) -> str:
        pred = self.g.nodes[covers[0]].predecessor
        return self.node(
            id, "llm", name=SUMMARY_NAME, output=f"{SUMMARY_MARKER}\n{text}", predecessor=pred, covers_ids=covers, compaction=True
        )

    def system(self, id: str, text: str) -> str:
        return self.node(id, "code", name=SYSTEM_PROMPT_NAME, output=text, caller="root")


def conversation(b: Builder, n: int, start: str = "root", prefix: str = "") -> str:
    """n turns u1/l1 … un/ln after ``start``; returns the last llm id."""
    pred = start
    for i in range(1, n + 1):
        u = b.user(f"{prefix}u{i}", f"question {prefix}{i}", pred)
        pred = b.llm(f"{prefix}l{i}", f"answer {prefix}{i}", u)
    return pred


def kinds(view: View) -> list[tuple[str, str]]:
    return [(i.kind, i.node_id) for i in view.items]


def texts(view: View) -> list[str]:
    return [i.text for i in view.items]


# ---------------------------------------------------------------- chain basics


def test_linear_conversation_reads_and_order():
    b = Builder()
    conversation(b, 3)
    v = render_view(b.g, "l3")
    assert v.reads == ["u1", "l1", "u2", "l2", "u3", "l3"]
    assert kinds(v) == [
        ("user", "u1"), ("assistant", "l1"), ("user", "u2"), ("assistant", "l2"), ("user", "u3"), ("assistant", "l3")
    ]
    assert v.items[0].text == "question 1" and v.items[0].role == "user"
    assert v.turn_count == 3
    assert v.turns == [("u1", 1), ("l1", 1), ("u2", 2), ("l2", 2), ("u3", 3), ("l3", 3)]


def test_root_never_rendered_nor_expanded():
    b = Builder()
    conversation(b, 1)
    b.user("x1", "other branch", "root")  # a ROOT-level sibling, caller=ROOT
    b.llm("y1", "other answer", "x1")
    v = render_view(b.g, "l1")
    assert "root" not in v.reads
    assert v.reads == ["u1", "l1"]
    assert all(i.text for i in v.items)  # no empty user message for ROOT (defect 6)
    empty = render_view(b.g, "root")
    assert empty.items == [] and empty.reads == []


def test_user_text_falls_back_to_input_and_llm_output_shapes():
    b = Builder()
    b.node("u1", "user", input="typed", output=None, caller="root", predecessor="root")
    b.llm("l1", {"text": "dict reply"}, "u1")
    b.user("u2", [{"type": "text", "text": "look"}, {"type": "image", "path": "att/a.png"}], "l1")
    b.llm("l2", [{"type": "thinking", "thinking": "hidden"}, {"type": "text", "text": "block reply"}], "u2")
    v = render_view(b.g, "l2")
    assert texts(v)[0] == "typed"
    assert texts(v)[1] == "dict reply"
    assert v.items[2].content == [{"type": "text", "text": "look"}, {"type": "image", "path": "att/a.png"}]
    assert texts(v)[3] == "block reply"


def test_memory_prefetch_and_prepend_context_prefix_the_user_message():
    b = Builder()
    b.user("u1", "hello", "root", memory_prefetch="<memory>likes tea</memory>", prepend_context="cwd: /w")
    v = render_view(b.g, "u1")
    assert [blk["text"] for blk in v.items[0].content] == ["<memory>likes tea</memory>", "cwd: /w", "hello"]
    assert len(v.items) == 1


# ---------------------------------------------------------------- branches


def test_sibling_branches_never_leak():
    b = Builder()
    conversation(b, 1)
    b.user("u2a", "branch A", "l1")
    b.llm("l2a", "A answer", "u2a")
    b.tool("ta", "l2a", "read", {"p": "a"}, "A data")
    b.user("u2b", "branch B", "l1")  # fork: same predecessor
    b.llm("l2b", "B answer", "u2b")
    va = render_view(b.g, "l2a")
    vb = render_view(b.g, "l2b")
    assert va.reads == ["u1", "l1", "u2a", "l2a", "ta"]
    assert vb.reads == ["u1", "l1", "u2b", "l2b"]


def test_llm_retry_sibling_under_same_user_does_not_leak():
    # both replies have caller=u1 (SPEC §4); expanding u1's caller subtree must not pull them in
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "first", "u1")
    b.llm("l1r", "second", "u1")
    assert render_view(b.g, "l1r").reads == ["u1", "l1r"]
    assert render_view(b.g, "l1").reads == ["u1", "l1"]
    assert render_view(b.g, "u1").reads == ["u1"]


def test_retry_never_sees_the_error_it_retries():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("bad", None, "u1", status="error", error={"type": "RateLimit", "message": "429 slow down"})
    b.llm("good", "ok", "u1")
    v = render_view(b.g, "good")
    assert v.reads == ["u1", "good"]
    # on its own branch the failure is visible to the model
    ve = render_view(b.g, "bad")
    assert ve.items[-1].kind == "assistant"
    assert ve.items[-1].text == "[error] the model call failed: 429 slow down"
    # a user who continues after the failure sees it too
    b.user("u2", "again?", "bad")
    assert "[error]" in render_view(b.g, "u2").items[1].text


def test_spawn_branch_stops_at_its_root_and_never_leaks_into_parent():
    b = Builder()
    b.user("u1", "delegate", "root")
    b.llm("l1", "spawning", "u1")
    b.tool("task", "l1", "task", {"goal": "g"}, "subagent done", expose="full")
    b.node("s0", "user", output="child goal", caller="task", predecessor=None, spawn_branch_root=True)
    b.llm("s1", "child answer", "s0")
    b.tool("st", "s1", "grep", {"q": "x"}, "child data")
    child = render_view(b.g, "s1")
    assert child.reads == ["s0", "s1", "st"]
    parent = render_view(b.g, "l1", expose_default="full")
    assert parent.reads == ["u1", "l1", "task"]


# ---------------------------------------------------------------- tools and expose


def test_tool_calls_pair_in_seq_order_with_results():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "let me look", "u1")
    b.tool("t1", "l1", "read", {"path": "a"}, "A")
    b.tool("t2", "l1", "read", {"path": "b"}, {"lines": 2})
    b.llm("l2", "done", "l1", caller="u1")
    v = render_view(b.g, "l2")
    assert kinds(v) == [
        ("user", "u1"), ("assistant", "l1"), ("tool_call", "t1"), ("tool_call", "t2"),
        ("tool_result", "t1"), ("tool_result", "t2"), ("assistant", "l2"),
    ]
    call = v.items[2]
    assert call.tool_call_id == "tc_t1" and call.owner == "l1" and call.input == {"path": "a"}
    assert v.items[5].text == '{"lines":2}'


def test_tool_retry_keeps_the_newest_call_with_the_same_id():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "", "u1")
    b.tool("t1", "l1", "fetch", {}, None, tcid="c1", status="error")
    b.tool("t1r", "l1", "fetch", {}, "fine", tcid="c1")
    v = render_view(b.g, "l1")
    assert "t1" not in v.reads and "t1r" in v.reads
    assert any("supersedes t1" in r for r in v.repairs)


def _nested(b: Builder, expose: str | None = None) -> None:
    b.user("u1", "analyse", "root")
    b.llm("l1", "calling analyse", "u1")
    meta = {"expose": expose} if expose else {}
    b.tool("fx", "l1", "analyse", {"f": "x.py"}, "analysis result", **meta)
    b.inner_llm("il1", "fx", "inner prompt", "inner reply")
    b.tool("it1", "il1", "read_file", {"p": "x.py"}, "SECRET FILE CONTENT")
    b.fn("sub", "fx", "helper", {"n": 1}, "helper out")
    b.inner_llm("il2", "sub", "deep prompt", "deep reply")
    b.llm("l2", "final", "l1", caller="u1")


def test_expose_io_hides_inner_llm_calls_and_their_tool_calls():
    b = Builder()
    _nested(b)
    v = render_view(b.g, "l2")
    assert v.reads == ["u1", "l1", "fx", "l2"]
    blob = "\n".join(texts(v))
    assert "SECRET" not in blob and "inner" not in blob  # defect 5
    assert [i.kind for i in v.items if i.node_id == "fx"] == ["tool_call", "tool_result"]


def test_expose_full_shows_everything_after_the_result_group():
    b = Builder()
    _nested(b)
    v = render_view(b.g, "l2", expose_default="full")
    assert v.reads == ["u1", "l1", "fx", "il1", "it1", "sub", "il2", "l2"]
    assert kinds(v) == [
        ("user", "u1"), ("assistant", "l1"), ("tool_call", "fx"), ("tool_result", "fx"),
        ("user", "il1"), ("assistant", "il1"), ("tool_call", "it1"), ("tool_result", "it1"),
        ("text_pair", "sub"), ("user", "il2"), ("assistant", "il2"), ("text_pair", "sub"),
        ("assistant", "l2"),
    ]
    assert v.items[4].text == "inner prompt" and v.items[4].depth == 1
    sub_call, sub_result = [i for i in v.items if i.node_id == "sub"]
    assert sub_call.part == "call" and sub_call.text == 'Called helper({"n":1})'
    assert sub_result.part == "result" and sub_result.text == "Result of helper:\nhelper out"


def test_per_function_expose_overrides_the_default():
    b = Builder()
    _nested(b, expose="full")
    v = render_view(b.g, "l2", expose_default="io")
    assert "il1" in v.reads and "it1" in v.reads
    b2 = Builder()
    _nested(b2, expose="io")
    v2 = render_view(b2.g, "l2", expose_default="full")
    assert v2.reads == ["u1", "l1", "fx", "l2"]


def test_full_parent_with_io_child_hides_the_child_insides():
    b = Builder()
    b.user("u1", "go", "root")
    b.fn("top", None, "pipeline", {}, "ok", pred="u1", expose="full")
    b.fn("child", "top", "step", {}, "step ok", expose="io")
    b.inner_llm("cl", "child", "p", "r")
    v = render_view(b.g, "top")
    assert v.reads == ["u1", "top", "child"]


def test_top_level_function_is_a_text_pair():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "a", "u1")
    b.fn("run", None, "lint", {"path": "src"}, "3 warnings", pred="l1")
    b.fn("boom", None, "deploy", None, None, pred="run", status="error", error="no credentials")
    v = render_view(b.g, "boom")
    pairs = [(i.role, i.part, i.text) for i in v.items if i.kind == "text_pair"]
    assert pairs == [
        ("assistant", "call", 'Called lint({"path":"src"})'),
        ("user", "result", "Result of lint:\n3 warnings"),
        ("assistant", "call", "Called deploy()"),
        ("user", "result", "Result of deploy:\n[error] no credentials"),
    ]


def test_status_markers_on_tool_results():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "", "u1")
    b.tool("e", "l1", "t", {}, "Traceback…", status="error")
    b.tool("c", "l1", "t", {}, None, status="cancelled")
    b.tool("r", "l1", "t", {}, None, status="running")
    b.tool("n", "l1", "t", {}, None)
    v = render_view(b.g, "l1")
    res = {i.node_id: i.text for i in v.items if i.kind == "tool_result"}
    assert res == {
        "e": "[error] Traceback…",
        "c": f"[cancelled] {NO_RESULT}",
        "r": NO_RESULT,
        "n": "(no output)",
    }
    assert [i.synthetic for i in v.items if i.kind == "tool_result"] == [False, False, True, False]
    assert any("unfinished tool call tc_r" in r for r in v.repairs)


def test_running_llm_head_renders_no_assistant_message():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", None, "u1", status="running")
    v = render_view(b.g, "l1")
    assert v.reads == ["u1"]


def test_cancelled_llm_is_marked():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "partial", "u1", status="cancelled")
    v = render_view(b.g, "l1")
    assert v.items[-1].text == "partial\n\n[cancelled] the model call was cancelled"


def test_aged_outputs_are_substituted_and_recorded():
    b = Builder()
    b.user("u1", "q", "root")
    b.llm("l1", "", "u1")
    b.tool("t1", "l1", "read", {}, "x" * 5000)
    v = render_view(b.g, "l1", aged={"t1": "[tool result removed: 5000 chars]", "u1": "ignored"})
    res = [i for i in v.items if i.kind == "tool_result"][0]
    assert res.text == "[tool result removed: 5000 chars]" and res.aged
    assert v.aged == ["t1"]
    assert v.items[0].text == "q"


def test_aging_an_unaged_view_equals_rendering_with_aging():
    """``age_view`` (the render after an aging plan reuses the view the plan walked)
    equals ``render_view(..., aged=)`` for every kind of aged result: tool results of
    every status, text pairs at the top level and inside an exposed function, image
    results, ids that are not code nodes or not rendered — and refuses a synthetic one."""
    from dagctx.context.render import age_view

    b = Builder()
    conversation(b, 2)
    b.user("u3", "go", "l2")
    b.llm("l3", "calling", "u3")
    b.tool("ok", "l3", "read", {"p": "a"}, "x" * 300)
    b.tool("err", "l3", "run", {}, "Traceback…", status="error")
    b.tool("cut", "l3", "run", {}, "partial", status="cancelled")
    b.tool("img", "l3", "shot", {}, [{"type": "image", "source": {"type": "url", "url": "file:///a.png"}}])
    b.tool("F", "l3", "refactor", {"f": "a.py"}, "done", expose="full")
    b.fn("Fsub", "F", "format", {}, "formatted")
    b.fn("run", None, "lint", {"path": "src"}, "3 warnings", pred="l3")
    b.fn("boom", None, "deploy", None, "no", pred="run", status="error")
    head = b.llm("l4", "finished", "boom")
    plain = render_view(b.g, head)
    for aged in ({}, {"ok": "[removed]"}, {"err": "[trimmed]", "cut": "[c]", "img": "[image]"},
                 {"F": "[f]", "Fsub": "[s]", "run": "[r]", "boom": "", "u3": "not code", "ghost": "x", "l3": "y"}):
        got = age_view(plain, b.g, aged)
        assert got == render_view(b.g, head, aged=aged), aged
        assert plain == render_view(b.g, head)  # the unaged view is left as it was
    b.tool("r", "l4", "t", {}, None, status="running")
    head = b.llm("l5", "more", "l4")
    plain = render_view(b.g, head)
    assert age_view(plain, b.g, {"r": "[aged]"}) is None  # a synthetic result: render again
    assert age_view(render_view(b.g, head, aged={"ok": "a"}), b.g, {"ok": "b"}) is None


# ---------------------------------------------------------------- frame


def _running_function(b: Builder) -> None:
    conversation(b, 1)
    b.user("u2", "refactor", "l1")
    b.llm("l2", "calling tools", "u2")
    b.tool("before", "l2", "ls", {}, "files")
    b.tool("F", "l2", "refactor", {"f": "a.py"}, None, status="running")
    b.inner_llm("fi1", "F", "plan the refactor", "plan: …")
    b.tool("fi1t", "fi1", "read", {"p": "a.py"}, "code")
    b.fn("fsub", "F", "format", {}, "formatted")  # expose io by default
    b.inner_llm("fsubl", "fsub", "x", "y")
    b.inner_llm("fi2", "F", "apply the plan", None, status="running")


def test_frame_renders_history_before_the_frame_plus_its_own_progress():
    b = Builder()
    _running_function(b)
    b.tool("after", "l2", "later_tool", {}, "later")  # started after F: invisible inside F
    v = render_view(b.g, "l2", frame="F")
    assert v.frame == "F"
    assert v.reads == ["u1", "l1", "u2", "l2", "before", "F", "fi1", "fi1t", "fsub", "fi2"]
    assert kinds(v)[4:] == [
        ("tool_call", "before"), ("tool_call", "F"), ("tool_result", "before"), ("tool_result", "F"),
        ("user", "fi1"), ("assistant", "fi1"), ("tool_call", "fi1t"), ("tool_result", "fi1t"),
        ("text_pair", "fsub"), ("text_pair", "fsub"), ("user", "fi2"),
    ]
    assert [i.text for i in v.items if i.node_id == "F" and i.kind == "tool_result"] == [IN_PROGRESS]
    assert "fsubl" not in v.reads  # a sub-function's insides follow its own expose


def test_frame_replay_of_an_inner_call_uses_before_seq():
    b = Builder()
    _running_function(b)
    v = render_view(b.g, "l2", frame="F", before_seq=b.g.nodes["fi2"].seq)
    assert v.reads[-1] == "fsub" and "fi2" not in v.reads


def test_frame_ignores_head_and_sees_its_own_branch():
    b = Builder()
    _running_function(b)
    b.user("other", "elsewhere", "l1")  # user checked out another branch meanwhile
    v = render_view(b.g, "other", frame="F")
    assert "other" not in v.reads and "u2" in v.reads


def test_frame_in_a_top_level_function_run_by_the_user():
    b = Builder()
    conversation(b, 1)
    b.fn("job", None, "batch", {"n": 3}, None, pred="l1", status="running")
    b.inner_llm("j1", "job", "step 1", "done 1")
    v = render_view(b.g, "job", frame="job")
    assert kinds(v) == [
        ("user", "u1"), ("assistant", "l1"), ("text_pair", "job"), ("user", "j1"), ("assistant", "j1")
    ]  # open: no result half
    # without a frame the running function shows io only: its call, no result yet
    assert kinds(render_view(b.g, "job"))[2:] == [("text_pair", "job")]


def test_frame_nested_two_levels_opens_the_call_stack():
    b = Builder()
    b.user("u1", "go", "root")
    b.llm("l1", "", "u1")
    b.tool("T", "l1", "outer", {}, None, status="running")
    b.inner_llm("Tl", "T", "outer prompt", "ok")
    b.fn("G", "T", "inner", {}, None, status="running")
    b.inner_llm("Gl", "G", "inner prompt", "inner ok")
    v = render_view(b.g, "l1", frame="G")
    assert v.reads == ["u1", "l1", "T", "Tl", "G", "Gl"]
    assert [i.kind for i in v.items if i.node_id == "G"] == ["text_pair"]


def test_render_range_callers_and_subcalls():
    b = Builder()
    conversation(b, 2)
    b.user("u3", "go", "l2")
    b.llm("l3", "", "u3")
    b.tool("T", "l3", "outer", {}, None, status="running")
    b.fn("G", "T", "inner", {"a": 1}, None, status="running", render_range={"callers": 0, "subcalls": 2})
    for k in range(4):
        b.inner_llm(f"g{k}", "G", f"p{k}", f"r{k}")
    v = render_view(b.g, "l3", frame="G")
    assert v.reads == ["G", "g2", "g3"]
    assert v.items[0].text == 'Called inner({"a":1})'
    b.g.nodes["G"].metadata["render_range"] = {"callers": 1}
    v1 = render_view(b.g, "l3", frame="G")
    assert v1.reads == ["T", "G", "g0", "g1", "g2", "g3"]
    b.g.nodes["G"].metadata["render_range"] = {"callers": 2}
    assert render_view(b.g, "l3", frame="G").reads[:2] == ["u1", "l1"]


def test_frame_must_be_a_function_inside_a_turn():
    b = Builder()
    conversation(b, 1)
    b.system("sys", "prompt")
    with pytest.raises(DagctxError) as e:
        render_view(b.g, "l1", frame="l1")
    assert e.value.kind == "InvalidParams"
    with pytest.raises(DagctxError):
        render_view(b.g, "l1", frame="sys")
    with pytest.raises(DagctxError) as e2:
        render_view(b.g, "l1", frame="nope")
    assert e2.value.kind == "NodeNotFound"


# ---------------------------------------------------------------- summaries


def _compacted() -> Builder:
    b = Builder()
    conversation(b, 4)
    b.tool("t1", "l1", "read", {}, "old data")
    b.summary("S", ["u1", "l1", "u2", "l2"], "we read old data")
    return b


def test_summary_replaces_its_segment_on_the_compacted_branch():
    b = _compacted()
    v = render_view(b.g, "l4")
    assert v.reads == ["S", "u3", "l3", "u4", "l4"]
    assert v.summary_id == "S" and v.covered == ["u1", "l1", "u2", "l2"]
    first = v.items[0]
    assert first.kind == "summary" and first.role == "user"
    assert first.text == f"{SUMMARY_MARKER}\nwe read old data"
    for covered in ("u1", "l1", "u2", "l2", "t1"):
        assert covered not in v.reads


def test_summary_text_gets_the_marker_once():
    b = Builder()
    conversation(b, 2)
    b.node("S", "llm", name=SUMMARY_NAME, output="plain text", predecessor="root", covers_ids=["u1", "l1"])
    assert render_view(b.g, "l2").items[0].text == f"{SUMMARY_MARKER}\nplain text"


def test_sibling_forked_inside_the_covered_range_renders_raw():
    b = _compacted()
    b.user("u2x", "retry from inside", "l1")  # fork inside [u1..l2]
    b.llm("l2x", "x", "u2x")
    v = render_view(b.g, "l2x")
    assert v.summary_id is None
    assert v.reads == ["u1", "l1", "t1", "u2x", "l2x"]  # defect 2: branch-local activity


def test_compacting_one_branch_does_not_change_another():
    b = Builder()
    conversation(b, 2)
    b.user("a3", "A", "l2")
    b.llm("a4", "A", "a3")
    b.user("b3", "B", "l2")
    b.llm("b4", "B", "b3")
    before_b = render_view(b.g, "b4").reads
    b.summary("SA", ["u1", "l1", "u2", "l2", "a3"], "A only")  # reaches into branch A
    assert render_view(b.g, "b4").reads == before_b
    assert render_view(b.g, "a4").reads == ["SA", "a4"]


def test_shared_prefix_summary_applies_to_every_branch_containing_it():
    b = Builder()
    conversation(b, 2)
    b.user("a3", "A", "l2")
    b.user("b3", "B", "l2")
    b.summary("S", ["u1", "l1"], "prefix")
    assert render_view(b.g, "a3").reads == ["S", "u2", "l2", "a3"]
    assert render_view(b.g, "b3").reads == ["S", "u2", "l2", "b3"]


def test_superseded_summary_is_never_rendered():
    b = Builder()
    conversation(b, 4)
    b.summary("S1", ["u1", "l1"], "first")
    b.summary("S2", ["u1", "l1", "u2", "l2", "u3", "l3"], "rolled")
    v = render_view(b.g, "l4")
    assert v.reads == ["S2", "u4", "l4"]
    assert v.superseded == ["S1"]
    assert "S1" not in v.reads
    # excluded (e.g. while validating a candidate) → the previous one is active again
    assert render_view(b.g, "l4", exclude_summaries={"S2"}).reads == ["S1", "u2", "l2", "u3", "l3", "u4", "l4"]
    assert render_view(b.g, "l4", summary_policy="none").reads[:2] == ["u1", "l1"]


def test_non_contiguous_or_foreign_covers_render_raw():
    b = Builder()
    conversation(b, 3)
    b.node("Sgap", "llm", name=SUMMARY_NAME, output="x", predecessor="root", covers_ids=["u1", "u2"])
    b.node("Sfor", "llm", name=SUMMARY_NAME, output="x", predecessor="root", covers_ids=["u1", "ghost"])
    assert render_view(b.g, "l3").summary_id is None


def test_summary_is_not_a_turn():
    b = _compacted()
    raw = render_view(b.g, "l4", summary_policy="none")
    comp = render_view(b.g, "l4")
    raw_turns = dict(raw.turns)
    comp_turns = dict(comp.turns)
    for nid in ("u3", "l3", "u4", "l4"):
        assert comp_turns[nid] == raw_turns[nid]  # same turn distance with or without S
    assert comp.turn_count == raw.turn_count == 4
    assert comp_turns["S"] == 2  # carries the covered turns, adds none


def test_before_seq_hides_later_summaries_and_nodes():
    b = _compacted()
    s_seq = b.g.nodes["S"].seq
    v = render_view(b.g, "l4", before_seq=s_seq)
    assert v.summary_id is None and v.reads[0] == "u1"
    v2 = render_view(b.g, "l4", before_seq=b.g.nodes["l4"].seq)
    assert "l4" not in v2.reads


def test_manifest_records_summary_state():
    b = _compacted()
    m = render_view(b.g, "l4").manifest()
    assert m["summaryId"] == "S" and m["coversIds"] == ["u1", "l1", "u2", "l2"]
    assert m["policyVersion"] >= 1 and m["exposeDefault"] == "io"


# ---------------------------------------------------------------- system prompt


def test_system_prompt_node_selected_by_seq():
    b = Builder()
    b.system("sys1", "prompt one")
    conversation(b, 1)
    b.system("sys2", "prompt two")
    b.user("u2", "q2", "l1")
    v1 = render_view(b.g, "l1")
    assert (v1.system_node, v1.system) == ("sys1", "prompt one")
    v2 = render_view(b.g, "u2")
    assert (v2.system_node, v2.system) == ("sys2", "prompt two")
    assert "sys1" not in v2.reads and "sys2" not in v2.reads
    v3 = render_view(b.g, "u2", system_node_id="sys1")
    assert v3.system == "prompt one"
    assert render_view(b.g, "u2", before_seq=b.g.nodes["sys2"].seq).system_node == "sys1"
    with pytest.raises(DagctxError):
        render_view(b.g, "u2", system_node_id="u1")


def test_no_system_prompt_node():
    b = Builder()
    conversation(b, 1)
    v = render_view(b.g, "l1")
    assert v.system is None and v.system_node is None


def test_render_is_deterministic():
    b = _compacted()
    assert render_view(b.g, "l4") == render_view(b.g, "l4")


def test_imported_system_prompt_node_with_role_llm_counts():
    b = Builder()
    b.node("sysi", "llm", name=SYSTEM_PROMPT_NAME, output="imported prompt", predecessor="root")
    conversation(b, 1)
    v = render_view(b.g, "l1")
    assert (v.system_node, v.system) == ("sysi", "imported prompt")
    assert "sysi" not in v.reads


def test_ask_user_answer_inside_an_exposed_function():
    b = Builder()
    b.user("u1", "deploy", "root")
    b.fn("dep", None, "deploy", {}, "deployed", pred="u1", expose="full")
    b.node("ask", "user", input="Which region?", output="eu-west", caller="dep")
    v = render_view(b.g, "dep")
    assert [(i.part, i.text) for i in v.items if i.node_id == "ask"] == [
        ("call", "Asked the user: Which region?"),
        ("result", "The user answered: eu-west"),
    ]
    assert v.turn_count == 1  # an ask-user answer is not a turn
