"""``session/export`` reads a session a page at a time (SPEC §9: memory bounded by the largest
node): the ledger's skeleton of the session (no texts, never cached) decides what is written,
and each node is read whole, a page at a time, only for its own lines. The file is byte for
byte the one written from the whole session graph, on both backends."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dagctx.engine.exports import ClaudeCodeExport
from dagctx.ledger import Store
from dagctx.ledger.store import SKELETON_DROPS, pages_of
from dagctx.protocol.nodes import NodeInput
from dagctx.transcripts.base import loaded

from conftest import parsed_file, require_corpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"


@pytest.fixture
def store(database: str):
    s = Store(database)
    yield s
    s.close()


def _import(store: Store, path: Path) -> list[str]:
    sids = []
    for k, t in enumerate(parsed_file(path)):
        info, created = store.import_session(source_key=f"{t.format}:{t.source_key}:{k}", title=t.title,
                                             nodes=(loaded(n) for n in t.nodes), head=t.head,
                                             metadata={"importedFrom": t.format})
        assert created
        sids.append(info.session_id)
    return sids


def _export(store: Store, sid: str, head: str, all_branches: bool, paged: bool, budget: int = 300) -> bytes:
    import msgspec

    out: list[bytes] = []
    emit = lambda line: out.append(msgspec.json.encode(line) + b"\n")  # noqa: E731
    info = store.get_session(sid)
    if paged:
        graph, sizes = store.skeleton(sid, budget=budget)
        exp = ClaudeCodeExport(SimpleNamespace(store=store), info, graph, head, emit, all_branches=all_branches,
                               sizes=sizes)
        import dagctx.ledger.store as st

        real = st.NodePages.__init__

        def small(self, *a, **kw):  # pages of a few hundred bytes: many pages for a small session
            kw["budget"] = budget
            real(self, *a, **kw)

        st.NodePages.__init__ = small  # type: ignore[method-assign]
        try:
            exp.build()
        finally:
            st.NodePages.__init__ = real  # type: ignore[method-assign]
    else:
        exp = ClaudeCodeExport(SimpleNamespace(store=store), info, store.graph(sid), head, emit,
                               all_branches=all_branches)
        exp.build()
    return b"".join(out)


FIXTURE_SOURCES = [FIXTURES / "claude-code/fx-cc.jsonl", FIXTURES / "codex/rollout-fx.jsonl",
                   FIXTURES / "openclaw/fx-openclaw.jsonl", FIXTURES / "swe-agent/fx.traj"]


def test_an_export_read_a_page_at_a_time_is_the_export_of_the_whole_graph(store: Store) -> None:
    """Every fixture, exported from the skeleton with nodes read in pages of 300 stored
    bytes, is the export of the whole cached graph, byte for byte, one branch and every
    branch."""
    _paged_equals_whole(store, FIXTURE_SOURCES)


@pytest.mark.slow  # a corpus-wide sweep (a third of a second): the slow tier, beside the daemon tests
def test_every_corpus_export_read_a_page_at_a_time_is_the_export_of_the_whole_graph(store: Store) -> None:
    """The same for the corpus's Claude Code and Codex sessions (DAGCTX_CORPUS; required
    under CI=true)."""
    root = require_corpus()
    paths = sorted((root / "claude-code").glob("*.jsonl")) + sorted((root / "codex").glob("*.jsonl"))
    assert paths
    _paged_equals_whole(store, paths)


def _paged_equals_whole(store: Store, paths: list[Path]) -> None:
    for path in paths:
        for sid in _import(store, path):
            head = store.get_session(sid).head
            for all_branches in (False, True):
                store.evict(sid)
                paged = _export(store, sid, head, all_branches, paged=True)
                assert sid not in {s for s, _, _ in store.cached_graphs()}, path  # the skeleton is not cached
                whole = _export(store, sid, head, all_branches, paged=False)
                assert paged == whole and paged.count(b"\n") > 2, (path, all_branches)


def test_a_skeleton_holds_no_text_and_is_read_in_pages(store: Store) -> None:
    """``Store.skeleton``: every node with its edges and metadata, none of its texts, not
    cached; ``nodes_of`` reads nodes whole; ``pages_of`` cuts runs within the budget."""
    nodes = [NodeInput(role="user", id="u0", output="q " * 100, predecessor="ROOT"),
             NodeInput(role="llm", id="l0", name="m", output="a " * 100, predecessor="u0",
                       metadata={"thinking": "t " * 100, "reasoning": [{"type": "thinking", "text": "t"}], "k": 1}),
             NodeInput(role="code", id="c0", name="sh", input={"cmd": "ls"}, output="o " * 100, caller="l0")]
    info, _ = store.import_session(source_key="t:1", title="t", nodes=iter(nodes), head="l0")
    g, sizes = store.skeleton(info.session_id, budget=10)
    assert info.session_id not in {s for s, _, _ in store.cached_graphs()}
    assert [n.id for n in g.by_seq][1:] == ["u0", "l0", "c0"] and g.callees["l0"] == ["c0"]
    for n in g.by_seq:
        assert n.input is None and n.output is None and not set(SKELETON_DROPS) & set(n.metadata)
    assert g.nodes["l0"].metadata["k"] == 1 and set(sizes) == set(g.nodes) and min(sizes.values()) > 0
    whole = store.nodes_of(info.session_id, ["c0", "l0"])
    assert whole["c0"].input == {"cmd": "ls"} and whole["l0"].metadata["thinking"] == "t " * 100
    assert list(pages_of([("a", 5), ("b", 5), ("c", 20), ("d", 1)], 10)) == [["a", "b"], ["c"], ["d"]]
    assert list(pages_of([(str(i), 0) for i in range(5)], 10, most=2)) == [["0", "1"], ["2", "3"], ["4"]]
