"""The character counts of a node's texts, measured when it is written and kept beside its
token counts (``NodeDerived.chars``), are the counts measuring the texts again gives; the
estimate read off them is the estimate of the text; and a compaction that takes them
(its transcript's entries, SPEC §8) gives the very result one that measures every body
gives — on rows written without them (older rows), on a fresh daemon, on both backends."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.context.char_classes import (NO_CLASSES, char_classes, classes_from_stored, estimate_of_classes,
                                         stored_classes)
from dagctx.context.summary_transcript import Transcript, item_body
from dagctx.context.tokens import ESTIMATE, estimate_tokens
from dagctx.engine import compaction_pipeline
from dagctx.engine.compaction_pipeline import compact
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.ledger import NodeDerived
from dagctx.ledger.backend import CHARS_KEY
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput
from sampling_peers import Summarizer

MODEL = "gpt-4o"

#: texts of every kind the counts tell apart: ASCII, CJK letters and punctuation, fullwidth
#: forms, other non-ASCII, kana past U+1B000 (counted by the regular expressions), short
#: and long ones, and the empty text
TEXTS = [
    "",
    "plain ASCII output of a tool\n" * 3,
    "修复 src/mod.py 中的错误，然后运行测试。",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ、「引用」" * 20,
    "naïve café — déjà vu · Ωμέγα " * 10,
    "かな \U0001B001\U0001B150 カナ " * 40,
    "한국어 텍스트와 ascii 섞임 " * 30,
    "x" * 5000 + "结果" * 3000,
]


def _engine(database: str, peer: Any = None) -> EngineCore:
    e = EngineCore(DaemonConfig(database=database), peer=peer)
    e.initialize(m.InitializeParams())
    return e


def _nodes(turns: int) -> list[NodeInput]:
    """A session of mostly-CJK turns with tool calls (JSON inputs, text outputs)."""
    out: list[NodeInput] = []
    head = None
    for i in range(turns):
        u = NodeInput(id=f"u{i}", role="user", output=f"第 {i} 轮：修复 src/mod_{i}.py，端口 80{i:02d}。",
                      predecessor=head or "ROOT")
        a = NodeInput(id=f"a{i}", role="llm", name=MODEL, output=f"正在读取 src/mod_{i}.py（第 {i} 轮）。",
                      predecessor=u.id)
        body = "\n".join(f"def f_{i}_{k}(x): return x + {k}  # 结果「{k}」，见 ｆｉｌｅ_{k}" for k in range(150))
        t = NodeInput(id=f"t{i}", role="code", name="read_file", input={"path": f"src/mod_{i}.py", "说明": "读取"},
                      output=body, caller=a.id, metadata={"toolCallId": f"call_{i}"})
        d = NodeInput(id=f"d{i}", role="llm", name=MODEL, output=f"src/mod_{i}.py 已完成。", predecessor=a.id)
        out += [u, a, t, d]
        head = d.id
    return out


def _write(database: str, nodes: list[NodeInput], *, keep_chars: bool) -> tuple[str, str]:
    """The session written through the store with what ``derive_node`` derives; without the
    character counts when not ``keep_chars`` (as rows written before they were kept)."""
    e = _engine(database)
    store = e.store
    sid = store.create_session("chars").session_id
    root = store.head(sid)
    nodes = [msgspec.structs.replace(n, predecessor=root) if n.predecessor == "ROOT" else n for n in nodes]
    derived = {n.id: e.derive_node(n.role, n.input, n.output, n.name) for n in nodes}
    if not keep_chars:
        derived = {k: NodeDerived(tokens=d.tokens, refs=d.refs) for k, d in derived.items()}
    store.append_many(sid, nodes, head=nodes[-1].id, derived=derived)
    e.close()
    return sid, nodes[-1].id


def _compact(database: str, sid: str) -> tuple[c.CompactResult, list[str], Any]:
    peer = Summarizer()
    e = _engine(database, peer)
    res = asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=2000)))
    node = e.store.get_nodes(sid, [res.summary_id])[0] if res.summary_id else None
    e.close()
    return res, peer.requests, node


def _comparable(res: c.CompactResult, node: Any) -> str:
    """What a compaction gives, without what differs between any two runs (its duration,
    the new node's random id and time, the session's root id)."""
    got = (res.ok, res.reason, res.tokens_before, res.tokens_after, res.covers_ids, res.summarised_count,
           res.identifier_retention, node.output, node.metadata, node.reads, node.predecessor)
    return re.sub(r"root-[0-9a-f-]{36}", "ROOT", msgspec.json.encode(got).decode())


# ------------------------------------------------------------------ at write


@pytest.mark.parametrize("text", TEXTS)
def test_stored_counts_are_the_measured_counts_and_give_the_estimate(fresh_sqlite: Path, text: str) -> None:
    e = _engine(str(fresh_sqlite))
    for role, input, output in (("llm", None, text), ("user", text, None), ("code", {"q": text}, text)):
        d = e.derive_node(role, input, output, "tool")
        assert d.chars is not None
        got_in, got_out = classes_from_stored(d.chars)
        assert got_out == (char_classes(output) if isinstance(output, str) else NO_CLASSES)
        assert got_in == (char_classes(input) if isinstance(input, str) else NO_CLASSES)
        # the estimate stored is the estimate of the text, whether read off the counts or not
        assert d.tokens is not None
        assert d.tokens[ESTIMATE] == (e.counter.count_value(input, ESTIMATE), e.counter.count_value(output, ESTIMATE))
        if isinstance(output, str):
            assert estimate_of_classes(got_out) == estimate_tokens(output) == d.tokens[ESTIMATE][1]
        # every other tokenizer's counts are as counting each value gives
        for tok, (tin, tout) in d.tokens.items():
            assert (tin, tout) == (e.counter.count_value(input, tok), e.counter.count_value(output, tok))
    e.close()


def test_counts_that_do_not_fit_are_not_kept() -> None:
    assert stored_classes(None, None) is None
    assert stored_classes((1 << 32, 0, 0, 0), None) is None
    assert classes_from_stored(b"\x00" * 31) is None
    kept = stored_classes(None, (5, 4, 3, 2))
    assert kept is not None and classes_from_stored(kept) == (NO_CLASSES, (5, 4, 3, 2))


def test_kept_in_the_token_counts_row_on_each_backend(database: str) -> None:
    nodes = _nodes(3)
    sid, _ = _write(database, nodes, keep_chars=True)
    e = _engine(database)
    chars: dict[str, bytes] = {}
    tokens = e.store.token_counts(sid, ESTIMATE, chars=chars)
    assert tokens == e.store.token_counts(sid, ESTIMATE)  # the counts read as without them
    for n in nodes:
        kept = classes_from_stored(chars[n.id])
        assert kept is not None
        assert kept == tuple(char_classes(v) if isinstance(v, str) else NO_CLASSES for v in (n.input, n.output))
    # what a view reads: the same, forgotten for nothing
    assert e.views.node_chars(e.store.graph(sid)) == chars
    e.close()


def test_a_running_node_is_measured_and_its_finished_output_kept(fresh_sqlite: Path) -> None:
    """The one mutation fills a running node's output: the counts kept are then the
    finished output's, and a view that read the running row forgets them when its graph
    sees the update."""
    e = _engine(str(fresh_sqlite))
    sid = e.store.create_session("running").session_id
    head = e.store.head(sid)
    u = asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(
        role="user", output="启动", predecessor=head)))).node
    a = asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(
        role="llm", name=MODEL, output="调用工具", predecessor=u.id)))).node
    t = asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(
        role="code", name="bash", input={"cmd": "ls"}, output="进行中…", status="running", caller=a.id,
        metadata={"toolCallId": "c1"})))).node
    graph = e.store.graph(sid)
    e.views.node_tokens(graph, ESTIMATE)
    running = graph.nodes[t.id]
    known = e.views.body_classes(graph)
    assert known is not None
    from dagctx.context.view import Item
    item = Item(kind="tool_result", node_id=t.id, role="tool", seq=running.seq, text=running.output)
    assert known([item], [running.output]) == [None]  # running: measured
    done = "完成：文件列表\n" * 50
    asyncio.run(e.node_update(m.NodeUpdateParams(session_id=sid, node_id=t.id, status="completed", output=done)))
    graph = e.store.graph(sid)
    assert t.id not in e.views.node_chars(graph) or classes_from_stored(
        e.views.node_chars(graph)[t.id])[1] == char_classes(done)  # type: ignore[index]
    fresh = _engine(str(fresh_sqlite))
    g2 = fresh.store.graph(sid)
    finished = g2.nodes[t.id]
    item = Item(kind="tool_result", node_id=t.id, role="tool", seq=finished.seq, text=finished.output)
    known = fresh.views.body_classes(g2)
    assert known is not None and known([item], [finished.output]) == [char_classes(done)]
    # a body that is not the node's own text is never given counts, even of its length
    other = "完成：文件列表\n" * 49 + "完成：文件列表X"
    assert len(other) == len(done) and known([item], [other]) == [None]
    fresh.close()
    e.close()


# ------------------------------------------------------------------ in a compaction


def test_transcript_counts_are_the_same_taken_or_measured(fresh_sqlite: Path) -> None:
    sid, _ = _write(str(fresh_sqlite), _nodes(12), keep_chars=True)
    e = _engine(str(fresh_sqlite))
    graph = e.store.graph(sid)
    view = e.views.render(sid, fmt="neutral", model=MODEL, remember=False).view
    items = view.items
    known = e.views.body_classes(graph)
    assert known is not None
    bodies = [item_body(it) for it in items]
    given = known(items, bodies)
    assert sum(g is not None for g in given) >= len(items) // 2  # most bodies are their nodes' texts
    for body, got in zip(bodies, given):
        if got is not None:
            assert got == char_classes(body)
    taken, measured = Transcript(known=known), Transcript()
    assert taken.classes_of(items) == measured.classes_of(items)
    assert taken.estimates(items) == measured.estimates(items)
    e.close()


def test_compaction_is_the_same_with_and_without_kept_counts(tmp_path: Path, fresh_sqlite: Path) -> None:
    nodes = _nodes(40)
    with_path = tmp_path / "with.db"
    shutil.copyfile(fresh_sqlite, with_path)
    sid_with, _ = _write(str(with_path), nodes, keep_chars=True)
    sid_without, _ = _write(str(fresh_sqlite), nodes, keep_chars=False)
    # the rows differ only by the counts
    e = _engine(str(fresh_sqlite))
    assert e.views.node_chars(e.store.graph(sid_without)) == {}
    assert e.views.body_classes(e.store.graph(sid_without)) is None
    e.close()
    asked: list[Any] = []
    real = compaction_pipeline.summarizer_input.Transcript

    def spy(known: Any = None) -> Transcript:
        asked.append(known)
        return real(known=known)

    compaction_pipeline.summarizer_input.Transcript = spy  # type: ignore[assignment]
    try:
        res_with, sent_with, node_with = _compact(str(with_path), sid_with)
        res_without, sent_without, node_without = _compact(str(fresh_sqlite), sid_without)
    finally:
        compaction_pipeline.summarizer_input.Transcript = real  # type: ignore[assignment]
    assert asked[0] is not None and asked[1] is None  # taken, then measured
    assert res_with.ok and res_with.summary_id, res_with
    assert len(sent_with) > 1  # in stages: staging read the counts
    assert sent_with == sent_without
    assert _comparable(res_with, node_with) == _comparable(res_without, node_without)
    # the summary written keeps its counts as any node does
    e = _engine(str(with_path))
    kept = e.views.node_chars(e.store.graph(sid_with)).get(res_with.summary_id)
    assert kept is not None and classes_from_stored(kept)[1] == char_classes(node_with.output)  # type: ignore[index]
    e.close()


def test_compaction_is_the_same_from_a_warm_daemon(tmp_path: Path, fresh_sqlite: Path) -> None:
    """A daemon that read the counts for an earlier render, and one just started, compact
    alike (the kept counts are a cache of the ledger's, not of the daemon's memory)."""
    sid, _ = _write(str(fresh_sqlite), _nodes(40), keep_chars=True)
    cold_path = tmp_path / "cold.db"
    shutil.copyfile(fresh_sqlite, cold_path)
    peer = Summarizer()
    warm = _engine(str(fresh_sqlite), peer)
    warm.views.render(sid, fmt="neutral", model=MODEL)  # reads the token rows (and the counts)
    res_warm = asyncio.run(compact(warm, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=2000)))
    node_warm = warm.store.get_nodes(sid, [res_warm.summary_id])[0]
    warm.close()
    res_cold, sent_cold, node_cold = _compact(str(cold_path), sid)
    assert res_warm.ok
    assert peer.requests == sent_cold
    assert _comparable(res_warm, node_warm) == _comparable(res_cold, node_cold)


def test_the_counts_key_is_no_tokenizer(fresh_sqlite: Path) -> None:
    e = _engine(str(fresh_sqlite))
    assert CHARS_KEY not in e.tokenizers() and CHARS_KEY.startswith(":")
    e.close()
