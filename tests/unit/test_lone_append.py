"""A lone append committed on its submitter's thread (``Store.append_alone``,
``Writer.run_alone``; SPEC §4.2): when the writer is idle and nothing would make it wait,
the unit is a group of one run where it was submitted. It must store exactly what the
group commit stores — rows, seq, HEAD, search rows — fail alone leaving the database as it
was, and never wait: not for another process's lock, not for a sync at COMMIT, not for
a thread holding the store; then it is not run at all and the writer thread takes it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dagctx.ledger import AppendRequest, Store
from dagctx.ledger.writer import Writer
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import NodeInput
from rawdb import RawDb


@pytest.fixture
def store(database: str):
    s = Store(database)
    yield s
    s.close()


def U(pred: str | None, text: str = "hi", **kw: Any) -> NodeInput:
    return NodeInput(role="user", input=text, predecessor=pred, **kw)


def L(pred: str | None, text: str = "ok", **kw: Any) -> NodeInput:
    return NodeInput(role="llm", output=text, predecessor=pred, **kw)


def _words(k: int) -> str:
    """A text only node ``k`` of a test has: one Latin word and one CJK word of its own."""
    return f"lone{k}word 第{'一二三四五六七八九十'[k % 10]}{'甲乙丙丁戊己庚辛壬癸'[k // 10 % 10]}段"


def _units(sid: str) -> list[AppendRequest]:
    """A turn: a user message, an llm call, its tool call (a batch with a second llm call),
    a branch from the root that leaves HEAD, and a moveHead append."""
    return [
        AppendRequest(sid, [U("ROOT", _words(0), id="n0")]),
        AppendRequest(sid, [L("n0", _words(1), id="n1")]),
        AppendRequest(sid, [NodeInput(role="code", name="bash", input={"cmd": "ls"}, output=_words(2),
                                      caller="n1", id="n2"), L("n1", _words(3), id="n3")], batch=True),
        AppendRequest(sid, [U("ROOT", _words(4), id="n4")]),
        AppendRequest(sid, [L("n4", _words(5), id="n5")], move_head=True),
    ]


def _columns(store: Store, sid: str) -> list[tuple]:
    root = store.get_session(sid).root_id
    return [(r.id, r.seq, r.rev, r.role, r.name, r.status, r.caller,
             "ROOT" if r.predecessor == root else r.predecessor, r.tokens, r.refs, r.search_text)
            for r in store.backend.node_rows(sid) if r.id != root]


def _session_row(path: str, sid: str) -> tuple:
    with RawDb(path) as db:
        return db.execute("SELECT head, next_seq, rev, node_count FROM sessions WHERE id=?", (sid,))[0]


def _state(path: str) -> tuple:
    """Everything an append may change: every node row, every session row, the search rows."""
    with RawDb(path) as db:
        nodes = db.execute("SELECT session_id, id, seq, rev, predecessor, caller FROM nodes ORDER BY session_id, seq")
        sessions = db.execute("SELECT id, head, next_seq, rev, node_count FROM sessions ORDER BY id")
        search = [] if db.pg else db.execute("SELECT rowid, node_id FROM search ORDER BY rowid")
    return nodes, sessions, search


def _threads_running_alone(store: Store) -> list[int]:
    """The thread of every ``append_alone`` the store runs from now on, in order (each one
    recorded, then run as it would be)."""
    threads: list[int] = []
    run_alone = store.append_alone

    def recorded(unit: AppendRequest) -> Any:
        threads.append(threading.get_ident())
        return run_alone(unit)

    store.append_alone = recorded  # type: ignore[method-assign]
    return threads


def test_a_lone_append_stores_what_a_group_stores(store: Store) -> None:
    alone, grouped = store.create_session(), store.create_session()
    outs = []
    for unit in _units(alone.session_id):
        before = _state(store.path)
        got = store.append_alone(unit)
        if store.kind != "sqlite":  # every PostgreSQL statement waits for the server
            assert got is None and _state(store.path) == before
            got = store.append_group([unit])[0]
        assert not isinstance(got, BaseException) and got is not None, got
        outs.append(got)
    together = store.append_group(_units(grouped.session_id))
    assert not any(isinstance(r, BaseException) for r in together), together
    assert [[(o.node.id, o.node.seq, o.head, o.moved) for o in r] for r in outs] == \
        [[(o.node.id, o.node.seq, o.head, o.moved) for o in r] for r in together]  # type: ignore[union-attr]
    assert _columns(store, alone.session_id) == _columns(store, grouped.session_id)
    assert _session_row(store.path, alone.session_id) == _session_row(store.path, grouped.session_id)
    assert _session_row(store.path, alone.session_id)[:2] == ("n5", 7)
    for k in range(6):
        for word in (f"lone{k}word", _words(k).split()[1][1:3]):
            for sid in (alone.session_id, grouped.session_id):
                assert [h.node_id for h in store.search(word, session_id=sid)] == [f"n{k}"], (k, word)
    other = Store(store.path)
    try:
        assert [n.id for n in other.history(alone.session_id)[0]] == ["n4", "n5"]
        assert set(other.graph(alone.session_id).nodes) == set(store.graph(alone.session_id).nodes)
    finally:
        other.close()


def _refuse_at_insert(path: str) -> None:
    with RawDb(path) as db:
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON nodes WHEN NEW.id = 'poison' "
                   "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")


def test_a_refused_lone_append_leaves_the_database_as_it_was(fresh_sqlite: Path) -> None:
    path = str(fresh_sqlite)
    store = Store(path)
    try:
        s = store.create_session()
        sid = s.session_id
        assert not isinstance(store.append_alone(AppendRequest(sid, [U(s.root_id, "first", id="a")])), BaseException)
        _refuse_at_insert(path)
        before = _state(path)
        refused = [
            AppendRequest(sid, [L("nope", id="b")]),  # by the rules, before writing
            AppendRequest(sid, [U("a", id="a")]),  # a duplicate id
            AppendRequest(sid, [L("a", "poisoned", id="poison")]),  # by the database, after writing
            AppendRequest(sid, [L("a", _words(7), id="c"), U("c", id="poison")], batch=True),  # its second node
            AppendRequest(sid, [L("a", id="d"), L("missing", id="e")], batch=True),
            AppendRequest("no-such-session", [U(None)]),
        ]
        for unit in refused:
            got = store.append_alone(unit)
            assert isinstance(got, BaseException), (unit, got)
            assert _state(path) == before, unit
        assert set(store.graph(sid).nodes) == {s.root_id, "a"}
        assert store.search("lone7word") == [] and store.search("poisoned") == []
        # and the next lone append goes on from there
        got = store.append_alone(AppendRequest(sid, [L("a", id="f")]))
        assert not isinstance(got, BaseException) and got is not None
        assert (got[0].node.seq, got[0].head) == (2, "f")
        assert _session_row(path, sid) == ("f", 3, 3, 3)
    finally:
        store.close()


def test_a_lone_append_never_waits_for_another_process_lock(fresh_sqlite: Path) -> None:
    path = str(fresh_sqlite)
    store = Store(path)
    raw = RawDb(path)
    try:
        s = store.create_session()
        before = _state(path)
        raw.begin()  # another process holds the write lock
        try:
            assert store.append_alone(AppendRequest(s.session_id, [U(s.root_id, id="x")])) is None
            assert store.backend._wdb.execute("PRAGMA busy_timeout").fetchone()[0] == \
                int(store.backend.lock_timeout * 1000)  # the writer thread still waits its time
            assert not store.backend._wdb.in_transaction
        finally:
            raw.commit()
        assert _state(path) == before
        got = store.append_alone(AppendRequest(s.session_id, [U(s.root_id, id="x")]))
        assert got is not None and not isinstance(got, BaseException) and got[0].node.seq == 1
    finally:
        raw.close()
        store.close()


def test_a_lone_append_never_waits_for_a_sync(fresh_sqlite: Path) -> None:
    """synchronous=FULL syncs at every COMMIT: the writer thread runs it (and groups it)."""
    store = Store(str(fresh_sqlite), synchronous="FULL")
    try:
        s = store.create_session()
        before = _state(str(fresh_sqlite))
        assert store.append_alone(AppendRequest(s.session_id, [U(s.root_id, id="x")])) is None
        assert _state(str(fresh_sqlite)) == before
        got = store.append_group([AppendRequest(s.session_id, [U(s.root_id, id="x")])])[0]
        assert not isinstance(got, BaseException) and got[0].node.seq == 1
    finally:
        store.close()


@pytest.mark.parametrize("which", ["lock", "_wlock"])
def test_a_lone_append_never_waits_for_a_thread_holding_the_store(fresh_sqlite: Path, which: str) -> None:
    """A view refreshing a graph holds the store's lock; a write of another thread holds the
    write lock: the lone append is not run (the writer thread waits for them instead)."""
    store = Store(str(fresh_sqlite))
    try:
        s = store.create_session()
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with getattr(store, which):
                held.set()
                release.wait()

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        try:
            assert store.append_alone(AppendRequest(s.session_id, [U(s.root_id, id="x")])) is None
        finally:
            release.set()
            t.join()
        assert _session_row(str(fresh_sqlite), s.session_id)[1:] == (1, 1, 1)
        assert store.append_alone(AppendRequest(s.session_id, [U(s.root_id, id="x")])) is not None
    finally:
        store.close()


def test_the_writer_runs_a_lone_append_on_the_callers_thread_only_when_idle(fresh_sqlite: Path) -> None:
    store = Store(str(fresh_sqlite))
    heard: list[Any] = []
    done = threading.Event()

    def notify(items: list[Any]) -> None:
        heard.extend(items)
        if any(w == "queued" for w, _, _ in items):
            done.set()

    threads = _threads_running_alone(store)
    writer = Writer(store, notify)
    try:
        s = store.create_session()
        sid = s.session_id
        got = writer.run_alone(AppendRequest(sid, [U(s.root_id, id="a")]))
        assert got is not None and not isinstance(got, BaseException) and got[0].node.seq == 1
        assert threads == [threading.get_ident()] and heard == []  # here, and nobody else was told
        assert (writer.groups, writer.units) == (1, 1)
        # a refusal is answered the same way, from here
        refused = writer.run_alone(AppendRequest(sid, [L("nope", id="b")]))
        assert isinstance(refused, DagctxError) and refused.kind == "NodeNotFound"

        # the writer thread busy with a write: not run here, and queued work keeps its order
        inside, go_on = threading.Event(), threading.Event()
        writer.call(lambda: (inside.set(), go_on.wait()), "blocking")
        inside.wait()
        assert writer.run_alone(AppendRequest(sid, [L("a", id="late")])) is None
        writer.append(AppendRequest(sid, [L("a", id="b")]), "queued")
        go_on.set()
        assert done.wait(30)
        outcome = {w: (ok, v) for w, ok, v in heard}
        assert outcome["queued"][0] and outcome["queued"][1][0].node.seq == 2
        assert [n.id for n in store.history(sid)[0]] == ["a", "b"]  # "late" was never written
        # idle again: the next lone append runs here once more
        got = writer.run_alone(AppendRequest(sid, [L("b", id="c")]))
        assert got is not None and not isinstance(got, BaseException) and got[0].node.seq == 3
        assert len(threads) == 3 and set(threads) == {threading.get_ident()}
    finally:
        writer.close()
        store.close()


def test_the_writer_thread_waits_while_a_lone_append_runs(fresh_sqlite: Path) -> None:
    """What is queued while a lone append runs on its submitter's thread is taken by the
    writer thread only after it: queue order holds."""
    store = Store(str(fresh_sqlite))
    order: list[str] = []
    told = threading.Event()

    def notify(items: list[Any]) -> None:
        order.extend(f"told {w}" for w, _, _ in items)
        told.set()

    inside, go_on = threading.Event(), threading.Event()
    run_alone = store.append_alone

    def slow(unit: AppendRequest) -> Any:
        inside.set()
        go_on.wait()
        out = run_alone(unit)
        order.append("alone committed")
        return out

    store.append_alone = slow  # type: ignore[method-assign]
    writer = Writer(store, notify)
    try:
        s = store.create_session()
        sid = s.session_id
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(writer.run_alone(AppendRequest(sid, [U(s.root_id, id="a")]))))
        t.start()
        inside.wait()
        writer.append(AppendRequest(sid, [L("a", id="b")]), "queued")
        assert not told.wait(0.2)  # the thread does not take it meanwhile
        go_on.set()
        t.join()
        assert told.wait(30)
        assert order == ["alone committed", "told queued"]
        assert result[0][0].node.seq == 1
        assert [n.id for n in store.history(sid)[0]] == ["a", "b"]
    finally:
        writer.close()
        store.close()


def test_a_lone_append_never_folds_the_log_into_the_file(fresh_sqlite: Path) -> None:
    """The COMMIT that brings the write-ahead log to 1000 pages checkpoints it — writes the
    pages back into the file and syncs it, milliseconds on the event loop. A lone append is
    refused well before that length (nothing written); the writer thread's group commits it
    and folds the log; lone appends resume on the short log."""
    import os
    import sys

    from dagctx.ledger.sqlite_file import CHECKPOINT_PAGES, NOWAIT_LOG_MARGIN

    path = str(fresh_sqlite)
    store = Store(path)
    index = -1
    try:
        s = store.create_session()
        index = os.open(path + "-shm", os.O_RDONLY)

        def log_pages() -> int:
            return int.from_bytes(os.pread(index, 96, 0)[16:20], sys.byteorder)

        ran, refused, shortened = [], 0, False
        prev = s.root_id
        for k in range(400):
            before = log_pages()
            unit = AppendRequest(s.session_id, [U(prev, _words(k) * 20, id=f"a{k}")])
            got = store.append_alone(unit)
            if got is None:
                refused += 1
                assert before >= CHECKPOINT_PAGES - NOWAIT_LOG_MARGIN
                got = store.append_group([unit])[0]  # what the writer thread does
            else:
                ran.append(before)
            assert not isinstance(got, BaseException) and got[0].node.seq == k + 1
            shortened = shortened or log_pages() < before
            prev = f"a{k}"
        assert ran and max(ran) < CHECKPOINT_PAGES - NOWAIT_LOG_MARGIN  # never near the fold
        assert refused and shortened  # the log grew to it, and the writer's commits folded it
        assert len(ran) > refused  # and lone appends went on once it was short again
    finally:
        if index >= 0:
            os.close(index)
        store.close()


def test_a_lone_append_leaves_a_replaced_file_to_the_writer_thread(fresh_sqlite: Path, tmp_path: Path) -> None:
    """The path names another file (restored from a backup): reopening it is the writer
    thread's (it may wait for the file), so the lone append is not run; the writer's group
    then reopens the file and writes there (SPEC §2.1)."""
    import os
    import sqlite3

    path = str(fresh_sqlite)
    store = Store(path)
    try:
        s = store.create_session()
        copy = str(tmp_path / "copy.db")
        src, dst = sqlite3.connect(path), sqlite3.connect(copy)
        src.backup(dst)
        src.close()
        dst.close()
        os.replace(copy, path)
        assert store.append_alone(AppendRequest(s.session_id, [U(s.root_id, id="x")])) is None
        assert _session_row(path, s.session_id)[1:] == (1, 1, 1)
        got = store.append_group([AppendRequest(s.session_id, [U(s.root_id, id="x")])])[0]
        assert not isinstance(got, BaseException) and got[0].node.seq == 1
        assert _session_row(path, s.session_id) == ("x", 2, 2, 2)
        # the file reopened, a lone append runs here again
        got = store.append_alone(AppendRequest(s.session_id, [L("x", id="y")]))
        assert got is not None and not isinstance(got, BaseException) and got[0].node.seq == 2
    finally:
        store.close()


def test_the_writer_thread_derives_what_was_left_to_it_and_isolates_its_failure(fresh_sqlite: Path) -> None:
    """A unit whose derived data (token counts) was left to whoever runs it
    (``AppendRequest.derive``) is derived once, by the writer thread before the group's
    commit, and its row keeps it; a unit whose derivation fails answers that error alone:
    nothing of it is written, its group-mates are committed with contiguous seq (SPEC §4.2).
    Run alone on the submitter's thread, the submitter derives it."""
    from dagctx.ledger import NodeDerived

    store = Store(str(fresh_sqlite))
    heard: list[Any] = []
    done = threading.Event()
    derived_on: list[tuple[str, int]] = []

    def notify(items: list[Any]) -> None:
        heard.extend(items)
        if len(heard) >= 3:
            done.set()

    def derive(nid: str, n: int, fail: bool = False) -> Any:
        def run() -> list[NodeDerived]:
            derived_on.append((nid, threading.get_ident()))
            if fail:
                raise ValueError(f"cannot count {nid}")
            return [NodeDerived(tokens={"cl100k": (n, n + 1)}) for _ in range(1)]
        return run

    writer = Writer(store, notify)
    try:
        s = store.create_session()
        sid = s.session_id
        inside, go_on = threading.Event(), threading.Event()
        writer.call(lambda: (inside.set(), go_on.wait()), "blocking")  # the three queue up as one group
        inside.wait()
        writer.append(AppendRequest(sid, [U(s.root_id, id="a")], derive=derive("a", 3)), "a")
        writer.append(AppendRequest(sid, [L("a", id="bad")], derive=derive("bad", 4, fail=True)), "bad")
        writer.append(AppendRequest(sid, [L("a", id="b")], derive=derive("b", 5)), "b")
        go_on.set()
        assert done.wait(30)
        outcome = {w: (ok, v) for w, ok, v in heard if w != "blocking"}
        assert outcome["a"][0] and outcome["b"][0]
        assert [o.node.seq for o in outcome["a"][1] + outcome["b"][1]] == [1, 2]
        assert not outcome["bad"][0] and isinstance(outcome["bad"][1], ValueError)
        assert [nid for nid, _ in derived_on] == ["a", "bad", "b"]  # once each, in queue order
        assert {t for _, t in derived_on} == {writer._thread.ident}
        rows = {r.id: r.tokens for r in store.backend.node_rows(sid)}
        assert "bad" not in rows and rows["a"] is not None and rows["b"] is not None and rows["a"] != rows["b"]
        # alone on this thread: derived here, before it runs
        got = writer.run_alone(AppendRequest(sid, [L("b", id="c")], derive=derive("c", 7)))
        assert got is not None and not isinstance(got, BaseException) and got[0].node.seq == 3
        assert derived_on[-1] == ("c", threading.get_ident())
    finally:
        writer.close()
        store.close()


async def test_an_append_is_queued_at_once_only_with_more_of_its_connection_behind_it(fresh_sqlite: Path) -> None:
    """``StoreCalls.start_unit`` (SPEC §4.2): an append with more of its connection behind
    it is in the writer's queue before the call returns (a ``QueuedAppend``); the last one
    its connection sent is not — whether it is a group of itself is decided at its first
    step, once the loop ran what was ready, and then it is committed here, on the loop's
    thread, never by the writer thread (one client appending in turn keeps the lone path)."""
    import asyncio

    from dagctx.engine.shared import APPEND_LAST, QueuedAppend, StoreCalls

    store = Store(str(fresh_sqlite))
    alone_on = _threads_running_alone(store)
    calls = StoreCalls(store)
    try:
        s = store.create_session()
        sid = s.session_id
        loop = asyncio.get_running_loop()
        seq_of = lambda outs: outs[0].node.seq  # noqa: E731

        token = APPEND_LAST.set(lambda: False)  # more of its connection behind it
        try:
            queued = calls.start_unit(AppendRequest(sid, [U(s.root_id, id="a")]), True, seq_of)
        finally:
            APPEND_LAST.reset(token)
        assert isinstance(queued, QueuedAppend)
        assert await queued == 1 and alone_on == []  # the writer thread committed it

        token = APPEND_LAST.set(lambda: True)  # the last its connection sent
        try:
            loop.call_soon(lambda: None)  # something else ready on the loop meanwhile
            later = calls.start_unit(AppendRequest(sid, [L("a", id="b")]), True, seq_of)
            assert asyncio.iscoroutine(later) and calls.writer.depth == 0  # not queued yet
            assert await loop.create_task(later) == 2
        finally:
            APPEND_LAST.reset(token)
        assert alone_on == [threading.get_ident()]  # alone, on this thread
        assert [n.id for n in store.history(sid)[0]] == ["a", "b"]
    finally:
        calls.close()
        store.close()


async def test_a_queued_append_is_answered_in_the_turn_that_hears_from_the_writer() -> None:
    """A ``QueuedAppend`` is its own waiter in the writer's queue: the writer's word
    (``_settle``, on the loop) gives it its answer at once — ``finish`` of the outcomes, or
    the error — with no turn of the loop in between; cancelling it takes it out of the
    queue while it is there, and is refused once the writer has it (SPEC §1.4, §4.2)."""
    import asyncio

    from dagctx.engine.shared import QueuedAppend, _cancelled, _settle

    class Queue:
        def __init__(self, holds: bool) -> None:
            self.holds = holds
            self.asked: list[Any] = []

        def withdraw(self, waiter: Any) -> bool:
            self.asked.append(waiter)
            return self.holds

    loop = asyncio.get_running_loop()
    finished: list[Any] = []
    done = QueuedAppend(Queue(False), loop, lambda outs: finished.append(outs) or ("answer", outs))  # type: ignore[arg-type]
    failed = QueuedAppend(Queue(False), loop, finished.append)  # type: ignore[arg-type]
    broken = QueuedAppend(Queue(False), loop, lambda outs: 1 / 0)  # type: ignore[arg-type]
    assert done.waiter == (loop, done) and not _cancelled(done.waiter)
    _settle([(done, True, ["o"]), (failed, False, DagctxError("InvalidEdge", "no")), (broken, True, [])])
    assert done.done() and done.result() == ("answer", ["o"]) and finished == [["o"]]  # no await in between
    assert isinstance(failed.exception(), DagctxError) and finished == [["o"]]
    assert isinstance(broken.exception(), ZeroDivisionError)
    assert not done.cancel()  # answered: nothing to cancel

    writer_has_it = Queue(False)
    running = QueuedAppend(writer_has_it, loop, finished.append)  # type: ignore[arg-type]
    assert not running.cancel() and not running.done() and writer_has_it.asked == [running.waiter]
    still_queued = Queue(True)
    dropped = QueuedAppend(still_queued, loop, finished.append)  # type: ignore[arg-type]
    assert dropped.cancel() and dropped.cancelled() and _cancelled(dropped.waiter)
    _settle([(dropped, False, None)])  # what the writer says of a cancelled waiter: nothing more
    assert dropped.cancelled() and finished == [["o"]]


@pytest.mark.parametrize("why", ["sync", "log", "server"])
def test_a_lone_append_that_would_be_refused_goes_to_the_writer_uncounted(
        fresh_sqlite: Path, why: str, request: pytest.FixtureRequest) -> None:
    """When a glance says a write that must not wait would be refused (``alone_likely``: a
    sync at every COMMIT, the log near its checkpoint, a PostgreSQL server), ``run_alone``
    hands the unit back before deriving it and writes nothing: the writer thread then counts
    it beside the loop and commits it; with none of that, the glance says yes."""
    import os
    import sys

    from dagctx.ledger.sqlite_file import CHECKPOINT_PAGES, NOWAIT_LOG_MARGIN

    if why == "server":
        store = Store(request.getfixturevalue("pg_url"))
    else:
        store = Store(str(fresh_sqlite), synchronous="FULL" if why == "sync" else None)
    writer = Writer(store, lambda done: None)
    try:
        s = store.create_session()
        sid = s.session_id
        if why == "log":
            assert store.alone_likely()
            index = os.open(str(fresh_sqlite) + "-shm", os.O_RDONLY)
            try:
                k, prev = 0, s.root_id
                while int.from_bytes(os.pread(index, 96, 0)[16:20], sys.byteorder) < CHECKPOINT_PAGES - NOWAIT_LOG_MARGIN:
                    store.append_group([AppendRequest(sid, [U(prev, _words(k) * 20, id=f"f{k}")])])
                    prev, k = f"f{k}", k + 1
            finally:
                os.close(index)
            pred = prev
        else:
            pred = s.root_id
        assert not store.alone_likely()
        counted: list[int] = []

        def derive() -> list[None]:
            counted.append(threading.get_ident())
            return [None]

        unit = AppendRequest(sid, [U(pred, id="late")], derive=derive)
        before = store.get_session(sid).node_count
        assert writer.run_alone(unit) is None and counted == []  # not counted, not tried
        assert store.get_session(sid).node_count == before
        done = threading.Event()
        heard: list[Any] = []
        writer._notify = lambda items: (heard.extend(items), done.set())  # type: ignore[method-assign]
        writer.append(unit, "w")
        assert done.wait(30)
        assert heard[0][1] and heard[0][2][0].node.id == "late"
        assert counted == [writer._thread.ident]  # counted by the writer thread, once
    finally:
        writer.close()
        store.close()
