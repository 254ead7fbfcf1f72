"""The validation counts a long summary in a thread of its own while it checks the
coverage and renders the candidate (``compaction_pipeline._Count``). A compaction so
done sends the same requests, answers the same result and writes the same node, with
the same stored counts, as one that counts the summary in line; the coverage check it
runs meanwhile still refuses a summary of turns it never saw, after a retry too."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.context import summarizer_input
from dagctx.context.references import extract_references
from dagctx.engine import compaction_pipeline
from dagctx.engine.compaction_pipeline import compact
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import NodeInput

MODEL = "gpt-4o"


class Summarizer:
    """Answers with every identifier it was shown; with ``drop_first`` its first answer
    keeps none (the fidelity gate then asks again, listing them)."""

    can_sample = True

    def __init__(self, drop_first: bool = False) -> None:
        self.prompts: list[tuple[str | None, list[str]]] = []
        self.drop_first = drop_first

    def notify(self, method: str, params: Any) -> None:
        pass

    def progress(self, token: Any, value: Any) -> None:
        pass

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        texts = [msg.content.text for msg in params.messages]
        self.prompts.append((params.system_prompt, texts))
        if self.drop_first and len(self.prompts) == 1:
            return c.CreateMessageResult(content=c.SamplingContent(text="Summary. Work went on."), model="t")
        text = "\n".join(texts)
        shown = re.findall(r"<(conversation|new-messages|previous-summary)>\n(.*?)\n</\1>", text, re.S)
        refs = sorted(extract_references("\n".join(b for _, b in shown) if shown else text))
        return c.CreateMessageResult(content=c.SamplingContent(text="Summary 摘要. " + ", ".join(refs)), model="t")


def _engine(path: Path, peer: Any = None) -> EngineCore:
    e = EngineCore(DaemonConfig(database=str(path)), peer=peer)
    e.initialize(m.InitializeParams(initialization_options=m.InitializationOptions()))
    return e


def _append(e: EngineCore, sid: str, **kw: Any) -> str:
    return asyncio.run(e.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw)))).node.id


def _built(tmp_path: Path, turns: int = 12) -> tuple[Path, str]:
    path = tmp_path / "built" / "c.db"
    path.parent.mkdir()
    e = _engine(path)
    sid = e.store.create_session("count-beside").session_id
    head = e.store.head(sid)
    for i in range(turns):
        u = _append(e, sid, role="user", output=f"turn {i}: 修复 src/mod_{i}.py, port 80{i:02d}", predecessor=head)
        head = _append(e, sid, role="llm", name=MODEL, output=f"Reading src/mod_{i}.py — turn {i}.", predecessor=u)
        body = "\n".join(f"def f_{i}_{k}(x): return x + {k * 7 % 1000}  # 结果 {k}" for k in range(60 + i))
        _append(e, sid, role="code", name="read_file", input={"path": f"src/mod_{i}.py"}, output=body,
                caller=head, metadata={"toolCallId": f"call_{i}"})
        head = _append(e, sid, role="llm", name=MODEL, output=f"Done with src/mod_{i}.py.", predecessor=head)
    e.close()
    return path, sid


def _copy(built: Path, tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    for f in built.parent.iterdir():
        shutil.copyfile(f, d / f.name)
    return d / "c.db"


def _observed(path: Path, sid: str, peer: Summarizer) -> tuple[Any, ...]:
    e = _engine(path, peer)
    res = asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=400)))
    fields = msgspec.to_builtins(res)
    fields.pop("durationMs", None)
    fields.pop("summaryId", None)
    written = stored = None
    if res.summary_id:
        node = e.store.graph(sid).nodes[res.summary_id]
        written = (node.role, node.name, node.output, node.predecessor, node.reads, node.metadata)
        tokenizer = e.counter.tokenizer_for(MODEL)
        stored = e.store.token_counts(sid, tokenizer)[res.summary_id]
        # what the store keeps is the summary's count afresh
        assert stored == (0, e.counter.count(node.output, tokenizer))
    e.close()
    return peer.prompts, fields, written, stored


@pytest.mark.parametrize("drop_first", [False, True])
def test_counting_beside_gives_what_counting_in_line_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           drop_first: bool) -> None:
    built, sid = _built(tmp_path)
    threads: list[int] = []
    start = compaction_pipeline._Count.start

    def counted_start(self: Any) -> None:
        threads.append(1)
        start(self)

    monkeypatch.setattr(compaction_pipeline._Count, "start", counted_start)
    monkeypatch.setattr(compaction_pipeline, "COUNT_BESIDE_CHARS", 1)  # every summary beside
    beside = _observed(_copy(built, tmp_path, "beside"), sid, Summarizer(drop_first))
    assert threads == [1] * (2 if drop_first else 1)  # one count per validation
    monkeypatch.setattr(compaction_pipeline, "COUNT_BESIDE_CHARS", 10**12)  # none
    in_line = _observed(_copy(built, tmp_path, "in-line"), sid, Summarizer(drop_first))
    assert len(threads) == (2 if drop_first else 1)
    assert beside[1]["ok"] is True and beside[2] is not None
    assert len(beside[0]) == (2 if drop_first else 1)
    assert beside == in_line


@pytest.mark.parametrize("drop_first", [False, True])
def test_coverage_checked_beside_still_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               drop_first: bool) -> None:
    built, sid = _built(tmp_path)
    monkeypatch.setattr(compaction_pipeline, "COUNT_BESIDE_CHARS", 1)
    asked: list[int] = []

    def never_covered(plan: Any, sent: Any, transcript: Any = None) -> bool:
        asked.append(len(sent))
        return False

    monkeypatch.setattr(summarizer_input, "covered_in_input", never_covered)
    path = _copy(built, tmp_path, "refused")
    peer = Summarizer(drop_first)
    e = _engine(path, peer)
    before = len(e.store.graph(sid).nodes)
    res = asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=400)))
    assert not res.ok and res.reason == "failed" and res.summary_id is None
    assert "a covered turn was not in the summarizer input" in (res.error or "")
    assert len(e.store.graph(sid).nodes) == before  # nothing written
    # checked on every request sent, the retry included
    assert asked[-1] == len(peer.prompts) == (2 if drop_first else 1)
    e.close()


@pytest.mark.parametrize("drop_first", [False, True])
def test_fidelity_terms_found_once_while_the_summary_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                drop_first: bool) -> None:
    """The fidelity terms are found by the first validation, after the summarizer
    answered, once for the compaction (a retry's validation checks the same ones), and
    the written node carries them."""
    from dagctx.context import summary_check

    built, sid = _built(tmp_path)
    monkeypatch.setattr(compaction_pipeline, "COUNT_BESIDE_CHARS", 1)  # the summary counted beside
    peer = Summarizer(drop_first)
    found: list[tuple[int, list[str]]] = []
    terms = summary_check.fidelity_terms

    def recorded(plan: Any, *args: Any, **kw: Any) -> list[str]:
        got = terms(plan, *args, **kw)
        found.append((len(peer.prompts), got))
        return got

    monkeypatch.setattr(summary_check, "fidelity_terms", recorded)
    e = _engine(_copy(built, tmp_path, "terms"), peer)
    res = asyncio.run(compact(e, c.CompactParams(session_id=sid, model=MODEL, keep_recent_tokens=400)))
    assert res.ok and res.summary_id
    # once, after the first answer (the retry, when there is one, was asked after it)
    assert len(found) == 1 and found[0][0] == 1 and len(peer.prompts) == (2 if drop_first else 1)
    stats = e.store.graph(sid).nodes[res.summary_id].metadata["stats"]
    assert stats["identifiersChecked"] == found[0][1] and len(found[0][1]) >= 5
    e.close()
