"""What one compaction or aging plan reuses within its request gives exactly what counting
and reading afresh gives: the summary's token counts taken from its validation, the
render after the write, reference lists read only when a plan asks for them."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.context import aging
from dagctx.context.references import extract_references
from dagctx.engine.compaction_pipeline import compact
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.engine.views import ContextService
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

MODEL = "gpt-4o"


class Summarizer:
    """A client that samples: answers with every identifier it was shown (passes the gate)."""

    can_sample = True

    def __init__(self) -> None:
        self.calls = 0

    def notify(self, method: str, params: Any) -> None:
        pass

    def progress(self, token: Any, value: Any) -> None:
        pass

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        self.calls += 1
        text = "\n".join(msg.content.text for msg in params.messages)
        body = re.search(r"<(conversation|new-messages)>\n(.*?)\n</\1>", text, re.S)
        refs = sorted(extract_references(body.group(2) if body else text))
        return c.CreateMessageResult(content=c.SamplingContent(text="Summary. " + ", ".join(refs)), model="t")


def _engine(path: Path, peer: Any = None, aging_opts: dict[str, Any] | None = None) -> EngineCore:
    e = EngineCore(DaemonConfig(database=str(path)), peer=peer)
    e.initialize(m.InitializeParams(initialization_options=m.InitializationOptions(
        aging=None if aging_opts is None else msgspec.convert(aging_opts, m.AgingOptions))))
    return e


def _append(e: EngineCore, sid: str, **kw: Any) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw)))).node.id


def _session(e: EngineCore, turns: int = 12) -> tuple[str, str]:
    sid = e.store.create_session("reuse").session_id
    head = e.store.head(sid)
    for i in range(turns):
        u = _append(e, sid, role="user", output=f"turn {i}: 修复 src/mod_{i}.py and check port 80{i:02d}",
                    predecessor=head)
        head = _append(e, sid, role="llm", name=MODEL, output=f"Reading src/mod_{i}.py for turn {i}.", predecessor=u)
        body = "\n".join(f"def f_{i}_{k}(x): return x + {k}  # 结果 {k}" for k in range(120))
        _append(e, sid, role="code", name="read_file", input={"path": f"src/mod_{i}.py"}, output=body,
                caller=head, metadata={"toolCallId": f"call_{i}"})
        head = _append(e, sid, role="llm", name=MODEL, output=f"Done with src/mod_{i}.py.", predecessor=head)
    return sid, head


@pytest.fixture(scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    path = tmp_path_factory.mktemp("reuse") / "c.db"
    e = _engine(path)
    sid, head = _session(e)
    e.close()
    return path, sid, head


@pytest.fixture
def db(_built: tuple[Path, str, str], tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """``_session``'s session in a database of the test's own: a copy of the files of one
    built once per module (48 appends through the engine per test were most of this
    module's setup)."""
    built, sid, head = _built
    path = tmp_path / "c.db"
    for f in built.parent.iterdir():
        shutil.copyfile(f, path.with_name(f.name))
    yield path, sid, head


def test_summary_counts_and_tokens_after_match_a_fresh_count(db: tuple[Path, str, str], tmp_path: Path) -> None:
    path, sid, head = db
    e = _engine(path, Summarizer())
    res = asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=800)))
    assert res.ok and res.summary_id, res
    e.close()
    # what the store keeps for the summary is what counting its stored text gives, for
    # every tokenizer (the model's one was taken from the validation's count)
    fresh = _engine(path)
    node = fresh.store.graph(sid).nodes[res.summary_id]
    for tok in fresh.tokenizers():
        stored = fresh.store.token_counts(sid, tok)[res.summary_id]
        assert stored == (fresh.counter.count_value(node.input, tok), fresh.counter.count_value(node.output, tok))
    # tokensAfter (the render after the write, the summary's count taken from the write)
    # is the render of a daemon that counts it afresh
    info = fresh.models.get(MODEL)
    aged, _ = fresh.views.aging_for(sid, head, info)
    tok = info.tokenizer or fresh.counter.tokenizer_for(MODEL)
    fresh.views.node_tokens(fresh.store.graph(sid), tok).pop(res.summary_id)  # counted, not read
    again = ContextService(fresh).render(sid, head=head, fmt="neutral", model=MODEL, aged=aged, remember=False)
    assert res.tokens_after == again.total
    fresh.close()


def test_derive_with_known_counts_equals_counting(tmp_path: Path) -> None:
    e = _engine(tmp_path / "d.db")
    text = "[Previous conversation summary]\n" + " ".join(f"src/x_{k}.py 迁移" for k in range(500))
    tok = e.counter.tokenizer_for(MODEL)
    counted = e.derive_node("llm", None, text)
    taken = e.derive_node("llm", None, text, known={tok: (0, e.counter.count(text, tok))})
    assert taken == counted
    # a spilled output is not the value the known counts were taken of: they are ignored
    big = "line of output\n" * 20_000
    wrong = e.derive_node("code", None, big, name="bash", known={tok: (0, 1)})
    assert wrong == e.derive_node("code", None, big, name="bash")
    assert wrong.tokens is not None and wrong.tokens[tok] != (0, 1)
    e.close()


def test_references_are_read_when_a_plan_asks_and_give_the_same_plan(db: tuple[Path, str, str],
                                                                      tmp_path: Path) -> None:
    path, sid, head = db
    # every result is younger than a minute: no result passes the gates, nothing is read
    young = _engine(path)
    aged, _ = young.views.aging_for(sid, head, young.models.get(MODEL))
    assert aged == {}
    assert sid not in young.views._refs
    young.close()
    # with no age limit results age: the lists read lazily make the plan the stored lists make
    copy = tmp_path / "old.db"
    for ext in ("", "-wal", "-shm"):
        if Path(f"{path}{ext}").exists():
            shutil.copyfile(f"{path}{ext}", f"{copy}{ext}")
    opts = {"minAgeSeconds": 0, "minTokens": 50, "keepRecentTurns": 2}
    old = _engine(copy, aging_opts=opts)
    info = old.models.get(MODEL)
    aged, stats = old.views.aging_for(sid, head, info)
    assert aged and sid in old.views._refs
    graph = old.store.graph(sid)
    from dagctx.context.render import render_view
    from dagctx.engine.view_aging import _turn_start

    view = render_view(graph, head)
    policy = old.aging_policy
    tok = info.tokenizer or old.counter.tokenizer_for(MODEL)
    stored = old.store.reference_lists(sid)
    plan = aging.plan_aging(
        view, graph, now=_turn_start(graph, view, policy.turn_unit),
        boundary_seq=aging.boundary_after_commit(view, graph, policy) or None, policy=policy,
        token_of=lambda nid: old.views.counts_of(graph, nid, tok)[1], window=info.context_window,
        count=lambda t: old.counter.count(t, tok), refs_of=stored.__getitem__)
    assert dict(plan.aged) == aged
    assert plan.stats.as_dict()["toolResultsAged"] == stats["toolResultsAged"]
    old.close()


def test_a_plan_of_another_key_ages_the_walk_a_render_kept(db: tuple[Path, str, str]) -> None:
    """A plan reuses the unaged walk of the branch the last render or plan made (same
    nodes, same updates): the same decisions as a service that walks it afresh, and a
    walk made before an append is never reused after it."""
    path, sid, head = db
    opts = {"minAgeSeconds": 0, "minTokens": 50, "keepRecentTurns": 2}
    e = _engine(path, aging_opts=opts)
    info = e.models.get(MODEL)
    e.views.render(sid, head=head, fmt="openai", model=MODEL)  # keeps the unaged walk
    for defer in (True, False):
        kept = e.views.aging_for(sid, head, info, defer=defer)
        fresh = ContextService(e).aging_for(sid, head, info, defer=defer)
        assert kept == fresh
    walked = e.views._unaged
    new = _append(e, sid, role="user", output="one more turn about src/mod_1.py", predecessor=head)
    after = e.views.aging_for(sid, new, info)
    assert e.views._unaged is not walked
    assert after == ContextService(e).aging_for(sid, new, info)
    e.close()


def test_trivial_whitespace_is_str_isspace() -> None:
    """The fidelity gate's phrase test (a reference with whitespace is not an identifier)
    reads whitespace exactly as ``str.isspace`` does, over every code point."""
    import sys

    from dagctx.context.references import _WHITESPACE

    assert all((_WHITESPACE.search(ch) is not None) == ch.isspace() for ch in map(chr, range(sys.maxunicode + 1)))


def test_request_estimate_is_the_estimate_of_the_request(db: tuple[Path, str, str]) -> None:
    """Each staged request's size, summed from its entries' character classes, is
    ``estimate_tokens`` of the text sent, in every mode of the request."""
    from dataclasses import replace

    from dagctx.context import compaction_plan, summarizer_input
    from dagctx.context.tokens import estimate_tokens

    path, sid, head = db
    e = _engine(path)
    graph = e.store.graph(sid)
    from dagctx.context.render import render_view

    view = render_view(graph, head)
    plan = compaction_plan.select_cut(view, graph, lambda it: len(it.text) // 3 + 1, window=8000,
                                      keep_recent_tokens=300)
    assert plan is not None
    t = summarizer_input.Transcript()
    stages = summarizer_input.split_stages(plan, 900, estimate_tokens, t)
    assert stages == summarizer_input.split_stages(plan, 900, estimate_tokens)  # the same stages
    assert len(stages) > 2
    owners = summarizer_input.stage_owners(plan)
    plans = [plan, replace(plan, previous_summary_text="S 迁移 src/a.py", previous_summary_id="s1")]
    plans += [summarizer_input.stage_plan(plan, items, index=i, total=len(stages), owner=owners,
                                          previous_text=None if i == 1 else f"summary so far {i} 结果")
              for i, items in enumerate(stages, 1)]
    for sub in plans:
        for kw in ({}, {"instructions": "focus on ports 端口", "max_chars": 4000}, {"update": False}):
            _, messages = summarizer_input.summarizer_messages(sub, transcript=t, **kw)
            assert messages == summarizer_input.summarizer_messages(sub, **kw)[1]
            text = messages[0]["content"]["text"]
            assert summarizer_input.request_estimate(sub, t, **kw) == estimate_tokens(text)
    e.close()


def test_owners_kept_per_graph_match_a_fresh_walk(db: tuple[Path, str, str]) -> None:
    """The owners ``owner_cache`` keeps for a graph object are those a fresh walk finds,
    after appends (new nodes under old ones) and after ``node/update``."""
    from dagctx.context.render import render_view

    path, sid, head = db
    e = _engine(path)

    def check() -> None:
        graph = e.store.graph(sid)
        view = render_view(graph, e.store.head(sid))
        kept = aging.owner_cache(graph)
        for it in view.items:
            assert aging.owner_chain_id(graph, it.node_id, kept) == aging.owner_chain_id(graph, it.node_id)

    check()
    step = _append(e, sid, role="llm", name=MODEL, output="next step", predecessor=head)
    running = _append(e, sid, role="code", name="bash", input={"cmd": "make"}, status="running", caller=step,
                      metadata={"toolCallId": "c-run"})
    inner = _append(e, sid, role="llm", name=MODEL, output="inner call", caller=running)
    _append(e, sid, role="code", name="cat", input={"f": "x"}, output="x", caller=inner, metadata={"toolCallId": "i1"})
    check()
    asyncio.run(e.node_update(m.NodeUpdateParams(session_id=sid, node_id=running, status="completed", output="ok")))
    check()
    e.close()


def test_candidate_graph_leaves_the_graph_as_it_was(db: tuple[Path, str, str]) -> None:
    """``with_candidate`` shares the graph's child lists but never changes them, whatever
    edges the candidate has."""
    from dagctx.context import compaction_plan

    path, sid, head = db
    e = _engine(path)
    graph = e.store.graph(sid)
    before = ({k: list(v) for k, v in graph.conv_children.items()}, {k: list(v) for k, v in graph.callees.items()})
    code = next(n for n in graph.by_seq if n.role == "code")
    for node_input in ({"output": "S", "predecessor": head},
                       {"name": "note", "output": "x", "predecessor": head, "caller": code.caller}):
        cand = compaction_plan.with_candidate(graph, node_input)
        assert "summary_candidate" in cand.nodes and "summary_candidate" not in graph.nodes
        assert ({k: list(v) for k, v in graph.conv_children.items()},
                {k: list(v) for k, v in graph.callees.items()}) == before
    assert "summary_candidate" in cand.callees[code.caller] and "summary_candidate" in cand.conv_children[head]
    e.close()


def test_coverage_check_finds_what_a_plain_search_finds(db: tuple[Path, str, str]) -> None:
    """The coverage check (searches after the previous item first, segment after segment)
    answers what "its body, or every line segment of it, occurs anywhere in the sent
    text" answers, whatever stages were sent, in whatever order."""
    import random

    from dagctx.context import compaction_plan, summarizer_input
    from dagctx.context.render import render_view
    from dagctx.context.tokens import estimate_tokens

    path, sid, head = db
    e = _engine(path)
    graph = e.store.graph(sid)
    plan = compaction_plan.select_cut(render_view(graph, head), graph, lambda it: len(it.text) // 3 + 1,
                                      window=8000, keep_recent_tokens=300)
    assert plan is not None
    stages = summarizer_input.split_stages(plan, 400, estimate_tokens)  # results split into parts
    assert any(len(st) == 1 and "(part 1 of" in summarizer_input.item_body(st[0]) for st in stages)
    owners = summarizer_input.stage_owners(plan)
    sent = [summarizer_input.summarizer_messages(summarizer_input.stage_plan(
        plan, items, index=i, total=len(stages), owner=owners, previous_text=None if i == 1 else "so far"))[1]
        for i, items in enumerate(stages, 1)]

    def plain(messages: list[Any]) -> list[bool]:
        joined = "\n".join(m["content"]["text"] for req in messages for m in req)
        out = []
        for it in plan.input_items:
            body = summarizer_input.item_body(it)
            out.append(not body or body in joined or all(
                seg in joined for seg in summarizer_input._segments(body) if seg.strip()))
        return out

    rng = random.Random(3)
    for trial in range(30):
        some = list(sent) if trial == 0 else rng.sample(sent, rng.randint(0, len(sent)))
        expect = plain(some)
        got = summarizer_input.summarized_ids(plan, some)
        for it, ok in zip(plan.input_items, expect):
            if not ok:
                assert it.node_id not in got or it.node_id in plan.empty_ids
        assert summarizer_input.covered_in_input(plan, some) == (
            set(plan.covered_ids) <= summarizer_input.summarized_ids(plan, some, summarizer_input.Transcript()))
        if all(expect):
            assert summarizer_input.covered_in_input(plan, some)
    e.close()


def test_item_tokens_in_one_loop_equal_the_per_item_count(db: tuple[Path, str, str]) -> None:
    """The cut's counts of every item in one loop (``many``) are the per-item counts: aged
    results (their replacement text counted), a summary, and an item of no node."""
    from dataclasses import replace

    from dagctx.engine.compaction_pipeline import _item_tokens

    path, sid, head = db
    e = _engine(path, Summarizer(), aging_opts={"minAgeSeconds": 0, "minTokens": 50, "keepRecentTurns": 2})
    info = e.models.get(MODEL)
    tokenizer = e.counter.tokenizer_for(MODEL)
    aged, _ = e.views.aging_for(sid, head, info)
    items = list(e.views.render(sid, head=head, fmt="neutral", model=MODEL, aged=aged, remember=False).view.items)
    # and the items of the branch once compacted (its summary first)
    assert asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=800))).ok
    graph = e.store.graph(sid)
    items += e.views.render(sid, head=head, fmt="neutral", model=MODEL, remember=False).view.items
    items.append(replace(items[-1], node_id="no-such-node", text="a text of no node 无"))
    kinds = {it.kind for it in items}
    assert aged and {"summary", "tool_result", "tool_call", "user", "assistant"} <= kinds
    token_of_item = _item_tokens(e, graph, tokenizer, aged)
    assert token_of_item.many(items) == [max(0, int(token_of_item(it))) for it in items]
    e.close()


def _owner_walk(graph: Any, node_id: str, cache: dict[str, str] | None = None) -> str:
    """``aging.owner_chain_id`` as it was written before (every node through the walk)."""
    from dagctx.context.summary_choice import is_chain_member

    if cache is not None and node_id in cache:
        return cache[node_id]
    path: list[str] = []
    nid: str | None = node_id
    out = node_id
    while nid is not None and nid in graph.nodes:
        if cache is not None and nid in cache:
            out = cache[nid]
            break
        node = graph.nodes[nid]
        path.append(nid)
        if is_chain_member(graph, node) or node.caller is None or node.caller == graph.root_id:
            out = nid
            break
        nid = node.caller
    if cache is not None:
        for p in path:
            cache[p] = out
    return out


def test_owner_of_a_node_without_caller_is_the_walks(db: tuple[Path, str, str]) -> None:
    """A node with no caller (or the root as caller) is its own owner at once: the owners,
    and what the cache keeps, are the walk's, for every node, nested calls, summaries and
    ids of no node included, in any order."""
    path, sid, head = db
    e = _engine(path, Summarizer())
    step = _append(e, sid, role="llm", name=MODEL, output="next step", predecessor=head)
    call = _append(e, sid, role="code", name="bash", input={"cmd": "make"}, output="ok", caller=step,
                   metadata={"toolCallId": "c-1"})
    inner = _append(e, sid, role="llm", name=MODEL, output="inner call", caller=call)
    _append(e, sid, role="code", name="cat", input={"f": "x"}, output="x", caller=inner, metadata={"toolCallId": "i1"})
    assert asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=300))).ok
    graph = e.store.graph(sid)
    ids = [n.id for n in graph.by_seq] + ["no-such-node"]
    for order in (ids, ids[::-1]):
        cache: dict[str, str] = {}
        walked: dict[str, str] = {}
        for nid in order:
            assert aging.owner_chain_id(graph, nid) == _owner_walk(graph, nid)
            assert aging.owner_chain_id(graph, nid, cache) == _owner_walk(graph, nid, walked)
        assert cache == walked
    e.close()


def test_candidate_graph_walks_the_branches_of_the_original(db: tuple[Path, str, str]) -> None:
    """The candidate graph starts from the original's last walked branch: the candidate
    render, and every branch, are those of a candidate that walks afresh."""
    from dagctx.context import compaction_plan
    from dagctx.context.render import render_view

    path, sid, head = db
    e = _engine(path)
    graph = e.store.graph(sid)
    view = render_view(graph, head)  # the original has walked the branch
    plan = compaction_plan.select_cut(view, graph, lambda it: len(it.text) // 3 + 1, window=8000,
                                      keep_recent_tokens=300)
    assert plan is not None
    node_input = compaction_plan.summary_node_input(plan, "the work so far: src/a.py", model=MODEL)
    kept = compaction_plan.with_candidate(graph, node_input)
    fresh = compaction_plan.with_candidate(graph, node_input)
    fresh._chain_head, fresh._chain_ids, fresh._chain_pos = None, [], None
    assert kept._chain_head == head
    for nid in [n.id for n in graph.by_seq if graph.is_conversation(n)]:
        assert [n.id for n in kept.chain(nid)] == [n.id for n in fresh.chain(nid)]
    ours, theirs = render_view(kept, head), render_view(fresh, head)
    assert [(it.node_id, it.kind, it.text) for it in ours.items] == [(it.node_id, it.kind, it.text)
                                                                     for it in theirs.items]
    assert ours.manifest() == theirs.manifest()
    assert any(it.node_id == "summary_candidate" for it in ours.items)
    e.close()
