"""Bench only (``bench_isolation.py --ticker PREFIX``): a thread in every Python process started
with this folder on ``PYTHONPATH`` wakes every 5 ms and writes each gap over 50 ms between its
wake-ups to ``PREFIX.<pid>.gaps`` with the process's CPU time over the gap (about the gap: a
thread of this process held the interpreter lock; much less: the process waited for a core).
``faulthandler`` re-armed every wake-up dumps every thread's stack to ``PREFIX.<pid>.stacks``
when a wake-up is 100 ms late — from a C thread, so the dump shows who held the lock."""

import os

_prefix = os.environ.get("DAGCTX_BENCH_TICKER")
if _prefix:
    import faulthandler
    import threading
    import time

    def _tick() -> None:
        pid = os.getpid()
        stacks = open(f"{_prefix}.{pid}.stacks", "w")  # noqa: SIM115 - open for the process's life
        gaps = open(f"{_prefix}.{pid}.gaps", "w")  # noqa: SIM115
        last, cpu = time.monotonic(), time.process_time()
        while True:
            faulthandler.dump_traceback_later(0.1, file=stacks)
            time.sleep(0.005)
            now, c = time.monotonic(), time.process_time()
            if now - last > 0.055:
                gaps.write(f"{time.time():.3f} gap {1000 * (now - last):.0f} ms cpu {1000 * (c - cpu):.0f} ms\n")
                gaps.flush()
            last, cpu = now, c

    threading.Thread(target=_tick, name="bench-ticker", daemon=True).start()
