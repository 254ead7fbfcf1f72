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

from test_shared_daemon import shared_env, spawn  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.asyncio


def claude_code_transcript(path: Path, turns: int, result_chars: int) -> None:
    """A Claude Code JSONL of ``turns`` tool-using turns, each tool result ``result_chars`` long."""
    sid = "0e9d2a54-7f3c-4b51-9a43-5b3d1c0f7a11"
    body = " ".join(f"w{k} src/mod_{k % 50}.py total {k * 7}" for k in range(result_chars // 30))
    parent = None
    n = 0

    def line(kind: str, message: dict[str, Any]) -> str:
        nonlocal parent, n
        n += 1
        uid = f"00000000-0000-4000-8000-{n:012d}"
        rec = {"type": kind, "uuid": uid, "parentUuid": parent, "sessionId": sid, "isSidechain": False,
               "timestamp": f"2026-01-01T00:{(n // 60) % 60:02d}:{n % 60:02d}.000Z", "message": message}
        parent = uid
        return json.dumps(rec)

    with open(path, "w", encoding="utf-8") as f:
        for i in range(turns):
            f.write(line("user", {"role": "user", "content": f"turn {i}: check src/mod_{i % 50}.py"}) + "\n")
            f.write(line("assistant", {"role": "assistant", "id": f"msg_{i}a", "content": [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"cat f{i}"}}]}) + "\n")
            f.write(line("user", {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{body} {i}"}]}) + "\n")
            f.write(line("assistant", {"role": "assistant", "id": f"msg_{i}b",
                                       "content": [{"type": "text", "text": f"done {i}"}]}) + "\n")


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
    claude_code_transcript(src, turns=60, result_chars=150_000)
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
        assert before >= 3, f"B got only {before} answers while A's render ran (worst {worst:.3f} s)"
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
        assert before >= 3, f"B got only {before} answers while A imported (worst {worst:.3f} s)"

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
    claude_code_transcript(src, turns=40, result_chars=150_000)
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
