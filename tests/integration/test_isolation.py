"""One shared daemon, several real clients: one client's heavy work is never felt by another
(SPEC §1.4). Each test starts heavy work on connection A and keeps asking connection B for
small answers; it asserts B's answers arrive WHILE A's work is still running — an order of
events, not a duration (CI is loaded) — and that A's work still succeeds.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m

from test_shared_daemon import claude_code_transcript, heavy_transcript, shared_env, spawn  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.asyncio


async def answered_meanwhile(heavy: asyncio.Future[Any], small: Any) -> tuple[int, float]:
    """Ask ``small()`` over and over until ``heavy`` is done: (answers that arrived before
    it was done, the worst latency of those)."""
    before = 0
    worst = 0.0
    while not heavy.done():
        t = time.monotonic()
        await small()
        if not heavy.done():
            before += 1
            worst = max(worst, time.monotonic() - t)
    return before, worst


async def test_a_small_render_of_another_client_finishes_before_a_cold_heavy_render(shared_env, tmp_path: Path) -> None:
    """The work pool serves connections in turn: B's 2-node render and session/list are
    answered while A's cold render of a big session (aging on) is still running."""
    db = tmp_path / "fair.db"
    src = tmp_path / "big.jsonl"
    heavy_transcript(src)  # many turns: a cold render with aging is heavy
    a = await spawn(db)
    try:
        imported = await a.import_path(str(src))
        big = imported.sessions[0].session_id
    finally:
        await a.close()  # the daemon keeps running (idle timeout): A's caches stay…
    a = await spawn(db)
    b = await spawn(db)
    try:
        s = await b.session_create("small")
        u = await b.append(s.session_id, "user", output="hello", predecessor=s.head)
        # …so make the render cold: a model whose aging plan and rendering were never asked for
        _, heavy = a.send_request("context/render", {"sessionId": big, "model": "claude-sonnet-4", "aging": True,
                                                     "format": "anthropic"})

        async def small() -> None:
            r = await b.render(s.session_id, head=u.node.id, model="gpt-4o")
            assert r.messages
            await b.session_list(limit=5)

        before, worst = await answered_meanwhile(heavy, small)
        res = await heavy
        assert res.messages
        # An outcome, not a rate: B's render and list were answered while A's render still ran
        # (how many fit in depends on the machine's load).
        assert before >= 1, f"B got no answer while A's render ran (worst {worst:.3f} s)"
    finally:
        await a.close()
        await b.close()


async def test_session_list_is_answered_while_another_client_imports_and_exports(shared_env, tmp_path: Path) -> None:
    db = tmp_path / "io.db"
    src = tmp_path / "import.jsonl"
    claude_code_transcript(src, turns=150, result_chars=100_000)  # ~15 MB
    a = await spawn(db)
    b = await spawn(db)
    try:
        await b.session_create("other")
        _, imp = a.send_request("session/import", {"path": str(src)})
        before, worst = await answered_meanwhile(imp, lambda: b.session_list(limit=5))
        res = await imp
        sid = res["sessions"][0]["sessionId"] if isinstance(res, dict) else res.sessions[0].session_id
        assert before >= 1, f"B got no answer while A imported (worst {worst:.3f} s)"

        out = tmp_path / "export.jsonl"
        _, exp = a.send_request("session/export", {"sessionId": sid, "format": "claude-code", "path": str(out)})
        before, worst = await answered_meanwhile(exp, lambda: b.session_list(limit=5))
        await exp
        assert out.stat().st_size > 10_000_000
        assert before >= 1, f"B got no answer while A exported (worst {worst:.3f} s)"
    finally:
        await a.close()
        await b.close()


async def test_a_cancelled_queued_render_is_answered_at_once_and_the_next_one_runs(shared_env, tmp_path: Path) -> None:
    """Two heavy renders of one connection run one after the other (its background lane);
    cancelling the queued one answers RequestCancelled before the running one finishes."""
    db = tmp_path / "cancel.db"
    src = tmp_path / "big.jsonl"
    heavy_transcript(src)
    a = await spawn(db)
    try:
        big = (await a.import_path(str(src))).sessions[0].session_id
        _, first = a.send_request("context/render", {"sessionId": big, "model": "claude-sonnet-4", "aging": True})
        rid, second = a.send_request("context/render", {"sessionId": big, "model": "gpt-4o", "aging": True})
        await asyncio.sleep(0.05)
        a.cancel(rid)
        with pytest.raises(RpcError) as exc:
            await asyncio.wait_for(second, 60)
        assert exc.value.kind == "RequestCancelled"
        assert (await first).messages
    finally:
        await a.close()


async def test_a_running_cold_render_cancelled_answers_request_cancelled_and_the_daemon_serves_on(
        shared_env, tmp_path: Path) -> None:
    """SPEC §1.4: $/cancelRequest of a render that is RUNNING (its worker busy, seen in
    daemon/status) answers RequestCancelled — the render stops at a checkpoint instead of
    finishing for nobody — and then the same connection's next request and another
    client's are answered. Order of events, no duration."""
    db = tmp_path / "cancel-running.db"
    src = tmp_path / "big.jsonl"
    heavy_transcript(src)
    a = await spawn(db)
    b = await spawn(db)
    try:
        big = (await a.import_path(str(src))).sessions[0].session_id
        small = await b.session_create("small")
        # Each attempt is a render no earlier one warmed (another model or format). On a loaded
        # machine a cold render can finish before it is seen running, or before the cancel reaches
        # it; such an attempt proves nothing either way and the next one is tried. The test fails
        # when no attempt of six is cancelled — what a daemon that ignores a running request's
        # cancel does every time.
        attempts = (("claude-sonnet-4", "anthropic"), ("gpt-4.1", "openai"), ("gpt-4o", "openai"),
                    ("claude-opus-4", "anthropic"), ("gpt-4.1", "neutral"), ("claude-sonnet-4", "neutral"))
        cancelled = 0
        for model, fmt in attempts:
            rid, heavy = a.send_request("context/render", {"sessionId": big, "model": model, "aging": True,
                                                           "format": fmt})
            for _ in range(2000):  # until its worker runs it (a hang guard, not a duration)
                if (await b.daemon_status()).queue.running >= 1 or heavy.done():
                    break
                await asyncio.sleep(0.005)
            if heavy.done():
                assert (await heavy).messages  # finished before it was seen running: a whole render
                continue
            a.cancel(rid)
            try:
                finished = await asyncio.wait_for(heavy, 120)
            except RpcError as exc:
                assert exc.kind == "RequestCancelled"
                cancelled += 1
            else:
                assert finished.messages  # it finished before the cancel arrived
            # the daemon serves on: the same connection, another one, and the same render again
            assert (await a.session_list(limit=5)).total == 2
            assert (await b.history(small.session_id)).nodes == []
            if cancelled == 2:
                break
        assert cancelled >= 1, "no running render of six was cancelled"
        again = await a.render(big, model="gpt-4.1", aging=True, format="openai")
        assert again.messages and a.process.returncode is None
    finally:
        await a.close()
        await b.close()


# ---------------------------------------------------------------- large answers, frame caps


async def test_an_answer_over_the_frame_limit_is_refused_with_how_to_page(shared_env, tmp_path: Path) -> None:
    """SPEC §1.4: the daemon never sends a frame the client cannot take; it answers
    ResponseTooLarge naming the paging parameters, and the connection lives on."""
    db = tmp_path / "large.db"
    a = await spawn(db, extra_args=["--max-frame-bytes", "200000"])
    try:
        s = await a.session_create("large")
        head = s.head
        for i in range(3):
            r = await a.append(s.session_id, "user", output=f"{i} " + "y" * 120_000, predecessor=head)
            head = r.head
        with pytest.raises(RpcError) as exc:
            await a.history(s.session_id)
        assert exc.value.kind == "ResponseTooLarge"
        assert "offset" in str(exc.value) and "limit" in str(exc.value) and "200,000" in str(exc.value)
        page = await a.request("session/history", {"sessionId": s.session_id, "offset": 1, "limit": 1})
        assert page.total == 3 and len(page.nodes) == 1 and page.nodes[0].output.startswith("1 ")
        with pytest.raises(RpcError) as exc:
            await a.get_nodes(s.session_id, [head, page.nodes[0].id])
        assert exc.value.kind == "ResponseTooLarge" and "range" in str(exc.value)
        piece = await a.get_nodes(s.session_id, [head], range=m.OutputRange(offset=0, length=1000))
        assert len(piece.nodes[0].output) == 1000
        assert (await a.session_list()).sessions  # the connection lives on
        assert a.process.returncode is None

        # a render too large for the frame: refused, naming `range`; asked in pieces, the
        # pieces are exactly the whole render another connection (default limit) gets
        with pytest.raises(RpcError) as exc:
            await a.render(s.session_id, head=head, model="gpt-4o", aging=False)
        assert exc.value.kind == "ResponseTooLarge" and "`range`" in str(exc.value)
        b = await spawn(db)
        try:
            whole = await b.render(s.session_id, head=head, model="gpt-4o", aging=False)
        finally:
            await b.close()
        assert whole.message_count == len(whole.messages) == 3
        pieces, per = [], []
        offset = 0
        while True:
            page = await a.request("context/render", {"sessionId": s.session_id, "head": head, "model": "gpt-4o",
                                                      "aging": False, "range": {"offset": offset, "limit": 1}})
            assert page.message_count == 3 and page.tokens.total == whole.tokens.total
            assert {k: v for k, v in page.manifest.items() if k != "renderId"} == \
                {k: v for k, v in whole.manifest.items() if k != "renderId"}  # one render, a new id each time
            if not page.messages:
                break
            pieces += page.messages
            per += page.tokens.per_message
            offset += len(page.messages)
        assert pieces == whole.messages and per == whole.tokens.per_message
        with pytest.raises(RpcError) as exc:  # a bad range is the caller's mistake, named
            await a.request("context/render", {"sessionId": s.session_id, "range": {"offset": -1}})
        assert exc.value.kind == "InvalidParams" and exc.value.data.get("path", "").startswith("params.range")
    finally:
        await a.close()


async def test_a_connection_cannot_lift_its_frame_limit_past_the_daemons_cap(shared_env, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGCTX_MAX_FRAME_CAP", "1000000")  # the daemon this test starts reads it
    a = await spawn(tmp_path / "cap.db", extra_args=["--max-frame-bytes", "50000000"])
    try:
        s = await a.session_create("cap")
        # over the cap: the frame is skipped (FrameTooLarge, id null: it was never read)
        _, skipped = a.send_request("node/append", {"sessionId": s.session_id, "node": {
            "role": "user", "output": "z" * 2_000_000, "predecessor": s.head}})
        ok = await a.append(s.session_id, "user", output="z" * 500_000, predecessor=s.head)
        assert [n.id for n in (await a.history(s.session_id)).nodes] == [ok.node.id]
        assert not skipped.done()
        skipped.cancel()
        log = Path((await a.daemon_status()).log).read_text()
        assert "capped at 1000000" in log
    finally:
        await a.close()


# ---------------------------------------------------------------- memory comes back


async def _rounds_of_big_sessions(tmp_path: Path, src: Path, tag: str, status: DagctxClient) -> m.DaemonStatus:
    for i in range(3):
        c = await spawn(tmp_path / f"{tag}{i}.db")
        try:
            sid = (await c.import_path(str(src))).sessions[0].session_id
            assert (await c.render(sid, model="gpt-4o", aging=True)).messages
        finally:
            await c.close()
    held = await status.daemon_status()
    assert any(cache.sessions for cache in held.caches)  # the last one is still cached
    for _ in range(300):  # released once nobody used it for DAGCTX_CACHE_IDLE_SECONDS
        st = await status.daemon_status()
        if not st.caches:
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"the unused databases were never closed: {st.caches}")


async def test_memory_is_given_back_when_clients_leave(shared_env, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §1.6: a database no client uses is closed after DAGCTX_CACHE_IDLE_SECONDS, its
    caches with it; the daemon's memory stays bounded over rounds of big sessions instead of
    growing with every session it ever served."""
    monkeypatch.setenv("DAGCTX_CACHE_IDLE_SECONDS", "1")
    src = tmp_path / "big.jsonl"
    claude_code_transcript(src, turns=30, result_chars=100_000)
    status = await spawn(None, initialize=False)
    try:
        first = await _rounds_of_big_sessions(tmp_path, src, "a", status)
        second = await _rounds_of_big_sessions(tmp_path, src, "b", status)
        grown = second.memory.rss_bytes - first.memory.rss_bytes
        assert grown < 0.2 * first.memory.rss_bytes, (first.memory, second.memory)
        assert second.memory.rss_bytes < second.memory.peak_rss_bytes
        assert second.queue.queued == 0
    finally:
        status.notify("exit")
        await status.wait(10)


async def test_session_caches_in_use_stay_within_their_byte_bound(shared_env, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §1.6: while a database is in use, its cached session graphs are bounded by
    DAGCTX_CACHE_BYTES, least recently used evicted first; an evicted session answers the
    same as before (read again from the database)."""
    monkeypatch.setenv("DAGCTX_CACHE_BYTES", "3000000")  # the daemon this test starts reads it
    base = tmp_path / "base.jsonl"
    claude_code_transcript(base, turns=60, result_chars=20_000)  # ~1.2 MB of node bodies, none spilled
    c = await spawn(tmp_path / "lru.db")
    try:
        sids, first = [], []
        for i in range(4):
            src = tmp_path / f"s{i}.jsonl"
            src.write_text(base.read_text().replace("0e9d2a54-7f3c-4b51-9a43-5b3d1c0f7a11",
                                                    f"0e9d2a54-7f3c-4b51-9a43-5b3d1c0f7a1{i}"))
            sid = (await c.import_path(str(src))).sessions[0].session_id
            sids.append(sid)
            first.append((await c.render(sid, model="gpt-4o", aging=True)).messages)
        st = await c.daemon_status()
        assert st.memory.cache_limit_bytes == 3_000_000
        for _ in range(600):  # a hang guard: the bound is looked at about once a second
            st = await c.daemon_status()
            cached = sum(cache.bytes for cache in st.caches)
            if cached <= 3_000_000:
                break
            await asyncio.sleep(0.05)
        assert 0 < cached <= 3_000_000, st.caches
        assert sum(cache.sessions for cache in st.caches) < 4  # some were evicted…
        for sid, messages in zip(sids, first):  # …and answer exactly as before
            assert (await c.render(sid, model="gpt-4o", aging=True)).messages == messages
    finally:
        await c.close()


async def test_session_list_is_answered_while_another_client_appends_50_mb(shared_env, tmp_path: Path) -> None:
    """A 50 MB node/append (its frame read and decoded, its tokens counted, its output
    spilled, its row written — all off the event loop) never holds up another connection."""
    db = tmp_path / "big-append.db"
    a = await spawn(db)
    b = await spawn(db)
    try:
        await b.session_create("other")
        s = await a.session_create("big")
        u = await a.append(s.session_id, "user", output="run it", predecessor=s.head)
        big = "".join(f"line {i} of the build log: compiling src/mod_{i % 97}.c\n" for i in range(1_000_000))[:50_000_000]
        _, app = a.send_request("node/append", {"sessionId": s.session_id, "node": {
            "role": "code", "name": "bash", "input": {"cmd": "make"}, "output": big, "caller": u.node.id}})
        before, worst = await answered_meanwhile(app, lambda: b.session_list(limit=5))
        res = await app
        node = res["node"] if isinstance(res, dict) else res.node
        assert before >= 1, f"B got no answer while A appended 50 MB (worst {worst:.3f} s)"
        got = await a.get_nodes(s.session_id, [node.id if not isinstance(node, dict) else node["id"]],
                                range=m.OutputRange(offset=len(big) - 40, length=40))
        assert got.nodes[0].output == big[-40:]  # kept whole (spilled), read back in a range
    finally:
        await a.close()
        await b.close()


# ---------------------------------------------------------------- export streams


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def _hwm_start(a: DagctxClient) -> tuple[int, int]:
    """The daemon's pid and RSS (KiB) with its high-water mark reset to that RSS
    (/proc/PID/clear_refs), once its tokenizers' warm-up is over: the shared daemon builds
    the encoders it has not needed yet at its first quiet moment (the o200k encoder alone
    is tens of MB), which on a loaded machine can fall inside the measured request."""
    status = await a.daemon_status()
    log = Path(status.log)
    for _ in range(1200):  # a hang guard, not a duration: the daemon is quiet now
        if "tokenizers ready:" in log.read_text():
            break
        await asyncio.sleep(0.05)
    assert "tokenizers ready:" in log.read_text(), log.read_text()[-2000:]
    before = _proc_kib(status.pid, "VmRSS")
    Path(f"/proc/{status.pid}/clear_refs").write_text("5")
    return status.pid, before


async def test_an_export_to_a_file_is_streamed_its_memory_bounded_by_the_largest_node(shared_env,
                                                                                       tmp_path: Path) -> None:
    """SPEC §9 session/export: a claude-code export to a path writes each line as it is made
    and reads a spilled tool result back only for its own line, so the daemon's peak RSS
    grows by a few times the largest node — not by the session, 12 times bigger. Measured
    as the daemon's own high-water mark (VmHWM), reset just before the export
    (/proc/PID/clear_refs), against its RSS just before."""
    src = tmp_path / "big.jsonl"
    node_chars = 3_000_000
    claude_code_transcript(src, turns=12, result_chars=node_chars)  # 12 tool results of 3 MB, all spilled
    a = await spawn(tmp_path / "stream.db")
    try:
        sid = (await a.import_path(str(src))).sessions[0].session_id
        warm = tmp_path / "warm.jsonl"  # the code paths and the session's graph are warm
        await a.request("session/export", {"sessionId": sid, "path": str(warm)})
        pid, before = await _hwm_start(a)
        out = tmp_path / "export.jsonl"
        res = await a.request("session/export", {"sessionId": sid, "path": str(out)})
        grown = (_proc_kib(pid, "VmHWM") - before) * 1024
        size = out.stat().st_size
        assert res.path == str(out) and size > 12 * node_chars  # the whole session was written…
        assert out.read_bytes() == warm.read_bytes()  # …the same bytes every time
        assert grown < 8 * node_chars, f"the export grew the daemon by {grown:,} bytes for a {size:,}-byte file"
        # cancelled midway (or before it ran): RequestCancelled and no file, not even a temp one
        cut = tmp_path / "cut.jsonl"
        rid, pending = a.send_request("session/export", {"sessionId": sid, "path": str(cut)})
        a.cancel(rid)
        try:
            await pending
            assert cut.read_bytes() == warm.read_bytes()  # it finished before the cancel arrived
        except RpcError as exc:
            assert exc.kind == "RequestCancelled", exc
            assert not cut.exists() and not list(tmp_path.glob(".dagctx-export-*"))
        # and what was written reads back as the same session (already present: created false)
        again = await a.import_path(str(out))
        assert again.sessions[0].session_id == sid and not again.sessions[0].created
    finally:
        await a.close()


async def test_an_import_is_streamed_its_memory_bounded_by_the_largest_node(shared_env, tmp_path: Path) -> None:
    """SPEC §9 session/import: tool results are kept aside (a private temporary file) as the
    transcript is read and read back one node at a time while it is written, so importing a
    session of 20 tool results of 3 MB (60 MB) grows the daemon's peak RSS by a few times the
    largest node — not by the session. Measured as the daemon's own high-water mark (VmHWM),
    reset just before the import (/proc/PID/clear_refs), against its RSS just before."""
    node_chars = 3_000_000
    warm = tmp_path / "warm.jsonl"  # the parser, tokenizer and ledger code paths are warm
    claude_code_transcript(warm, turns=2, result_chars=node_chars, sid="5b0c1f8e-2d3a-4e6f-8a9b-0c1d2e3f4a5b")
    src = tmp_path / "big.jsonl"
    claude_code_transcript(src, turns=20, result_chars=node_chars)  # 20 tool results of 3 MB
    a = await spawn(tmp_path / "stream.db")
    try:
        await a.import_path(str(warm))
        pid, before = await _hwm_start(a)
        res = await a.import_path(str(src))
        grown = (_proc_kib(pid, "VmHWM") - before) * 1024
        s = res.sessions[0]
        assert s.created and s.tool_pairs == 20, s
        size = src.stat().st_size
        assert size > 20 * node_chars
        assert grown < 10 * node_chars, f"the import grew the daemon by {grown:,} bytes for a {size:,}-byte transcript"
        # every tool result was written whole: each reads back at its full length
        hist = await a.request("session/history", {"sessionId": s.session_id})
        assert hist is not None
        again = await a.import_path(str(src))  # idempotent: the same session, nothing copied
        assert again.sessions[0].session_id == s.session_id and not again.sessions[0].created
    finally:
        await a.close()


def _texts_transcript(path: Path, fmt: str, count: int, chars: int, sid: str) -> None:
    """``count`` alternating user and model texts of ``chars`` characters, one chain, in
    ``fmt``: Claude Code's, Codex's or OpenClaw's JSON Lines, a ShareGPT JSON array, an
    OpenHands event list (``.json``) or a SWE-agent trajectory (``.traj``, each step's
    observation repeated in its ``trajectory`` as the real ones do)."""
    words = " ".join(f"w{k} src/mod_{k % 50}.py" for k in range(chars // 18))
    texts = [f"{i} {words}"[:chars] for i in range(count)]
    if fmt in ("sharegpt", "openhands", "swe-agent"):
        if fmt == "sharegpt":
            doc: Any = [{"id": sid, "conversations": [
                {"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(texts)]}]
        elif fmt == "openhands":
            doc = {"instance_id": sid, "events": [
                {"id": i, "timestamp": f"2026-04-05T08:{i // 60 % 60:02d}:{i % 60:02d}", "action": "message",
                 "source": "user" if i % 2 == 0 else "agent", "args": {"content": t}} for i, t in enumerate(texts)]}
        else:
            doc = {"trajectory": [{"action": "echo", "observation": t, "thought": ""} for t in texts[1::2]],
                   "history": [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                               for i, t in enumerate(texts)],
                   "info": {"instance": sid}, "replay_config": json.dumps({"agent": {"model": {"name": "m"}}})}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        return
    with open(path, "w", encoding="utf-8") as f:
        if fmt == "openclaw":
            f.write(json.dumps({"type": "session", "version": 3, "id": sid, "timestamp": "2026-04-03T07:00:00.000Z",
                                "cwd": "/tmp"}) + "\n")
        if fmt == "codex":
            f.write(json.dumps({"timestamp": "2026-04-02T08:00:00.000Z", "type": "session_meta",
                                "payload": {"id": sid, "timestamp": "2026-04-02T08:00:00.000Z", "cwd": "/tmp"}}) + "\n")
        parent = None
        for i, text in enumerate(texts):
            user = i % 2 == 0
            if fmt == "codex":
                rec: dict[str, Any] = {
                    "timestamp": f"2026-04-02T08:{i // 60 % 60:02d}:{i % 60:02d}.000Z", "type": "response_item",
                    "payload": {"type": "message", "role": "user" if user else "assistant",
                                "content": [{"type": "input_text" if user else "output_text", "text": text}]}}
            elif fmt == "openclaw":
                msg: dict[str, Any] = {"role": "user", "content": text} if user else {
                    "role": "assistant", "content": [{"type": "text", "text": text}], "model": "m", "stopReason": "stop"}
                rec = {"type": "message", "id": f"e{i}", "parentId": parent,
                       "timestamp": f"2026-04-03T07:{i // 60 % 60:02d}:{i % 60:02d}.000Z", "message": msg}
                parent = f"e{i}"
            else:
                uid = f"00000000-0000-4000-8000-{i + 1:012d}"
                msg = {"role": "user", "content": text} if user else {
                    "role": "assistant", "id": f"msg_{i}", "content": [{"type": "text", "text": text}]}
                rec = {"type": "user" if user else "assistant", "uuid": uid, "parentUuid": parent, "sessionId": sid,
                       "isSidechain": False, "timestamp": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.000Z",
                       "message": msg}
                parent = uid
            f.write(json.dumps(rec) + "\n")


_SUFFIX = {"sharegpt": ".json", "openhands": ".json", "swe-agent": ".traj"}


@pytest.mark.parametrize("formats", [("claude-code", "openclaw"), ("codex", "sharegpt"), ("openhands", "swe-agent")])
async def test_an_import_of_many_texts_is_streamed_its_memory_bounded_by_the_largest_node(shared_env, tmp_path: Path,
                                                                                           formats: tuple[str, str]) -> None:
    """SPEC §9 session/import: user and model texts are kept aside as they are read too
    (Claude Code's and OpenClaw's lines wait for their tree walk without their texts), the
    write checks its rules on a skeleton without texts, and what is announced after it is
    read back a page at a time. So importing 24 MB of 100 KB texts grows the daemon's peak RSS
    by a fixed part (the allocator's and the tokenizers' buffers: 4 MiB), each node's
    skeleton (ids, edges, metadata, token counts: under 8 KB) and a few times the largest
    node — not by the session (before: by more than the session). High-water mark as above.
    Every format: Codex's lines too, and the formats that are one JSON document (a ShareGPT
    array, an OpenHands event list, a SWE-agent trajectory), read an element at a time
    (before: decoded whole, the file's text and its decoded tree at once)."""
    chars, count = 100_000, 240
    a = await spawn(tmp_path / "texts.db")
    try:
        for fmt in formats:
            warm = tmp_path / f"warm-{fmt}{_SUFFIX.get(fmt, '.jsonl')}"
            _texts_transcript(warm, fmt, 30, chars, f"warm-{fmt}")  # SQLite's page cache is full too
            await a.import_path(str(warm), format=fmt)
        sessions = []
        for fmt in formats:
            src = tmp_path / f"texts-{fmt}{_SUFFIX.get(fmt, '.jsonl')}"
            _texts_transcript(src, fmt, count, chars, f"texts-{fmt}")
            size = src.stat().st_size
            assert size > count * chars
            pid, before = await _hwm_start(a)
            res = await a.import_path(str(src), format=fmt)
            grown = (_proc_kib(pid, "VmHWM") - before) * 1024
            s = res.sessions[0]
            assert s.created and s.nodes == count, s
            sessions.append(s.session_id)
            bound = 4 * 2**20 + 8192 * count + 10 * chars
            assert grown < bound < size / 3, (
                f"{fmt}: the import grew the daemon by {grown:,} bytes for a {size:,}-byte transcript")
        for sid in sessions:  # the texts were written whole, in order
            got = await a.request("session/history", {"sessionId": sid, "offset": count - 3, "limit": 3})
            assert got.total == count
            assert [(n.role, n.output[:4], len(n.output)) for n in got.nodes] == [
                ("llm" if i % 2 else "user", f"{i} w0"[:4], chars) for i in range(count - 3, count)]
    finally:
        await a.close()


async def _export_grown(a: DagctxClient, sid: str, tmp_path: Path, fmt: str) -> tuple[Any, Path, Path, int]:
    """Export ``sid`` in ``fmt`` twice to files: once to warm the code paths and SQLite's page
    cache, then again with the daemon's high-water mark reset. Returns the second export's
    answer, both files and how far that export grew the daemon's peak RSS (bytes)."""
    suffix = ".jsonl" if fmt == "claude-code" else ".json"
    warm, out = tmp_path / f"warm{suffix}", tmp_path / f"export{suffix}"
    await a.request("session/export", {"sessionId": sid, "path": str(warm), "format": fmt})
    pid, before = await _hwm_start(a)
    res = await a.request("session/export", {"sessionId": sid, "path": str(out), "format": fmt})
    return res, out, warm, (_proc_kib(pid, "VmHWM") - before) * 1024


async def test_an_export_of_many_texts_reads_the_session_a_page_at_a_time(shared_env, tmp_path: Path) -> None:
    """SPEC §9 session/export: the export walks the session's skeleton (edges and metadata,
    no texts; never cached) and reads each node whole, a page at a time, only for its own
    lines — so exporting 24 MB of 100 KB user and model texts (texts the ledger keeps in
    the nodes, not aside) grows the daemon's peak RSS by a fixed part, each node's skeleton
    and a few times the largest node, not by the session (before: the whole session graph,
    cached), and caches no graph of it. The file reads back as the same session."""
    chars, count = 100_000, 240
    a = await spawn(tmp_path / "export.db")
    try:
        src = tmp_path / "texts.jsonl"
        _texts_transcript(src, "claude-code", count, chars, "export-texts")
        sid = (await a.import_path(str(src), format="claude-code")).sessions[0].session_id
        _res, out, warm, grown = await _export_grown(a, sid, tmp_path, "claude-code")
        size = out.stat().st_size
        assert size > count * chars and out.read_bytes() == warm.read_bytes()
        bound = 4 * 2**20 + 8192 * count + 10 * chars
        assert grown < bound < size / 3, f"the export grew the daemon by {grown:,} bytes for a {size:,}-byte file"
        status = await a.daemon_status()
        assert status.caches and all(cache.sessions == 0 for cache in status.caches), status.caches
        again = await a.import_path(str(out))
        assert again.sessions[0].session_id == sid and not again.sessions[0].created
    finally:
        await a.close()


async def test_an_openai_export_of_many_texts_is_written_a_segment_at_a_time(shared_env, tmp_path: Path) -> None:
    """SPEC §9 session/export, ``openai``: the render is walked on the session's skeleton a
    segment of turns at a time, and each message is encoded and written as it is made —
    so exporting 24 MB of 100 KB texts grows the daemon's peak RSS by a fixed part, each
    node's skeleton and a few times the largest node, not by the session (before: the
    whole session graph cached, the whole message list, its encoding and its indented
    copy), and caches no graph of it. The document is the render's, valid JSON."""
    chars, count = 100_000, 240
    a = await spawn(tmp_path / "export-openai.db")
    try:
        src = tmp_path / "texts.jsonl"
        _texts_transcript(src, "claude-code", count, chars, "export-openai")
        sid = (await a.import_path(str(src), format="claude-code")).sessions[0].session_id
        res, out, warm, grown = await _export_grown(a, sid, tmp_path, "openai")
        size = out.stat().st_size
        assert size > count * chars and out.read_bytes() == warm.read_bytes() and res.lines == count
        doc = json.loads(out.read_bytes())
        assert [(x["role"], len(x["content"])) for x in doc["messages"][:2]] == [("user", chars), ("assistant", chars)]
        bound = 4 * 2**20 + 8192 * count + 10 * chars
        assert grown < bound < size / 3, f"the export grew the daemon by {grown:,} bytes for a {size:,}-byte file"
        status = await a.daemon_status()
        assert status.caches and all(cache.sessions == 0 for cache in status.caches), status.caches
    finally:
        await a.close()


async def test_an_export_without_path_stops_at_the_frame_limit(shared_env, tmp_path: Path) -> None:
    """SPEC §9 session/export, §1.4: without `path` the text is the answer's `content`, so
    it is counted as the answer carries it while it is made; as soon as it could no longer
    fit the connection's frame limit (here 500,000 bytes) the export stops and answers
    `ResponseTooLarge`, saying to pass `path` — in both formats. So asking for a 24 MB
    session's text grows the daemon by the frame limit, not the session (before: the whole
    text was built, then refused by its size). A text that fits is answered whole, the
    file's bytes, and the connection lives on."""
    chars, count, limit = 100_000, 240, 500_000
    a = await spawn(tmp_path / "answer.db", extra_args=["--max-frame-bytes", str(limit)])
    try:
        src = tmp_path / "texts.jsonl"
        _texts_transcript(src, "claude-code", count, chars, "answer-texts")
        sid = (await a.import_path(str(src), format="claude-code")).sessions[0].session_id
        small = tmp_path / "small.jsonl"
        _texts_transcript(small, "claude-code", 4, 1000, "answer-small")
        small_sid = (await a.import_path(str(small), format="claude-code")).sessions[0].session_id
        for fmt in ("claude-code", "openai"):  # warm: the code paths, SQLite's page cache
            with pytest.raises(RpcError):
                await a.request("session/export", {"sessionId": sid, "format": fmt})
        for fmt in ("claude-code", "openai"):
            pid, before = await _hwm_start(a)
            with pytest.raises(RpcError) as exc:
                await a.request("session/export", {"sessionId": sid, "format": fmt})
            grown = (_proc_kib(pid, "VmHWM") - before) * 1024
            bound = 4 * 2**20 + 8192 * count + 10 * chars + 4 * limit
            assert grown < bound < count * chars / 2, f"{fmt}: the refused export grew the daemon by {grown:,} bytes"
            err = exc.value
            assert err.kind == "ResponseTooLarge" and "`path`" in err.message and "500,000" in err.message, err
            details = err.data["details"]
            assert details["limit"] == limit and limit - 1024 < details["bytes"] < limit + 3 * chars, details
            out = tmp_path / f"small-{fmt}"
            res = await a.request("session/export", {"sessionId": small_sid, "format": fmt})
            await a.request("session/export", {"sessionId": small_sid, "format": fmt, "path": str(out)})
            assert res.content.encode() == out.read_bytes() and res.lines >= 4
        assert (await a.session_list()).sessions and a.process.returncode is None  # the connection lives on
    finally:
        await a.close()


async def test_an_import_announced_to_an_observing_client_waits_for_it_a_page_at_a_time(shared_env,
                                                                                        tmp_path: Path) -> None:
    """SPEC §9 session/import, §1.5: a client that observes its writes (``observeNodes``)
    hears ``node/didAppend`` for every node an import wrote, in order, whole; the import
    reads them back a page at a time and sends the next page only once the client was sent
    this one and has read most of it — so the announcement of 36 MB of 100 KB texts grows
    the daemon's peak RSS by a page, not by the session queued for the client (36 MB: its
    fixed few MB of page caches and buffers stay far below a third of the transcript)."""
    chars, count = 100_000, 360
    a = await spawn(tmp_path / "observe.db", initialization_options={"observeNodes": True})
    try:
        warm = tmp_path / "warm.jsonl"
        _texts_transcript(warm, "claude-code", 30, chars, "observe-warm")
        await a.import_path(str(warm), format="claude-code")
        src = tmp_path / "texts.jsonl"
        _texts_transcript(src, "claude-code", count, chars, "observe-texts")
        size = src.stat().st_size
        pid, before = await _hwm_start(a)
        res = await a.import_path(str(src), format="claude-code")
        grown = (_proc_kib(pid, "VmHWM") - before) * 1024
        sid = res.sessions[0].session_id
        await a.daemon_status()  # a request after the import: every notification before it has arrived
        heard = [p.node for meth, p in a.notifications if meth == "node/didAppend" and p.session_id == sid]
        hist = await a.request("session/history", {"sessionId": sid, "limit": count})
        assert [n.id for n in heard] == [n.id for n in hist.nodes] and len(heard) == count
        assert all(len(n.output) == chars for n in heard)
        bound = 4 * 2**20 + 8192 * count + 10 * chars
        assert grown < bound < size / 3, f"the import grew the daemon by {grown:,} bytes for a {size:,}-byte transcript"
    finally:
        await a.close()


async def test_the_tokenizers_are_built_at_a_quiet_moment_not_by_a_request(shared_env, tmp_path: Path) -> None:
    """Building a tokenizer's encoder holds the interpreter lock throughout (tiktoken's
    constructor), so the shared daemon builds them in a thread of its own at its first
    quiet moments, not when a request first counts tokens in the middle of every
    connection's work (SPEC §1.4); its log says so. The counts are the same."""
    a = await spawn(tmp_path / "warm.db")
    try:
        log = Path((await a.daemon_status()).log)
        for _ in range(1200):  # a hang guard, not a duration: the daemon is quiet now
            if "tokenizers ready: cl100k_base" in log.read_text():
                break
            await asyncio.sleep(0.05)
        assert "tokenizers ready: cl100k_base" in log.read_text(), log.read_text()[-2000:]
        s = await a.session_create("warm")
        u = await a.append(s.session_id, "user", output="hello world", predecessor=s.head)
        r = await a.render(s.session_id, head=u.node.id, model="gpt-4")
        assert r.tokens.total > 0 and r.messages
    finally:
        await a.close()
