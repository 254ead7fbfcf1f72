"""Which transcript format a file is in, from its suffix and its first records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


from .reading import _BOM, RecordTooLarge, decode_json, iter_lines, load_json


# --------------------------------------------------------------------------- detection

_CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
_CLAUDE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "progress", "file-history-snapshot", "queue-operation", "attachment"}
)


def _is_event(item: Any) -> bool:
    if isinstance(item, list):  # an [action, observation] pair of older OpenHands output
        return any(_is_event(x) for x in item)
    return isinstance(item, dict) and "source" in item and ("action" in item or "observation" in item)


def _openhands_history(value: dict) -> bool:
    """``{"history": [...events]}`` is OpenHands; SWE-agent's history holds chat messages."""
    history = value.get("history")
    if not isinstance(history, list):
        return False
    items = [h for h in history[:20] if h]
    return bool(items) and any(_is_event(h) for h in items)


def _detect_line(obj: dict) -> str | None:
    t = obj.get("type")
    if "instance_id" in obj and isinstance(obj.get("history"), list):
        return "openhands"  # evaluation output: one run a line
    if t in _CODEX_TYPES and "payload" in obj:
        return "codex"
    if t == "session" and ("version" in obj or "cwd" in obj) and "id" in obj:
        return "openclaw"
    if t in ("message", "compaction", "branch_summary", "model_change", "thinking_level_change") and "parentId" in obj:
        return "openclaw"
    if isinstance(obj.get("conversations"), list):
        return "sharegpt"
    if "sessionId" in obj or "parentUuid" in obj or (t in _CLAUDE_TYPES and ("uuid" in obj or "leafUuid" in obj or "messageId" in obj)):
        return "claude-code"
    if isinstance(obj.get("messages"), list) and "type" not in obj:
        return "sharegpt"
    return None


def _detect_json(value: Any) -> str | None:
    if isinstance(value, dict):
        if _openhands_history(value):
            return "openhands"
        if "history" in value or "trajectory" in value:
            return "swe-agent"
        if isinstance(value.get("events"), list):
            return "openhands"
        if isinstance(value.get("conversations"), list) or isinstance(value.get("messages"), list):
            return "sharegpt"
        return None
    if isinstance(value, list):
        for item in value[:20]:
            if not isinstance(item, dict):
                continue
            if "source" in item and ("action" in item or "observation" in item):
                return "openhands"
            if isinstance(item.get("conversations"), list) or isinstance(item.get("messages"), list):
                return "sharegpt"
        return None
    return None


def detect_format(path: str | Path) -> str:
    """The format of a transcript file (one of ``FORMATS``); ``ValueError`` if unknown."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a directory; use parse_path")
    if p.suffix == ".traj":
        return "swe-agent"
    with p.open("rb") as fh:
        first_chunk = fh.read(4096).removeprefix(_BOM).lstrip()
    if first_chunk[:1] == b"[" or (p.suffix == ".json" and first_chunk[:1] == b"{"):
        try:
            fmt = _detect_json(load_json(p))
        except (msgspec.DecodeError, RecordTooLarge, RecursionError):
            fmt = None
        if fmt:
            return fmt
    seen = 0
    for _, raw in iter_lines(p):
        if isinstance(raw, int):
            continue  # over the cap: the parser reports it
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except (msgspec.DecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            fmt = _detect_line(obj)
            if fmt:
                return fmt
        seen += 1
        if seen >= 200:
            break
    raise ValueError(
        f"cannot tell which transcript format {p} is in (not Claude Code, Codex, OpenClaw, SWE-agent, OpenHands "
        "or ShareGPT); pass --format / format if it is one of them"
    )
