"""The quick reads' account (SPEC §1.4): which reads may still be answered on the event loop.

A quick read (``session/list``, ``session/get`` of a SQLite file: ``EngineCore.quick_handlers``)
is answered on the loop when its answer is at hand without a wait, which spares a small
request the two thread hand-offs of the pool — most of its cost. What keeps that from
stalling the other connections is a bound on what one may cost: a read that held the loop
longer than ``BUDGET`` (a list of thousands of sessions, a disk that makes it wait) counts
a strike; ``STRIKES`` in a row send that method's quick reads of that database to the pool
for ``DEMOTED_SECONDS``. In a row, because a loaded machine may take the core away in the
middle of any one read (a read costs ~10 µs: being preempted twice running is rare), and
the first read of a connection opens its reader.

What a read costs is what it held. On the loop, the loop: its wall time, a wait for the
disk included. In a connection's reader thread (SPEC §1.4), only the interpreter lock, and
only while it ran: its CPU time (``time.thread_time``). The reader waits for the disk with
the lock released, and a wall clock there counted every time another process took the
core: on a loaded two-core machine, two such reads in a row sent ``session/list`` to the
pool in the middle of a benchmark, and 13,000 sequential reads/s fell to 4,000 for 30 s
(bench/bench_roundtrip.py). But the thread's CPU clock is a system call (1.6 µs, twice a
read, against 0.05 µs for the wall clock: a tenth of a cheap read), and a read's CPU time
never exceeds its wall time. So a reader thread times its reads by the wall clock; one
over the budget only makes its method *suspect* (no strike), and the suspect's next reads
there are timed by the CPU clock, which counts the strikes — until one is under the budget.

Architecture Invariant: no I/O and no JSON-RPC here; the server asks and reports.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("dagctx.server")

#: The longest one quick read may hold the event loop.
BUDGET = 0.002
#: Reads over the budget in a row before their method goes to the pool.
STRIKES = 2
#: How long a method sent to the pool stays there before the loop tries it again.
DEMOTED_SECONDS = 30.0


class QuickReads:
    """Per daemon: the methods sent to the pool for a while, and how many reads the loop answered."""

    def __init__(self) -> None:
        #: requests answered on the loop since the daemon started (``daemon/status``)
        self.answered = 0
        #: (database key, method) → until when its quick reads go to the pool
        self._demoted: dict[tuple[str, str], float] = {}
        #: (database key, method) → its quick reads over the budget in a row
        self._strikes: dict[tuple[str, str], int] = {}
        #: (database key, method) whose reads in reader threads are timed by the CPU clock
        self._suspect: set[tuple[str, str]] = set()

    def suspect(self, key: str, method: str) -> bool:
        """Whether a reader thread must time ``method``'s next read on ``key`` by its CPU
        clock (its last read there was over the budget by the wall clock)."""
        return bool(self._suspect) and (key, method) in self._suspect

    def allowed(self, key: str, method: str) -> bool:
        """Whether ``method``'s quick reads on database ``key`` may be answered on the loop."""
        if not self._demoted:
            return True
        until = self._demoted.get((key, method))
        if until is None:
            return True
        if time.monotonic() < until:
            return False
        del self._demoted[(key, method)]
        return True

    def took(self, key: str, method: str, seconds: float, *, wall_in_thread: bool = False) -> None:
        """One quick read was answered, holding the loop (or, in a reader thread, the
        interpreter lock) for ``seconds``. ``wall_in_thread``: ``seconds`` is the wall time
        of a read in a reader thread, an upper bound of what it held: over the budget, it
        makes the method suspect instead of counting a strike."""
        self.answered += 1
        if seconds <= BUDGET:
            if self._strikes:
                self._strikes.pop((key, method), None)
            if self._suspect:
                self._suspect.discard((key, method))
            return
        if wall_in_thread:
            self._suspect.add((key, method))
            return
        strikes = self._strikes[(key, method)] = self._strikes.get((key, method), 0) + 1
        if strikes >= STRIKES:
            del self._strikes[(key, method)]
            self._demoted[(key, method)] = time.monotonic() + DEMOTED_SECONDS
            log.info("%s on %s held the event loop (or the interpreter) for %.1f ms; answered in the pool for the next %.0f s",
                     method, key, seconds * 1000, DEMOTED_SECONDS)
