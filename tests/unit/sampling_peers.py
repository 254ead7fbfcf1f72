"""In-process stand-ins for a client that samples (``sampling/createMessage``, SPEC §9): what
``EngineCore(peer=...)`` asks for a summary. Not a test module (no ``test_`` prefix)."""

from __future__ import annotations

from typing import Any

from dagctx.context.references import extract_references
from dagctx.protocol import context_messages as c


class Summarizer:
    """A client that samples: every identifier of its request, the summary so far of a
    staged one included (passes the compaction's fidelity gate); keeps each request's text,
    so two compactions' requests can be compared."""

    can_sample = True

    def __init__(self) -> None:
        self.requests: list[str] = []

    def notify(self, method: str, params: Any) -> None:
        pass

    def progress(self, token: Any, value: Any) -> None:
        pass

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        text = "\n".join(msg.content.text for msg in params.messages)
        self.requests.append(text)
        refs = sorted(extract_references(text))
        return c.CreateMessageResult(content=c.SamplingContent(text="Summary. " + ", ".join(refs)), model="t")
