"""Whether dagctx is failing, for every engine copy of a Hermes install: one warning per
outage, and a pause after a connection failure so a dead daemon costs a turn nothing.

Kept apart from the engine (``engine.py``) because it is state of the process and of
the Hermes home, not of one engine: Hermes deep-copies the engine per agent, and
``hermes chat -q`` is a process per turn, yet an outage is one warning.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

log = logging.getLogger("dagctx_hermes")

#: Seconds during which a dagctx that could not be reached is not tried again.
RETRY_AFTER = 30.0


class Outage:
    """Whether dagctx is failing: one warning per outage, a pause after a connection failure.

    Shared by every engine copy of this process (they share the connections too) and, through
    a small file in Hermes's home (``dagctx-outage.json``), by the processes of one Hermes
    install: ``hermes chat -q`` is a process per turn, and an outage is still one warning.
    The file is removed when dagctx answers again; one whose last failure is older than
    ``MEMORY`` is forgotten (a new outage, a new warning).
    """

    MEMORY = 600.0

    def __init__(self) -> None:
        self.until = 0.0
        self.warned = False
        self.failures = 0

    @staticmethod
    def marker() -> str:
        try:
            from hermes_constants import get_hermes_home

            home = str(get_hermes_home())
        except Exception:  # noqa: BLE001 - outside a Hermes install
            home = os.environ.get("HERMES_HOME") or os.path.join(os.path.expanduser("~"), ".hermes")
        return os.path.join(home, "dagctx-outage.json")

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.marker()) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        last = float(data.get("last", data.get("since", 0))) if isinstance(data, dict) else 0.0
        return data if isinstance(data, dict) and time.time() - last < self.MEMORY else None

    def paused(self) -> bool:
        if time.monotonic() < self.until:
            return True
        known = self._read()
        return bool(known and time.time() < float(known.get("until", 0)))

    def failed(self, what: str, exc: BaseException) -> None:
        from dagctx.client import RpcError

        self.failures += 1
        reachable = isinstance(exc, RpcError)
        pause = 0.0 if reachable else RETRY_AFTER  # not reachable or timed out: leave it alone a while
        self.until = time.monotonic() + pause
        known = self._read()
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if not self.warned and known is None:
            log.warning("dagctx failed in %s (%s); Hermes's built-in compressor handles the context until dagctx "
                        "answers again%s", what, why, "" if reachable else f" (tried again after {RETRY_AFTER:.0f} s)")
        else:
            log.info("dagctx failed again in %s (%s); Hermes's built-in compressor goes on", what, why)
        self.warned = True
        now = time.time()
        try:
            os.makedirs(os.path.dirname(self.marker()), exist_ok=True)
            with open(self.marker(), "w") as f:
                json.dump({"since": (known or {}).get("since", now), "last": now, "until": now + pause,
                           "reason": why}, f)
        except OSError:
            pass

    def recovered(self) -> None:
        if self.warned or os.path.exists(self.marker()):
            log.info("dagctx answers again; it handles the context from now on")
            try:
                os.unlink(self.marker())
            except OSError:
                pass
        self.warned = False
        self.until = 0.0


OUTAGE = Outage()


__all__ = ["OUTAGE", "RETRY_AFTER", "Outage"]
