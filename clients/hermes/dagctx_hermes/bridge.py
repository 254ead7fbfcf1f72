"""A synchronous face over the asyncio ``DagctxClient``.

Hermes calls its context engine synchronously, from whatever thread runs the agent
loop (and sometimes from several agents at once). The client is asyncio, so it lives on
one private event loop in a daemon thread; every call is submitted there and waited
for. One bridge (one daemon connection) serves every engine copy Hermes makes.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ClientBridge:
    """Owns one daemon connection on a background event loop."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], timeout: float = 180.0) -> None:
        self._connect = connect
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dagctx-hermes", daemon=True)
        self._thread.start()
        self._client: Any = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def run(self, fn: Callable[[Any], Awaitable[T]], timeout: float | None = None) -> T:
        """Run ``fn(client)`` on the bridge's loop; (re)connects when the daemon is gone."""

        async def go() -> T:
            if self._client is None or self._client.closed.done():
                self._client = await self._connect()
            return await fn(self._client)

        if self._loop.is_closed():
            raise RuntimeError("the dagctx bridge is closed")
        fut = asyncio.run_coroutine_threadsafe(go(), self._loop)
        try:
            return fut.result(timeout or self.timeout)
        except TimeoutError:
            fut.cancel()  # nothing keeps running for a caller that stopped waiting
            raise

    @property
    def closed(self) -> bool:
        return self._loop.is_closed()

    def close(self) -> None:
        with self._lock:
            if self._loop.is_closed():
                return

            async def shut() -> None:
                if self._client is not None and not self._client.closed.done():
                    await self._client.close()

            try:
                asyncio.run_coroutine_threadsafe(shut(), self._loop).result(15)
            except Exception:  # noqa: BLE001 - best effort at interpreter exit
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()
