"""The compaction's one-pass helpers give what the per-item computation gave: the
transcript's bodies and estimates read in one loop (staging, fidelity terms, coverage),
and the merged identifier counts of ``distinctive_identifiers``. End to end, a
compaction with the one-pass helpers sends the same prompts, answers the same result and
writes the same node as one with the per-item originals."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.context import references, summarizer_input, summary_check
from dagctx.context.references import _even_sample, _reference_counts, _trivial, extract_references
from dagctx.context.char_classes import char_classes
from dagctx.context.render import render_view
from dagctx.context.summarizer_input import Transcript, item_body, split_stages, transcript_entry
from dagctx.context.tokens import estimate_tokens
from dagctx.engine.compaction_pipeline import compact
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

MODEL = "gpt-4o"


def _reference_distinctive(texts: Iterable[str], top: int = 20,
                           sample_chars: int | None = references.IDENTIFIER_SAMPLE_CHARS) -> list[str]:
    """``distinctive_identifiers`` as it was written before (a Counter, ``in`` then ``+=``)."""
    texts = list(texts)
    if sample_chars is not None:
        texts = _even_sample(texts, sample_chars)
    total: Counter[str] = Counter()
    first: dict[str, tuple[int, int]] = {}
    for ti, text in enumerate(texts):
        counts, pos = _reference_counts(text)
        for ref, n in counts.items():
            if ref in total:
                total[ref] += n
            else:
                total[ref] = n
                first[ref] = (ti, pos[ref])
    out: list[str] = []
    if top <= 0:
        return out
    for r in sorted(total, key=lambda r: (-total[r], first[r], r)):
        if not _trivial(r):
            out.append(r)
            if len(out) == top:
                break
    return out


def _texts(seed: int) -> list[str]:
    rnd = random.Random(seed)
    words = ["src/app.py", "README.md", "fix_the_bug", "UserService", "a1b2c3d4e5f6", "localhost:8080",
             "`npm run build`", "tests/test_x.py", "迁移", "ok", "https://example.com/x", "src/main.py",
             "MAX_RETRIES", "getUserById", "the", "and", "/etc/hosts", "v1.2.3"]
    # many names of few counts (ties at the head's edge), the trivial ones among them
    words += [f"src/m{k}.py" for k in range(rnd.randint(0, 300))] + ["main.py", "index.js", "LICENSE"] * 5
    skew = [rnd.choice(words[: rnd.randint(1, len(words))]) for _ in range(rnd.randint(0, 400))]
    return [" ".join(rnd.choice(words + skew) for _ in range(rnd.randint(0, 80))) for _ in range(rnd.randint(1, 60))]


@pytest.mark.parametrize("seed", range(40))
def test_distinctive_identifiers_equal_the_counter_merge(seed: int) -> None:
    texts = _texts(seed)
    for top in (0, 1, 5, 20, 40):
        for sample in (None, 200, references.IDENTIFIER_SAMPLE_CHARS):
            assert references.distinctive_identifiers(texts, top, sample) == \
                _reference_distinctive(texts, top, sample)


def test_distinctive_identifiers_when_trivial_names_fill_the_head() -> None:
    # the 4·top most frequent names are mostly trivial (phrases in backticks): the head
    # holds only some of the ``top`` names, the rest come from the whole ranking
    trivial = [f"`run step {k}`" for k in range(28)]
    texts = [" ".join(trivial * 10), " ".join(["src/a.py", "src/b.py"] * 10),
             " ".join([f"src/c{k}.py" for k in range(3)] * 9), " ".join(f"src/d{k}.py" for k in range(50))]
    for top in (1, 2, 5, 7, 20):
        got = references.distinctive_identifiers(texts, top)
        assert got == _reference_distinctive(texts, top)
    assert references.distinctive_identifiers(texts, 5) == ["src/a.py", "src/b.py", "src/c0.py", "src/c1.py",
                                                            "src/c2.py"]


class Summarizer:
    """A client that samples: keeps every prompt, answers with the identifiers it was shown."""

    can_sample = True

    def __init__(self) -> None:
        self.prompts: list[tuple[str | None, list[str]]] = []

    def notify(self, method: str, params: Any) -> None:
        pass

    def progress(self, token: Any, value: Any) -> None:
        pass

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        texts = [msg.content.text for msg in params.messages]
        self.prompts.append((params.system_prompt, texts))
        text = "\n".join(texts)
        # what it was shown and the summary so far (a staged request carries it)
        shown = re.findall(r"<(conversation|new-messages|previous-summary)>\n(.*?)\n</\1>", text, re.S)
        refs = sorted(extract_references("\n".join(b for _, b in shown) if shown else text))
        return c.CreateMessageResult(content=c.SamplingContent(text="Summary. " + ", ".join(refs)), model="t")


def _engine(path: Path, peer: Any = None) -> EngineCore:
    e = EngineCore(DaemonConfig(database=str(path)), peer=peer)
    e.initialize(m.InitializeParams(initialization_options=m.InitializationOptions()))
    return e


def _append(e: EngineCore, sid: str, **kw: Any) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw)))).node.id


def _session(e: EngineCore, turns: int, lines: int, seed: int) -> tuple[str, str]:
    rnd = random.Random(seed)
    sid = e.store.create_session("one-pass").session_id
    head = e.store.head(sid)
    for i in range(turns):
        u = _append(e, sid, role="user", output=f"turn {i}: 修复 src/mod_{i}.py and check port 80{i:02d}",
                    predecessor=head)
        head = _append(e, sid, role="llm", name=MODEL, output=f"Reading src/mod_{i}.py — turn {i}.", predecessor=u)
        body = "\n".join(f"def f_{i}_{k}(x): return x + {rnd.randint(0, 999)}  # 结果 {k}"
                         for k in range(rnd.randint(1, lines)))
        _append(e, sid, role="code", name="read_file", input={"path": f"src/mod_{i}.py"}, output=body,
                caller=head, metadata={"toolCallId": f"call_{i}"})
        head = _append(e, sid, role="llm", name=MODEL, output=f"Done with src/mod_{i}.py.", predecessor=head)
    return sid, head


def _per_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain per-item computations in place of the one-pass helpers: every entry
    built whole and measured afresh, the request joined from whole entries."""
    def pieces(self: Any, items: Any, lead: Any = ()) -> list[str]:
        return ["\n\n".join([*lead, *(transcript_entry(it) for it in items)])]

    monkeypatch.setattr(Transcript, "bodies", lambda self, items: [item_body(it) for it in items])
    monkeypatch.setattr(Transcript, "entries", lambda self, items: [transcript_entry(it) for it in items])
    monkeypatch.setattr(Transcript, "classes_of",
                        lambda self, items: [char_classes(transcript_entry(it)) for it in items])
    monkeypatch.setattr(Transcript, "estimates",
                        lambda self, items: [estimate_tokens(transcript_entry(it)) for it in items])
    monkeypatch.setattr(Transcript, "pieces", pieces)
    monkeypatch.setattr(Transcript, "bodies_at", lambda self, items: (
        [item_body(it) for it in items],
        [len(transcript_entry(it)) - len(item_body(it)) + (0 if item_body(it) else 1) for it in items]))
    monkeypatch.setattr(summary_check, "distinctive_identifiers", _reference_distinctive)


def _observed(path: Path, sid: str, keep: int, model: str) -> tuple[Any, ...]:
    peer = Summarizer()
    e = _engine(path, peer)
    res = asyncio.run(compact(e, c.CompactParams(session_id=sid, model=model, keep_recent_tokens=keep)))
    node = e.store.graph(sid).nodes.get(res.summary_id) if res.summary_id else None
    e.close()
    fields = msgspec.to_builtins(res)
    fields.pop("durationMs", None)
    fields.pop("summaryId", None)
    written = None if node is None else (node.role, node.name, node.output, node.predecessor, node.reads,
                                         node.metadata)
    return peer.prompts, fields, written


@pytest.mark.parametrize(("turns", "lines", "keep", "seed", "model", "stages"), [
    (6, 40, 400, 1, MODEL, 1), (14, 160, 900, 2, MODEL, 1),
    # a 32k-token summarizer: the prefix goes in stages
    pytest.param(24, 400, 2000, 3, "gpt-4-32k", 3, marks=pytest.mark.slow),  # a fifth of a second: the slow tier
])
def test_compaction_matches_the_per_item_computation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turns: int,
                                                     lines: int, keep: int, seed: int, model: str,
                                                     stages: int) -> None:
    built = tmp_path / "built" / "c.db"
    built.parent.mkdir()
    e = _engine(built)
    sid, _head = _session(e, turns, lines, seed)
    e.close()
    copies = []
    for name in ("fast", "fresh"):
        d = tmp_path / name
        d.mkdir()
        for f in built.parent.iterdir():
            shutil.copyfile(f, d / f.name)
        copies.append(d / "c.db")
    fast = _observed(copies[0], sid, keep, model)
    with monkeypatch.context() as mp:
        _per_item(mp)
        fresh = _observed(copies[1], sid, keep, model)
    assert fast[2] is not None, (fast[1], len(fast[0]))
    assert len(fast[0]) >= stages
    assert fast == fresh


def test_transcript_one_pass_equals_per_item(tmp_path: Path) -> None:
    e = _engine(tmp_path / "c.db")
    sid, head = _session(e, 10, 200, 7)
    view = render_view(e.store.graph(sid), head)
    e.close()
    items = list(view.items)
    tr = Transcript()
    # half of them seen before, in another order, then all in one pass (twice: cached)
    for it in items[::-2]:
        tr.estimate(it)
    for _ in range(2):
        assert tr.bodies(items) == [item_body(it) for it in items]
        assert tr.entries(items) == [transcript_entry(it) for it in items]
        assert tr.classes_of(items) == [char_classes(transcript_entry(it)) for it in items]
        assert tr.estimates(items) == [estimate_tokens(transcript_entry(it)) for it in items]
        assert tr.bodies_at(items) == ([item_body(it) for it in items], [
            len(transcript_entry(it)) - len(item_body(it)) + (0 if item_body(it) else 1) for it in items])
        for lead in ((), ("[earlier]\nso far",)):
            assert "".join(tr.pieces(items, lead)) == "\n\n".join([*lead, *map(transcript_entry, items)])
    assert Transcript().estimates(items) == [estimate_tokens(transcript_entry(it)) for it in items]
    assert Transcript().entries(items) == [transcript_entry(it) for it in items]
    # the request around the entries is measured as measuring its text afresh
    plan = _plan(items[:40])
    # an ASCII previous summary is measured apart from the words around it (not ASCII)
    for prev in (None, "earlier 摘要 summary", "earlier summary: src/a.py, port 8080 " * 40):
        for stage in (None, (1, 3), (2, 3)):
            sub = dataclasses.replace(plan, previous_summary_text=prev, stage=stage)
            tr = Transcript()
            _, msgs = summarizer_input.summarizer_messages(sub, max_chars=900, transcript=tr)
            assert msgs == summarizer_input.summarizer_messages(sub, max_chars=900)[1]
            assert summarizer_input.request_estimate(sub, tr, max_chars=900) == \
                estimate_tokens(msgs[0]["content"]["text"])
    # staging with the one-pass measures cuts where measuring each entry afresh cuts
    plan = _plan(items)
    for budget in (300, 1000, 5000):
        fresh = split_stages(plan, budget, lambda t: estimate_tokens(t))  # not the transcript path
        assert split_stages(plan, budget, estimate_tokens, Transcript()) == fresh


@pytest.mark.parametrize("seed", range(6))
def test_transcript_columns_answer_questions_in_any_order(tmp_path: Path, seed: int) -> None:
    """The transcript reads a run of the items it holds as one slice of each column, and
    any other question place by place: runs, runs past the end of what it holds, items
    out of order, asked twice, and items it never saw (a long item's pieces) all get
    what the plain per-item functions give, whichever question comes first."""
    e = _engine(tmp_path / "c.db")
    sid, head = _session(e, 8, 60, seed)
    view = render_view(e.store.graph(sid), head)
    e.close()
    items = list(view.items)
    rnd = random.Random(seed)
    pieces = [summarizer_input._with_body(it, f"(part 1 of 2)\n{item_body(it)[:7]}") for it in items[:5]]

    def question() -> list[Any]:
        n = len(items)
        a = rnd.randrange(n)
        b = rnd.randrange(a, n + 1)
        shape = rnd.randrange(6)
        if shape == 0:
            return items[a:b]  # a run
        if shape == 1:
            return items[a:] + items[:rnd.randrange(3)]  # a run, then what is held before it
        if shape == 2:
            return rnd.sample(items, rnd.randrange(n))  # out of order
        if shape == 3:
            return items[a:b] + items[a:b]  # each asked twice
        if shape == 4:
            return items[a:b] + rnd.sample(pieces, rnd.randrange(len(pieces)))  # never seen
        return [items[a]]

    for _ in range(3):
        tr = Transcript()
        for _ in range(12):
            asked = question()
            got = rnd.randrange(7)
            if got == 0:
                assert tr.bodies(asked) == [item_body(it) for it in asked]
            elif got == 1:
                assert tr.entries(asked) == [transcript_entry(it) for it in asked]
            elif got == 2:
                assert tr.classes_of(asked) == [char_classes(transcript_entry(it)) for it in asked]
            elif got == 3:
                assert tr.estimates(asked) == [estimate_tokens(transcript_entry(it)) for it in asked]
            elif got == 4:
                lead = rnd.choice(((), ("[earlier]\nso far",)))
                assert "".join(tr.pieces(asked, lead)) == "\n\n".join([*lead, *map(transcript_entry, asked)])
            elif got == 5:
                assert tr.bodies_at(asked) == ([item_body(it) for it in asked], [
                    len(transcript_entry(it)) - len(item_body(it)) + (0 if item_body(it) else 1) for it in asked])
            elif asked:
                it = asked[0]
                assert (tr.body(it), tr.entry(it), tr.classes(it), tr.estimate(it)) == (
                    item_body(it), transcript_entry(it), char_classes(transcript_entry(it)),
                    estimate_tokens(transcript_entry(it)))
        # whatever was asked before, the whole prefix and its stages read the same
        assert tr.classes_of(items + pieces) == [char_classes(transcript_entry(it)) for it in items + pieces]
        assert tr.bodies(items[3:]) == [item_body(it) for it in items[3:]]


def _plan(items: list[Any]) -> Any:
    from dagctx.context.compaction_plan import CutPlan

    fields = {f: None for f in CutPlan.__dataclass_fields__}
    fields.update(input_items=items, input_groups=[it.node_id for it in items])
    return CutPlan(**fields)



def _reference_summarized(plan: Any, sent: Any) -> set[str]:
    """``summarized_ids`` as it was written before (one search call per item, one fold)."""
    si = summarizer_input
    joined = "\n".join(si._message_texts(sent))
    pos = 0
    found: list[bool] = []
    for it in plan.input_items:
        body = item_body(it)
        if not body:
            found.append(True)
            continue
        i = si._find_anywhere(joined, body, pos)
        if i >= 0:
            pos = i + len(body)
            found.append(True)
            continue
        found.append(si._segments_sent(joined, body, pos))
    node_ok: dict[str, bool] = {}
    group_ok: dict[str, bool] = {}
    for it, group, ok in zip(plan.input_items, plan.input_groups, found):
        node_ok[it.node_id] = node_ok.get(it.node_id, True) and ok
        group_ok[group] = group_ok.get(group, True) and ok
    out = {nid for nid, ok in node_ok.items() if ok and nid not in group_ok}
    out |= {g for g, ok in group_ok.items() if ok}
    out.update(plan.empty_ids)
    if plan.previous_summary_id is not None and group_ok.get(plan.previous_summary_id):
        out.update(set(plan.covered_ids) - set(plan.new_covered_ids))
    return out


def test_summarized_ids_equal_the_per_item_search(tmp_path: Path) -> None:
    e = _engine(tmp_path / "c.db")
    sid, head = _session(e, 12, 300, 11)
    graph = e.store.graph(sid)
    view = render_view(graph, head)
    e.close()
    items = list(view.items)
    rnd = random.Random(5)
    groups = [rnd.choice([it.node_id, "g" + str(k // 3)]) for k, it in enumerate(items)]
    groups[-1] = "last"  # a group of one item, the last
    # a node of several items, none of them its own group (an assistant reply with its calls)
    ids = [it.node_id for it in items]
    first = next(it for k, it in enumerate(items) if it.node_id in ids[k + 1:] and len(item_body(it)) > 8)
    for k, nid in enumerate(ids):
        if nid == first.node_id:
            groups[k] = f"own{k}"
        elif groups[k] == first.node_id:
            groups[k] = "other"
    plan = dataclasses.replace(_plan(items), input_groups=groups, empty_ids=[])
    for budget in (200, 900, 100_000):
        tr = Transcript()
        stages = split_stages(plan, budget, estimate_tokens, tr)
        sent = [summarizer_input.summarizer_messages(
            summarizer_input.stage_plan(plan, st, index=i, total=len(stages), previous_text="so far"),
            transcript=tr)[1] for i, st in enumerate(stages, 1)]
        cases = [sent, sent[1:], sent[:-1], sent[::2], list(reversed(sent))]
        # a message with one body cut out, and one with a body's lines shuffled
        text = sent[0][0]["content"]["text"]
        victim = max(tr.bodies(items), key=len)
        cases.append([[{"role": "user", "content": {"type": "text", "text": text.replace(victim, "")}}], *sent[1:]])
        lines = victim.split("\n")
        rnd.shuffle(lines)
        cases.append([[{"role": "user", "content": {"type": "text",
                                                     "text": text.replace(victim, "\n".join(lines))}}], *sent[1:]])
        whole = _reference_summarized(plan, sent)
        assert whole >= set(groups) | {first.node_id}
        fewer = 0
        # the first item of that node cut out (its later ones sent)
        cut = [[{"role": "user", "content": {"type": "text",
                                             "text": m[0]["content"]["text"].replace(item_body(first), "")}}]
               for m in sent]
        cases.append(cut)
        for case in cases:
            want = _reference_summarized(plan, case)
            fewer += want != whole
            assert summarizer_input.summarized_ids(plan, case, tr) == want
            assert summarizer_input.summarized_ids(plan, case) == want
            # a previous summary's covered nodes count when its group was sent: a group of
            # the plan (sent whole, or not), one of no item, and none
            for prev in (groups[3], "absent", None):
                old = dataclasses.replace(plan, previous_summary_id=prev, covered_ids=["old1", "old2", ids[0]],
                                          new_covered_ids=[ids[0]])
                want = _reference_summarized(old, case)
                assert ("old1" in want) == (prev == groups[3] and groups[3] in want)
                assert summarizer_input.summarized_ids(old, case, tr) == want
                assert summarizer_input.summarized_ids(old, case) == want
        assert fewer >= 2


def _reference_watch(graph: Any, ids: set[str], also: set[str]) -> dict[str, tuple[Any, Any, Any]]:
    """``compaction_pipeline._watch`` as it was written before (``graph.subtree`` per id)."""
    watched = set(ids) | also
    for nid in ids:
        watched.update(n.id for n in graph.subtree(nid))
    return {nid: (graph.nodes[nid].status, graph.nodes[nid].output, graph.nodes[nid].metadata)
            for nid in watched if nid in graph.nodes}


def test_watch_equals_the_subtree_of_each_node(tmp_path: Path) -> None:
    from dagctx.engine.compaction_pipeline import _watch

    e = _engine(tmp_path / "c.db")
    sid, head = _session(e, 6, 20, 13)
    # calls nested three deep under the head's reply: a tool that runs a model that calls a tool
    tool = _append(e, sid, role="code", name="agent", input={"task": "x"}, output="done", caller=head)
    inner = _append(e, sid, role="llm", name=MODEL, output="inner reply", caller=tool)
    _append(e, sid, role="code", name="read_file", input={"path": "a.py"}, output="print(1)", caller=inner)
    graph = e.store.graph(sid)
    e.close()
    chain = [n.id for n in graph.chain(head)]
    rnd = random.Random(3)
    for k in (0, 1, 5, len(chain)):
        ids = set(rnd.sample(chain, k)) | ({head} if k == 1 else set())
        also = {chain[-1], "not-a-node"}
        got = _watch(graph, ids, also)
        assert {nid: (n.status, n.output, n.metadata) for nid, n in got.items()} == \
            _reference_watch(graph, ids, also)
    assert {tool, inner} <= _watch(graph, {head}, set()).ids


def _cut_as_before(view: Any, graph: Any, tok: Any, target: int) -> tuple[int, list[str], str | None]:
    """Where ``cut_decision`` cut before its loops were folded (one walk back per item,
    then the user boundaries asked again, each owner looked up one by one), and the
    groups and previous summary it found: ``(cut index, input groups, previous id)``."""
    from dagctx.context.aging import owner_chain_id
    from dagctx.context.compaction_plan import KEEP_MIN_MESSAGES, MESSAGE_RULE_MAX, _is_user_boundary

    items = view.items
    n = len(items)
    toks = [max(0, int(tok(it))) for it in items]
    tail, msgs = [0] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        it = items[i]
        conv = (_is_user_boundary(it, graph) if it.kind == "user"
                else it.kind == "assistant" and it.depth == 0 and bool(it.text.strip()))
        tail[i], msgs[i] = tail[i + 1] + toks[i], msgs[i + 1] + (1 if conv else 0)
    i_tok = max(i for i in range(n) if tail[i] >= target)
    users = [b for b in range(n) if _is_user_boundary(items[b], graph)]
    first_real = next((i for i, it in enumerate(items) if it.kind != "summary"), n)
    bounds = [b for b in users if b > first_real]
    cut = next((b for b in bounds if b >= i_tok), bounds[-1])
    last_two = users[-2] if len(users) >= 2 else users[-1] if users else 0
    if tail[last_two] <= target:
        enough = [b for b in bounds if msgs[b] >= KEEP_MIN_MESSAGES]
        goal = enough[-1] if enough else bounds[0]
        if goal < cut:
            cut = next((b for b in bounds if goal <= b < cut and tail[b] <= MESSAGE_RULE_MAX * target), cut)
    groups = [it.node_id if it.kind == "summary" else owner_chain_id(graph, it.node_id) for it in items[:cut]]
    prev = [it.node_id for it in items[:cut] if it.kind == "summary"]
    return cut, groups, prev[-1] if prev else None


def test_cut_decision_cuts_where_it_cut_before(tmp_path: Path) -> None:
    seed = 4
    from dagctx.context.aging import owner_cache
    from dagctx.context.compaction_plan import cut_decision, keep_target

    e = _engine(tmp_path / "c.db", Summarizer())
    sid, _ = _session(e, 9, 30, seed)
    # a summary in the view (the previous one of the next cut), then more turns after it
    assert asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=300))).ok
    rnd = random.Random(seed)
    head = e.store.head(sid)
    for i in range(4):
        u = _append(e, sid, role="user", output=f"more {i}: {'  ' if i == 1 else ''}check {rnd.random()}",
                    predecessor=head)
        # replies of only whitespace do not count as conversation messages
        head = _append(e, sid, role="llm", name=MODEL, output=" \n\t " if i == 2 else f"ok {i}", predecessor=u)
    graph = e.store.graph(sid)
    view = render_view(graph, head)
    e.close()
    assert any(it.kind == "summary" for it in view.items)

    def tok(it: Any) -> int:
        return 3 + len(it.text) // 5

    cuts = set()
    for keep in (*range(0, 240, 3), 400, 900, 5_000):
        if keep % 2:
            owner_cache(graph).clear()  # every owner found afresh (none cached), or most cached
        plan, why = cut_decision(view, graph, tok, window=128_000, keep_recent_tokens=keep)
        if plan is None:
            assert why in ("belowThreshold", "nothingToCompact")
            continue
        cut, groups, prev = _cut_as_before(view, graph, tok, keep_target(128_000, keep))
        assert (plan.cut_index, plan.input_groups, plan.previous_summary_id) == (cut, groups, prev)
        cuts.add(cut)
    assert len(cuts) >= 2  # the token rule and the message rule both cut somewhere


def _even_sample_as_before(texts: list[str], budget: int) -> list[str]:
    """``references._even_sample`` as it was written before (indices sorted by length)."""
    lens = list(map(len, texts))
    if sum(lens) <= budget:
        return texts
    out = list(texts)
    remaining, pending = budget, sorted(range(len(texts)), key=lens.__getitem__)
    k = 0
    while k < len(pending):
        share = remaining // (len(pending) - k)
        i = pending[k]
        if lens[i] <= share:
            remaining -= lens[i]
            k += 1
            continue
        for j in pending[k:]:
            out[j] = texts[j][:share]
        break
    return out


@pytest.mark.parametrize("seed", range(6))
def test_even_sample_equals_the_sample_by_sorted_indices(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(60):
        n = rnd.randint(0, 60)
        texts = ["".join(rnd.choice("ab 结/") for _ in range(rnd.choice((0, 1, 5, rnd.randint(0, 400)))))
                 for _ in range(n)]
        total = sum(map(len, texts))
        for budget in (0, 1, total // 3, total // 2, max(0, total - 1), total, total + 5, rnd.randint(0, total + 1)):
            assert _even_sample(texts, budget) == _even_sample_as_before(texts, budget)
