"""A render after the database file was replaced underneath the daemon (SPEC §2.1) is the
render a fresh daemon gives of the new file: nothing the views kept of the old file's
sessions — token counts, character counts, references — is taken for the new file's."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from dagctx.client import DagctxClient


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
