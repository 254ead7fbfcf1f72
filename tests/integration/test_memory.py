"""memory/index, memory/status, memory/search, memory/get through the real daemon on both
backends (SPEC §5.1): incremental re-index, decay, MMR, line ranges, and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import memory_messages as mem
from memory_support import client, write  # noqa: F401 - the fixture is used by name

pytestmark = [pytest.mark.slow]


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients and commands share one daemon, as a user's do (each test its own
    database and workspace): the embedding model loads once, not once per test."""


async def index(c: DagctxClient, ws: Path, **options: Any) -> mem.MemoryIndexResult:
    params: dict[str, Any] = {"workspace": str(ws)}
    force = options.pop("force", False)
    if options:
        params["options"] = options
    if force:
        params["force"] = True
    return await c.request("memory/index", params)


async def search(c: DagctxClient, ws: Path, query: str, **kw: Any) -> mem.MemorySearchResult:
    return await c.request("memory/search", {"workspace": str(ws), "query": query, **kw})


async def status(c: DagctxClient, ws: Path) -> mem.MemoryStatusResult:
    return await c.request("memory/status", {"workspace": str(ws)})


async def error_of(coro: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    return info.value


async def test_an_edit_reindexes_only_that_file(client: DagctxClient, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws, "MEMORY.md", "# Decisions\n\nThe cache eviction policy is LRU with a five minute TTL.\n")
    write(ws, "memory/notes.md", "Deploys go through the blue green pipeline.\nRollbacks take one command.\n")
    first = await index(client, ws)
    assert (first.files, first.reindexed, first.unchanged, first.removed, first.complete) == (2, 2, 0, 0, True)
    before = {h.path: h.chunk_id for h in (await search(client, ws, "eviction OR pipeline")).hits}
    assert set(before) == {"MEMORY.md", "memory/notes.md"}

    again = await index(client, ws)
    assert (again.reindexed, again.unchanged, again.chunks) == (0, 2, first.chunks)

    write(ws, "memory/notes.md", "Deploys go through the blue green pipeline.\nRollbacks take one command.\n"
          "The zeppelin dashboard shows deploy health.\n")
    edited = await index(client, ws)
    assert (edited.reindexed, edited.unchanged, edited.removed) == (1, 1, 0)
    hits = (await search(client, ws, "zeppelin")).hits
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [("memory/notes.md", 1, 3)]
    # the edited file's old chunk is gone; the untouched file kept its chunk id
    err = await error_of(client.request("memory/get", {"workspace": str(ws), "chunkId": before["memory/notes.md"]}))
    assert err.kind == "ChunkNotFound"
    kept = await client.request("memory/get", {"workspace": str(ws), "chunkId": before["MEMORY.md"]})
    assert "eviction policy" in kept.text and kept.path == "MEMORY.md"

    (ws / "memory/notes.md").unlink()
    gone = await index(client, ws)
    assert (gone.files, gone.removed, gone.reindexed) == (1, 1, 0)
    assert (await search(client, ws, "zeppelin")).hits == []
    st = await status(client, ws)
    assert [f.path for f in st.files] == ["MEMORY.md"] and st.chunks == gone.chunks and st.complete


async def test_decay_orders_two_equal_chunks_by_age(client: DagctxClient, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    text = "We chose PostgreSQL advisory locks for the migration runner.\n"
    old = write(ws, "memory/a-old.md", text)
    write(ws, "memory/b-new.md", text)
    sixty_days_ago = time.time() - 60 * 86_400
    os.utime(old, (sixty_days_ago, sixty_days_ago))
    await index(client, ws)
    plain = (await search(client, ws, "advisory locks")).hits
    assert [h.path for h in plain] == ["memory/a-old.md", "memory/b-new.md"]  # equal scores: path order
    assert plain[0].score == pytest.approx(plain[1].score)
    decayed = (await search(client, ws, "advisory locks", temporalDecay={"halfLifeDays": 30})).hits
    assert [h.path for h in decayed] == ["memory/b-new.md", "memory/a-old.md"]
    # sixty days at a thirty-day half-life: a quarter of the fresh chunk's score
    assert decayed[1].score / decayed[0].score == pytest.approx(0.25, rel=0.01)
    assert decayed[1].text_score == pytest.approx(decayed[0].text_score)


async def test_mmr_removes_a_near_duplicate(client: DagctxClient, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws, "memory/1.md", "deploy pipeline: the deploy pipeline runs blue green deployment with canary checks\n")
    write(ws, "memory/2.md", "deploy pipeline: the deploy pipeline runs blue green deployment with canary checks today\n")
    write(ws, "memory/3.md", "rollback notes for the deploy step: when the pipeline fails during an incident, "
          "revert the release tag, page the on call engineer and write the postmortem\n")
    await index(client, ws)
    plain = (await search(client, ws, "deploy pipeline", maxResults=2)).hits
    assert {h.path for h in plain} == {"memory/1.md", "memory/2.md"}
    diverse = (await search(client, ws, "deploy pipeline", maxResults=2, mmr={"lambda": 0.5})).hits
    assert len(diverse) == 2 and diverse[0].path in ("memory/1.md", "memory/2.md")
    assert diverse[1].path == "memory/3.md"
    # λ = 1 is relevance only: the duplicate stays
    same = (await search(client, ws, "deploy pipeline", maxResults=2, mmr={"lambda": 1.0})).hits
    assert [h.path for h in same] == [h.path for h in plain]


async def test_get_reads_line_ranges_and_chunks(client: DagctxClient, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    lines = [f"line {i}: the retention window for metrics is {i} days" for i in range(1, 41)]
    write(ws, "memory/log.md", "\n".join(lines) + "\n")
    res = await index(client, ws, chunkTokens=60, overlapTokens=20)
    assert res.chunks > 3
    got = await client.request("memory/get", {"workspace": str(ws), "path": "memory/log.md", "fromLine": 3, "lines": 4})
    assert got.text == "\n".join(lines[2:6]) and (got.start_line, got.end_line, got.total_lines) == (3, 6, 40)
    tail = await client.request("memory/get", {"workspace": str(ws), "path": "memory/log.md", "fromLine": 39})
    assert tail.text == "\n".join(lines[38:]) and tail.end_line == 40
    err = await error_of(client.request("memory/get", {"workspace": str(ws), "path": "memory/log.md", "fromLine": 41}))
    assert err.kind == "InvalidParams" and "past the end" in err.message

    hits = (await search(client, ws, "retention", maxResults=50)).hits
    spans = sorted((h.start_line, h.end_line, h.chunk_id) for h in hits)
    assert spans[0][0] == 1 and spans[-1][1] == 40
    for (s1, e1, _), (s2, _e2, _) in zip(spans, spans[1:]):
        assert s2 <= e1 + 1 and s2 > s1  # consecutive chunks overlap (or touch), never skip a line
    assert any(s2 <= e1 for (_, e1, _), (s2, _, _) in zip(spans, spans[1:]))  # the overlap is real
    for start, end, cid in spans:
        chunk = await client.request("memory/get", {"workspace": str(ws), "chunkId": cid})
        assert chunk.text == "\n".join(lines[start - 1 : end]) and chunk.total_lines == 40
    one = await client.request("memory/get", {"workspace": str(ws), "chunkId": spans[1][2], "fromLine": 2, "lines": 1})
    assert one.text == lines[spans[1][0]] and one.start_line == one.end_line == spans[1][0] + 1


async def test_bad_input_is_refused_or_skipped_with_a_note(client: DagctxClient, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    outside = tmp_path / "outside.md"
    outside.write_text("secret outside the workspace\n")
    write(ws, "MEMORY.md", "good memory about the release train\n")
    write(ws, "memory/latin1.md", "caf\xe9 notes about the release train\n")
    assert (await index(client, ws)).complete  # valid UTF-8 so far

    # an extra path outside the workspace refuses the run and writes nothing
    before = await status(client, ws)
    for extra in ("../outside.md", str(outside)):
        err = await error_of(index(client, ws, extraPaths=[extra]))
        assert err.kind == "WorkspaceEscape" and "extraPaths[0]" in err.message
    # the refused runs wrote nothing (the vectors' background read may finish meanwhile)
    after = await status(client, ws)
    assert msgspec.structs.replace(after, vectors_loaded=before.vectors_loaded) == before

    (ws / "memory/latin1.md").write_bytes("caf\xe9 notes about the release train\n".encode("latin-1"))
    write(ws, "memory/blob.md", b"PK\x03\x04\x00\x00binary release train")
    os.symlink(outside, ws / "memory" / "link.md")
    write(tmp_path, "outdir/secret.md", "secret folder outside the workspace\n")
    os.symlink(tmp_path / "outdir", ws / "memory" / "linked")  # a folder: not entered, a note
    with open(ws / "memory" / "huge.md", "wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GB on paper, nothing read
    res = await index(client, ws)
    kinds = {s.path: s.kind for s in res.skipped}
    assert kinds == {"memory/latin1.md": "notUtf8", "memory/blob.md": "binary", "memory/link.md": "symlinkOutside",
                     "memory/huge.md": "tooLarge", "memory/linked": "symlinkOutside"}
    assert not res.complete and res.files == 1 and all(s.note.startswith(s.path) for s in res.skipped)
    # the file that turned bad lost its old chunks: the index never claims what it no longer holds
    assert [h.path for h in (await search(client, ws, "release train")).hits] == ["MEMORY.md"]
    assert (await search(client, ws, "secret")).hits == []
    st = await status(client, ws)
    assert not st.complete and {s.path for s in st.skipped} == set(kinds)

    for params, kind in (
        ({"path": "memory/link.md"}, "WorkspaceEscape"),
        ({"path": "../outside.md"}, "WorkspaceEscape"),
        ({"path": str(outside)}, "WorkspaceEscape"),
        ({"path": "memory/blob.md"}, "InvalidParams"),
        ({"path": "memory/latin1.md"}, "InvalidParams"),
        ({"path": "memory/huge.md"}, "InvalidParams"),
        ({"path": "README.txt"}, "InvalidParams"),
        ({"path": "memory/missing.md"}, "InvalidParams"),
        ({"chunkId": "nope"}, "ChunkNotFound"),
        ({}, "InvalidParams"),
    ):
        err = await error_of(client.request("memory/get", {"workspace": str(ws), **params}))
        assert err.kind == kind, (params, err.kind, err.message)
    for params, kind in (
        ({"workspace": str(tmp_path / "nowhere")}, "InvalidParams"),
        ({"workspace": str(ws), "options": {"chunkTokens": 50, "overlapTokens": 50}}, "InvalidParams"),
    ):
        err = await error_of(client.request("memory/index", params))
        assert err.kind == kind, (params, err.message)
    err = await error_of(client.request("memory/search", {"query": "x"}))
    assert err.kind == "InvalidParams" and "workspace" in err.message
    # a workspace whose memory/ is a symlink out of it: MEMORY.md indexed, never complete
    ws2 = tmp_path / "ws2"
    write(ws2, "MEMORY.md", "the second workspace\n")
    os.symlink(tmp_path / "outdir", ws2 / "memory")
    res = await index(client, ws2)
    assert [(s.path, s.kind) for s in res.skipped] == [("memory", "symlinkOutside")] and not res.complete
    assert res.files == 1 and (await search(client, ws2, "secret")).hits == []
    # still serving
    assert (await status(client, ws)).files[0].path == "MEMORY.md"


async def test_conversational_and_cjk_queries_and_sessions(client: DagctxClient, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws, "MEMORY.md", "Cache eviction: we settled on LRU with a five minute TTL.\n\n我们决定缓存淘汰策略使用LRU。\n")
    await index(client, ws)
    res = await search(client, ws, "what did we decide about the cache eviction policy?")
    assert res.keywords == ["cache", "eviction", "policy"] and res.expression == "cache OR eviction OR policy"
    assert [h.path for h in res.hits] == ["MEMORY.md"]
    cjk = await search(client, ws, "缓存淘汰策略是什么")
    assert [h.path for h in cjk.hits] == ["MEMORY.md"] and "缓存" in cjk.keywords
    # a session node is a second source, selectable per query
    s = await client.session_create("ops")
    await client.append(s.session_id, "user", input="remember: the cache eviction runs nightly", predecessor=s.head)
    both = await search(client, ws, "cache eviction", sources=["memory", "sessions"])
    assert {h.source for h in both.hits} == {"memory", "sessions"}
    only = await search(client, ws, "cache eviction", sources=["sessions"])
    assert [h.session_id for h in only.hits] == [s.session_id] and only.hits[0].time is not None
    assert only.hits[0].text == "remember: the cache eviction runs nightly"
    high = await search(client, ws, "cache eviction", minScore=0.999)
    assert high.hits == []


def test_the_memory_commands(tmp_path: Path) -> None:
    """`dagctx memory index|search|get|status` as a user runs them: the first standalone, the
    rest through the module's shared daemon."""
    ws = tmp_path / "ws"
    write(ws, "MEMORY.md", "The staging database lives on port 5433.\n")
    db = str(tmp_path / "cli.db")
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    env.pop("DAGCTX_DB", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "--db", db, "memory", *args],
                              capture_output=True, text=True, timeout=90, env=env)

    p = cli("index", "--standalone", "--workspace", str(ws), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["files"] == 1
    p = cli("search", "--workspace", str(ws), "--json", "which port is staging on")
    hit = json.loads(p.stdout)["hits"][0]
    assert hit["path"] == "MEMORY.md" and hit["startLine"] == 1
    p = cli("get", "--workspace", str(ws), "--chunk", hit["chunkId"])
    assert p.returncode == 0 and p.stdout == "The staging database lives on port 5433.\n"
    p = cli("get", "--workspace", str(ws), "--path", "../etc/passwd")
    assert p.returncode == 1 and "WorkspaceEscape" in p.stdout + p.stderr
    # the session index in `memory status`: an imported session waits, a search indexes it
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts" / "sharegpt" / "fx.jsonl"
    imp = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "--db", db, "import", str(fixture)],
                         capture_output=True, text=True, timeout=90, env=env)
    assert imp.returncode == 0, imp.stderr
    p = cli("status", "--workspace", str(ws), "--json")
    waiting = json.loads(p.stdout)["sessions"]
    assert (waiting["sessions"], waiting["upToDate"]) == (0, False) and waiting["pending"] >= 1, waiting
    p = cli("status", "--workspace", str(ws))
    assert p.returncode == 0 and "sessions: 0 indexed" in p.stdout, p.stdout
    assert f"{waiting['pending']} session(s) written since" in p.stdout, p.stdout
    p = cli("search", "--workspace", str(ws), "--sources", "sessions", "--json", "anything at all")
    assert p.returncode == 0, p.stderr
    p = cli("status", "--workspace", str(ws), "--json")
    ss = json.loads(p.stdout)["sessions"]
    assert (ss["sessions"], ss["pending"], ss["upToDate"]) == (waiting["pending"], 0, True) and ss["chunks"] > 0, ss
    p = cli("status", "--workspace", str(ws))
    assert f"sessions: {ss['sessions']} indexed" in p.stdout and "up to date" in p.stdout, p.stdout
    write(ws, "memory/bad.md", b"\xff\xfe bad")
    p = cli("index", "--workspace", str(ws))
    assert p.returncode == 3 and "notUtf8" in p.stdout + p.stderr


async def test_a_rare_word_among_common_ones_finds_its_chunk_first(client: DagctxClient, tmp_path: Path) -> None:
    """A conversational query runs as the OR of its keywords; on SQLite the chunks of a word
    held by more than ``KEYWORD_BUDGET`` chunks are never ranked whole (SPEC §5.1): the rare
    word's chunk — the last of 3,302, after every common word's — must still come first."""
    ws = tmp_path / "ws"
    common = ("deploy", "release", "pipeline")
    lines = [f"we {common[i % 3]} on tuesday, note {i}" for i in range(3_300)]
    lines += ["the zeppelin deploy waits for the hangar", "先跑迁移脚本 release"]
    write(ws, "memory/ops.md", "\n".join(lines) + "\n")
    done = await client.request("memory/index", {"workspace": str(ws), "embedding": {"provider": "none"},
                                                 "options": {"chunkTokens": 16, "overlapTokens": 0}})
    assert done.chunks >= 3_302 and done.complete
    res = await search(client, ws, "how do we deploy the release pipeline for the zeppelin?", mode="fts")
    assert res.keywords == ["deploy", "release", "pipeline", "zeppelin"]
    assert res.hits[0].text == "the zeppelin deploy waits for the hangar", res.hits[:2]
    assert len(res.hits) == 6 and all(any(w in h.text for w in common) for h in res.hits[1:])
    cjk = await search(client, ws, "release 迁移脚本", mode="fts")
    assert cjk.hits[0].text == "先跑迁移脚本 release", cjk.hits[:2]
    # every word common: the hits hold them (drawn in index order, not ranked whole)
    plain = await search(client, ws, "deploy release pipeline", mode="fts")
    assert len(plain.hits) == 6 and all(any(w in h.text for w in common) for h in plain.hits)


async def test_a_rare_word_outranks_common_ones_alike_on_both_backends(pg_url: str, tmp_path: Path) -> None:
    """Both backends weigh a conversational query's keywords by how many chunks hold them
    (SQLite: FTS5's vocabulary and BM25; PostgreSQL: ``memory_terms``, kept by the schema's
    triggers, and the same BM25 — SPEC §5.1): a chunk holding only the rare word of the query
    outranks the chunks holding only its common word, and the two backends answer the same
    hits in the same order with the same scores — when the common word's chunks are drawn
    (more than ``KEYWORD_BUDGET``) and when the ``OR`` is ranked whole. The kept counts follow
    every insert and delete (``memory/status``)."""
    big = [f"we deploy on tuesday, note {i}" for i in range(1_400)]
    big.insert(900, "the zeppelin waits in the hangar")
    small = [f"we deploy on tuesday, note {i}" for i in range(40)]
    small.insert(30, "the zeppelin waits in the hangar")
    answers: dict[str, list[list[tuple[Any, ...]]]] = {}
    for name, db in (("sqlite", str(tmp_path / "dagctx.db")), ("postgresql", pg_url)):
        c = await DagctxClient.spawn(db)
        try:
            got = []
            for label, lines in (("big", big), ("small", small)):
                ws = tmp_path / f"{name}-{label}"
                write(ws, "memory/ops.md", "\n".join(lines) + "\n")
                write(ws, "memory/extra.md", "a note about the hangar doors\n")
                done = await c.request("memory/index", {"workspace": str(ws), "embedding": {"provider": "none"},
                                                        "options": {"chunkTokens": 16, "overlapTokens": 0}})
                res = await search(c, ws, "when does the zeppelin deploy?", mode="fts", maxResults=8)
                assert res.keywords == ["zeppelin", "deploy"]
                assert res.hits[0].text == "the zeppelin waits in the hangar", (name, label, res.hits[:3])
                assert len(res.hits) == 8 and all("deploy" in h.text for h in res.hits[1:]), (name, label)
                assert res.hits[0].text_score > 2 * res.hits[1].text_score, (name, label, res.hits[:2])
                got.append([(h.path, h.start_line, h.text, h.text_score) for h in res.hits])
                st = await status(c, ws)
                assert (st.chunks, len(st.files)) == (done.chunks, 2) and st.chunks == sum(f.chunks for f in st.files)
                (ws / "memory" / "extra.md").unlink()
                again = await c.request("memory/index", {"workspace": str(ws), "embedding": {"provider": "none"},
                                                         "options": {"chunkTokens": 16, "overlapTokens": 0}})
                st = await status(c, ws)
                assert (st.chunks, len(st.files), again.removed) == (done.chunks - 1, 1, 1), st
            answers[name] = got
        finally:
            await c.close()
    for sq, pg in zip(answers["sqlite"], answers["postgresql"]):
        assert [h[:3] for h in sq] == [h[:3] for h in pg]
        assert [h[3] for h in sq] == pytest.approx([h[3] for h in pg], rel=1e-6)


async def test_a_version_4_memory_index_gets_its_counts_and_terms(database: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema version 5 (SPEC §5.1) fills the kept counts — and on PostgreSQL each lexeme's
    chunk count — from the rows a version-4 database holds; the triggers then keep them."""
    from rawdb import RawDb

    # a daemon of its own for each open: the database is rewritten as version 4 between them
    monkeypatch.setenv("DAGCTX_STANDALONE", "1")
    ws = tmp_path / "ws"
    write(ws, "MEMORY.md", "The zeppelin waits in the hangar.\n")
    write(ws, "memory/ops.md", "".join(f"we deploy on tuesday, note {i}\n" for i in range(40)))
    opts = {"workspace": str(ws), "embedding": {"provider": "none"}, "options": {"chunkTokens": 16, "overlapTokens": 0}}
    c = await DagctxClient.spawn(database)
    try:
        done = await c.request("memory/index", opts)
    finally:
        await c.close()
    with RawDb(database) as raw:  # the database as version 4 left it
        if raw.pg:
            raw.execute("DROP TABLE dagctx.memory_counts, dagctx.memory_terms")
            for name in ("memory_chunks_added", "memory_chunks_removed", "memory_files_added", "memory_files_removed",
                         "memory_vectors_added", "memory_vectors_removed"):
                raw.execute(f"DROP FUNCTION dagctx.{name}() CASCADE")
        else:
            for name in ("memory_chunks_added", "memory_chunks_removed", "memory_files_added", "memory_files_removed",
                         "memory_vectors_added", "memory_vectors_removed"):
                raw.execute(f"DROP TRIGGER {name}")
            raw.execute("DROP TABLE memory_counts")
        raw.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    c = await DagctxClient.spawn(database)
    try:
        st = await status(c, ws)
        assert (st.chunks, len(st.files)) == (done.chunks, 2) and done.chunks > 2
        res = await search(c, ws, "when does the zeppelin deploy?", mode="fts")
        assert res.hits[0].path == "MEMORY.md" and res.hits[0].text_score > 2 * res.hits[1].text_score
        write(ws, "memory/ops.md", "we deploy on friday\n")
        again = await c.request("memory/index", opts)
        assert (await status(c, ws)).chunks == again.chunks == 2
    finally:
        await c.close()
    with RawDb(database) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'") == [("5",)]
        if raw.pg:
            terms = dict(raw.execute("SELECT term, chunks FROM dagctx.memory_terms WHERE term IN "
                                     "('zeppelin', 'deploy', 'tuesday', 'friday')"))
            assert terms == {"zeppelin": 1, "deploy": 1, "tuesday": 0, "friday": 1}, terms
