"""Importers: every public corpus transcript parses to exactly the counts checked by hand.

The corpus is read-only and lives outside the repository (``../shared/corpus`` from the
repo root, or ``$DAGCTX_CORPUS``); corpus tests skip when it is absent. The expected
numbers below were cross-checked with jq/python one-offs against the raw files (see the
comments) and against ``SOURCES.md``. OpenClaw has no public sample, so its fixtures are
small JSONL strings written here.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from dagctx.transcripts import (
    Skipped,
    Transcript,
    check_transcript,
    detect_format,
    parse_file,
    parse_path,
)
from dagctx.protocol.context_messages import Usage
from dagctx.protocol.nodes import SUMMARY_NAME, SYSTEM_PROMPT_NAME

from conftest import DEFAULT_CORPUS, corpus_dir, parsed_file


CORPUS = corpus_dir() or DEFAULT_CORPUS
needs_corpus = pytest.mark.corpus

CC = "claude-code"
SUBAGENT_SESSION = "claude-code/0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl"
COMPACT_SESSION = "claude-code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
GENERAL = "claude-code/general-tool-calls.jsonl"
SHORT = "claude-code/short.jsonl"
CODEX = "codex/rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl"
SWE = "swe-agent/marshmallow-code__marshmallow-1867.traj"
OPENHANDS = "openhands/basic_gui_mode.json"
GLAIVE = "sharegpt-zh/glaive_toolcall_zh_demo.jsonl"
LONGEST = "sharegpt-zh/sharegpt_zh_longest_330_turns.jsonl"

ALL_FILES = [SUBAGENT_SESSION, COMPACT_SESSION, GENERAL, SHORT, CODEX, SWE, OPENHANDS, GLAIVE, LONGEST]


def parsed(rel: str) -> tuple[Transcript, ...]:
    return parsed_file(CORPUS / rel)


def one(rel: str) -> Transcript:
    ts = parsed(rel)
    assert len(ts) == 1
    return ts[0]


def by_id(t: Transcript) -> dict:
    return {n.id: n for n in t.nodes}


def chain(t: Transcript, tip: str | None) -> list[str]:
    nodes = by_id(t)
    out = []
    while tip is not None and tip != "ROOT":
        out.append(tip)
        tip = nodes[tip].predecessor
    return out[::-1]


# --------------------------------------------------------------------------- detection


@needs_corpus
@pytest.mark.parametrize(
    ("rel", "fmt"),
    [
        (SUBAGENT_SESSION, CC),
        (COMPACT_SESSION, CC),
        (GENERAL, CC),  # starts with two `//` lines
        (SHORT, CC),
        (CODEX, "codex"),
        (SWE, "swe-agent"),
        (OPENHANDS, "openhands"),
        (GLAIVE, "sharegpt"),
        (LONGEST, "sharegpt"),
    ],
)
def test_detect_format(rel: str, fmt: str) -> None:
    assert detect_format(CORPUS / rel) == fmt


def test_detect_format_unknown(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="cannot tell"):
        detect_format(f)


# --------------------------------------------------------------------------- invariants on every file


@needs_corpus
@pytest.mark.parametrize("rel", ALL_FILES)
def test_structure_of_every_transcript(rel: str) -> None:
    for t in parsed(rel):
        assert check_transcript(t) == [], rel
        ids = [n.id for n in t.nodes]
        assert len(ids) == len(set(ids))
        nodes = by_id(t)
        seen: set[str] = set()
        for n in t.nodes:
            for ref in (n.caller, n.predecessor):
                assert ref is None or ref == "ROOT" or ref in seen
            if n.role in ("user", "llm") and n.caller is None:
                assert n.predecessor is not None or n.name == SUMMARY_NAME
            if n.role == "code" and n.metadata.get("toolCallId") is not None:
                assert nodes[n.caller].role == "llm"
            for c in n.metadata.get("covers_ids", ()):
                assert c in seen and nodes[c].role in ("user", "llm")
            seen.add(n.id)
        assert t.counts["nodes"] == len(t.nodes)
        assert t.head is None or t.head in seen


@needs_corpus
@pytest.mark.parametrize("rel", ALL_FILES)
def test_parsing_is_deterministic(rel: str) -> None:
    again = parse_file(CORPUS / rel)
    assert again == list(parsed(rel))


# --------------------------------------------------------------------------- Claude Code

# Counts cross-checked by hand, e.g. for general-tool-calls.jsonl:
#   user nodes  = user lines with non-tool_result content: 6 string + 20 + 3 block lines = 29
#   llm nodes   = distinct message.id per copy of the replayed history: 49 (lines 5–353) + 56 = 105
#   tool calls  = 110 tool_use blocks (65 distinct ids, 45 repeated by the replay); results 109
CC_EXPECTED = {
    SUBAGENT_SESSION: dict(
        messages=71,  # 49 in the main file (= SOURCES.md) + 22 in the 5 subagent files
        nodes=55, userTurns=22, llmCalls=21, toolCalls=12, toolPairs=12,
        compactions=0, spawnBranches=5, skipped=0, errors=1, progress=11,
    ),
    COMPACT_SESSION: dict(
        messages=657, nodes=466, userTurns=6, llmCalls=217, toolCalls=242, toolPairs=242,
        compactions=1, spawnBranches=0, skipped=0, errors=12, progress=1683,
    ),
    GENERAL: dict(
        messages=404, nodes=244, userTurns=29, llmCalls=105, toolCalls=110, toolPairs=109,
        compactions=0, spawnBranches=0, skipped=2, errors=7, progress=124,
    ),
    SHORT: dict(
        messages=9, nodes=5, userTurns=2, llmCalls=1, toolCalls=2, toolPairs=2,
        compactions=0, spawnBranches=0, skipped=0, errors=2, progress=1,
    ),
}


@needs_corpus
@pytest.mark.parametrize("rel", list(CC_EXPECTED))
def test_claude_code_counts(rel: str) -> None:
    t = one(rel)
    exp = dict(CC_EXPECTED[rel])
    errors = exp.pop("errors")
    progress = exp.pop("progress")
    assert {k: t.counts[k] for k in exp} == exp
    code = [n for n in t.nodes if n.role == "code"]
    assert sum(1 for n in code if n.status == "error") == errors  # tool_result is_error: true
    assert sum(n.metadata.get("progress", 0) for n in code) == progress  # progress lines naming a tool_use
    assert not any(n.role == "user" and n.metadata.get("progress") for n in t.nodes)


@needs_corpus
def test_claude_code_session_keys_titles_and_heads() -> None:
    assert [(one(r).source_key, one(r).head) for r in CC_EXPECTED] == [
        ("0ccf1a04-1b4c-43b6-8aa5-79e41db43a68", "6e5967cf-fb82-40bc-b935-d38d70667332"),
        ("ae4a77f8-aedd-4bc1-888f-c94edc91af04", "b560b6d4-d3d0-4db0-928f-3c61c592f729"),
        ("88f04c6a-d128-40bf-96b3-6b2aa787f62c", "066165ee-5b0d-46fc-a91f-84d6792af91c"),
        ("55604662-cf2a-4331-851a-ec234028f8ca", "c06a9fe4-ba05-44f2-b619-a057c18101e5"),
    ]
    # `summary` lines title the session by the leaf on the head's chain.
    assert one(SUBAGENT_SESSION).title == "Spawn curry poem agents, write sushi"
    assert one(GENERAL).title == "Claude Code Session Share Plugin Development"
    assert one(SHORT).title == "mix phx.server doesnt seem to start"


@needs_corpus
def test_claude_code_comment_lines_are_reported_not_raised() -> None:
    t = one(GENERAL)
    assert [s.line for s in t.skipped] == [1, 2]
    assert all(isinstance(s, Skipped) and s.reason.startswith("not JSON: '//") for s in t.skipped)


@needs_corpus
def test_claude_code_call_without_result_is_cancelled() -> None:
    t = one(GENERAL)
    missing = [n for n in t.nodes if n.metadata.get("noResult")]
    assert [n.id for n in missing] == ["toolu_016AxdxfjYf6j77zeLDN8qwe"]
    assert missing[0].status == "cancelled" and missing[0].output is None
    assert missing[0].metadata["toolCallId"] == "toolu_016AxdxfjYf6j77zeLDN8qwe"
    assert t.head == missing[0].caller  # the session ends on that call


@needs_corpus
def test_claude_code_replayed_history_is_a_second_root_branch() -> None:
    t = one(GENERAL)
    roots = [n for n in t.nodes if n.predecessor == "ROOT"]
    assert [n.id for n in roots] == ["e436bad9-1f54-43b0-9129-d138fa40ba2b", "2ea23128-fe7b-40f3-b20c-d8818da764b9"]
    # tool_use ids reused by the replay get a #2 suffix; results pair with the right copy
    suffixed = [n for n in t.nodes if n.role == "code" and n.id.endswith("#2")]
    assert len(suffixed) == 45
    for n in suffixed:
        first = by_id(t)[n.id[:-2]]
        assert n.metadata["toolCallId"] == first.metadata["toolCallId"]
        assert n.caller != first.caller


@needs_corpus
def test_claude_code_message_id_lines_merge_into_one_llm_node() -> None:
    t = one(SHORT)
    [llm] = [n for n in t.nodes if n.role == "llm"]
    # five assistant lines share message.id: one node, id = the first line's uuid
    assert (llm.id, llm.metadata["messageId"]) == ("1b7d717f-d6a2-46a6-8575-fa4f937450ea", "msg_01MKH1ccEGrZGNPvu8pYiiQa")
    assert llm.name == "claude-opus-4-6"
    assert llm.output == "Let me check the project structure and try running the server to see the error."
    assert llm.metadata["thinking"].startswith("The user is having trouble starting their Phoenix server.")
    assert t.usage == {llm.id: Usage(input=3, output=13, cache_read=11515, cache_write=13835)}
    calls = [n for n in t.nodes if n.role == "code"]
    assert [(c.name, c.caller, c.status) for c in calls] == [("Bash", llm.id, "error"), ("Glob", llm.id, "error")]
    assert calls[0].input == {"command": "mix phx.server 2>&1 | head -80", "timeout": 30000}


@needs_corpus
def test_claude_code_compaction() -> None:
    t = one(COMPACT_SESSION)
    nodes = by_id(t)
    [s] = [n for n in t.nodes if n.name == SUMMARY_NAME]
    assert s.id == "94000b8f-fa9f-4b7b-8d81-cdc73aa8a085"  # the isCompactSummary line
    assert s.role == "llm" and s.predecessor == "ROOT" and s.caller is None
    assert s.output.startswith("This session is being continued from a previous conversation")
    md = s.metadata
    assert md["compaction"] is True
    assert (md["trigger"], md["preTokens"], md["boundaryUuid"]) == ("manual", 142431, "434dc859-6299-4713-8613-d28662692f06")
    covers = md["covers_ids"]
    assert len(covers) == 140
    assert covers[0] == "858a6db7-6721-4caa-b306-39ec1f17cbf1"  # first user message
    assert covers[-1] == "1d698e31-9e57-4b0c-b787-727e7bcea2f9"  # last reply before /compact
    assert covers == chain(t, covers[-1])  # the whole pre-boundary chain, in order
    # the conversation after the boundary continues from the last covered node
    after = [n for n in t.nodes if n.predecessor == covers[-1]]
    assert [n.id for n in after] == ["bc8137ed-4f00-41c3-824d-3e220d6d5def"]
    head_chain = chain(t, t.head)
    assert head_chain[: len(covers)] == covers and len(head_chain) == 223
    assert nodes[s.id].id not in head_chain  # the summary sits beside the chain


@needs_corpus
def test_claude_code_subagents_are_spawn_branches_of_their_task_calls() -> None:
    t = one(SUBAGENT_SESSION)
    nodes = by_id(t)
    roots = [n for n in t.nodes if n.metadata.get("spawn_branch_root")]
    got = {n.metadata["agentId"]: (n.caller, n.metadata["spawnMatch"]) for n in roots}
    assert got == {
        "a9cad17": ("toolu_014qfHW38puz7Wk8PgqC45nY", "agentId"),
        "aa5ef13": ("toolu_01EeTxsNZzn4MFsxuRo7BYcK", "agentId"),
        "ac27727": ("toolu_018pmVb1JqzfoGPF4pfSuB4J", "agentId"),
        "afbbf75": ("toolu_01GWWdppestRqCj3fkznnGwf", "agentId"),
        "a5bdbc1": ("toolu_011472X3mPpLSX8BmtHebyH4", "agentId"),
    }
    for r in roots:
        call = nodes[r.caller]
        assert r.role == "user" and r.predecessor is None
        assert r.metadata["source"] == "subagent"
        assert call.role == "code" and call.name == "Task"
        assert call.input["prompt"] == r.output  # the subagent's first message is the Task prompt
        assert call.metadata["spawnBranchRoots"] == [r.id]
        branch = [n for n in t.nodes if chain(t, n.id)[:1] == [r.id]]
        assert len(branch) == 3  # prompt + two replies (the WebSearch call hangs off the first by caller)
    # spawn branches never provide the head
    assert chain(t, t.head)[0] == "b048274d-efd6-4153-b01f-3aa6f2fbc623"


@needs_corpus
def test_claude_code_fork_keeps_both_children() -> None:
    t = one(SUBAGENT_SESSION)
    kids = [n.id for n in t.nodes if n.predecessor == "b4fea3e7-b432-4334-9503-e7638309ace3"]
    assert kids == ["b17705eb-0b03-4d11-9999-6a1150926c56", "03a754e3-8604-4a5a-a094-4db5e24b577f"]
    # head: the tip whose last message is newest (21:21:28 vs 21:21:27 for the other tip)
    assert t.head == "6e5967cf-fb82-40bc-b935-d38d70667332"


# --------------------------------------------------------------------------- Codex


@needs_corpus
def test_codex_rollout() -> None:
    t = one(CODEX)
    assert t.source_key == "019e1695-0522-7c83-8b39-0dd379793f80"
    assert t.title.startswith("analyze trascript and summarzie action items")
    c = t.counts
    assert (c["toolCalls"], c["toolPairs"], c["userTurns"], c["llmCalls"], c["systemPrompts"], c["nodes"], c["messages"]) == (
        38, 38, 3, 20, 1, 62, 6,
    )
    llms = [n for n in t.nodes if n.role == "llm" and n.name != SYSTEM_PROMPT_NAME]
    assert sum(n.metadata.get("reasoningItems", 0) for n in llms) == 16  # = SOURCES.md
    assert sum(n.metadata.get("reasoningEncrypted", 0) for n in llms) == 16
    assert [n.id for n in llms if n.output][:2] == ["codex-29", "codex-32"]
    calls = [n for n in t.nodes if n.role == "code"]
    assert Counter(n.name for n in calls) == Counter({"exec_command": 35, "js": 3})
    assert all(n.metadata.get("namespace") == "mcp__node_repl__" for n in calls if n.name == "js")
    assert all(n.id == n.metadata["toolCallId"] and n.status == "completed" for n in calls)
    # three user turns come from event_msg (this trimmed rollout has no user response_items)
    assert [n.id for n in t.nodes if n.role == "user"] == ["codex-2", "codex-31", "codex-33"]
    assert t.head == "codex-98"
    assert chain(t, t.head)[0] == "codex-2"


CODEX_FIXTURE = [
    {"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta", "payload": {"id": "sess-1", "cwd": "/w", "base_instructions": {"text": "You are Codex."}}},
    {"timestamp": "2026-01-01T00:00:01Z", "type": "response_item", "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n<cwd>/w</cwd>\n</environment_context>"}]}},
    {"timestamp": "2026-01-01T00:00:01Z", "type": "turn_context", "payload": {"model": "gpt-5-codex", "cwd": "/w"}},
    {"timestamp": "2026-01-01T00:00:02Z", "type": "response_item", "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}},
    {"timestamp": "2026-01-01T00:00:02Z", "type": "event_msg", "payload": {"type": "user_message", "message": "list files"}},
    {"timestamp": "2026-01-01T00:00:03Z", "type": "response_item", "payload": {"type": "reasoning", "summary": [{"type": "summary_text", "text": "**Listing**"}], "content": None}},
    {"timestamp": "2026-01-01T00:00:03Z", "type": "response_item", "payload": {"type": "local_shell_call", "call_id": "c1", "status": "completed", "action": {"type": "exec", "command": ["ls"]}}},
    {"timestamp": "2026-01-01T00:00:03Z", "type": "response_item", "payload": {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"}},
    {"timestamp": "2026-01-01T00:00:03Z", "type": "response_item", "payload": {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "x"}}},
    {"timestamp": "2026-01-01T00:00:04Z", "type": "event_msg", "payload": {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 100, "cached_input_tokens": 60, "output_tokens": 7, "reasoning_output_tokens": 3}}}},
    {"timestamp": "2026-01-01T00:00:04Z", "type": "event_msg", "payload": {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 100, "cached_input_tokens": 60, "output_tokens": 7}}}},
    {"timestamp": "2026-01-01T00:00:05Z", "type": "response_item", "payload": {"type": "function_call_output", "call_id": "c1", "output": "a\nb"}},
    {"timestamp": "2026-01-01T00:00:05Z", "type": "response_item", "payload": {"type": "custom_tool_call_output", "call_id": "c2", "output": {"content": "failed", "success": False}}},
    {"timestamp": "2026-01-01T00:00:06Z", "type": "response_item", "payload": {"type": "function_call", "name": "shell", "arguments": "{\"command\": [\"cat\", \"a\"]}", "call_id": "c3"}},
    {"timestamp": "2026-01-01T00:00:07Z", "type": "compacted", "payload": {"message": "Listed files; patch failed."}},
    {"timestamp": "2026-01-01T00:00:08Z", "type": "response_item", "payload": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}},
]


def _write_jsonl(path: Path, rows: list, extra_lines: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(extra_lines) + "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_codex_fixture(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "rollout-x.jsonl", CODEX_FIXTURE, ("// not json\n",))
    assert detect_format(f) == "codex"
    [t] = parse_file(f)
    assert check_transcript(t) == []
    assert t.source_key == "sess-1" and t.title == "list files"
    assert t.skipped == [Skipped(1, "not JSON: '// not json'")]
    nodes = by_id(t)
    env, user = (n for n in t.nodes if n.role == "user")
    assert env.metadata["injected"] is True and "injected" not in user.metadata  # event duplicate not used
    assert env.predecessor == "ROOT" and user.predecessor == env.id
    llm1 = nodes["codex-7"]  # reasoning (line 7) opens the response
    assert llm1.name == "gpt-5-codex" and llm1.metadata["thinking"] == "**Listing**"
    assert t.usage[llm1.id] == Usage(input=40, output=7, cache_read=60, cache_write=0)  # the duplicate token_count is ignored
    assert (nodes["c1"].name, nodes["c1"].input, nodes["c1"].output, nodes["c1"].status) == ("local_shell", {"type": "exec", "command": ["ls"]}, "a\nb", "completed")
    assert (nodes["c2"].input, nodes["c2"].status, nodes["c2"].output) == ({"input": "*** Begin Patch"}, "error", "failed")
    [web] = [n for n in t.nodes if n.name == "web_search"]
    assert web.metadata["hostedTool"] is True and "toolCallId" not in web.metadata and web.caller == llm1.id
    llm2 = nodes["codex-15"]
    assert llm2.predecessor == llm1.id and nodes["c3"].status == "cancelled" and nodes["c3"].metadata["noResult"] is True
    [s] = [n for n in t.nodes if n.name == SUMMARY_NAME]
    assert s.metadata["covers_ids"] == [env.id, user.id, llm1.id, llm2.id] and s.predecessor == "ROOT"
    final = nodes["codex-17"]
    assert final.predecessor == llm2.id and final.output == "Done." and t.head == final.id
    assert t.counts["toolCalls"] == 4 and t.counts["toolPairs"] == 2 and t.counts["systemPrompts"] == 1


# --------------------------------------------------------------------------- SWE-agent, OpenHands


@needs_corpus
def test_swe_agent_trajectory() -> None:
    t = one(SWE)
    c = t.counts
    assert (c["messages"], c["toolCalls"], c["toolPairs"], c["llmCalls"], c["userTurns"], c["systemPrompts"], c["nodes"]) == (
        28, 13, 13, 13, 1, 1, 28,
    )
    assert t.title == "marshmallow-code__marshmallow-1867" and t.source_key.startswith("sha256:")
    assert t.head == "swe-26"
    assert {n.name for n in t.nodes if n.role == "llm" and n.name != SYSTEM_PROMPT_NAME} == {"replay"}
    # the demonstration reuses one call id for four different calls; each keeps its own result
    reused = [n for n in t.nodes if n.metadata.get("toolCallId") == "call_5iDdbOYybq7L19vqXmR0DPaU"]
    assert [n.id for n in reused] == ["swe-12.0", "swe-14.0", "swe-22.0", "swe-24.0"]
    assert [n.output.split("\n")[0] for n in reused] == [
        "344", "AUTHORS.rst\t    LICENSE\t RELEASING.md\t      performance/    setup.py\r",
        "345", "Your command ran successfully and did not produce any output.",
    ]
    assert by_id(t)["swe-26.0"].name == "submit"


@needs_corpus
def test_openhands_events() -> None:
    t = one(OPENHANDS)
    c = t.counts
    assert (c["messages"], c["userTurns"], c["llmCalls"], c["toolCalls"], c["toolPairs"], c["nodes"]) == (18, 1, 5, 4, 4, 10)
    nodes = by_id(t)
    assert [n.name for n in t.nodes if n.role == "code"] == ["execute_bash", "str_replace_editor", "str_replace_editor", "execute_bash"]
    server = nodes["oh-13"]
    assert server.status == "error" and server.metadata["exitCode"] == -1  # `success: false`
    assert server.output.startswith("Serving HTTP on 0.0.0.0 port 8000")
    assert nodes["oh-9"].input["command"] == "create"  # arguments come from the model response
    assert set(t.usage) == {"oh-7-llm", "oh-9-llm", "oh-11-llm", "oh-13-llm"}
    assert t.usage["oh-7-llm"] == Usage(input=4, output=104, cache_read=0, cache_write=3435)
    assert t.head == "oh-15" and nodes["oh-15"].name == "claude-3-5-sonnet-20241022"
    assert chain(t, t.head) == ["oh-4", "oh-7-llm", "oh-9-llm", "oh-11-llm", "oh-13-llm", "oh-15"]


@needs_corpus
def test_openhands_reasoning_text_is_kept_as_a_reasoning_block(tmp_path: Path) -> None:
    """SPEC §4: a model response's ``reasoning_content`` is the llm node's reasoning."""
    events = json.loads((CORPUS / OPENHANDS).read_text())
    hit = 0
    for ev in events:
        resp = (ev.get("tool_call_metadata") or {}).get("model_response") if isinstance(ev, dict) else None
        if isinstance(resp, dict) and resp.get("id") and not hit:
            resp["choices"][0]["message"]["reasoning_content"] = "The server must be started first."
            hit = 1
    assert hit
    path = tmp_path / "oh.json"
    path.write_text(json.dumps(events))
    (t,) = tuple(parse_file(path))
    kept = [n.metadata["reasoning"] for n in t.nodes if n.metadata.get("reasoning")]
    assert kept == [[{"type": "reasoning", "text": "The server must be started first."}]]


# --------------------------------------------------------------------------- ShareGPT


@needs_corpus
def test_sharegpt_glaive_tool_calls() -> None:
    ts = parsed(GLAIVE)
    assert len(ts) == 300
    total = Counter()
    for t in ts:
        total.update(t.counts)
    assert total["toolCalls"] == 216 and total["toolPairs"] == 216
    assert total["messages"] == 1880  # 722 human + 724 gpt + 216 function_call + 218 observation
    assert total["nodes"] == 1878  # every turn but the 2 observations that follow no call
    assert total["llmCalls"] == 724 + 216 and total["userTurns"] == 722
    bad = [(i + 1, t.skipped) for i, t in enumerate(ts) if t.skipped]
    assert bad == [
        (198, [Skipped(198, "turn 2: observation without a preceding function_call")]),
        (294, [Skipped(294, "turn 2: observation without a preceding function_call")]),
    ]
    assert len({t.source_key for t in ts}) == 300
    first = ts[0]
    call = by_id(first)["sg1-1-call"]
    assert call.name == "generate_invoice" and call.caller == "sg1-1" and call.input["customer_name"] == "约翰·多伊"
    assert call.output.startswith('{"invoice_id": "INV12345"')
    assert first.nodes[0].metadata["tools"][0]["name"] == "generate_invoice"


@needs_corpus
def test_sharegpt_longest_conversation() -> None:
    t = one(LONGEST)
    c = t.counts
    assert (c["messages"], c["nodes"], c["userTurns"], c["llmCalls"], c["toolCalls"]) == (330, 330, 165, 165, 0)
    assert t.head == "sg1-329" and len(chain(t, t.head)) == 330
    assert t.title.startswith("你将扮演一款基于文本的冒险游戏")


# --------------------------------------------------------------------------- folders


@needs_corpus
def test_parse_path_folds_subagents(tmp_path: Path) -> None:
    errors: list = []
    ts = parse_path(CORPUS, errors=errors)
    assert errors == []
    assert Counter(t.format for t in ts) == Counter({"claude-code": 4, "codex": 1, "swe-agent": 1, "openhands": 1, "sharegpt": 301})
    assert not any(t.source_key.startswith("agent-") for t in ts)
    cc = parse_path(CORPUS / "claude-code")
    assert [t.source_key for t in cc] == [one(r).source_key for r in CC_EXPECTED]


# --------------------------------------------------------------------------- OpenClaw (no public sample)

OPENCLAW_FIXTURE = [
    {"type": "session", "version": 3, "id": "oc-session-1", "timestamp": "2026-01-05T10:00:00.000Z", "cwd": "/home/u/proj"},
    {"type": "session_info", "id": "e0", "parentId": None, "timestamp": "2026-01-05T10:00:00.500Z", "name": "Fix the flaky test"},
    {"type": "message", "id": "u1", "parentId": "e0", "timestamp": "2026-01-05T10:00:01.000Z", "message": {"role": "user", "content": [
        {"type": "text", "text": "Why does test_io fail?"},
        {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="},
    ]}},
    {"type": "message", "id": "a1", "parentId": "u1", "timestamp": "2026-01-05T10:00:02.000Z", "message": {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Look at the test first."},
        {"type": "text", "text": "Let me look."},
        {"type": "toolCall", "id": "tc1", "name": "read", "arguments": {"path": "tests/test_io.py"}},
        {"type": "toolCall", "id": "tc2", "name": "bash", "arguments": {"command": "pytest -x"}},
    ], "provider": "anthropic", "model": "claude-sonnet-4-5", "usage": {"input": 120, "output": 40, "cacheRead": 1000, "cacheWrite": 50, "totalTokens": 1210}, "stopReason": "toolUse"}},
    {"type": "message", "id": "r1", "parentId": "a1", "timestamp": "2026-01-05T10:00:03.000Z", "message": {"role": "toolResult", "toolCallId": "tc1", "toolName": "read", "content": [{"type": "text", "text": "def test_io(): ..."}], "isError": False}},
    {"type": "message", "id": "r2", "parentId": "r1", "timestamp": "2026-01-05T10:00:04.000Z", "message": {"role": "toolResult", "toolCallId": "tc2", "toolName": "bash", "content": [{"type": "text", "text": "1 failed"}], "isError": True}},
    {"type": "message", "id": "a2", "parentId": "r2", "timestamp": "2026-01-05T10:00:05.000Z", "message": {"role": "assistant", "content": [{"type": "text", "text": "The test races on a temp file."}], "model": "claude-sonnet-4-5", "stopReason": "stop"}},
    {"type": "message", "id": "u2", "parentId": "a2", "timestamp": "2026-01-05T10:00:06.000Z", "message": {"role": "user", "content": "Fix it."}},
    {"type": "model_change", "id": "m1", "parentId": "u2", "timestamp": "2026-01-05T10:00:06.500Z", "provider": "openai", "modelId": "gpt-5"},
    {"type": "message", "id": "a3", "parentId": "m1", "timestamp": "2026-01-05T10:00:07.000Z", "message": {"role": "assistant", "content": [{"type": "toolCall", "id": "tc3", "name": "edit", "arguments": {"path": "tests/test_io.py"}}], "stopReason": "aborted"}},
    {"type": "compaction", "id": "c1", "parentId": "a3", "timestamp": "2026-01-05T10:00:08.000Z", "summary": "User asked why test_io fails; it races on a temp file.", "firstKeptEntryId": "u2", "tokensBefore": 5000},
    {"type": "message", "id": "u3", "parentId": "c1", "timestamp": "2026-01-05T10:00:09.000Z", "message": {"role": "user", "content": "Try again."}},
    {"type": "message", "id": "b1", "parentId": "u3", "timestamp": "2026-01-05T10:00:09.500Z", "message": {"role": "bashExecution", "command": "git status", "output": "clean", "exitCode": 0, "cancelled": False, "truncated": False}},
    {"type": "message", "id": "a4", "parentId": "b1", "timestamp": "2026-01-05T10:00:10.000Z", "message": {"role": "assistant", "content": [{"type": "text", "text": "Done."}], "model": "gpt-5", "usage": {"input": 10, "output": 2, "cacheRead": 0, "cacheWrite": 0}, "stopReason": "stop"}},
    {"type": "branch_summary", "id": "s1", "parentId": "a2", "timestamp": "2026-01-05T10:00:11.000Z", "fromId": "a4", "summary": "Tried an edit on another branch; it was aborted."},
    {"type": "custom_message", "id": "x1", "parentId": "s1", "timestamp": "2026-01-05T10:00:11.500Z", "customType": "memory", "content": "Remember: prefer tmp_path.", "display": False},
    {"type": "message", "id": "u4", "parentId": "x1", "timestamp": "2026-01-05T10:00:12.000Z", "message": {"role": "user", "content": "Use tmp_path instead."}},
    {"type": "message", "id": "a5", "parentId": "u4", "timestamp": "2026-01-05T10:00:13.000Z", "message": {"role": "assistant", "content": [{"type": "text", "text": "Switched to tmp_path."}], "model": "gpt-5", "stopReason": "stop"}},
    {"type": "message", "id": "r9", "parentId": "a5", "timestamp": "2026-01-05T10:00:14.000Z", "message": {"role": "toolResult", "toolCallId": "nope", "toolName": "bash", "content": [{"type": "text", "text": "?"}], "isError": False}},
]


def _openclaw(tmp_path: Path, rows: list = OPENCLAW_FIXTURE) -> Transcript:
    header, *rest = rows
    f = tmp_path / "oc-session-1.jsonl"
    f.write_text(json.dumps(header) + "\n// a comment\n" + "".join(json.dumps(r) + "\n" for r in rest), encoding="utf-8")
    assert detect_format(f) == "openclaw"
    [t] = parse_file(f)
    assert check_transcript(t) == []
    return t


def test_openclaw_tree(tmp_path: Path) -> None:
    t = _openclaw(tmp_path)
    nodes = by_id(t)
    assert (t.format, t.source_key, t.title) == ("openclaw", "oc-session-1", "Fix the flaky test")
    assert t.skipped == [Skipped(2, "not JSON: '// a comment'"), Skipped(20, "toolResult for unknown toolCallId 'nope'")]
    c = t.counts
    assert (c["messages"], c["nodes"], c["userTurns"], c["llmCalls"], c["toolCalls"], c["toolPairs"], c["compactions"], c["orphanResults"]) == (
        13, 16, 6, 5, 3, 2, 1, 1,
    )
    # the session_info entry is not a node: u1 starts the chain
    assert nodes["u1"].predecessor == "ROOT"
    a1 = nodes["a1"]
    assert (a1.name, a1.output, a1.metadata["thinking"]) == ("claude-sonnet-4-5", "Let me look.", "Look at the test first.")
    assert t.usage["a1"] == Usage(input=120, output=40, cache_read=1000, cache_write=50)
    assert [(n.id, n.caller, n.status, n.output) for n in t.nodes if n.caller == "a1"] == [
        ("tc1", "a1", "completed", "def test_io(): ..."), ("tc2", "a1", "error", "1 failed"),
    ]
    assert nodes["a2"].predecessor == "a1"  # tool results are not turns: the loop chains llm → llm
    assert nodes["a3"].predecessor == "u2" and nodes["a3"].name == "gpt-5" and nodes["a3"].status == "cancelled"
    assert nodes["tc3"].status == "cancelled" and nodes["tc3"].metadata["noResult"] is True


def test_openclaw_compaction_keeps_the_tail(tmp_path: Path) -> None:
    t = _openclaw(tmp_path)
    nodes = by_id(t)
    s = nodes["c1"]
    assert (s.role, s.name, s.predecessor) == ("llm", SUMMARY_NAME, "ROOT")
    assert s.metadata["covers_ids"] == ["u1", "a1", "a2"]  # everything before firstKeptEntryId u2
    assert s.metadata["tokensBefore"] == 5000
    assert nodes["u3"].predecessor == "a3"  # the entry after the compaction continues the chain
    assert chain(t, "a4") == ["u1", "a1", "a2", "u2", "a3", "u3", "b1", "a4"]
    bash = nodes["b1"]  # a command the user ran is a top-level code node on the chain
    assert (bash.role, bash.caller, bash.predecessor, bash.input, bash.output) == ("code", None, "u3", {"command": "git status"}, "clean")


def test_openclaw_branch_summary_images_and_head(tmp_path: Path) -> None:
    t = _openclaw(tmp_path)
    nodes = by_id(t)
    s1 = nodes["s1"]
    assert (s1.role, s1.predecessor) == ("user", "a2")
    assert s1.metadata == {"timestamp": s1.metadata["timestamp"], "injected": True, "branchSummary": True, "fromId": "a4"}
    assert nodes["x1"].metadata["customType"] == "memory" and nodes["x1"].predecessor == "s1"
    assert [n.id for n in t.nodes if n.predecessor == "a2"] == ["u2", "s1"]  # a fork at a2
    assert t.head == "a5"  # newest tip wins over a4
    img = nodes["u1"].output[1]
    assert img["type"] == "image" and img["mediaType"] == "image/png" and img["data"] == "<omitted>"
    assert img["bytes"] == 70 and len(img["sha256"]) == 64


def test_openclaw_v1_entries_without_ids(tmp_path: Path) -> None:
    f = tmp_path / "old.jsonl"
    rows = [
        {"type": "session", "id": "old", "timestamp": "2025-01-01T00:00:00Z", "cwd": "/"},
        {"type": "message", "timestamp": "2025-01-01T00:00:01Z", "message": {"role": "user", "content": "hi"}},
        {"type": "message", "timestamp": "2025-01-01T00:00:02Z", "message": {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}},
    ]
    _write_jsonl(f, rows)
    [t] = parse_file(f, format="openclaw")
    assert [(n.id, n.predecessor) for n in t.nodes] == [("line2", "ROOT"), ("line3", "line2")]
    assert t.head == "line3" and check_transcript(t) == []


# --------------------------------------------------------------------------- Claude Code edge cases (synthetic)


def _cc(uuid: str, parent: str | None, typ: str, content, ts: str, **extra) -> dict:
    row = {"parentUuid": parent, "isSidechain": False, "sessionId": "s-legacy", "type": typ, "uuid": uuid, "timestamp": ts}
    if typ == "assistant":
        row["message"] = {"id": extra.pop("mid"), "model": "claude-x", "role": "assistant", "content": content}
    else:
        row["message"] = {"role": "user", "content": content}
    row.update(extra)
    return row


def test_claude_code_legacy_sidechain_images_and_orphans(tmp_path: Path) -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    rows = [
        _cc("u1", None, "user", [{"type": "text", "text": "look at this"}, image], "2026-01-01T00:00:00Z"),
        _cc("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Task", "input": {"prompt": "Find the bug", "description": "d"}}], "2026-01-01T00:00:01Z", mid="m1"),
        # legacy: the subagent's lines live in the main file as a sidechain with its own root
        _cc("s1", None, "user", "Find the bug", "2026-01-01T00:00:02Z", isSidechain=True),
        _cc("s2", "s1", "assistant", [{"type": "text", "text": "Found it."}], "2026-01-01T00:00:03Z", isSidechain=True, mid="m2"),
        _cc("r1", "a1", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "bug found"}, image]}], "2026-01-01T00:00:04Z"),
        _cc("r2", "r1", "user", [{"type": "tool_result", "tool_use_id": "nope", "content": "?"}], "2026-01-01T00:00:05Z"),
        {"parentUuid": None, "logicalParentUuid": "r1", "type": "system", "subtype": "compact_boundary", "uuid": "b1", "sessionId": "s-legacy",
         "timestamp": "2026-01-01T00:00:06Z", "content": "Conversation compacted", "compactMetadata": {"trigger": "auto", "preTokens": 9}},
        _cc("u2", "b1", "user", "continue", "2026-01-01T00:00:07Z"),
    ]
    f = _write_jsonl(tmp_path / "s-legacy.jsonl", rows)
    [t] = parse_file(f)
    assert check_transcript(t) == []
    nodes = by_id(t)
    assert nodes["u1"].output[1] == {"type": "image", "mediaType": "image/png", "data": "<omitted>", "bytes": 70, "sha256": nodes["u1"].output[1]["sha256"]}
    assert nodes["t1"].output[0] == {"type": "text", "text": "bug found"} and nodes["t1"].output[1]["data"] == "<omitted>"
    s1 = nodes["s1"]
    assert (s1.predecessor, s1.caller, s1.metadata["spawnMatch"], s1.metadata["spawn_branch_root"]) == (None, "t1", "prompt", True)
    assert nodes["s2"].predecessor == "s1"
    assert t.skipped == [Skipped(6, "tool_result for unknown tool_use 'nope'")] and t.counts["orphanResults"] == 1
    # a boundary without its summary line still yields a summary; the chain continues
    [s] = [n for n in t.nodes if n.name == SUMMARY_NAME]
    assert s.metadata["summaryMissing"] is True and s.metadata["covers_ids"] == ["u1", "a1"]
    assert nodes["u2"].predecessor == "a1" and t.head == "u2"
    assert t.counts["spawnBranches"] == 1


def test_claude_code_subagent_file_matched_by_agent_id(tmp_path: Path) -> None:
    main = tmp_path / "sess.jsonl"
    rows = [
        _cc("u1", None, "user", "spawn two", "2026-01-01T00:00:00Z"),
        _cc("a1", "u1", "assistant", [{"type": "tool_use", "id": "t1", "name": "Task", "input": {"prompt": "same"}}], "2026-01-01T00:00:01Z", mid="m1"),
        _cc("a2", "a1", "assistant", [{"type": "tool_use", "id": "t2", "name": "Task", "input": {"prompt": "same"}}], "2026-01-01T00:00:01Z", mid="m1"),
        _cc("r1", "a1", "user", [{"type": "tool_result", "tool_use_id": "t1", "content": "launched"}], "2026-01-01T00:00:02Z", toolUseResult={"agentId": "bbb"}),
        _cc("r2", "a2", "user", [{"type": "tool_result", "tool_use_id": "t2", "content": "Async agent launched.\nagentId: aaa (internal)"}], "2026-01-01T00:00:02Z"),
    ]
    _write_jsonl(main, rows)
    sub = tmp_path / "sess" / "subagents"
    sub.mkdir(parents=True)
    for agent, ts in (("aaa", "03"), ("bbb", "04")):
        _write_jsonl(sub / f"agent-{agent}.jsonl", [
            _cc(f"{agent}-1", None, "user", "same", f"2026-01-01T00:00:{ts}Z", isSidechain=True, agentId=agent),
            _cc(f"{agent}-2", f"{agent}-1", "assistant", [{"type": "text", "text": agent}], f"2026-01-01T00:00:{ts}Z", isSidechain=True, agentId=agent, mid=f"m-{agent}"),
        ])
    [t] = parse_file(main)
    assert check_transcript(t) == []
    nodes = by_id(t)
    # identical prompts: only the agent id tells the two apart
    assert (nodes["aaa-1"].caller, nodes["bbb-1"].caller) == ("t2", "t1")
    assert {nodes["aaa-1"].metadata["spawnMatch"], nodes["bbb-1"].metadata["spawnMatch"]} == {"agentId"}
    assert t.head == "a1"  # spawned branches never provide the head
    assert [x.source_key for x in parse_path(tmp_path)] == ["s-legacy"]  # agent files are folded, not returned
    # read on its own, a subagent file is an ordinary session with a key of its own
    [alone] = parse_file(sub / "agent-aaa.jsonl")
    assert alone.source_key == "s-legacy:agent-aaa" and check_transcript(alone) == []
    assert alone.nodes[0].predecessor == "ROOT" and alone.nodes[0].metadata["spawnUnmatched"] is True


# --------------------------------------------------------------------------- ShareGPT variants, folders, odd input


def test_sharegpt_json_array_with_roles_system_and_parallel_calls(tmp_path: Path) -> None:
    convs = [
        {
            "system": "Be terse.",
            "tools": [{"name": "add"}],
            "messages": [
                {"role": "user", "content": "1+1 and 2+2?"},
                {"role": "function_call", "content": json.dumps([{"name": "add", "arguments": {"a": 1, "b": 1}}, {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}])},
                {"role": "observation", "content": "2"},
                {"role": "observation", "content": "4"},
                {"role": "assistant", "content": "2 and 4."},
                {"role": "function_call", "content": {"name": "add", "arguments": {"a": 0}}},
            ],
        },
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "narrator", "value": "?"}]},
    ]
    f = tmp_path / "data.json"
    f.write_text(json.dumps(convs), encoding="utf-8")
    assert detect_format(f) == "sharegpt"
    t1, t2 = parse_file(f)
    assert check_transcript(t1) == [] and check_transcript(t2) == []
    nodes = by_id(t1)
    assert nodes["sg1-system"].name == SYSTEM_PROMPT_NAME and t1.nodes[0].id == "sg1-system"
    assert [(n.id, n.output) for n in t1.nodes if n.role == "code"] == [("sg1-1-call0", "2"), ("sg1-1-call1", "4"), ("sg1-5-call", None)]
    assert nodes["sg1-1-call1"].input == {"a": 2, "b": 2}
    assert nodes["sg1-5-call"].status == "cancelled" and nodes["sg1-5-call"].metadata["noResult"] is True
    assert nodes["sg1-0"].metadata["tools"] == [{"name": "add"}]
    assert t1.head == "sg1-5" and chain(t1, "sg1-5") == ["sg1-0", "sg1-1", "sg1-4", "sg1-5"]
    assert t2.skipped == [Skipped(2, "turn 1: unknown speaker 'narrator'")]


def test_parse_path_reports_unknown_files(tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text('{"a": 1}', encoding="utf-8")
    (tmp_path / "chat.jsonl").write_text('\ufeff{"conversations": [{"from": "human", "value": "hi"}]}\n\nnot json\n[1]\n', encoding="utf-8")
    errors: list = []
    [t] = parse_path(tmp_path, errors=errors)
    assert [Path(p).name for p, _ in errors] == ["notes.json"]
    assert t.skipped == [Skipped(3, "not JSON: 'not json'"), Skipped(4, "not a JSON object (list)")]
    assert [n.output for n in t.nodes] == ["hi"] and t.head == "sg1-0"


@needs_corpus
@pytest.mark.parametrize("rel", ALL_FILES)
def test_keeping_tool_results_aside_changes_no_transcript(rel: str) -> None:
    """What ``session/import`` parses (tool results over a limit kept in a temporary file
    as they are read, SPEC §9 import) is, read back, what is parsed in memory."""
    assert parsed_aside(CORPUS / rel) == list(parsed(rel))


def parsed_aside(path: Path) -> list:
    """``path`` parsed with every tool result over 512 bytes kept aside, read back."""
    from dagctx.transcripts.base import loaded
    from dagctx.transcripts.builder import SPILL_OVER

    token = SPILL_OVER.set(512)
    try:
        aside = parse_file(path)
    finally:
        SPILL_OVER.reset(token)
    for t in aside:
        t.nodes = [loaded(n) for n in t.nodes]
    return aside


@needs_corpus
@pytest.mark.parametrize("rel", [SWE, OPENHANDS])
@pytest.mark.parametrize("chunk", [61, 1 << 20])
def test_a_json_document_streamed_parses_as_decoded_whole(rel: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The corpus's whole-JSON files (a SWE-agent trajectory, an OpenHands event list) read
    an element at a time (SPEC §9 import: ``jsonstream``, nothing decoded whole, a window of
    ``chunk`` bytes) parse into exactly what they parse into decoded in one piece, with and
    without the bodies kept aside. A window of 61 bytes cuts the two files 7,300 times (the
    fixtures' test reads every cut, at windows of 1 and 2 bytes); each wrong reading of a
    cut tried (a number or whitespace run cut by the window end) failed here at 61 bytes as
    at 7, where parsing took 4 times as long."""
    from dagctx.transcripts import jsonstream

    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 1 << 62)
        whole = parse_file(CORPUS / rel)
    assert whole == list(parsed(rel)) and whole[0].nodes
    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 0)
        m.setattr(jsonstream, "_CHUNK", chunk)
        assert parse_file(CORPUS / rel) == whole
        assert parsed_aside(CORPUS / rel) == whole


@needs_corpus
@pytest.mark.parametrize("rel", [GLAIVE, LONGEST])
def test_a_sharegpt_array_streamed_parses_as_decoded_whole(rel: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The corpus's ShareGPT conversations as one JSON array (written to a temporary file for
    this test) read a conversation and a turn at a time parse into what the array decoded
    whole parses into — each conversation keyed by the digest of its re-encoding."""
    from dagctx.transcripts import jsonstream

    lines = [ln for ln in (CORPUS / rel).read_text(encoding="utf-8").splitlines() if ln.strip()]
    arr = tmp_path / "array.json"
    arr.write_text("[\n" + ",\n".join(lines) + "\n]\n", encoding="utf-8")
    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 1 << 62)
        whole = parse_file(arr)
    assert len(whole) == len(parsed(rel))
    assert [[n.output for n in t.nodes] for t in whole] == [[n.output for n in t.nodes] for t in parsed(rel)]
    with monkeypatch.context() as m:
        m.setattr(jsonstream, "WHOLE_BELOW", 0)
        m.setattr(jsonstream, "_CHUNK", 4093)
        assert parse_file(arr) == whole
