"""Spilling a long function result at write time (SPEC §4): what the node keeps.

A function or tool result of at least ``SpillPolicy.min_chars`` characters is stored
whole in the backend's ``blobs`` and the node keeps its head and tail with a marker
saying how to read the rest (``node/get`` with ``range``). Pure and deterministic, so
the engine counts the tokens of exactly what the store will keep before it appends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME


@dataclass(frozen=True)
class SpillPolicy:
    """Function and tool results of at least ``min_chars`` characters, whatever their
    line count, are stored whole in ``blobs`` and the node keeps head + tail with a marker
    (write path, once, deterministic; SPEC §4). A system prompt is never spilled."""

    min_chars: int = 32_000
    head_chars: int = 6_000
    tail_chars: int = 3_000


def spill_output(output: Any, policy: SpillPolicy, *, role: str = "code",
                 name: str = "") -> tuple[Any, dict[str, Any] | None]:
    """What the node keeps of ``output``, and the spill record (``data`` = the whole text).

    Pure and deterministic, so the engine can count the tokens of exactly what the
    store will keep before it appends. Size alone decides (SPEC §4: a 50 MB output on
    one line spills like a 50 MB log). Only function and tool results (``role`` code)
    spill: a user's message and a model's reply are what the conversation is, and a
    ``context/system_prompt`` node (``name``) is sent whole, so it is stored and counted
    whole, however long.
    """
    p = policy
    if (role != "code" or name == SYSTEM_PROMPT_NAME or not isinstance(output, str)
            or len(output) < p.min_chars):
        return output, None
    chars = len(output)
    # counted a mebibyte at a time: one count over 50 MB holds the interpreter lock
    # throughout, felt by every connection of the daemon (SPEC §1.4)
    lines = sum(output.count("\n", i, i + (1 << 20)) for i in range(0, chars, 1 << 20)) + 1
    head = output[: p.head_chars]
    tail = output[chars - p.tail_chars :]
    omitted = chars - len(head) - len(tail)
    marker = (
        f"\n[… {omitted:,} of {chars:,} characters ({lines:,} lines) omitted here; the whole "
        f"output is stored: read it with node/get and range {{offset: {len(head)}, length: {omitted}}} …]\n"
    )
    info = {
        "chars": chars,
        "lines": lines,
        "headChars": len(head),
        "tailChars": len(tail),
        "omitted": omitted,
        "data": output,
    }
    return head + marker + tail, info
