"""``session/export`` in the ``openai`` format streams (SPEC §9): the branch is walked on the
session's skeleton, a segment of turns at a time, and each message is written as it is made —
and the file is byte for byte the document the whole render made (``context/render`` of the
head in the OpenAI format, ``indent=2``, a trailing newline), on both backends: every
transcript fixture, every corpus session, and a session made to hold every shape a render
knows (branches, a summary, tool call groups whose results straddle a segment's end,
retries, renamed duplicate ids, exposed insides, text pairs, images, unfinished calls)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from dagctx.context.formats._assembly import Assembler, assemble
from dagctx.context.render import render_view
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.engine.export_openai import OpenAIExport
from dagctx.engine.exports import session_export
from dagctx.ledger.graph import is_summary
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import SUMMARY_MARKER, SUMMARY_NAME, SYSTEM_PROMPT_NAME, NodeInput
from dagctx.transcripts.base import UNKNOWN_MODEL, loaded

from conftest import parsed_file, require_corpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
_enc = msgspec.json.Encoder()


@pytest.fixture
def engine(database: str) -> Iterator[EngineCore]:
    e = EngineCore(DaemonConfig(database=database))
    e.initialize(m.InitializeParams())
    yield e
    e.close()


def _whole(e: EngineCore, sid: str, head: str) -> tuple[bytes, int]:
    """The export as it was made before it streamed: the whole render, formatted whole."""
    chain = e.store.graph(sid).chain(head)
    model = next((n.name for n in reversed(chain) if n.role == "llm" and n.name and n.name != UNKNOWN_MODEL), None)
    r = e.views.render(sid, head=head, fmt="openai", model=model, remember=False)
    doc = {"model": model or r.model.name, "messages": r.messages}
    return msgspec.json.format(_enc.encode(doc), indent=2) + b"\n", len(r.messages)


def _streamed(e: EngineCore, sid: str, head: str, budget: int) -> tuple[bytes, OpenAIExport]:
    graph, sizes = e.store.skeleton(sid, budget=budget)
    chain = graph.chain(head)
    model = next((n.name for n in reversed(chain) if n.role == "llm" and n.name and n.name != UNKNOWN_MODEL),
                 None) or e.models.get(e.options.default_model).name
    exp = OpenAIExport(e.store, sid, graph, sizes, head, model, budget=budget)
    parts: list[bytes] = []
    count = exp.write(parts.append)
    assert count == exp_lines(parts)
    return b"".join(parts), exp


def exp_lines(parts: list[bytes]) -> int:
    return len(msgspec.json.decode(b"".join(parts))["messages"])


def _heads(e: EngineCore, sid: str) -> list[str]:
    g = e.store.graph(sid)
    heads = [e.store.get_session(sid).head]
    heads += [t for t in g.tips() if t not in heads and t in g.nodes and g.is_conversation(g.nodes[t])
              and not is_summary(g.nodes[t]) and t != g.root_id]
    return heads


def _same(e: EngineCore, sid: str, heads: list[str], budget: int = 300) -> int:
    """Streamed == whole for each head; how many segments the streamed exports had."""
    segments = 0
    for head in heads:
        e.store.evict(sid)
        streamed, exp = _streamed(e, sid, head, budget)
        assert sid not in {s for s, _, _ in e.store.cached_graphs()}  # the skeleton is never cached
        whole, lines = _whole(e, sid, head)
        assert streamed == whole, (sid, head)
        assert exp.read_alone == 0, (sid, head)  # every node a segment shows was read with it
        segments += exp.segments
        # and through the handler: the same bytes, the same count, a newline at the end
        got = session_export(e, c.ExportParams(session_id=sid, format="openai", head=head))
        assert got.content is not None and got.content.encode("utf-8") == whole and got.lines == lines
    return segments


def _import(e: EngineCore, path: Path) -> list[str]:
    sids = []
    for k, t in enumerate(parsed_file(path)):
        info, created = e.store.import_session(source_key=f"{t.format}:{t.source_key}:{k}", title=t.title,
                                               nodes=(loaded(n) for n in t.nodes), head=t.head,
                                               metadata={"importedFrom": t.format})
        assert created
        sids.append(info.session_id)
    return sids


FIXTURE_FILES = ["claude-code/fx-cc.jsonl", "codex/rollout-fx.jsonl", "openclaw/fx-openclaw.jsonl",
                 "openhands/fx-events.json", "sharegpt/fx-array.json", "sharegpt/fx.jsonl", "swe-agent/fx.traj"]


def test_every_fixture_streams_the_bytes_of_the_whole_render(engine: EngineCore) -> None:
    """Each transcript fixture, exported in segments of 300 stored bytes (many segments for
    each), is the whole render's document byte for byte, for HEAD and every branch tip."""
    for name in FIXTURE_FILES:
        for sid in _import(engine, FIXTURES / name):
            assert _same(engine, sid, _heads(engine, sid)) > 1, name


@pytest.mark.slow  # a corpus-wide sweep (a second and more): the slow tier, beside the daemon tests
def test_every_corpus_session_streams_the_bytes_of_the_whole_render(engine: EngineCore) -> None:
    """Every session of the corpus (DAGCTX_CORPUS; required under CI=true), in segments of
    4 KiB, is the whole render's document byte for byte, for HEAD and every branch tip."""
    root = require_corpus()
    paths = sorted(p for p in root.rglob("*") if p.suffix in (".jsonl", ".json", ".traj") and p.is_file()
                   and "subagents" not in p.parts)
    assert paths
    done = 0
    for path in paths:
        try:
            sids = _import(engine, path)
        except Exception:  # noqa: BLE001 — a file no importer reads whole is no session of ours
            continue
        for sid in sids:
            _same(engine, sid, _heads(engine, sid), budget=4096)
            done += 1
    assert done >= len(paths) - 2, (done, paths)


def _shapes(e: EngineCore) -> tuple[str, list[str]]:
    """A session holding every shape a render knows; its conversation nodes."""
    big = "x" * 400
    n: list[NodeInput] = [
        NodeInput(role="code", id="sp1", name=SYSTEM_PROMPT_NAME, output="You are terse. " * 20),
        NodeInput(role="user", id="u1", output="question one " + big, predecessor="ROOT"),
        NodeInput(role="llm", id="l1", name="gpt-4o", output="calling " + big, caller="u1", predecessor="u1"),
        NodeInput(role="code", id="c1a", name="bash", input={"cmd": "ls"}, output="a\n" * 300, caller="l1",
                  metadata={"toolCallId": "t1"}),
        NodeInput(role="code", id="c1b", name="bash", input={"cmd": "cat"}, output="b " * 300, caller="l1",
                  metadata={"toolCallId": "t2"}),
        NodeInput(role="code", id="c1c", name="bash", input={"cmd": "cat"}, output="retry " * 100, caller="l1",
                  metadata={"toolCallId": "t2"}),  # a retry of t2: supersedes c1b
        NodeInput(role="llm", id="l1b", name="gpt-4o", output=None, caller="u1", predecessor="l1"),
        NodeInput(role="code", id="c2", name="grep", input="not json " + big, output=[
            {"type": "text", "text": "found " + big}, {"type": "image", "url": "https://e.invalid/i.png"}],
            caller="l1b", metadata={"toolCallId": "t1"}),  # t1 again: renamed t1_2
        NodeInput(role="code", id="c3", name="agent", input={"task": big}, output="done " + big, caller="l1b",
                  metadata={"toolCallId": "t3", "expose": "full"}),
        NodeInput(role="llm", id="c3l", name="gpt-4o", input="inner prompt " + big, output="inner reply " + big,
                  caller="c3"),
        NodeInput(role="code", id="c3c", name="read", input={"p": "a"}, output="inner tool " + big, caller="c3l",
                  metadata={"toolCallId": "t9"}),
        NodeInput(role="code", id="c4", name="hidden", input={"q": 1}, output="io only " + big, caller="l1b",
                  metadata={"toolCallId": "t4"}),
        NodeInput(role="code", id="c4i", name="deep", input={}, output="never shown " + big, caller="c4"),
        NodeInput(role="code", id="f1", name="fmt", input={"x": 1}, output="text pair " + big, caller="l1b"),
        NodeInput(role="user", id="u2", output=[{"type": "text", "text": "look " + big},
                                                 {"type": "image", "url": "https://e.invalid/2.png"}],
                  predecessor="l1b", metadata={"prepend_context": "ctx " + big}),
        NodeInput(role="llm", id="l2", name="gpt-4o", output="thinking only", caller="u2", predecessor="u2",
                  metadata={"reasoning": [{"type": "thinking", "text": "hmm " + big}]}),
        NodeInput(role="code", id="c5", name="slow", input={}, status="running", caller="l2",
                  metadata={"toolCallId": "t5"}),
        NodeInput(role="code", id="c6", name="boom", input={}, output="bad " + big, status="error", caller="l2",
                  metadata={"toolCallId": "t6"}),
        NodeInput(role="llm", id="l3", name="gpt-4o", output="partial " + big, status="error", caller="u2",
                  predecessor="l2", metadata={"error": "overloaded"}),
        NodeInput(role="llm", id="S1", name=SUMMARY_NAME, output=f"{SUMMARY_MARKER}\nfirst turn " + big,
                  predecessor="ROOT", metadata={"covers_ids": ["u1", "l1"], "head": "l3"}),
        NodeInput(role="code", id="sp2", name=SYSTEM_PROMPT_NAME, output=[{"type": "text", "text": "Second. " + big}]),
        NodeInput(role="user", id="u3", output="fork " + big, predecessor="l1b"),
        NodeInput(role="llm", id="l4", name="claude-x", output=None, caller="u3", predecessor="u3",
                  metadata={"reasoning": [{"type": "thinking", "text": "only thought"}]}),
        NodeInput(role="llm", id="l5", name="claude-x", output="after " + big, caller="u3", predecessor="l4"),
        NodeInput(role="code", id="c7", name="bash", input=None, output="", caller="l5",
                  metadata={"toolCallId": "t5"}),
        NodeInput(role="code", id="f2", name="fn", input={"y": 2}, output="fn out " + big, predecessor="l5"),
        NodeInput(role="user", id="u4", output="", predecessor="f2"),
        NodeInput(role="llm", id="l6", name=UNKNOWN_MODEL, output="last " + big, caller="u4", predecessor="u4"),
    ]
    info, created = e.store.import_session(source_key="shapes:1", title="shapes", nodes=iter(n), head="l3")
    assert created
    g = e.store.graph(info.session_id)
    return info.session_id, [x.id for x in g.by_seq if g.is_conversation(x) and not is_summary(x)
                             and x.id != g.root_id]


@pytest.mark.parametrize("budget", [1, 300, 2000, 1 << 20])
def test_a_session_of_every_shape_streams_the_bytes_of_the_whole_render(engine: EngineCore, budget: int) -> None:
    """Every conversation node of the made session as head (the summary applies on one
    branch, not the other; a tool call group's results are read in the segments after its
    call; a retry, a renamed duplicate id, a synthetic result, exposed insides), in segments
    of one node up to the whole session: the whole render's bytes."""
    sid, heads = _shapes(engine)
    r = engine.views.render(sid, head="l3", fmt="openai", remember=False)
    assert r.view.summary_id == "S1" and r.messages[0]["content"].startswith("You are terse.")
    assert engine.views.render(sid, head="l6", fmt="openai", remember=False).messages[0]["content"].startswith(
        "Second.")
    r = engine.views.render(sid, head="l1b", fmt="openai", remember=False)
    repairs = r.record.manifest["repairs"]
    assert r.view.summary_id is None and any("renamed" in x for x in repairs)
    assert any("supersedes" in x for x in repairs)
    segments = _same(engine, sid, heads, budget)
    # one segment per export when the whole session fits the budget, more otherwise
    assert segments == len(heads) if budget == 1 << 20 else segments > 2 * len(heads)


def test_an_empty_branch_and_the_default_model(engine: EngineCore) -> None:
    """A session with no turns exports ``[]`` messages under the daemon's default model."""
    info = engine.store.create_session("empty")
    _same(engine, info.session_id, [info.head])
    u = engine.store.import_session(source_key="one:1", title="one", nodes=iter(
        [NodeInput(role="user", id="q", output="hi", predecessor="ROOT")]), head="q")[0]
    _same(engine, u.session_id, ["q"], budget=1)


def test_the_assembler_fed_in_pieces_is_assemble() -> None:
    """``Assembler`` fed a view an item at a time, taking what is ``ready`` after each, makes
    the messages and repairs ``assemble`` makes of the whole view."""
    from dagctx.ledger.graph import SessionGraph
    from dagctx.protocol.nodes import Call

    g = SessionGraph("s", "root")
    g.add(Call(id="root", seq=0, created_at=0.0, role="user", metadata={"display": "root"}))
    seq = 0

    def add(**kw) -> None:
        nonlocal seq
        seq += 1
        g.add(Call(seq=seq, created_at=float(seq), **kw))

    add(id="u", role="user", output="q", caller="root", predecessor="root")
    add(id="l", role="llm", name="m", output="a", caller="u", predecessor="u")
    for k in range(3):
        add(id=f"t{k}", role="code", name="x", input={}, output=f"r{k}", caller="l", metadata={"toolCallId": "dup"})
        add(id=f"s{k}", role="code", name="y", input={}, output="s", caller="l", metadata={"toolCallId": f"i{k}"})
    add(id="l2", role="llm", name="m", output=None, caller="u", predecessor="l")
    add(id="t9", role="code", name="x", input={}, output="r", caller="l2", metadata={"toolCallId": "i0"})
    view = render_view(g, "l2")
    whole, repairs = assemble(view)
    a = Assembler(repairs=list(view.repairs))
    got = []
    for it in view.items:
        a.feed([it])
        got += a.ready()
    got += a.finish()
    assert got == whole and a.repairs == repairs and any("renamed" in x for x in repairs)


def test_an_answer_text_counts_what_the_answer_carries() -> None:
    """``AnswerText`` (an export without ``path``) counts each piece as the answer's JSON
    string carries it, escapes included, and stops past the limit less the envelope's room,
    dropping what it kept; without a limit (in process) it keeps everything."""
    from dagctx.engine.export_sinks import ENVELOPE_ROOM, AnswerText
    from dagctx.protocol.errors import DagctxError

    a = AnswerText(5000, "openai")
    piece = '"\n\x01'.encode() * 400 + "é".encode() * 100  # 1,400 raw bytes, 4,200 as a JSON string
    with pytest.raises(DagctxError):
        a.write(piece)
    a = AnswerText(10_000, "openai")
    a.write(piece)
    assert a.size == 400 * (2 + 2 + 6) + 200 and a.text().encode() == piece
    a = AnswerText(5000, "openai")
    a.write(b'"' * ((5000 - ENVELOPE_ROOM) // 2))
    with pytest.raises(DagctxError) as exc:
        a.write(b"x")
    assert exc.value.kind == "ResponseTooLarge" and "`path`" in exc.value.message and not a.parts
    assert exc.value.details == {"bytes": 5000 - ENVELOPE_ROOM + 1, "limit": 5000}
    b = AnswerText(None, "openai")
    b.write(b"x" * 10**6)
    assert b.size == 0 and b.text() == "x" * 10**6
