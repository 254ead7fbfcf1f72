"""What the engine may ask of the connected client, without knowing JSON-RPC.

The server implements ``Peer``; tests and the CLI can implement it too.
"""

from __future__ import annotations

from typing import Any, Protocol


class Peer(Protocol):
    def notify(self, method: str, params: Any) -> None:
        """Send a notification to the client."""

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        """Send a request to the client and wait for its typed result."""

    def progress(self, token: int | str | None, value: dict[str, Any]) -> None:
        """Report work-done progress (``$/progress``) when the client gave a token."""

    @property
    def can_sample(self) -> bool:
        """Whether the client declared it answers ``sampling/createMessage``."""

    def drain(self) -> None:
        """After many notifications (an import's announcement, a page at a time): wait
        until the client has been sent them and has read most of them, so they do not
        pile up in memory (SPEC §9 session/import)."""


class NullPeer:
    """A peer that hears nothing and cannot sample (in-process use, tests)."""

    can_sample = False

    def notify(self, method: str, params: Any) -> None:
        return None

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        from dagctx.protocol.errors import DagctxError

        raise DagctxError("SamplingFailed", "no client is connected to answer " + method)

    def progress(self, token: int | str | None, value: dict[str, Any]) -> None:
        return None

    def drain(self) -> None:
        return None
