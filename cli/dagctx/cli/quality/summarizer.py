"""The deterministic summarizer stand-in: how ``dagctx eval`` answers the daemon's
``sampling/createMessage`` (SPEC §9) when no model endpoint is configured.

It is no model and says so: every answer starts with ``LABEL``. It is extractive and
deterministic (same request → same text), so a replay is reproducible and its numbers
measure dagctx's decisions (what is cut, when, what is kept verbatim), not a model's
writing. What it writes, within the length the request allows:

1. the label;
2. on a retry, the identifiers the daemon's fidelity gate named as missing (SPEC §8);
3. the identifiers of the transcript it was shown, most frequent first (``identifiers``);
4. the first line of each user message of the transcript, then of the other entries.

Its length: at most the ``Keep the whole summary under N characters`` the request
names, at most ``maxTokens`` × 3 characters, and about a sixth of what it was shown
(a summary is smaller than what it replaces), never under 400 characters.
"""

from __future__ import annotations

import re
from typing import Any

from dagctx.cli.quality import identifiers as ids

LABEL = "[stand-in summary: deterministic and extractive, written by dagctx eval without a model]"

_UNDER = re.compile(r"Keep the whole summary under (\d+) characters")
_RETRY = re.compile(r"copy each of these exactly where it belongs:\n((?:- .*\n?)+)")
_ENTRY = re.compile(r"^\[(user|assistant|tool call[^\]]*|tool result[^\]]*|function call|function result)\]\n(.*)$", re.M)


def budget_chars(text: str, max_tokens: int) -> int:
    limit = max_tokens * 3
    m = _UNDER.search(text)
    if m:
        limit = min(limit, int(m.group(1)))
    return max(400, min(limit, len(text) // 6))


def summarize(text: str, max_tokens: int) -> str:
    """The stand-in's summary of one request's text."""
    limit = budget_chars(text, max_tokens)
    parts: list[str] = [LABEL]
    used = len(LABEL)

    def add(piece: str) -> bool:
        nonlocal used
        if used + len(piece) + 1 > limit:
            return False
        parts.append(piece)
        used += len(piece) + 1
        return True

    retry = _RETRY.search(text)
    if retry:
        missing = [line[2:].strip() for line in retry.group(1).splitlines() if line.startswith("- ")]
        add("Identifiers: " + ", ".join(missing))
        text = text[: retry.start()]
    freq = ids.counted(text.split("\n\n"))
    ranked = sorted(freq, key=lambda k: (-freq[k], k))
    line = "Identifiers:"
    for ident in ranked:
        if used + len(line) + len(ident) + 3 > limit * 2 // 3:
            break
        line += " " + ident
    if line != "Identifiers:":
        add(line)
    entries = [(m.group(1), m.group(2).strip()) for m in _ENTRY.finditer(text)]
    for kind, first in [e for e in entries if e[0] == "user"] + [e for e in entries if e[0] != "user"]:
        if first and not add(f"- {kind}: {first[:200]}"):
            break
    return "\n".join(parts)


def answer(params: Any) -> dict[str, Any]:
    """A ``sampling/createMessage`` result for decoded params (``CreateMessageParams``)."""
    text = "\n".join(m.content.text for m in params.messages)
    return {"role": "assistant", "content": {"type": "text", "text": summarize(text, int(params.max_tokens))},
            "model": "dagctx-eval-stand-in", "stopReason": "endTurn"}
