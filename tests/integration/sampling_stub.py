"""A scripted answerer of ``sampling/createMessage`` for tests that drive the daemon's
summaries through the client (SPEC §8: compaction, reduction within a turn).

``ScriptedSampler(answer)`` is registered with ``client.on_request``; ``answer(params)``
returns the summary text (or a whole result dict, or an awaitable of either) and may be
swapped by a test. Every request is recorded; ``called`` is set by the first one;
``slow(seconds)`` answers late unless ``release`` is set (teardown sets it, so no slow
answer outlives its test).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


def request_text(params: Any) -> str:
    """Every message text of one ``sampling/createMessage`` request."""
    return "\n".join(m.content.text for m in params.messages)


class ScriptedSampler:
    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.requests: list[Any] = []
        self.answer = answer
        self.called = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, params: Any) -> Any:
        self.requests.append(params)
        self.called.set()
        out = self.answer(params)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, dict):
            return out
        return {"role": "assistant", "content": {"type": "text", "text": out}, "model": "scripted",
                "stopReason": "endTurn"}

    def purposes(self) -> list[str]:
        return [p.metadata.get("purpose") for p in self.requests]

    def text(self) -> str:
        return "\n".join(request_text(p) for p in self.requests)

    async def slow(self, seconds: float) -> str:
        try:
            await asyncio.wait_for(self.release.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        return "late"
