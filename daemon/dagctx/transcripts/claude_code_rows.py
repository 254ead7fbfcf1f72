"""What of a Claude Code line the parser keeps while the rest of the file is read, when
``session/import`` keeps large tool results aside (``builder.SPILL_OVER``; SPEC §9 import):
the rows wait for the whole file, since its tree is ordered before any line is parsed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from dagctx.protocol.context_messages import Skipped

from .builder import Builder
from .reading import iter_jsonl
from .values import content_output


def lines(b: Builder, path: Path, label: str) -> Iterator[tuple[int, dict]]:
    """``(line_no, object)`` of each JSON line of ``path``, slimmed (``slim``) when ``b``
    keeps results aside; bad lines go to ``b.skipped``."""
    for item in iter_jsonl(path, label=label):
        if isinstance(item, Skipped):
            b.skipped.append(item)
            continue
        if b.spills:
            slim(b, item[1])
        yield item


def slim(b: Builder, obj: dict) -> None:
    """Keep a line's tool results aside as it is read (``Builder.keep``), and of its
    ``toolUseResult`` (which repeats the result) only the ``agentId`` the parser reads:
    the rows wait for the whole file (its tree is ordered first), their payloads need not."""
    tur = obj.get("toolUseResult")
    if tur is not None:
        agent = tur.get("agentId") if isinstance(tur, dict) else None
        obj["toolUseResult"] = {"agentId": agent} if isinstance(agent, str) else None
    msg = obj.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    results = False
    if obj.get("type") == "user" and not obj.get("isCompactSummary") and isinstance(content, list):
        for blk in content:
            if isinstance(blk, dict) and blk.get("type") == "tool_result":
                blk["content"] = b.keep(content_output(blk.get("content")))
                results = True
    if not results and obj.get("type") in ("user", "assistant") and isinstance(msg, dict) and content is not None:
        # a user or model text waits for the tree walk on disk too: the parser reads the
        # content back (``base.unspilled``) when it reaches this line
        msg["content"] = b.keep(content)
