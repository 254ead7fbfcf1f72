"""Cooperative cancellation for long views (SPEC §1.4: `$/cancelRequest`).

The daemon runs heavy views (render with aging, prepare, search, replay, compaction planning) in a worker
thread and sets the request's ``CancelToken`` when the client cancels it; views call
``stop_if_cancelled()`` between bounded pieces of work, so a cancelled render stops within
one piece instead of finishing for nobody. Outside the daemon no token is set and a
check costs one context-variable read.

Architecture Invariant: no I/O here; the views stay pure (a check only raises).
"""

from __future__ import annotations

from contextvars import ContextVar

from dagctx.protocol.errors import DagctxError


class CancelToken:
    """Set once by ``cancel`` (any thread), read by checkpoints (any thread). A plain flag:
    nobody waits on it, and one is made per request (an ``Event`` costs a lock and a
    condition each)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def cancel(self) -> None:
        self._set = True

    @property
    def cancelled(self) -> bool:
        return self._set


CURRENT: ContextVar[CancelToken | None] = ContextVar("dagctx_cancel", default=None)


def stop_if_cancelled() -> None:
    """Raise ``RequestCancelled`` when the current request was cancelled."""
    token = CURRENT.get()
    if token is not None and token.cancelled:
        raise DagctxError("RequestCancelled", "the request was cancelled; nothing was written")
