"""session/import and session/export through a real daemon, on the real-agent corpus.

Counts are what the importers produce for the corpus files (see the corpus's
SOURCES.md); every number here is read back through the protocol.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.context.formats import check_pairs
from dagctx.transcripts import parse_path

from conftest import corpus_dir


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


CORPUS = corpus_dir()
pytestmark = pytest.mark.corpus

CC_SPAWN = "claude-code/0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl"
CC_COMPACT = "claude-code/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
CC_GENERAL = "claude-code/general-tool-calls.jsonl"
CC_SHORT = "claude-code/short.jsonl"
GLAIVE = "sharegpt-zh/glaive_toolcall_zh_demo.jsonl"
SHAREGPT = "sharegpt-zh/sharegpt_zh_longest_330_turns.jsonl"

# file → (sessions, nodes, tool pairs, compactions, spawn branches, skipped line numbers)
EXPECTED: dict[str, tuple[int, int, int, int, int, list[int]]] = {
    CC_SPAWN: (1, 55, 12, 0, 5, []),
    CC_COMPACT: (1, 466, 242, 1, 0, []),
    CC_GENERAL: (1, 244, 109, 0, 0, [1, 2]),
    CC_SHORT: (1, 5, 2, 0, 0, []),
    "codex/rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl": (1, 62, 38, 0, 0, []),
    "openhands/basic_gui_mode.json": (1, 10, 4, 0, 0, []),
    GLAIVE: (300, 1878, 216, 0, 0, [198, 294]),
    SHAREGPT: (1, 330, 0, 0, 0, []),
    "swe-agent/marshmallow-code__marshmallow-1867.traj": (1, 28, 13, 0, 0, []),
}


def corpus(rel: str) -> str:
    assert CORPUS is not None
    return str(CORPUS / rel)


async def import_all(client: DagctxClient) -> dict[str, Any]:
    return {rel: await client.import_path(corpus(rel)) for rel in EXPECTED}


async def test_every_corpus_file_imports_with_exact_counts_and_once_only(daemon: DagctxClient) -> None:
    results = await import_all(daemon)
    for rel, (n_sessions, nodes, pairs, compactions, spawns, skipped) in EXPECTED.items():
        res = results[rel]
        s = res.sessions
        got = (len(s), sum(x.nodes for x in s), sum(x.tool_pairs for x in s), sum(x.compactions for x in s),
               sum(x.spawn_branches for x in s), [k.line for k in res.skipped])
        assert got == (n_sessions, nodes, pairs, compactions, spawns, skipped), rel
        assert all(x.created for x in s), rel
        # the ledger holds exactly the imported nodes plus each session's ROOT
        if n_sessions == 1:
            info = await daemon.session_get(s[0].session_id)
            assert info.node_count == nodes + 1, rel
            assert info.metadata["importedFrom"] == rel.split("/")[0].replace("sharegpt-zh", "sharegpt")
    general = results[CC_GENERAL].skipped
    assert [k.reason.startswith("not JSON: '//") for k in general] == [True, True]
    total = (await daemon.session_list()).total
    assert total == sum(v[0] for v in EXPECTED.values()) == 308

    # importing the same files again, and the whole folder, adds nothing
    again = await import_all(daemon)
    for rel in EXPECTED:
        assert [x.session_id for x in again[rel].sessions] == [x.session_id for x in results[rel].sessions]
        assert not any(x.created for x in again[rel].sessions), rel
    folder = await daemon.import_path(str(CORPUS))
    # skipped lines name the file they are in, also when a whole folder is imported
    comments = [k for k in folder.skipped if k.line in (1, 2) and "not JSON" in k.reason]
    assert comments and all(k.file.endswith("general-tool-calls.jsonl") for k in comments)
    assert len(folder.sessions) == 308 and not any(x.created for x in folder.sessions)
    assert (await daemon.session_list()).total == total


async def test_every_imported_head_renders_pair_valid(daemon: DagctxClient) -> None:
    await import_all(daemon)
    sessions = (await daemon.session_list(limit=1000)).sessions
    assert len(sessions) == 308
    for s in sessions:
        for fmt in ("openai", "anthropic"):
            r = await daemon.render(s.session_id, format=fmt)
            assert r.messages, s.title
            assert check_pairs(r.messages, fmt) == [], (s.title, fmt)


async def test_claude_code_compaction_renders_its_summary(daemon: DagctxClient) -> None:
    sid = (await daemon.import_path(corpus(CC_COMPACT))).sessions[0].session_id
    r = await daemon.render(sid, format="anthropic")
    summary_id = r.manifest["summaryId"]
    assert summary_id
    summary = (await daemon.get_nodes(sid, [summary_id])).nodes[0]
    assert summary.name == "context/summary" and summary.metadata["trigger"] == "manual"
    covered = set(summary.metadata["covers_ids"])
    assert covered and set(r.manifest["coversIds"]) == covered
    assert summary_id in r.reads and not covered & set(r.reads)
    assert check_pairs(r.messages, "anthropic") == []
    text = json.dumps(r.messages, ensure_ascii=False)
    assert "[Previous conversation summary]" in text


async def test_subagents_become_spawn_branches(daemon: DagctxClient) -> None:
    sid = (await daemon.import_path(corpus(CC_SPAWN))).sessions[0].session_id
    br = await daemon.branches(sid)
    spawned = [b for b in br.branches if b.spawn]
    assert len(spawned) == 5
    roots = (await daemon.get_nodes(sid, [b.root for b in spawned])).nodes  # type: ignore[misc]
    callers = (await daemon.get_nodes(sid, [n.caller for n in roots])).nodes  # type: ignore[misc]
    assert {c.name for c in callers} == {"Task"}
    assert all(n.metadata["agentId"] and n.predecessor is None for n in roots)
    # a spawn branch never moves the parent's HEAD
    assert not any(b.current for b in spawned)


async def test_search_finds_chinese_words_in_imported_sharegpt(daemon: DagctxClient) -> None:
    imported = set()
    for rel in (GLAIVE, SHAREGPT):
        imported |= {s.session_id for s in (await daemon.import_path(corpus(rel))).sessions}
    for word in ("发票", "苹果"):
        hits = (await daemon.search(word, limit=10)).hits
        assert hits, word
        assert all(h.session_id in imported for h in hits)
        assert all(word in h.snippet for h in hits), word


# ---------------------------------------------------------------- export


def _exported_ids(path: str) -> set[str]:
    """The node ids the importer gives a file (used to pick what to compare)."""
    return {n.id for n in parse_path(path)[0].nodes}


def _branch_of_head(path: str) -> set[str]:
    """The oracle: nodes an export of HEAD must carry, from the importer's view of the
    original file — the chain to HEAD, the chain llm nodes' tool calls, the subagent
    branches those calls spawned (with their own calls), and summaries of those nodes."""
    t = parse_path(path)[0]
    by = {n.id: n for n in t.nodes}
    keep: set[str] = set()
    cur = t.head
    while cur and cur != "ROOT":
        keep.add(cur)
        cur = by[cur].predecessor
    spawned: set[str] = set()  # subagent branches hang off kept calls; all of them is exported
    changed = True
    while changed:
        changed = False
        for n in t.nodes:
            if n.id in keep:
                continue
            covers = n.metadata.get("covers_ids")
            in_spawn = bool(n.metadata.get("spawn_branch_root") and n.caller in keep) or (
                n.predecessor in spawned and n.name != "context/summary"
            )
            take = (
                in_spawn
                or (n.role == "code" and n.caller in keep and by[n.caller].role == "llm")
                or (covers is not None and set(covers) <= keep)
            )
            if take:
                keep.add(n.id)
                if in_spawn:
                    spawned.add(n.id)
                changed = True
    return keep


def _comparable(node: Any, root: str, rename: dict[str, str]) -> dict[str, Any]:
    d = msgspec.to_builtins(node)
    for k in ("seq", "createdAt", "id"):
        d.pop(k)
    for k in ("predecessor", "caller"):
        d[k] = "ROOT" if d[k] == root else rename.get(d[k], d[k])
    return d


@pytest.mark.parametrize(
    "rel,renamed",
    [(CC_SHORT, 0), (CC_COMPACT, 0), (CC_SPAWN, 0), (CC_GENERAL, 0)],
    ids=["short", "compaction", "spawns", "resumed"],
)
async def test_claude_code_export_round_trips_the_ledger(
    daemon: DagctxClient, tmp_path: Path, rel: str, renamed: int
) -> None:
    """import → export(claude-code) → import into a fresh database gives the same nodes:
    ids, edges, roles, names, inputs, outputs, statuses, metadata (seq/createdAt aside).

    ``renamed``: tool calls whose node id would not survive. general-tool-calls.jsonl is a
    session resumed under a second root, so 45 tool calls carry the importer's ``#2``
    collision suffix; the export holds one branch (no collision there) and records
    those ids in ``dagctxToolNodeIds``, so the re-import restores them: none renamed."""
    src = corpus(rel)
    res = await daemon.import_path(src)
    sid = res.sessions[0].session_id
    out = tmp_path / "export.jsonl"
    ex = await daemon.export(sid, format="claude-code", path=str(out))
    assert ex.path == str(out) and ex.content is None
    assert ex.lines == len(out.read_text(encoding="utf-8").splitlines())
    again = await daemon.export(sid, format="claude-code")
    assert again.content == out.read_text(encoding="utf-8")  # deterministic bytes

    expected = _branch_of_head(src)
    got_ids = _exported_ids(str(out))
    rename = {i: (i if i in got_ids else re.sub(r"#\d+$", "", i)) for i in expected}
    assert set(rename.values()) == got_ids
    assert sum(1 for k, v in rename.items() if k != v) == renamed

    fresh = await DagctxClient.spawn(tmp_path / "fresh.db")
    try:
        back = await fresh.import_path(str(out))
        assert back.skipped == []
        s2 = back.sessions[0]
        assert s2.created and s2.nodes == len(expected)
        assert s2.spawn_branches == res.sessions[0].spawn_branches
        assert s2.compactions == res.sessions[0].compactions
        a_info = await daemon.session_get(sid)
        b_info = await fresh.session_get(s2.session_id)
        assert b_info.title == a_info.title
        assert rename.get(a_info.head, a_info.head) == b_info.head
        ids = sorted(expected)
        a_nodes = (await daemon.get_nodes(sid, ids)).nodes
        b_nodes = (await fresh.get_nodes(s2.session_id, [rename[i] for i in ids])).nodes
        for a, b in zip(a_nodes, b_nodes):
            assert _comparable(b, b_info.root_id, {}) == _comparable(a, a_info.root_id, rename), a.id
        # exporting the re-imported session gives the same nodes again
        ex2 = await fresh.export(s2.session_id, format="claude-code", path=str(tmp_path / "export2.jsonl"))
        assert _exported_ids(ex2.path or "") == got_ids
        # importing the export twice is a no-op
        assert not (await fresh.import_path(str(out))).sessions[0].created
    finally:
        await fresh.close()


async def test_openai_export_and_errors(daemon: DagctxClient, tmp_path: Path) -> None:
    sid = (await daemon.import_path(corpus(CC_SHORT))).sessions[0].session_id
    ex = await daemon.export(sid, format="openai")
    doc = json.loads(ex.content or "")
    assert set(doc) == {"model", "messages"} and doc["model"].startswith("claude")
    r = await daemon.render(sid, format="openai", model=doc["model"])
    assert doc["messages"] == r.messages and ex.lines == len(r.messages)
    assert check_pairs(doc["messages"], "openai") == []
    target = tmp_path / "out.json"
    target.write_text("old")
    target.chmod(0o600)
    with pytest.raises(RpcError) as e:  # an existing file is never replaced unasked
        await daemon.export(sid, format="openai", path=str(target))
    assert e.value.kind == "InvalidParams" and "overwrite: true" in e.value.message
    assert target.read_text() == "old"
    written = await daemon.export(sid, format="openai", path=str(target), overwrite=True)
    assert written.content is None and json.loads(target.read_text())["messages"] == r.messages  # overwritten
    assert target.stat().st_mode & 0o777 == 0o600  # keeps its permissions
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dagctx-export-")] == []  # no temp left
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(RpcError) as e:  # nor written through a symlink, even with overwrite
        await daemon.export(sid, format="openai", path=str(link), overwrite=True)
    assert e.value.kind == "InvalidParams" and not (tmp_path / "elsewhere.json").exists()

    with pytest.raises(RpcError) as e:
        await daemon.export("no-such-session", format="claude-code")
    assert e.value.kind == "SessionNotFound"
    with pytest.raises(RpcError) as e:
        await daemon.request("session/export", {"sessionId": sid, "format": "yaml"})
    assert e.value.code == -32602
    with pytest.raises(RpcError) as e:
        await daemon.export(sid, format="claude-code", head="no-such-node")
    assert e.value.kind == "NodeNotFound"
    with pytest.raises(RpcError) as e:
        await daemon.export(sid, format="claude-code", path=str(tmp_path / "missing" / "x.jsonl"))
    assert e.value.code == -32602
    r = await daemon.render(sid, format="neutral")
    tool_node = next(m for m in r.messages if m["role"] == "tool")["nodeIds"][0]
    with pytest.raises(RpcError) as e:
        await daemon.export(sid, format="claude-code", head=tool_node)
    assert e.value.code == -32602 and "not a conversation turn" in e.value.message


async def test_native_session_round_trips_ids_edges_and_contents(daemon: DagctxClient, tmp_path: Path) -> None:
    """A session written through node/append (not imported) exports as a well-formed Claude
    Code transcript; importing it gives back the same ids, edges and contents when tool
    calls use their provider call id as node id (a Claude Code tool call's id *is* its
    tool_use id). Metadata gains the transcript's fields (timestamps, message ids)."""
    c = daemon
    s = await c.session_create("native")
    u = await c.append(s.session_id, "user", id="u1", output="请把 src/app.py 里的 parse_config 改名", predecessor=s.head)
    a = await c.append(s.session_id, "llm", id="a1", name="claude-sonnet-4-5", output="Looking.", predecessor="u1")
    await c.append(s.session_id, "code", id="toolu_1", name="grep", input={"pattern": "parse_config"},
                   output="src/app.py:3: def parse_config():", caller="a1", metadata={"toolCallId": "toolu_1"})
    await c.append(s.session_id, "code", id="toolu_2", name="bash", input={"command": "false"},
                   output="exit 1", status="error", caller="a1", metadata={"toolCallId": "toolu_2"})
    await c.append(s.session_id, "llm", id="a2", name="claude-sonnet-4-5", output="Renamed to load_config.",
                   predecessor="a1")
    await c.append(s.session_id, "llm", id="a2-retry", name="claude-sonnet-4-5", output="Done: load_config.",
                   predecessor="a1", move_head=True)
    assert u.head == "u1" and a.head == "a1"
    ids = ["u1", "a1", "toolu_1", "toolu_2", "a2-retry"]

    out = tmp_path / "native.jsonl"
    await c.export(s.session_id, format="claude-code", path=str(out))
    assert _exported_ids(str(out)) == set(ids)  # the other branch (a2) is not on HEAD's branch
    fresh = await DagctxClient.spawn(tmp_path / "fresh.db")
    try:
        back = (await fresh.import_path(str(out))).sessions[0]
        info = await fresh.session_get(back.session_id)
        assert info.head == "a2-retry" and info.title == "native"
        a_nodes = (await c.get_nodes(s.session_id, ids)).nodes
        b_nodes = (await fresh.get_nodes(back.session_id, ids)).nodes
        for x, y in zip(a_nodes, b_nodes):
            for field in ("id", "role", "name", "input", "output", "status"):
                assert getattr(x, field) == getattr(y, field), (x.id, field)
            assert (x.caller, x.predecessor == s.root_id) == (y.caller, y.predecessor == info.root_id), x.id
            if x.predecessor != s.root_id:
                assert x.predecessor == y.predecessor
    finally:
        await fresh.close()


@pytest.mark.parametrize("rel", [CC_SPAWN, CC_GENERAL])
async def test_export_of_every_branch_keeps_every_node_and_is_already_present(
    daemon: DagctxClient, tmp_path: Path, rel: str
) -> None:
    """HEAD's branch alone drops side branches (55 → 53 for the subagent session); every
    branch keeps them, and the file names its source, so the same database says
    "already present" instead of making a copy."""
    [s] = (await daemon.import_path(corpus(rel))).sessions
    out = tmp_path / "all.jsonl"
    await daemon.export(s.session_id, path=str(out), branches="all")
    [same] = (await daemon.import_path(str(out))).sessions
    assert not same.created and same.session_id == s.session_id
    assert (await daemon.session_list()).total == 1
    fresh = await DagctxClient.spawn(tmp_path / "fresh.db")
    try:
        [copy] = (await fresh.import_path(str(out))).sessions
        assert copy.created and copy.nodes == s.nodes
        assert (await fresh.session_get(copy.session_id)).head == (await daemon.session_get(s.session_id)).head
        assert len((await fresh.branches(copy.session_id)).branches) == len(
            (await daemon.branches(s.session_id)).branches)
    finally:
        await fresh.close()
