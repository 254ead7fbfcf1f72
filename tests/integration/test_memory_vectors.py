"""Hybrid memory search through the real daemon on both backends (SPEC §5.1): the local
static embedding model (weights from the installed ``wordllama`` package, nothing
downloaded), vectors stored in the ledger per model, a paraphrase that keyword search
cannot find, a model change that re-embeds, and an OpenAI-compatible endpoint that is
down or answers the wrong dimension."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError
from memory_support import client  # noqa: F401 - the fixture is used by name
from memory_support import workspace as make_workspace

pytestmark = [pytest.mark.slow]
pytest.importorskip("wordllama", reason="the local embedding model ships in the wordllama package (dagctx[embed])")


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database and
    workspace): the embedding model loads once, not once per test."""

PARAPHRASE = "We settled on least-recently-used for evicting entries from the store, capped at 256 MiB."


def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path, {
        "MEMORY.md": "# Memory\n\nThe user prefers tabs over spaces.\n",
        "memory/store.md": f"# Store\n\n{PARAPHRASE}\n",
        "memory/deploy.md": "# Deploy\n\nDeploys go out on Tuesdays after the freeze.\n",
        "memory/infra.md": "# Infra\n\nEverything runs on kubernetes since March.\n",
    })


class EmbeddingStub:
    """A loopback OpenAI-compatible /v1/embeddings: deterministic vectors from word hashes."""

    def __init__(self, dims: int = 256) -> None:
        self.dims = dims
        self.calls = 0
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.calls += 1
                data = []
                for i, text in enumerate(body["input"]):
                    v = [0.0] * stub.dims
                    for w in text.lower().split():
                        v[int(hashlib.sha1(w.encode()).hexdigest(), 16) % stub.dims] += 1.0
                    data.append({"object": "embedding", "index": i, "embedding": v})
                out = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[EmbeddingStub]:
    s = EmbeddingStub()
    yield s
    s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_paraphrase_is_found_by_vector_that_keywords_miss(client: DagctxClient, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    idx = await client.request("memory/index", {"workspace": str(ws)})
    assert idx.embedding == "local:wordllama-l2-supercat-256" and idx.embedded == idx.chunks == 4
    assert idx.complete and idx.vectors_missing == 0
    query = "what did we decide about the cache eviction policy?"
    fts = await client.request("memory/search", {"workspace": str(ws), "query": query, "mode": "fts"})
    assert fts.mode == "fts" and not any(h.path == "memory/store.md" for h in fts.hits), fts.hits
    hyb = await client.request("memory/search", {"workspace": str(ws), "query": query})
    assert hyb.mode == "hybrid" and hyb.embedding == "local:wordllama-l2-supercat-256"
    assert hyb.hits and hyb.hits[0].path == "memory/store.md", [(h.path, h.score) for h in hyb.hits]
    top = hyb.hits[0]
    assert top.text_score == 0 and top.vector_score and top.score == pytest.approx(0.7 * top.vector_score)
    # unrelated chunks are not vector candidates (below minVectorScore)
    assert all(h.path != "memory/infra.md" for h in hyb.hits)
    vec = await client.request("memory/search", {"workspace": str(ws), "query": query, "mode": "vector"})
    assert vec.mode == "vector" and vec.hits[0].path == "memory/store.md"
    # a keyword hit in hybrid mode scores text and vector together
    k = await client.request("memory/search", {"workspace": str(ws), "query": "kubernetes"})
    assert k.hits[0].path == "memory/infra.md" and k.hits[0].text_score > 0 and k.hits[0].vector_score
    assert k.hits[0].score == pytest.approx(0.3 * k.hits[0].text_score + 0.7 * k.hits[0].vector_score)
    # CJK in every mode: no error, keyword hits as before
    (ws / "memory" / "zh.md").write_text("我们决定把数据库迁移安排在周二。\n")
    await client.request("memory/index", {"workspace": str(ws)})
    for mode in ("auto", "fts", "hybrid", "vector"):
        r = await client.request("memory/search", {"workspace": str(ws), "query": "数据库迁移", "mode": mode})
        if mode != "vector":
            assert r.hits and r.hits[0].path == "memory/zh.md", (mode, r.hits)


async def test_hybrid_keeps_what_vector_search_finds_for_a_paraphrase(client: DagctxClient, tmp_path: Path) -> None:
    """A paraphrase query whose words each appear, alone, in unrelated notes: keyword search
    finds only those notes, vector search finds the answer, and hybrid search (the default
    weights) keeps the answer first — one accidental keyword does not outrank it (SPEC §5.1,
    the keyword coverage of a hit)."""
    ws = workspace(tmp_path)
    notes = {
        "ci.md": "The CI cache is keyed by the hash of the lockfile and restored before every build.",
        "browser.md": "Clear the browser cache when the login page shows a stale stylesheet.",
        "password.md": "The password policy requires twelve characters and a rotation every ninety days.",
        "review.md": "Our review policy: two approvals for anything that touches billing.",
        "office.md": "The eviction notice for the old office arrived in May; the movers come in June.",
    }
    for name, text in notes.items():
        (ws / "memory" / name).write_text(f"# {name}\n\n{text}\n")
    idx = await client.request("memory/index", {"workspace": str(ws)})
    assert idx.complete and idx.vectors_missing == 0 and idx.chunks == 9
    query = "what did we decide about the cache eviction policy?"
    base = {"workspace": str(ws), "query": query, "maxResults": 3}
    fts = await client.request("memory/search", {**base, "mode": "fts"})
    assert fts.keywords == ["cache", "eviction", "policy"]
    assert len(fts.hits) == 3 and all(h.path != "memory/store.md" for h in fts.hits), fts.hits
    vec = await client.request("memory/search", {**base, "mode": "vector"})
    assert vec.hits[0].path == "memory/store.md", [(h.path, h.score) for h in vec.hits]
    hyb = await client.request("memory/search", base)
    assert hyb.mode == "hybrid"
    assert hyb.hits[0].path == "memory/store.md", [(h.path, h.score, h.text_score) for h in hyb.hits]
    # each note holds one keyword of three: its keyword score counts a ninth of BM25's
    one = next(h for h in fts.hits if h.path in ("memory/ci.md", "memory/browser.md"))
    assert 0 < one.text_score < 1 / 9
    # a note holding all three keywords keeps its full keyword score and leads
    (ws / "memory" / "all.md").write_text("# all\n\nThe cache eviction policy of the CDN is set by the vendor.\n")
    await client.request("memory/index", {"workspace": str(ws)})
    both = await client.request("memory/search", base)
    assert both.hits[0].path == "memory/all.md" and both.hits[0].text_score > 1 / 9
    # the vectors a search keeps are read again after the re-index: the new note has one
    vec2 = await client.request("memory/search", {**base, "mode": "vector", "maxResults": 10})
    assert "memory/all.md" in [h.path for h in vec2.hits]
    assert "memory/store.md" in [h.path for h in both.hits]


async def test_incremental_embedding_and_a_model_change(client: DagctxClient, tmp_path: Path,
                                                        stub: EmbeddingStub) -> None:
    ws = workspace(tmp_path)
    first = await client.request("memory/index", {"workspace": str(ws)})
    assert first.embedded == 4
    again = await client.request("memory/index", {"workspace": str(ws)})
    assert again.embedded == 0 and again.complete, "nothing changed: nothing embedded again"
    (ws / "memory" / "deploy.md").write_text("# Deploy\n\nDeploys go out on Wednesdays now.\n")
    edit = await client.request("memory/index", {"workspace": str(ws)})
    assert edit.reindexed == 1 and edit.embedded == 1 and edit.complete
    # another model: every chunk is embedded with it; the local vectors stay for local searches
    endpoint = {"provider": "openai", "baseUrl": stub.url, "model": "stub-embed"}
    other = await client.request("memory/index", {"workspace": str(ws), "embedding": endpoint})
    assert other.embedding == f"openai:stub-embed@{stub.url}" and other.embedded == 4 and other.complete
    r = await client.request("memory/search", {"workspace": str(ws), "query": "kubernetes March", "embedding": endpoint})
    assert r.mode == "hybrid" and r.embedding == other.embedding and r.hits[0].path == "memory/infra.md"
    local = await client.request("memory/search", {"workspace": str(ws), "query": "kubernetes"})
    assert local.embedding == "local:wordllama-l2-supercat-256"


async def test_an_endpoint_down_or_of_the_wrong_dimension(client: DagctxClient, tmp_path: Path,
                                                         stub: EmbeddingStub) -> None:
    ws = workspace(tmp_path)
    down = {"provider": "openai", "baseUrl": f"http://127.0.0.1:{free_port()}/v1", "model": "m"}
    idx = await client.request("memory/index", {"workspace": str(ws), "embedding": down})
    # the files are indexed; the vectors are not, and the run does not claim to be complete
    assert idx.chunks == 4 and idx.embedded == 0 and idx.vectors_missing == 4 and not idx.complete
    assert "not reachable" in (idx.embedding_error or "")
    with pytest.raises(RpcError) as err:
        await client.request("memory/search", {"workspace": str(ws), "query": "cache", "embedding": down,
                                                "mode": "hybrid"})
    assert err.value.kind == "EmbeddingUnavailable"
    # keyword search is unaffected
    ok = await client.request("memory/search", {"workspace": str(ws), "query": "kubernetes", "mode": "fts"})
    assert ok.hits[0].path == "memory/infra.md"
    # a declared dimension the endpoint does not answer: nothing stored, a clear error
    wrong = {"provider": "openai", "baseUrl": stub.url, "model": "m", "dimensions": 32}
    idx = await client.request("memory/index", {"workspace": str(ws), "embedding": wrong})
    assert idx.embedded == 0 and idx.vectors_missing == 4 and not idx.complete
    assert "256 dimensions, expected 32" in (idx.embedding_error or ""), idx.embedding_error
    for bad, kind in [({"provider": "openai", "model": "m"}, "InvalidParams"),
                      ({"provider": "openai", "baseUrl": "ftp://x", "model": "m"}, "InvalidParams"),
                      ({"provider": "openai", "baseUrl": stub.url, "model": "m", "apiKeyEnv": "NO_SUCH_KEY_VAR"},
                       "InvalidParams")]:
        with pytest.raises(RpcError) as err:
            await client.request("memory/index", {"workspace": str(ws), "embedding": bad})
        assert err.value.kind == kind, (bad, err.value)
    st = await client.request("memory/status", {"workspace": str(ws)})
    assert st.chunks == 4


async def test_a_session_hit_is_its_nodes_best_chunk(client: DagctxClient, tmp_path: Path) -> None:
    """Sessions as a second source: a long node is chunked as a memory file is, and the hit is
    the chunk with the query's words, with its lines within the node."""
    ws = workspace(tmp_path)
    await client.request("memory/index", {"workspace": str(ws)})
    s = await client.session_create("long output")
    lines = [f"line {i}: routine build output, nothing to see" for i in range(1, 1201)]
    lines[899] = "line 900: the zeppelin migration finished with checksum 7f3a"
    node = await client.append(s.session_id, "user", output="\n".join(lines), predecessor=s.head)
    r = await client.request("memory/search", {"workspace": str(ws), "query": "zeppelin checksum",
                                               "sources": ["memory", "sessions"]})
    hit = next(h for h in r.hits if h.source == "sessions")
    assert hit.node_id == node.node.id and hit.session_id == s.session_id
    assert hit.start_line is not None and hit.start_line <= 900 <= hit.end_line
    assert hit.end_line - hit.start_line < 200 and "zeppelin migration" in hit.text
    assert hit.vector_score is not None


async def test_sessions_are_indexed_incrementally_and_searched_hybrid(client: DagctxClient) -> None:
    """Sessions as a source (SPEC §5.1): their nodes are chunked, indexed and embedded by the
    first search after an append — only what is new, a running node again once it finished —
    so a paraphrase finds a session node that keyword search cannot."""
    s = await client.session_create("ops")
    u = await client.append(s.session_id, "user", input="How should old entries leave the store once it is full?",
                            predecessor=s.head)
    a = await client.append(s.session_id, "llm", output=PARAPHRASE, predecessor=u.node.id)
    query = "what did we decide about the cache eviction policy?"
    base = {"query": query, "sources": ["sessions"], "maxResults": 3}
    fts = await client.request("memory/search", {**base, "mode": "fts"})
    assert any(n.startswith("sessions indexed now: 3 node(s) of 1 session(s)") for n in fts.notes), fts.notes
    assert not any(h.node_id == a.node.id for h in fts.hits), fts.hits
    hyb = await client.request("memory/search", base)
    assert hyb.mode == "hybrid" and not any("sessions indexed now" in n for n in hyb.notes), hyb.notes
    top = hyb.hits[0]
    assert (top.source, top.session_id, top.node_id) == ("sessions", s.session_id, a.node.id), hyb.hits
    assert top.text == PARAPHRASE and top.text_score == 0 and top.vector_score and top.path is None
    # an append is indexed by the next search, and only it
    t = await client.append(s.session_id, "code", name="bash", input={"cmd": "df -h"},
                            output="/dev/sda1 91% used: the zeppelin volume is nearly full", predecessor=a.node.id)
    r = await client.request("memory/search", {**base, "query": "zeppelin volume"})
    assert any(n.startswith("sessions indexed now: 1 node(s) of 1 session(s)") for n in r.notes), r.notes
    assert r.hits[0].node_id == t.node.id and "zeppelin volume" in r.hits[0].text
    # a running node is indexed as it stands, and again once it finished (its old text gone)
    run = await client.append(s.session_id, "code", name="build", input={"target": "all"},
                              output="compiling the wombat module", status="running", predecessor=t.node.id)
    r = await client.request("memory/search", {**base, "query": "wombat", "mode": "fts"})
    assert [h.node_id for h in r.hits] == [run.node.id]
    await client.update(s.session_id, run.node.id, "completed", output="built: the artefact is quokka.tar")
    r = await client.request("memory/search", {**base, "query": "quokka", "mode": "fts"})
    assert [h.node_id for h in r.hits] == [run.node.id], r.notes
    r = await client.request("memory/search", {**base, "query": "wombat", "mode": "fts"})
    assert r.hits == []
    # sessionId narrows both sides; a deleted session's chunks go
    s2 = await client.session_create("other")
    b = await client.append(s2.session_id, "llm", output=PARAPHRASE, predecessor=s2.head)
    both = await client.request("memory/search", {**base, "maxResults": 10})
    assert {h.session_id for h in both.hits if h.node_id in (a.node.id, b.node.id)} == {s.session_id, s2.session_id}
    one = await client.request("memory/search", {**base, "maxResults": 10, "sessionId": s2.session_id})
    assert one.hits and {h.session_id for h in one.hits} == {s2.session_id} and one.hits[0].node_id == b.node.id
    await client.session_delete(s2.session_id)
    gone = await client.request("memory/search", {**base, "maxResults": 10})
    assert any("1 deleted session(s) dropped" in n for n in gone.notes), gone.notes
    assert {h.session_id for h in gone.hits} == {s.session_id}
    with pytest.raises(RpcError) as err:
        await client.request("memory/search", {**base, "sessionId": s2.session_id})
    assert err.value.kind == "SessionNotFound"


async def test_the_session_index_catches_up_without_listing_and_shows_in_status(client: DagctxClient,
                                                                               tmp_path: Path) -> None:
    """The session index is brought up to date from the ledger's marker (SPEC §5.1): nothing is
    read when no session changed, only the written sessions when some did, every session only
    for a first index or a deletion; ``memory/status`` shows the index and the counts."""
    ws = workspace(tmp_path)
    sessions = []
    for i in range(4):
        s = await client.session_create(f"s{i}")
        await client.append(s.session_id, "user", input=f"note {i}: the staging database is on port 543{i}",
                            predecessor=s.head)
        sessions.append(s)

    async def st() -> Any:
        return (await client.request("memory/status", {"workspace": str(ws)})).sessions

    before = await st()
    assert (before.sessions, before.chunks, before.pending, before.up_to_date, before.checks) == (0, 0, 4, False, 0)
    base = {"workspace": str(ws), "sources": ["sessions"], "maxResults": 10}
    r = await client.request("memory/search", {**base, "query": "staging database port"})
    assert {h.session_id for h in r.hits} == {s.session_id for s in sessions}
    first = await st()
    assert (first.sessions, first.pending, first.up_to_date) == (4, 0, True)
    assert first.chunks >= 4 and first.vectors == first.chunks and first.vectors_missing == 0
    assert (first.checks, first.unchanged, first.listings, first.sessions_read) == (1, 0, 1, 4)
    assert first.indexed_at is not None
    # nothing changed: nothing read, however many searches
    for _ in range(3):
        await client.request("memory/search", {**base, "query": "staging database port"})
    same = await st()
    assert (same.checks, same.unchanged, same.listings, same.sessions_read) == (4, 3, 1, 4)
    assert same.chunks == first.chunks and same.up_to_date
    # one session written: status says so, the next search reads it alone and finds its node
    n = await client.append(sessions[2].session_id, "llm", output="the wombat replica lags by a minute",
                            predecessor=sessions[2].head)
    waiting = await st()
    assert (waiting.pending, waiting.up_to_date) == (1, False)
    r = await client.request("memory/search", {**base, "query": "wombat replica"})
    assert [h.node_id for h in r.hits][:1] == [n.node.id]
    after = await st()
    assert (after.checks, after.unchanged, after.listings, after.sessions_read) == (5, 3, 1, 5)
    assert after.up_to_date and after.chunks > first.chunks
    # a new session: found, read alone
    s5 = await client.session_create("new")
    m = await client.append(s5.session_id, "user", input="the quokka cluster moved to rack nine", predecessor=s5.head)
    r = await client.request("memory/search", {**base, "query": "quokka cluster"})
    assert [h.node_id for h in r.hits][:1] == [m.node.id]
    new = await st()
    assert (new.sessions, new.listings, new.sessions_read) == (5, 1, 6)
    # a deletion: every session compared once, the deleted one's chunks gone
    await client.session_delete(sessions[0].session_id)
    r = await client.request("memory/search", {**base, "query": "staging database port"})
    assert sessions[0].session_id not in {h.session_id for h in r.hits} and r.hits
    gone = await st()
    assert (gone.sessions, gone.listings, gone.sessions_read, gone.up_to_date) == (4, 2, 6, True)
    assert gone.chunks < new.chunks


async def test_vectors_are_read_in_the_background_at_start_and_after_an_index(database: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §5.1: a daemon reads the vectors of the indexed workspaces into its matrices in
    the background when it opens the database, and a workspace's new generation after each
    index run — before any search asks (``vectorsLoaded`` in ``memory/status``); a search
    asking first waits for that read and answers hybrid. Another daemon's index run is
    seen by the generation stamp: the matrix is read again."""
    import asyncio

    monkeypatch.setenv("DAGCTX_STANDALONE", "1")  # daemons of its own: what one reads when it opens
    ws = workspace(tmp_path)

    async def loaded(c: DagctxClient) -> bool:
        for _ in range(600):  # polls while the pool reads; no duration is asserted
            st = await c.request("memory/status", {"workspace": str(ws)})
            if st.vectors_loaded:
                return True
            await asyncio.sleep(0.05)
        return False

    c = await DagctxClient.spawn(database)
    try:
        done = await c.request("memory/index", {"workspace": str(ws)})
        assert done.embedded == done.chunks > 0
        assert await loaded(c)  # after the index run, no search asked
        st = await c.request("memory/status", {"workspace": str(ws)})
        assert (st.vectors, st.vectors_loaded) == (done.chunks, True)
    finally:
        await c.close()
    c = await DagctxClient.spawn(database)
    other = await DagctxClient.spawn(database)
    try:
        assert await loaded(c)  # read when the daemon opened the database
        (ws / "memory" / "more.md").write_text("# More\n\nThe cache holds 256 MiB at most.\n")
        await other.request("memory/index", {"workspace": str(ws)})  # a write this daemon did not see
        res = await c.request("memory/search", {"workspace": str(ws), "query": "what do we evict from the store",
                                                "mode": "hybrid"})
        assert res.mode == "hybrid" and res.hits[0].path == "memory/store.md", res.hits[:2]
        st = await c.request("memory/status", {"workspace": str(ws)})
        assert (st.vectors, st.vectors_loaded) == (done.chunks + 1, True)
    finally:
        await other.close()
        await c.close()
