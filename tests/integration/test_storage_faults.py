"""Storage faults through a real daemon: every one answered with a stable kind, no write
acknowledged that is not on disk, reads still served, the daemon alive.

* the database file deleted or replaced underneath a running daemon → the daemon opens
  (or creates) the file the path names for its next request, with a note in its log;
  nothing is ever acknowledged into an unlinked file;
* a second daemon on that path refuses to start an empty database while the old
  write-ahead log is still there;
* a full disk (a small tmpfs) → ``StorageFull``; a read-only mount → ``StorageReadOnly``;
  damaged pages → ``StorageCorrupt``.

The disk tests mount a tmpfs and so need root (CI runs as root); elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagctx.client import DagctxClient, RpcError

from rawdb import RawDb


async def append_user(c: DagctxClient, sid: str, text: str) -> str:
    head = (await c.session_get(sid)).head
    return (await c.append(sid, "user", input=text, predecessor=head)).node.id


async def expect(kind: str, coro) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    assert info.value.kind == kind, info.value.message
    return info.value


async def test_a_deleted_database_is_created_again_for_the_next_request(db_path: Path) -> None:
    c = await DagctxClient.spawn(db_path)
    try:
        sid = (await c.session_create("doomed")).session_id
        for i in range(3):
            await append_user(c, sid, f"before {i}")
        os.unlink(db_path)
        # SPEC §2.1: a missing file is created — by the running daemon too, for its next request.
        assert (await c.session_list()).total == 0
        await expect("SessionNotFound", c.session_get(sid))
        fresh = await c.session_create("after")
        acked = [await append_user(c, fresh.session_id, f"after {i}") for i in range(3)]
        assert db_path.exists() and (db_path.stat().st_mode & 0o777) == 0o600
        with RawDb(db_path) as raw:  # every acknowledged write is in the file the path names
            stored = {r[0] for r in raw.execute("SELECT id FROM nodes WHERE session_id=?", (fresh.session_id,))}
        assert set(acked) <= stored
        await c.stderr_tail.settle() if c.stderr_tail else None
        assert c.stderr_tail is not None and "deleted or replaced" in c.stderr_tail.text(50)
    finally:
        assert await c.close() == 0


async def test_a_second_daemon_refuses_to_start_fresh_beside_the_old_log(db_path: Path) -> None:
    c = await DagctxClient.spawn(db_path)
    try:
        sid = (await c.session_create("doomed")).session_id
        await append_user(c, sid, "before")
        os.unlink(db_path)
        # Before the first daemon noticed: the old write-ahead log is still there.
        with pytest.raises(RpcError) as info:
            await DagctxClient.spawn(db_path)
        assert info.value.kind == "StorageUnavailable" and "-wal" in info.value.message
        assert not db_path.exists()
        # The first daemon folds its log away and starts the new file; then a second one can open it.
        assert (await c.session_list()).total == 0
        d = await DagctxClient.spawn(db_path)
        assert (await d.session_list()).total == 0
        await d.close()
    finally:
        await c.close()


async def test_a_replaced_database_is_reopened_for_the_next_request(tmp_path: Path) -> None:
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    c, d = await DagctxClient.spawn(db), await DagctxClient.spawn(other)
    try:
        sid = (await c.session_create("a")).session_id
        await append_user(c, sid, "one")
        theirs = (await d.session_create("from b")).session_id
        await d.close()
        os.replace(other, db)  # another database moved over ours
        # a write to a session only the old file had: refused, written nowhere
        await expect("SessionNotFound", append_user(c, sid, "two"))
        listed = await c.session_list()
        assert [x.session_id for x in listed.sessions] == [theirs]
        nid = await append_user(c, theirs, "into the new file")
        with RawDb(db) as raw:
            assert raw.execute("SELECT id FROM nodes WHERE id=?", (nid,)) == [(nid,)]
            assert raw.execute("SELECT count(*) FROM nodes WHERE session_id=?", (sid,)) == [(0,)]
    finally:
        await c.close()


async def test_tables_changed_under_the_daemon_are_brought_up_to_date_for_the_next_request(tmp_path: Path) -> None:
    """Another program drops a table of the file and sets its schema version back while the
    daemon has it open: the request that meets the missing table answers
    ``StorageUnavailable`` (not ``InternalError``), and the next one finds the file opened
    again with its schema brought up to date — sessions kept, no restart."""
    db, ws = tmp_path / "t.db", tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("# notes\nthe build uses make\n")
    c = await DagctxClient.spawn(db)
    try:
        sid = (await c.session_create("kept")).session_id
        await append_user(c, sid, "before")
        await c.request("memory/status", {"workspace": str(ws)})
        with RawDb(db) as raw:
            raw.execute("DROP TABLE memory_counts")
            raw.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
        err = await expect("StorageUnavailable", c.request("memory/status", {"workspace": str(ws)}))
        assert "changed while this daemon had it open" in err.message and "retry" in err.message
        status = await c.request("memory/status", {"workspace": str(ws)})
        assert status is not None
        assert [s.session_id for s in (await c.session_list()).sessions] == [sid]
        await append_user(c, sid, "after")
        with RawDb(db) as raw:
            assert raw.execute("SELECT value FROM meta WHERE key='schema_version'") == [("5",)]
            assert raw.execute("SELECT count(*) FROM nodes WHERE session_id=?", (sid,)) == [(3,)]
    finally:
        assert await c.close() == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs (root only): a disk that really fills up and can be made read-only."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


async def test_full_disk_answers_storage_full_and_reads_keep_working(small_disk: Path) -> None:
    db = small_disk / "dagctx.db"
    c = await DagctxClient.spawn(db)
    try:
        sid = (await c.session_create("full")).session_id
        acked = [await append_user(c, sid, f"turn {i}") for i in range(3)]
        filler = fill(small_disk)
        err = None
        for i in range(40):  # until the WAL can no longer grow
            try:
                acked.append(await append_user(c, sid, f"big {i} " + "x" * 60_000))
            except RpcError as exc:
                err = exc
                break
        assert err is not None and err.kind == "StorageFull", err
        assert "free space" in err.message
        assert [n.id for n in (await c.history(sid)).nodes] == acked  # every ack is there, nothing else
        filler.unlink()
        acked.append(await append_user(c, sid, "after freeing space"))
        assert [n.id for n in (await c.history(sid)).nodes] == acked
    finally:
        await c.close()
    d = await DagctxClient.spawn(db)  # and it is all on disk
    try:
        assert [n.id for n in (await d.history(sid)).nodes] == acked
    finally:
        await d.close()


async def test_a_subscriber_hears_a_running_node_finish_after_a_write_failed_on_a_full_disk(
        small_disk: Path) -> None:
    """A write that fails inside its transaction drops the session's graph, read anew for
    the next request: what a subscriber was told is not counted on that graph (SPEC §1.5),
    so a tool that finishes after the failure is announced all the same."""
    db = small_disk / "dagctx.db"
    c = await DagctxClient.spawn(db)
    try:
        s = await c.session_create("watched")
        sid = s.session_id
        q = await c.append(sid, "user", input="run both checks", predecessor=s.head)
        turn = await c.append(sid, "llm", output="running lint and the tests", predecessor=q.node.id)
        one = await c.append(sid, "code", name="lint", input={}, status="running", caller=turn.node.id)
        two = await c.append(sid, "code", name="test", input={}, status="running", caller=turn.node.id)
        await c.subscribe(sid)

        def finished() -> list[tuple[str, str, object]]:
            return [(p.node.id, p.node.status, p.node.output) for meth, p in c.notifications
                    if meth == "node/didUpdate" and p.session_id == sid]

        await c.update(sid, one.node.id, "completed", output="lint: clean")
        filler = fill(small_disk)
        err = None
        for i in range(40):  # until the WAL can no longer grow
            try:
                await c.append(sid, "user", input=f"big {i} " + "x" * 60_000, predecessor=turn.node.id)
            except RpcError as exc:
                err = exc
                break
        assert err is not None and err.kind == "StorageFull", err
        filler.unlink()
        await c.update(sid, two.node.id, "completed", output="tests: 12 passed")
        await c.session_get(sid)  # a request answered after the announcement (a round trip later)
        for _ in range(100):
            if len(finished()) == 2:
                break
            await asyncio.sleep(0.05)
        assert finished() == [(one.node.id, "completed", "lint: clean"),
                              (two.node.id, "completed", "tests: 12 passed")]
    finally:
        await c.close()


async def test_read_only_mount_serves_reads_and_answers_storage_read_only(small_disk: Path) -> None:
    db = small_disk / "dagctx.db"
    c = await DagctxClient.spawn(db)
    sid = (await c.session_create("ro")).session_id
    acked = [await append_user(c, sid, f"迁移 turn {i}") for i in range(3)]
    for i in range(3):
        llm = await c.append(sid, "llm", name="gpt-4o", output="reading", predecessor=acked[-1])
        await c.append(sid, "code", name="read_file", output=f"src/app_{i}.py: def main(): ...", caller=llm.node.id)
        acked += [llm.node.id, await append_user(c, sid, f"next {i}")]
    await c.close()
    with RawDb(db) as raw:  # rows as schema version 1 left them: aging mines them, cannot store that
        raw.execute("UPDATE nodes SET refs=NULL")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    aging = {"minAgeSeconds": 0, "keepRecentTurns": 1, "minTokens": 1, "protectFirst": 0}
    d = await DagctxClient.spawn(db, initialization_options={"aging": aging}, extra_args=["--log-level", "INFO"])
    try:
        assert (await d.render(sid, model="gpt-4o")).messages, "a derived write that fails costs the render nothing"
        assert d.stderr_tail is not None and "not stored (StorageReadOnly)" in d.stderr_tail.text(50)
        assert [n.id for n in (await d.history(sid)).nodes] == acked
        assert len((await d.search("迁移")).hits) == 3
        err = await expect("StorageReadOnly", append_user(d, sid, "refused"))
        assert "read-only" in err.message
        await expect("StorageReadOnly", d.session_create("refused"))
        assert (await d.session_list()).total == 1
    finally:
        await d.close()


async def test_corrupt_pages_answer_storage_corrupt(db_path: Path) -> None:
    c = await DagctxClient.spawn(db_path)
    sid = (await c.session_create("corrupt")).session_id
    for i in range(30):
        await append_user(c, sid, f"turn {i} " + "y" * 2000)
    await c.close()
    with open(db_path, "r+b") as f:  # keep the schema pages, scribble over the node pages
        size = f.seek(0, 2)
        f.seek(size // 2)
        f.write(random.Random(1).randbytes(size - size // 2))
    d = await DagctxClient.spawn(db_path)
    try:
        err = await expect("StorageCorrupt", d.history(sid))
        assert "backup" in err.message and ".recover" in err.message
        await expect("StorageCorrupt", append_user(d, sid, "more"))
        await expect("StorageCorrupt", d.search("turn", session_id=sid))  # not InternalError
        assert (await d.session_get(sid)).title == "corrupt"  # what is readable is still served
    finally:
        await d.close()
    # A file damaged beyond opening is refused at initialize with the same kind, never InternalError.
    with open(db_path, "r+b") as f:
        f.seek(100)
        f.write(random.Random(2).randbytes(8000))
    with pytest.raises(RpcError) as info:
        await DagctxClient.spawn(db_path)
    assert info.value.kind == "StorageCorrupt"
