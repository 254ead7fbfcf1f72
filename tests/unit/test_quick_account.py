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
