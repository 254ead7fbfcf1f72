"""A peer for in-process benches that can sample and answers at once.

``EngineCore`` talks to its client through a peer (``notify``, ``progress``, ``request``);
this one answers ``sampling/createMessage`` with ``answer(text of the request)`` and
keeps the time spent answering (``seconds``) and the number of calls, so a bench can
take the summarizer out of its figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dagctx.protocol import context_messages as c


class StandInPeer:
    can_sample = True

    def __init__(self, answer: Callable[[str], str]) -> None:
        self.answer = answer
        self.seconds = 0.0
        self.calls = 0

    def notify(self, method: str, params: Any) -> None:
        pass

    def progress(self, token: Any, value: Any) -> None:
        pass

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        t = time.perf_counter()
        text = "\n".join(m.content.text for m in params.messages)
        out = c.CreateMessageResult(content=c.SamplingContent(text=self.answer(text)), model="stand-in")
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out
