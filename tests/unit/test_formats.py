"""Neutral view → OpenAI / Anthropic / neutral messages; pair validity always."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from dagctx.context import formats
from dagctx.context.formats import (
    check_pairs,
    message_tokens,
    to_messages,
)
from dagctx.context.formats.anthropic import PLACEHOLDER_USER
from dagctx.context.render import render_view
from dagctx.context.view import NO_RESULT, Item, View
from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.nodes import SUMMARY_MARKER, SUMMARY_NAME, SYSTEM_PROMPT_NAME, Call

FORMATS = ("openai", "anthropic", "neutral")


class Builder:
    """Build a SessionGraph in memory; every node gets the next seq."""

    def __init__(self) -> None:
        self.g = SessionGraph("s1", "root")
        self.seq = 0
        self.g.add(Call(id="root", seq=0, created_at=0.0, role="user", metadata={"display": "root"}))

    def node(self, id: str, role: str, **kw: Any) -> str:
        self.seq += 1
        meta = kw.pop("metadata", {})
        self.g.add(Call(id=id, seq=self.seq, created_at=float(self.seq), role=role, metadata=meta, **kw))  # type: ignore[arg-type]
        return id

    def user(self, id: str, text: Any, pred: str, **meta: Any) -> str:
        return self.node(id, "user", output=text, caller="root", predecessor=pred, metadata=meta)

    def llm(self, id: str, text: Any, pred: str, *, caller: str | None = None, status: str = "completed") -> str:
        return self.node(id, "llm", name="m", output=text, caller=caller or pred, predecessor=pred, status=status)

    def tool(self, id: str, owner: str, name: str, input: Any, output: Any, *, tcid: str | None = None, status: str = "completed") -> str:
        return self.node(
            id, "code", name=name, input=input, output=output, caller=owner, status=status,
            metadata={"toolCallId": tcid or f"tc_{id}"},
        )


def tool_session() -> Builder:
    b = Builder()
    b.node("sys", "code", name=SYSTEM_PROMPT_NAME, output="You are helpful.", caller="root")
    b.user("u1", "list files", "root")
    b.llm("l1", "Looking.", "u1")
    b.tool("t1", "l1", "ls", {"path": ".", "all": True}, "a.py\nb.py")
    b.tool("t2", "l1", "cat", {"path": "a.py"}, "boom", status="error")
    b.llm("l2", "Two files.", "l1", caller="u1")
    b.user("u2", "thanks", "l2")
    return b


def dumps(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


# ---------------------------------------------------------------- openai


def test_openai_shape():
    b = tool_session()
    system, messages, ids = to_messages(render_view(b.g, "u2"), "openai")
    assert system == "You are helpful."
    assert messages == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "tc_t1", "type": "function", "function": {"name": "ls", "arguments": '{"path":".","all":true}'}},
                {"id": "tc_t2", "type": "function", "function": {"name": "cat", "arguments": '{"path":"a.py"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "tc_t1", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "tc_t2", "content": "[error] boom"},
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "thanks"},
    ]
    assert ids == [["sys"], ["u1"], ["l1", "t1", "t2"], ["t1"], ["t2"], ["l2"], ["u2"]]
    assert check_pairs(messages, "openai") == []


def test_openai_without_system_and_tool_only_assistant_has_null_content():
    b = Builder()
    b.user("u1", "go", "root")
    b.llm("l1", None, "u1")
    b.tool("t1", "l1", "run", "not json", 42)
    _, messages, _ = to_messages(render_view(b.g, "l1"), "openai", include_system=False)
    assert messages[1]["content"] is None
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"input":"not json"}'
    assert messages[2]["content"] == "42"
    assert check_pairs(messages, "openai") == []


def test_openai_string_json_arguments_pass_through():
    b = Builder()
    b.user("u1", "go", "root")
    b.llm("l1", None, "u1")
    b.tool("t1", "l1", "run", '{"b": 1, "a": 2}', "ok")
    _, messages, _ = to_messages(render_view(b.g, "l1"), "openai")
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"b": 1, "a": 2}'


def test_openai_images_become_parts():
    b = Builder()
    b.user(
        "u1",
        [
            {"type": "text", "text": "what is this"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "url": "https://x/y.png"},
        ],
        "root",
    )
    _, messages, _ = to_messages(render_view(b.g, "u1"), "openai")
    assert messages[0]["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]


# ---------------------------------------------------------------- anthropic


def test_anthropic_shape_and_alternation():
    b = tool_session()
    system, messages, ids = to_messages(render_view(b.g, "u2"), "anthropic")
    assert system == "You are helpful."
    assert all(m["role"] != "system" for m in messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "tc_t1", "name": "ls", "input": {"path": ".", "all": True}},
        {"type": "tool_use", "id": "tc_t2", "name": "cat", "input": {"path": "a.py"}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "tc_t1", "content": "a.py\nb.py"},
        {"type": "tool_result", "tool_use_id": "tc_t2", "content": "[error] boom", "is_error": True},
    ]
    assert ids[2] == ["t1", "t2"]
    assert check_pairs(messages, "anthropic") == []


def test_anthropic_merges_consecutive_roles():
    b = Builder()
    for i in range(1, 4):
        b.user(f"u{i}", f"q{i}", "root" if i == 1 else f"l{i - 1}")
        b.llm(f"l{i}", f"a{i}", f"u{i}")
    b.llm("l3b", "more", "l3", caller="u3")  # a second model step right after
    b.node("S", "llm", name=SUMMARY_NAME, output="sum", predecessor="root", metadata={"covers_ids": ["u1", "l1"]})
    b.user("u4", "q4", "l3b")
    _, messages, ids = to_messages(render_view(b.g, "u4"), "anthropic")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == [
        {"type": "text", "text": f"{SUMMARY_MARKER}\nsum"},
        {"type": "text", "text": "q2"},
    ]
    assert ids[0] == ["S", "u2"]
    assert messages[3]["content"] == [{"type": "text", "text": "a3"}, {"type": "text", "text": "more"}]
    assert check_pairs(messages, "anthropic") == []


def test_anthropic_results_open_the_user_message_before_text():
    b = Builder()
    b.user("u1", "go", "root")
    b.llm("l1", "", "u1")
    b.tool("t1", "l1", "ls", None, "x")
    b.user("u2", "next", "l1")
    _, messages, _ = to_messages(render_view(b.g, "u2"), "anthropic")
    assert [blk["type"] for blk in messages[2]["content"]] == ["tool_result", "text"]
    assert messages[1]["content"] == [{"type": "tool_use", "id": "tc_t1", "name": "ls", "input": {}}]
    assert check_pairs(messages, "anthropic") == []


def test_anthropic_placeholder_when_branch_starts_with_assistant():
    b = Builder()
    b.node("f", "code", name="lint", input={"p": 1}, output="ok", predecessor="root")
    r = to_messages(render_view(b.g, "f"), "anthropic")
    assert r.messages[0] == {"role": "user", "content": [{"type": "text", "text": PLACEHOLDER_USER}]}
    assert r.node_ids[0] == []
    assert any("placeholder" in x for x in r.repairs)
    assert check_pairs(r.messages, "anthropic") == []


def test_anthropic_image_references():
    b = Builder()
    b.user("u1", [{"type": "image", "path": "att/1.png", "media_type": "image/png"}, {"type": "text", "text": "see"}], "root")
    _, messages, _ = to_messages(render_view(b.g, "u1"), "anthropic")
    assert messages[0]["content"] == [
        {"type": "image", "source": {"type": "path", "path": "att/1.png", "media_type": "image/png"}},
        {"type": "text", "text": "see"},
    ]


# ---------------------------------------------------------------- neutral


def test_neutral_shape():
    b = tool_session()
    system, messages, ids = to_messages(render_view(b.g, "u2"), "neutral")
    assert system == "You are helpful."
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_call", "id": "tc_t1", "name": "ls", "input": {"path": ".", "all": True}},
            {"type": "tool_call", "id": "tc_t2", "name": "cat", "input": {"path": "a.py"}},
        ],
        "nodeIds": ["l1", "t1", "t2"],
    }
    assert messages[2] == {
        "role": "tool",
        "content": [
            {"type": "tool_result", "toolCallId": "tc_t1", "content": "a.py\nb.py", "isError": False},
            {"type": "tool_result", "toolCallId": "tc_t2", "content": "[error] boom", "isError": True},
        ],
        "nodeIds": ["t1", "t2"],
    }
    assert ids == [m["nodeIds"] for m in messages]
    assert check_pairs(messages, "neutral") == []


# ---------------------------------------------------------------- pair validity


def _item(kind: str, node_id: str, role: str, **kw: Any) -> Item:
    return Item(kind=kind, node_id=node_id, role=role, seq=0, **kw)  # type: ignore[arg-type]


def _view(items: list[Item], repairs: list[str] | None = None) -> View:
    return View(head="h", items=items, reads=[i.node_id for i in items], turns=[], repairs=list(repairs or []))


@pytest.mark.parametrize("fmt", FORMATS)
def test_orphan_result_dropped(fmt: str):
    items = [
        _item("user", "u", "user", content=[{"type": "text", "text": "hi"}], text="hi"),
        _item("tool_result", "t9", "tool", tool_call_id="ghost", content=[{"type": "text", "text": "r"}]),
        _item("assistant", "a", "assistant", content=[{"type": "text", "text": "yo"}], text="yo"),
    ]
    r = to_messages(_view(items), fmt)  # type: ignore[arg-type]
    assert check_pairs(r.messages, fmt) == []  # type: ignore[arg-type]
    assert "ghost" not in json.dumps(r.messages)
    assert any("orphan" in x for x in r.repairs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unfinished_call_gets_synthetic_result(fmt: str):
    b = Builder()
    b.user("u1", "go", "root")
    b.llm("l1", "working", "u1")
    b.tool("t1", "l1", "slow", {}, None, status="running")
    b.tool("t2", "l1", "stopped", {}, None, status="cancelled")
    b.user("u2", "still there?", "l1")
    r = to_messages(render_view(b.g, "u2"), fmt)  # type: ignore[arg-type]
    assert check_pairs(r.messages, fmt) == []  # type: ignore[arg-type]
    blob = json.dumps(r.messages)
    assert blob.count(NO_RESULT) == 2
    # a view that lacks the result item entirely is repaired by the formatter
    items = [
        _item("user", "u", "user", content=[{"type": "text", "text": "hi"}]),
        _item("assistant", "a", "assistant"),
        _item("tool_call", "t", "assistant", tool_call_id="c1", owner="a", name="x", input={}),
    ]
    r2 = to_messages(_view(items), fmt)  # type: ignore[arg-type]
    assert check_pairs(r2.messages, fmt) == []  # type: ignore[arg-type]
    assert NO_RESULT in json.dumps(r2.messages)
    assert any("synthetic" in x for x in r2.repairs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_duplicate_tool_call_ids_are_renamed(fmt: str):
    b = Builder()
    b.user("u1", "go", "root")
    b.llm("l1", "", "u1")
    b.tool("t1", "l1", "x", {}, "one", tcid="call_0")
    b.llm("l2", "", "l1", caller="u1")
    b.tool("t2", "l2", "x", {}, "two", tcid="call_0")  # a local model reusing ids
    r = to_messages(render_view(b.g, "l2"), fmt)  # type: ignore[arg-type]
    assert check_pairs(r.messages, fmt) == []  # type: ignore[arg-type]
    blob = json.dumps(r.messages)
    assert "call_0_2" in blob and "two" in blob and "one" in blob
    assert any("renamed" in x for x in r.repairs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_render_of_a_rich_session_is_pair_valid(fmt: str):
    b = tool_session()
    b.llm("l3", "", "u2")
    b.tool("t3", "l3", "deep", {}, "deep out")
    b.node("i1", "llm", name="m", input="inner", output="inner reply", caller="t3")
    b.node("i1t", "code", name="grep", input={}, output="g", caller="i1", metadata={"toolCallId": "tc_i1t"})
    b.node("fx", "code", name="fn", input=None, output=None, status="running", predecessor="l3")
    for expose in ("io", "full"):
        for head in ("l1", "l2", "u2", "l3", "fx"):
            view = render_view(b.g, head, expose_default=expose)  # type: ignore[arg-type]
            r = to_messages(view, fmt)  # type: ignore[arg-type]
            assert check_pairs(r.messages, fmt) == [], (expose, head)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_view_same_bytes(fmt: str):
    b = tool_session()
    one = to_messages(render_view(b.g, "u2"), fmt)  # type: ignore[arg-type]
    two = to_messages(render_view(b.g, "u2"), fmt)  # type: ignore[arg-type]
    assert dumps(one.messages) == dumps(two.messages)
    assert one.node_ids == two.node_ids


# ---------------------------------------------------------------- check_pairs catches bad lists


def test_check_pairs_flags_openai_problems():
    bad = [
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "a", "content": "orphan"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[]"}}]},
        {"role": "user", "content": "no result in between"},
    ]
    problems = check_pairs(bad, "openai")
    assert any("does not follow" in p for p in problems)
    assert any("has no result" in p for p in problems)
    assert any("not a JSON object" in p for p in problems)


def test_check_pairs_flags_anthropic_problems():
    bad = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "a", "content": "r"}]},
        {"role": "user", "content": [{"type": "text", "text": ""}]},
    ]
    problems = check_pairs(bad, "anthropic")
    assert any("first message" in p for p in problems)
    assert any("after other content" in p for p in problems)
    assert any("in a row" in p for p in problems)
    assert any("empty text" in p for p in problems)


def test_check_pairs_flags_neutral_problems():
    bad = [
        {"role": "assistant", "content": [{"type": "tool_call", "id": "a", "name": "f", "input": {}}], "nodeIds": []},
        {"role": "user", "content": [{"type": "text", "text": "x"}], "nodeIds": []},
        {"role": "tool", "content": [{"type": "tool_result", "toolCallId": "b", "content": "", "isError": False}], "nodeIds": []},
    ]
    problems = check_pairs(bad, "neutral")
    assert any("'a' has no result" in p for p in problems)
    assert any("does not follow" in p for p in problems)


def test_unknown_format_rejected():
    with pytest.raises(ValueError):
        to_messages(_view([]), "gemini")  # type: ignore[arg-type]


def test_message_tokens_uses_the_given_counter():
    b = tool_session()
    _, messages, _ = to_messages(render_view(b.g, "u2"), "openai")
    counts = message_tokens(messages, lambda s: len(s), overhead=3)
    assert len(counts) == len(messages)
    assert counts[1] == len("list files") + 3
    assert counts[0] == len("You are helpful.") + 3


@pytest.mark.parametrize("fmt", ("openai", "anthropic"))
def test_image_without_usable_reference_becomes_text(fmt: str):
    # importers keep only a digest of inline images: never send a bogus url
    b = Builder()
    omitted = {"type": "image", "mediaType": "image/png", "data": "<omitted>", "bytes": 10, "sha256": "ab12"}
    b.user("u1", [{"type": "text", "text": "see"}, omitted], "root")
    _, messages, _ = to_messages(render_view(b.g, "u1"), fmt)  # type: ignore[arg-type]
    blob = json.dumps(messages)
    assert "[image: ab12]" in blob
    assert "image_url" not in blob and '"source"' not in blob


# ---------------------------------------------------------------- reasoning (SPEC §6)

SIGNED = {"type": "thinking", "text": "Check both files.", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-1"}
PLAIN = {"type": "reasoning", "text": "unsigned musing"}
CODEX = {"type": "reasoning", "id": "rs_1", "summary": ["Looked at a.py"], "encryptedContent": "enc-1"}


def reasoning_session(head_is_user: bool) -> tuple[Builder, str]:
    b = Builder()
    b.user("u1", "list files", "root")
    b.node("l0", "llm", name="m", output="Done before.", caller="u1", predecessor="u1",
           metadata={"reasoning": [dict(SIGNED, signature="old")]})
    b.user("u2", "now the tests", "l0")
    b.node("l1", "llm", name="m", output="Looking.", caller="u2", predecessor="u2",
           metadata={"reasoning": [SIGNED, REDACTED, PLAIN, CODEX]})
    b.tool("t1", "l1", "ls", {"path": "."}, "a.py")
    head = "l1"
    if head_is_user:
        b.node("l2", "llm", name="m", output="Two files.", caller="u2", predecessor="l1")
        head = b.user("u3", "thanks", "l2")
    return b, head


def test_anthropic_sends_the_current_tool_loops_signed_blocks_first_and_unchanged() -> None:
    b, head = reasoning_session(False)
    view = render_view(b.g, head)
    msgs = to_messages(view, "anthropic").messages
    assert check_pairs(msgs, "anthropic") == []
    loop = [m for m in msgs if m["role"] == "assistant"][-1]
    assert loop["content"][:3] == [
        {"type": "thinking", "thinking": "Check both files.", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque-1"},
        {"type": "text", "text": "Looking."},
    ]
    # the earlier turn's block is not sent by default; "all" sends every signed one; "none" none
    assert "old" not in json.dumps(msgs)
    every = json.dumps(to_messages(view, "anthropic", reasoning="all").messages)
    assert '"old"' in every and "sig-1" in every and "unsigned musing" not in every and "enc-1" not in every
    assert "thinking" not in json.dumps(to_messages(view, "anthropic", reasoning="none").messages)


@pytest.mark.parametrize("block, sent_signed_by", [
    (SIGNED, {"anthropic", "neutral"}),
    (REDACTED, {"anthropic", "neutral"}),
    (PLAIN, set()),
    (CODEX, {"neutral"}),
    ({"type": "redacted_thinking"}, {"neutral"}),
])
def test_each_format_says_which_stored_reasoning_it_sends_signed(block: dict[str, Any], sent_signed_by: set[str]) -> None:
    """SPEC §6, §8: what goes out byte for byte is the format's own knowledge (a request
    checkpoint may not cover a step holding such a block)."""
    assert {name for name, fmt in formats.FORMATS.items() if fmt.sends_signed(block)} == sent_signed_by


def test_openai_takes_no_reasoning_unless_asked_and_neutral_keeps_the_blocks() -> None:
    b, head = reasoning_session(False)
    view = render_view(b.g, head)
    plain = to_messages(view, "openai").messages
    assert not any("reasoning_content" in m for m in plain) and "Check both" not in json.dumps(plain)
    every = to_messages(view, "openai", reasoning="all").messages
    assert [m["reasoning_content"] for m in every if "reasoning_content" in m] == [
        "Check both files.", "Check both files.\n\nunsigned musing\n\nLooked at a.py"]
    assert check_pairs(every, "openai") == []
    neutral = to_messages(view, "neutral").messages
    loop = [m for m in neutral if m["role"] == "assistant"][-1]
    assert loop["content"][:4] == [SIGNED, REDACTED, PLAIN, CODEX]


def test_a_new_user_message_ends_the_tool_loop() -> None:
    b, head = reasoning_session(True)
    view = render_view(b.g, head)
    for fmt in ("anthropic", "neutral"):
        assert "sig-1" not in json.dumps(to_messages(view, fmt).messages)
        assert "sig-1" in json.dumps(to_messages(view, fmt, reasoning="all").messages)


# ---------------------------------------------------------------- the registry of formats


def test_the_registry_is_the_wire_literal():
    from typing import get_args

    from dagctx.protocol.context_messages import Format

    assert set(formats.FORMATS) == set(get_args(Format)) == set(FORMATS)
    for name, fmt in formats.FORMATS.items():
        assert fmt.name == name


def test_turn_hooks_go_before_the_newest_user_text_in_every_format():
    from dagctx.context.formats import apply_turn_hooks

    b = tool_session()
    b.llm("l3", "Reading again.", "u2")
    b.tool("t3", "l3", "cat", {"path": "b.py"}, "print(2)")
    view = render_view(b.g, "l3")
    hooks = {"memoryPrefetch": "<memory>tea</memory>", "prependContext": "cwd: /w"}
    for fmt in FORMATS:
        _, messages, _ = to_messages(view, fmt)
        hooked = apply_turn_hooks(messages, hooks, fmt)
        assert check_pairs(hooked, fmt) == [], fmt
        changed = [i for i, (a, b2) in enumerate(zip(messages, hooked)) if a != b2]
        assert len(changed) == 1, fmt
        text = json.dumps(hooked[changed[0]])
        # the user's own message "thanks" carries it — never the tool results after it
        assert "thanks" in text and text.index("tea") < text.index("cwd: /w") < text.index("thanks"), (fmt, text)


def test_a_user_message_a_format_cannot_prefix_is_an_error_never_a_silent_no_op():
    from dagctx.context.formats import apply_turn_hooks

    parts_shaped = [{"role": "user", "parts": [{"text": "hello"}]}]
    with pytest.raises(ValueError, match="turn hooks"):
        apply_turn_hooks(parts_shaped, {"prependContext": "cwd: /w"}, "openai")


def test_a_new_format_is_one_module(monkeypatch: pytest.MonkeyPatch):
    """A Gemini-style ``contents`` format written as a module would be: one RenderFormat
    subclass; rendering, pairing, turn hooks and token text then work through the registry."""
    from dagctx.context.formats import RenderFormat, apply_turn_hooks, message_tokens

    class Contents(RenderFormat):
        name = "contents-test"

        def build(self, view, msgs, repairs, *, include_system):
            out, ids = [], []
            for m in msgs:
                parts = []
                for blk in m.blocks:
                    if blk["type"] == "text" and blk.get("text"):
                        parts.append({"text": blk["text"]})
                    elif blk["type"] == "tool_call":
                        parts.append({"functionCall": {"name": blk["name"], "args": blk["input"], "id": blk["id"]}})
                    elif blk["type"] == "tool_result":
                        parts.append({"functionResponse": {"id": blk["toolCallId"], "response": blk["content"]}})
                if parts:
                    out.append({"role": "model" if m.role == "assistant" else "user", "parts": parts})
                    ids.append(list(m.node_ids))
            return out, ids

        def check_pairs(self, messages):
            calls = [p["functionCall"]["id"] for m in messages for p in m["parts"] if "functionCall" in p]
            answers = [p["functionResponse"]["id"] for m in messages for p in m["parts"] if "functionResponse" in p]
            return [] if sorted(calls) == sorted(answers) else ["unanswered call"]

        def prepend_to_newest_user(self, messages, prefix):
            out = list(messages)
            for i in range(len(out) - 1, -1, -1):
                if out[i]["role"] == "user" and any("text" in p for p in out[i]["parts"]):
                    out[i] = {**out[i], "parts": [{"text": prefix}, *out[i]["parts"]]}
                    break
            return out

        def message_text(self, message):
            return json.dumps(message["parts"])  # names, arguments and responses are billed

    monkeypatch.setitem(formats.FORMATS, Contents.name, Contents())
    view = render_view(tool_session().g, "u2")
    system, messages, ids = to_messages(view, "contents-test")
    assert system == "You are helpful." and len(messages) == len(ids)
    assert check_pairs(messages, "contents-test") == []
    hooked = apply_turn_hooks(messages, {"prependContext": "cwd: /w"}, "contents-test")
    assert hooked[-1]["parts"][0] == {"text": "cwd: /w"} and hooked[-1]["parts"][1] == {"text": "thanks"}
    assert all(n > 0 for n in message_tokens(messages, len, format="contents-test"))
