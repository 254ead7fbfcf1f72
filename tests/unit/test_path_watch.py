"""The kernel's word that a path still names the file it named (``ledger/path_watch.py``), and
the never-waiting reads' mark built on it (SPEC §1.4): a replaced file, a folder moved on the
way, a commit — each is seen by the very next look, with nothing to wait for."""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from dagctx.ledger import Store
from dagctx.ledger.path_watch import PathWatch, folders

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def test_folders_are_every_folder_up_to_the_root_of_the_path_and_of_what_it_resolves_to(tmp_path: Path) -> None:
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    got = folders(str(tmp_path / "link" / "deep" / "x.db"))
    assert got[0] == str(tmp_path / "link" / "deep") and "/" in got
    assert str(tmp_path / "real" / "deep") in got and str(tmp_path / "real") in got and str(tmp_path) in got


def test_a_watch_says_changed_once_for_any_name_moved_in_its_folders(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    db = tmp_path / "a" / "b" / "x.db"
    db.write_bytes(b"x")
    w = PathWatch.open(str(db))
    assert w is not None
    try:
        assert not w.changed()
        (db.parent / "x.db.new").write_bytes(b"y")  # a name created beside it
        assert w.changed() and not w.changed()  # once: the events were consumed
        os.replace(db.parent / "x.db.new", db)  # the file replaced by a rename
        assert w.changed() and not w.stale
        (tmp_path / "a" / "other").mkdir()  # a name created in a folder on the way
        assert w.changed() and not w.changed()
        os.rename(tmp_path / "a" / "b", tmp_path / "a" / "b2")  # the file's folder moved away
        assert w.changed() and w.stale  # its watch now watches a folder elsewhere
        with open(db.parent.parent / "b2" / "x.db", "ab") as f:  # a write moves no name
            f.write(b"z")
    finally:
        w.close()
    assert w.fd == -1


def _mark_ready(st: Store):
    """The store's mark, after the reads that open its WAL index (as a quick read does)."""
    st.list_sessions_nowait(10, 0)
    st.list_sessions_nowait(10, 0)
    marker = st.nowait_marker()
    assert marker is not None
    return marker


def test_the_mark_is_the_same_until_a_commit_of_any_connection(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    st = Store(path)
    sid = st.create_session("s").session_id
    marker = _mark_ready(st)
    first = marker()
    assert first is not None and marker() == first == marker()
    st.list_sessions(10, 0)  # a read commits nothing
    assert marker() == first
    st.rename_session(sid, "t")
    second = marker()
    assert second is not None and second != first
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("UPDATE sessions SET title='by hand'")
    raw.close()
    assert marker() not in (None, first, second)
    st.close()


def test_a_replaced_file_gives_no_mark_at_the_very_next_look(tmp_path: Path) -> None:
    path, other = tmp_path / "a.db", tmp_path / "b.db"
    st = Store(path)
    st.create_session("old file")
    marker = _mark_ready(st)
    assert marker() is not None
    o = Store(other)
    o.create_session("new file")
    o.close()
    os.replace(other, path)  # renamed over the open file: the path names another file now
    assert marker() is None
    assert st.list_sessions(10, 0)[1] == 1 and st.list_sessions(10, 0)[0][0].title == "new file"  # reopened
    marker = _mark_ready(st)
    assert marker() is not None and marker() == marker()
    st.close()


def test_after_a_move_every_mark_looks_at_the_path_until_the_file_is_reopened(tmp_path: Path) -> None:
    """The first look empties the watch's queue; a second one — another client's reader, before
    the usual read reopened the file — must not take the watch's silence since for "nothing
    moved": it looks at the path too, and gets no mark while the path names another file."""
    path, other = tmp_path / "a.db", tmp_path / "b.db"
    st = Store(path)
    st.create_session("old file")
    marker = _mark_ready(st)
    assert marker() is not None
    Store(other).close()
    os.replace(other, path)
    assert marker() is None  # the watch told of it (and its queue is empty now)
    assert marker() is None and marker() is None  # still another file at the path: no mark
    assert st.list_sessions(10, 0)[1] == 0  # the usual read reopens the file the path names
    marker = _mark_ready(st)
    assert marker() is not None and marker() == marker()
    st.close()


def test_a_readers_quiet_word_stands_for_the_watch_and_only_for_it(tmp_path: Path) -> None:
    """``quiet``: the watch a reader thread polled beside its input, found with nothing queued
    when the input woke it (pipe_reader.py). The mark then does not ask the watch (its queue is
    left as it was); given anything else, or nothing, it asks (and empties the queue)."""
    import select

    path = tmp_path / "a.db"
    st = Store(path)
    st.create_session("s")
    marker = _mark_ready(st)
    watch = st.nowait_watch()
    assert watch is not None and watch is st.backend.nowait_watch()  # type: ignore[attr-defined]
    first = marker()

    def queued() -> bool:
        return bool(select.select([watch], [], [], 0)[0])

    (tmp_path / "beside.txt").write_bytes(b"x")  # a name created in the folder: an event queued
    assert queued()
    assert marker(watch) == first and queued()  # taken at its word: the queue not touched
    assert marker(object()) == first and not queued()  # not its word: asked (the same file)
    (tmp_path / "beside2.txt").write_bytes(b"x")
    assert queued() and marker() == first and not queued()
    st.close()


def test_a_folder_moved_on_the_way_gives_no_mark(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "a.db"
    st = Store(path)
    st.create_session("here")
    marker = _mark_ready(st)
    assert marker() is not None
    os.rename(tmp_path / "d", tmp_path / "moved")  # the path names nothing now
    (tmp_path / "d").mkdir()
    shutil.copy(tmp_path / "moved" / "a.db", path)  # and then a copy
    assert marker() is None
    st.close()


def test_without_a_watch_the_mark_looks_at_the_path_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where inotify is out of reach (its instance limit reached), the mark stats the path."""
    monkeypatch.setattr(PathWatch, "open", classmethod(lambda cls, path: None))
    path, other = tmp_path / "a.db", tmp_path / "b.db"
    st = Store(path)
    st.create_session("old")
    marker = _mark_ready(st)
    assert st.backend._path_watch is None  # type: ignore[attr-defined]
    assert marker() is not None and marker() == marker()
    Store(other).close()
    os.replace(other, path)
    assert marker() is None
    st.close()


def test_a_process_keeps_at_most_so_many_watches_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inotify instances are a budget the user's other programs share: past ``AT_MOST`` open
    in this process, a path gets no watch (and is looked at with ``stat``); one closed frees one."""
    from dagctx.ledger import path_watch

    start = path_watch._open  # (other tests' stores may hold some)
    monkeypatch.setattr(path_watch, "AT_MOST", start + 3)
    held = []
    try:
        while (w := PathWatch.open(str(tmp_path / f"{len(held)}.db"))) is not None:
            held.append(w)
            assert len(held) <= path_watch.AT_MOST
        assert len(held) == 3 and path_watch._open == path_watch.AT_MOST
        held.pop().close()
        again = PathWatch.open(str(tmp_path / "again.db"))
        assert again is not None
        again.close()
        again.close()  # closing twice frees one place, not two
        more = PathWatch.open(str(tmp_path / "more.db"))
        assert more is not None
        held.append(more)
        assert PathWatch.open(str(tmp_path / "full.db")) is None
    finally:
        for w in held:
            w.close()
    assert path_watch._open == start
