"""After the database file was replaced underneath the daemon (SPEC §2.1): a render is the
render a fresh daemon gives of the new file (nothing the views kept of the old file's
sessions — token counts, character counts, references — is taken for the new file's), and
a session's subscribers are told ``replaced`` with the new file's head, not a node-by-node
account of the old graph against the new one (SPEC §1.5); what follows speaks of the new
file. (A graph read anew from the same file, after a failed write: ``test_storage_faults.py``.)"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

from dagctx.client import DagctxClient


def _seen(c: DagctxClient, method: str, sid: str) -> list[Any]:
    return [p for meth, p in c.notifications if meth == method and p.session_id == sid]


async def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"not heard within {timeout} s: {what}")
        await asyncio.sleep(0.02)


def _copy(src: Path, dst: Path) -> None:
    """A consistent copy of a database another process has open (SQLite's backup)."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()


async def test_a_render_after_the_file_was_replaced_counts_the_new_files_nodes(tmp_path: Path) -> None:
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    c = await DagctxClient.spawn(db)
    fresh = None
    try:
        s = await c.session_create("replaced")
        sid = s.session_id
        q = await c.append(sid, "user", input="what is in the log?", predecessor=s.head)
        call = await c.append(sid, "code", name="read_log", input={"path": "app.log"}, output="(reading)",
                              status="running", caller=None, predecessor=q.node.id)
        before = await c.render(sid)
        # the same session, its tool call finished with a long output, in another file
        _copy(db, other)
        d = await DagctxClient.spawn(other)
        long_output = "error: the disk is full at block 7\n" * 400
        await d.update(sid, call.node.id, "completed", output=long_output)
        assert await d.close() == 0
        os.replace(other, db)  # moved over the file the first daemon has open
        after = await c.render(sid)
        fresh = await DagctxClient.spawn(db)
        truth = await fresh.render(sid)
        assert after.tokens.total == truth.tokens.total, (before.tokens.total, after.tokens.total, truth.tokens.total)
        assert after.tokens.total > before.tokens.total + 2_000
        assert after.messages == truth.messages
    finally:
        if fresh is not None:
            await fresh.close()
        await c.close()


async def test_subscribers_are_told_replaced_when_the_file_is_replaced(tmp_path: Path) -> None:
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    c = await DagctxClient.spawn(db)
    try:
        s = await c.session_create("replaced")
        sid = s.session_id
        q = await c.append(sid, "user", input="what is in the log?", predecessor=s.head)
        turn = await c.append(sid, "llm", output="reading the log", predecessor=q.node.id)
        call = await c.append(sid, "code", name="read_log", input={"path": "app.log"}, status="running",
                              caller=turn.node.id)
        # the same session in another file: the tool finished there and a turn followed
        _copy(db, other)
        d = await DagctxClient.spawn(other)
        await d.update(sid, call.node.id, "completed", output="error: the disk is full")
        answer = await d.append(sid, "llm", output="The disk is full.", predecessor=turn.node.id)
        assert await d.close() == 0
        await c.subscribe(sid)
        os.replace(other, db)  # moved over the file the first daemon has open
        await _until(lambda: _seen(c, "session/didChange", sid), "session/didChange after the replacement")
        change = _seen(c, "session/didChange", sid)
        assert [(p.change, p.head, p.origin) for p in change] == [("replaced", answer.node.id, None)]
        # no node-by-node account of the old file's graph against the new one's
        assert _seen(c, "node/didUpdate", sid) == [] and _seen(c, "node/didAppend", sid) == []
        history = await c.history(sid)
        assert answer.node.id in [n.id for n in history.nodes]
        # what follows speaks of the new file: the next append is announced, once
        nxt = await c.append(sid, "user", input="free some space", predecessor=answer.node.id)
        # its node and the head it moved are two notifications, written one after the other
        await _until(lambda: _seen(c, "node/didAppend", sid) and len(_seen(c, "session/didChange", sid)) >= 2,
                     "the append after the replacement and the head it moved")
        assert [p.node.id for p in _seen(c, "node/didAppend", sid)] == [nxt.node.id]
        assert [p.change for p in _seen(c, "session/didChange", sid)] == ["replaced", "head"]
    finally:
        await c.close()
