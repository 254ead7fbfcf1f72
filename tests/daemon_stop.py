"""Stopping a shared daemon that a test's client started.

The client starts the daemon as its own child (SPEC §1.4), so once the daemon exits it is a
zombie of the test process until someone waits for it: ``os.kill(pid, 0)`` still succeeds on a
zombie. A loop that polls only ``kill(pid, 0)`` therefore waits out its whole deadline, twice
(SIGTERM, then SIGKILL) — ten seconds of every teardown. Reaping our own child, or reading the
process state for someone else's, tells an exited daemon from a running one at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def daemon_pids(run: Path) -> list[int]:
    """The shared daemons running from the runtime folder ``run`` (their pid files)."""
    pids = []
    for f in (run / "dagctx").glob("*.pid") if (run / "dagctx").is_dir() else ():
        try:
            pids.append(int(json.loads(f.read_text())["pid"]))
        except (ValueError, KeyError, OSError):
            pass
    return pids


def exited(pid: int) -> bool:
    """True once ``pid`` has exited (reaped here when it is our child; a zombie counts)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return True
    except ChildProcessError:
        pass  # not our child: its parent reaps it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] == "Z"
    except (OSError, IndexError):
        return True


async def stop_daemon(pid: int | None, clients: Iterable[Any] = (), *, grace: float = 5.0) -> None:
    """Close ``clients``, then SIGTERM the daemon and, after ``grace`` seconds, SIGKILL it."""
    for c in clients:
        try:
            await asyncio.wait_for(c.close(), grace)
        except Exception:
            pass
    if pid is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if exited(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if exited(pid):
                return
            await asyncio.sleep(0.02)
