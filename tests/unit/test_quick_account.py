"""The quick reads' account (SPEC §1.4): a read over the budget is forgiven once; two in a
row send that method of that database to the pool for a while, and only that one."""

from __future__ import annotations

import pytest

from dagctx.server import quick
from dagctx.server.quick import QuickReads


def test_two_reads_over_the_budget_in_a_row_send_only_that_method_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(quick.time, "monotonic", lambda: now[0])
    q = QuickReads()
    over, fine = quick.BUDGET * 2, quick.BUDGET / 2
    q.took("a.db", "session/list", over)  # a cold first read: forgiven
    q.took("a.db", "session/list", fine)  # a cheap one clears the strike
    q.took("a.db", "session/list", over)
    assert q.allowed("a.db", "session/list")
    q.took("a.db", "session/list", over)  # the second in a row
    assert not q.allowed("a.db", "session/list")
    assert q.allowed("a.db", "session/get") and q.allowed("b.db", "session/list")
    assert q.answered == 4  # every one of them was answered on the loop
    now[0] += quick.DEMOTED_SECONDS + 1
    assert q.allowed("a.db", "session/list")  # tried on the loop again
    q.took("a.db", "session/list", over)
    assert q.allowed("a.db", "session/list")  # the count started over


def test_a_quick_read_in_a_reader_thread_is_charged_its_cpu_time_on_the_loop_its_wall_time() -> None:
    """In a connection's reader thread a quick read holds only the interpreter lock, and
    only while it runs: a read that waited (for the disk, or for the core another process
    took) is not over the budget there. On the loop its wall time held the loop."""
    import threading
    import time
    from types import SimpleNamespace

    from dagctx.engine.config import DaemonConfig
    from dagctx.server.jsonrpc_server import DagctxServer

    proto = DagctxServer(DaemonConfig()).protocol
    proto.engine.db = SimpleNamespace(key="x.db")  # type: ignore[assignment]
    waits = lambda params, same_batch: time.sleep(quick.BUDGET * 2) or {"waited": True}  # noqa: E731
    answered = proto.hub.quick.answered

    proto.hub._loop_thread = threading.get_ident() + 1  # this thread is a reader, not the loop
    for i in range(quick.STRIKES + 1):
        data = proto._quick_answer(i, "session/list", waits, None, False)
        assert data is not None and data.endswith(b'{"id":%d,"result":{"waited":true},"jsonrpc":"2.0"}' % i)
    assert proto.hub.quick.allowed("x.db", "session/list")

    proto.hub._loop_thread = threading.get_ident()  # now on the loop
    for i in range(quick.STRIKES):
        assert proto._quick_answer(10 + i, "session/list", waits, None, False) is not None
    assert not proto.hub.quick.allowed("x.db", "session/list")
    assert proto.hub.quick.answered == answered + 2 * quick.STRIKES + 1


def test_a_reader_thread_times_by_the_wall_clock_until_a_read_is_over_then_by_the_cpu_clock() -> None:
    """The thread's CPU clock is a system call: a read is timed by the wall clock, and one
    over the budget only makes its method suspect; the suspect's reads are timed by the
    CPU clock, and those over the budget count the strikes. A read that burns the CPU is
    sent to the pool after one suspect read and ``STRIKES`` strikes; one that waits never is."""
    import threading
    import time
    from types import SimpleNamespace

    from dagctx.engine.config import DaemonConfig
    from dagctx.server.jsonrpc_server import DagctxServer

    def burns(params: object, same_batch: bool) -> dict[str, bool]:
        end = time.thread_time() + quick.BUDGET * 2
        while time.thread_time() < end:
            pass
        return {"burnt": True}

    proto = DagctxServer(DaemonConfig()).protocol
    proto.engine.db = SimpleNamespace(key="x.db")  # type: ignore[assignment]
    proto.hub._loop_thread = threading.get_ident() + 1  # this thread is a reader, not the loop
    reads = proto.hub.quick
    assert proto._quick_answer(0, "session/get", burns, None, False) is not None
    assert reads.suspect("x.db", "session/get") and reads.allowed("x.db", "session/get")  # no strike yet
    for i in range(quick.STRIKES):
        assert reads.allowed("x.db", "session/get")
        assert proto._quick_answer(1 + i, "session/get", burns, None, False) is not None
    assert not reads.allowed("x.db", "session/get")
    assert reads.allowed("x.db", "session/list")

    q = QuickReads()  # a suspect cleared by a read under the budget
    q.took("y.db", "session/list", quick.BUDGET * 2, wall_in_thread=True)
    assert q.suspect("y.db", "session/list")
    q.took("y.db", "session/list", quick.BUDGET / 2)
    assert not q.suspect("y.db", "session/list")
