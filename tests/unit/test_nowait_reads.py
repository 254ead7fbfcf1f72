"""Reads that never wait (SPEC §1.4, the quick reads the daemon answers on its event loop):
the same answers as the usual reads, kept only until any connection commits, and None —
at once — whenever the usual read would have to wait or reopen the file."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

from dagctx.ledger import Store
from dagctx.ledger.sqlite_backend import SqliteBackend


def _store(path: Path, **kw) -> Store:
    return Store(path, **kw)


def test_the_nowait_reads_answer_what_the_usual_reads_answer(tmp_path: Path) -> None:
    st = _store(tmp_path / "a.db")
    ids = [st.create_session(f"s{i}", {"k": i, "_private": 1}).session_id for i in range(5)]
    for limit, offset in ((1, 0), (3, 2), (100, 0), (0, 0), (5, 10), (Store.NOWAIT_LIST_LIMIT, 0)):
        got = st.list_sessions_nowait(limit, offset)
        assert got is not None and got == st.list_sessions(limit, offset), (limit, offset)
        assert got == st.list_sessions_nowait(limit, offset)  # kept: the same again
    for sid in ids:
        assert st.get_session_nowait(sid) == st.get_session(sid)
        assert "_private" not in st.get_session_nowait(sid).metadata  # type: ignore[union-attr]
    fresh = _store(tmp_path / "a.db")  # a reader that never looked: same_batch cannot skip the look
    assert fresh.list_sessions_nowait(3, 0, same_batch=True) == st.list_sessions(3, 0)
    assert fresh.get_session_nowait(ids[0], same_batch=True) == st.get_session(ids[0])
    # what the usual read answers with an error, or would read long, is left to it
    assert st.get_session_nowait("no-such-session") is None
    assert st.list_sessions_nowait(Store.NOWAIT_LIST_LIMIT + 1, 0) is None
    assert st.list_sessions_nowait(10, Store.NOWAIT_LIST_LIMIT + 1) is None
    assert st.list_sessions_nowait(-1, 0) is None and st.list_sessions_nowait(1, -1) is None


def test_a_kept_answer_is_dropped_when_any_connection_commits(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    st = _store(path)
    sid = st.create_session("first").session_id
    before = st.list_sessions_nowait(10, 0)
    assert before is not None and before[1] == 1
    assert st.get_session_nowait(sid).title == "first"  # type: ignore[union-attr]

    st.rename_session(sid, "renamed")  # this store's writer connection
    assert st.get_session_nowait(sid).title == "renamed"  # type: ignore[union-attr]
    assert st.list_sessions_nowait(10, 0) == st.list_sessions(10, 0) != before

    other = _store(path)  # another store on the file, as another process would be
    other.create_session("from elsewhere")
    got = st.list_sessions_nowait(10, 0)
    assert got is not None and got[1] == 2 and got == st.list_sessions(10, 0)

    raw = sqlite3.connect(path, isolation_level=None)  # a plain connection behind our back
    raw.execute("UPDATE sessions SET title='by hand' WHERE id=?", (sid,))
    raw.close()
    assert st.get_session_nowait(sid).title == "by hand"  # type: ignore[union-attr]
    assert st.get_session_nowait(sid) == st.get_session(sid)


def test_the_nowait_reader_never_waits_for_a_lock(tmp_path: Path) -> None:
    """In WAL mode a reader meets a lock only while another connection recovers the log or
    holds the file in exclusive locking mode; then the usual read waits up to the storage
    timeout and the never-waiting one must not: its connection has no busy timeout."""
    backend = SqliteBackend(str(tmp_path / "a.db"), lock_timeout=30.0)
    st = Store(backend=backend)
    st.create_session("s")
    assert st.list_sessions_nowait(10, 0) is not None
    conn = backend._nowait_conn  # the file's never-waiting reader
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    assert backend.db.execute("PRAGMA busy_timeout").fetchone()[0] == 30000  # the usual reader waits
    # a fault on it (here: closed under it, as a reopen does) answers None, then a new one is opened
    conn.close()
    assert st.list_sessions_nowait(10, 0) is None
    assert st.list_sessions_nowait(10, 0) == st.list_sessions(10, 0)
    assert backend._nowait_conn is not conn and conn not in backend._readers


def test_the_nowait_reads_share_one_connection_and_never_wait_for_each_other(tmp_path: Path) -> None:
    """Many clients' reader threads: one connection for the file, however many threads
    asked (a connection per thread would outlive its client), and a read that finds it
    taken answers None at once (the usual way serves it) instead of waiting."""
    backend = SqliteBackend(str(tmp_path / "a.db"))
    st = Store(backend=backend)
    sid = st.create_session("s").session_id
    readers_before = len(backend._readers)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(st.get_session_nowait(sid))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(backend._readers) <= readers_before + 1
    assert all(r is None or r == st.get_session(sid) for r in results) and any(r is not None for r in results)
    with backend._nowait_lock:  # another quick read under way
        assert st.get_session_nowait(sid) is None and st.list_sessions_nowait(10, 0) is None
    assert st.get_session_nowait(sid) == st.get_session(sid)


def test_a_replaced_file_is_left_to_the_usual_read_which_reopens_it(tmp_path: Path) -> None:
    path, other = tmp_path / "a.db", tmp_path / "b.db"
    st = _store(path)
    st.create_session("old file")
    assert st.list_sessions_nowait(10, 0)[1] == 1  # type: ignore[index]
    o = _store(other)
    o.create_session("new file 1")
    o.create_session("new file 2")
    o.backend.close()
    for sfx in ("", "-wal", "-shm"):
        if os.path.exists(str(path) + sfx):
            os.unlink(str(path) + sfx)
    shutil.copy(other, path)
    time.sleep(0)  # nothing to wait for: the next read sees the new file's identity
    assert st.list_sessions_nowait(10, 0) is None
    assert st.list_sessions(10, 0)[1] == 2  # the usual read reopens the file the path names
    got = st.list_sessions_nowait(10, 0)
    assert got is not None and got[1] == 2 and got == st.list_sessions(10, 0)


def test_a_store_in_memory_has_no_nowait_reads() -> None:
    st = Store(":memory:")
    sid = st.create_session("s").session_id
    assert st.list_sessions_nowait(10, 0) is None and st.get_session_nowait(sid) is None


def _statements(st: Store) -> list[str]:
    """Every statement the never-waiting connection runs from now on."""
    seen: list[str] = []
    st.backend._nowait_conn.set_trace_callback(seen.append)  # type: ignore[attr-defined]
    return seen


def test_with_no_commit_since_the_last_look_a_nowait_read_runs_no_statement(tmp_path: Path) -> None:
    """The WAL index header unchanged since the last ``PRAGMA data_version`` means no commit
    since: the kept rows are answered without a statement (SPEC §1.4)."""
    st = _store(tmp_path / "a.db")
    sid = st.create_session("s").session_id
    assert st.list_sessions_nowait(10, 0) is not None
    assert st.list_sessions_nowait(10, 0) is not None  # the WAL index is open after a look
    seen = _statements(st)
    for _ in range(5):
        assert st.list_sessions_nowait(10, 0) == st.list_sessions(10, 0)
        assert st.get_session_nowait(sid) is not None
    assert [s for s in seen if "data_version" in s] == []
    assert len([s for s in seen if s.startswith("SELECT")]) == 1  # the session row, read once and kept
    st.rename_session(sid, "t")  # a commit: the header moves, the version is read again
    assert st.get_session_nowait(sid).title == "t"  # type: ignore[union-attr]
    assert [s for s in seen if "data_version" in s] == ["PRAGMA data_version"]


def test_every_commit_behind_our_back_is_seen_checkpoints_and_log_restarts_included(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    st = _store(path)
    sid = st.create_session("s").session_id
    raw = sqlite3.connect(path, isolation_level=None)
    for i in range(40):
        raw.execute("UPDATE sessions SET title=? WHERE id=?", (f"t{i}", sid))
        if i % 7 == 3:  # the log folded into the file and started over: the header is rewritten
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert st.get_session_nowait(sid).title == f"t{i}"  # type: ignore[union-attr]
        assert st.get_session_nowait(sid).title == f"t{i}"  # type: ignore[union-attr]
    raw.close()


def test_a_commit_from_another_process_is_seen(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "a.db"
    st = _store(path)
    sid = st.create_session("s").session_id
    for i in range(3):
        assert st.get_session_nowait(sid) is not None
        subprocess.run([sys.executable, "-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], isolation_level=None); "
                        "c.execute('UPDATE sessions SET title=? WHERE id=?', (sys.argv[2], sys.argv[3]))",
                        str(path), f"p{i}", sid], check=True)
        assert st.get_session_nowait(sid).title == f"p{i}"  # type: ignore[union-attr]


def test_the_wal_index_is_closed_with_the_store(tmp_path: Path) -> None:
    st = _store(tmp_path / "a.db")
    st.create_session("s")
    st.list_sessions_nowait(10, 0)
    st.list_sessions_nowait(10, 0)
    fd = st.backend._nowait_shm  # type: ignore[attr-defined]
    assert fd >= 0 and os.readlink(f"/proc/self/fd/{fd}").endswith("a.db-shm")
    st.close()
    assert st.backend._nowait_shm == -1  # type: ignore[attr-defined]


def test_an_answer_is_built_once_while_nothing_is_committed(tmp_path: Path) -> None:
    """The same answer object for every read until a commit (the server then reuses its
    encoding); a commit gives a new one that says what changed."""
    st = _store(tmp_path / "a.db")
    sid = st.create_session("s").session_id

    def shape(sessions: list, total: int) -> tuple[str, list, int]:
        return ("shaped", sessions, total)

    first = st.list_sessions_nowait(10, 0, shape=shape)
    assert first == ("shaped", *st.list_sessions(10, 0))
    assert st.list_sessions_nowait(10, 0, shape=shape) is first
    plain = st.list_sessions_nowait(10, 0)
    assert plain == st.list_sessions(10, 0) and st.list_sessions_nowait(10, 0) is plain  # its own answer
    one = st.get_session_nowait(sid)
    assert st.get_session_nowait(sid) is one
    st.rename_session(sid, "renamed")
    again = st.list_sessions_nowait(10, 0, shape=shape)
    assert again is not first and again[1][0].title == "renamed"
    assert st.get_session_nowait(sid) is not one and st.get_session_nowait(sid).title == "renamed"  # type: ignore[union-attr]


def test_no_commit_can_bypass_the_wal_index_while_the_store_is_open(tmp_path: Path) -> None:
    """What the look at the WAL index header rests on: while the store's connections are
    open, another process can neither leave WAL mode nor write in exclusive locking mode
    (which keeps its index in private memory); either would commit without rewriting the
    header."""
    import subprocess
    import sys

    path = tmp_path / "a.db"
    st = _store(path)
    sid = st.create_session("s").session_id
    assert st.get_session_nowait(sid) is not None and st.get_session_nowait(sid) is not None
    script = """
import sqlite3, sys
for first_read in (False, True):
    c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0.05)
    if first_read:
        c.execute('SELECT count(*) FROM sessions').fetchone()  # the index mapped first, then exclusive
    for pragma in ('PRAGMA locking_mode=EXCLUSIVE', 'PRAGMA journal_mode=DELETE'):
        try:
            c.execute(pragma).fetchone()
            c.execute("UPDATE sessions SET title='behind' WHERE id=?", (sys.argv[2],))
            print('wrote', pragma)
        except sqlite3.OperationalError as exc:
            print('refused', pragma, exc)
    c.close()
"""
    out = subprocess.run([sys.executable, "-c", script, str(path), sid], capture_output=True, text=True, check=True).stdout
    assert "wrote" not in out and out.count("refused") == 4, out
    assert st.get_session_nowait(sid).title == "s" == st.get_session(sid).title  # type: ignore[union-attr]
