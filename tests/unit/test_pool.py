"""The work pool (``dagctx.server.pool``, SPEC §1.4): lanes keep their order, a job holds its
lane only when its ``hold`` predicate says so, ``Done`` settles exactly once (result,
exception or a drop while queued), and a lane's queued jobs wake no extra workers."""

from __future__ import annotations

import threading
import time
from typing import Any

from dagctx.server.pool import Done, FairPool


def wait_for(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_lane_runs_in_order_on_one_worker_and_wakes_no_other() -> None:
    pool = FairPool(workers=4)
    try:
        gate = threading.Event()
        ran: list[int] = []
        settled: list[Done] = []
        pool.submit("a", gate.wait)
        for i in range(200):
            pool.submit("a", lambda i=i: ran.append(i), on_done=settled.append)
        gate.set()
        wait_for(lambda: len(settled) == 200)
        assert ran == list(range(200))
        assert all(d.done() and not d.cancelled() and d.exception() is None for d in settled)
        assert pool.threads() == 1  # one lane: its jobs are one worker's, in turn
        # a second lane, while the first is busy, gets a worker of its own
        gate2, seen = threading.Event(), threading.Event()
        pool.submit("a", gate2.wait)
        pool.submit("b", seen.set)
        assert seen.wait(30)
        gate2.set()
        assert pool.threads() == 2
    finally:
        pool.shutdown()


def test_hold_predicate_holds_only_unfinished_results_until_release() -> None:
    pool = FairPool(workers=2)
    try:
        order: list[str] = []
        done: list[Done] = []
        first = pool.submit("l", lambda: "unfinished", hold=lambda r: r == "unfinished", on_done=done.append)
        pool.submit("l", lambda: order.append("second") or "finished", hold=lambda r: r == "unfinished",
                    on_done=done.append)
        wait_for(lambda: len(done) == 1)
        time.sleep(0.05)  # a lane freed by mistake runs the second job on the idle worker at once
        assert order == []  # the lane is held by the first job's unfinished result
        pool.release("l", first)
        wait_for(lambda: len(done) == 2)
        assert order == ["second"] and done[1].result() == "finished"
        # a finished result frees the lane at once: the next job runs without a release
        pool.submit("l", lambda: "finished", hold=lambda r: r == "unfinished", on_done=done.append)
        pool.submit("l", lambda: "finished too", hold=lambda r: r == "unfinished", on_done=done.append)
        wait_for(lambda: len(done) == 4)
        assert done[3].result() == "finished too"
    finally:
        pool.shutdown()


def test_done_settles_once_with_an_exception_or_a_drop_while_queued() -> None:
    pool = FairPool(workers=1)
    try:
        gate = threading.Event()
        calls: list[Done] = []
        pool.submit("x", gate.wait)

        def boom() -> None:
            raise ValueError("bad")

        failing = pool.submit("x", boom, on_done=calls.append)
        dropped = pool.submit("x", lambda: "never", on_done=calls.append)
        assert pool.cancel_queued("x", dropped)
        assert calls == [dropped] and dropped.cancelled()
        assert not dropped.cancel()  # settled already: nothing happens twice
        gate.set()
        wait_for(lambda: len(calls) == 2)
        assert calls[1] is failing and isinstance(failing.exception(), ValueError)
        try:
            failing.result()
        except ValueError as exc:
            assert str(exc) == "bad"
        else:
            raise AssertionError("result() of a failed job raises its exception")
        # a lane forgotten (its connection gone) drops its queued jobs, each settled once
        gate2 = threading.Event()
        pool.submit("y", gate2.wait)
        queued = [pool.submit("y", lambda: None, on_done=calls.append) for _ in range(3)]
        pool.forget("y")
        gate2.set()
        assert all(q.cancelled() for q in queued) and calls[-3:] == queued
    finally:
        pool.shutdown()
