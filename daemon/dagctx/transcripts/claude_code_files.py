"""The files of one Claude Code session besides its main JSONL: subagent transcripts
(``<session>/subagents/agent-*.jsonl``, legacy ``agent-*.jsonl`` beside the session with the
same ``sessionId``) and the compaction summarizer's transcripts
(``subagents/agent-acompact-*.jsonl``, read for what they tell about the compaction they
produced). Which file is which, found by name and ``sessionId``; ``claude_code.py`` parses them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .reading import decode_json, iter_lines, read_jsonl
from .values import content_blocks, text_of_blocks, to_epoch


def is_agent_file(path: Path) -> bool:
    return path.name.startswith("agent-") and path.suffix == ".jsonl"


def is_compaction_file(path: Path) -> bool:
    """The compaction summarizer's transcript (``agent-acompact-<id>.jsonl``)."""
    return path.name.startswith("agent-acompact") and path.suffix == ".jsonl"


def compaction_files(main: Path) -> list[Path]:
    """The compaction summarizer transcripts of the session in ``main`` (not turns)."""
    if is_agent_file(main):
        return []
    sub = main.with_suffix("") / "subagents"
    if not sub.is_dir():
        return []
    return sorted(p for p in sub.glob("agent-acompact*.jsonl") if p.is_file())


@functools.lru_cache(maxsize=4096)
def _session_id_of(path_str: str, mtime: float) -> str | None:
    """The first ``sessionId`` in a file (reads at most 50 lines)."""
    del mtime  # part of the cache key only
    try:
        for i, (_, raw) in enumerate(iter_lines(Path(path_str))):
            if i >= 50:
                break
            if isinstance(raw, int):
                continue  # over the size cap: never read whole
            try:
                obj = decode_json(raw.strip() or b"null")
            except (msgspec.DecodeError, RecursionError):
                continue
            if isinstance(obj, dict) and isinstance(obj.get("sessionId"), str):
                return obj["sessionId"]
    except OSError:
        return None
    return None


def _sid(path: Path) -> str | None:
    try:
        return _session_id_of(str(path), path.stat().st_mtime)
    except OSError:
        return None


def subagent_files(main: Path) -> list[Path]:
    """Files holding the subagents of the session in ``main``, in a stable order."""
    if is_agent_file(main):
        return []
    out: list[Path] = []
    sub = main.with_suffix("") / "subagents"
    if sub.is_dir():
        out.extend(sorted(p for p in sub.glob("agent-*.jsonl") if p.is_file() and not is_compaction_file(p)))
    ids = {main.stem}
    sid = _sid(main)
    if sid:
        ids.add(sid)
    for f in sorted(main.parent.glob("agent-*.jsonl")):
        if f.is_file() and f not in out and not is_compaction_file(f) and _sid(f) in ids:
            out.append(f)
    return out


def agent_from_name(path: Path) -> str | None:
    stem = path.stem
    return stem[len("agent-") :] if stem.startswith("agent-") else None


@dataclass
class SummarizerFile:
    """What a compaction summarizer transcript tells about the compaction it produced."""

    file: str
    reply: str
    last_ts: float | None
    model: str | None
    lines: int


def read_summarizer(f: Path, main: Path) -> SummarizerFile:
    rows, _ = read_jsonl(f)
    reply = ""
    last: float | None = None
    model: str | None = None
    for _, obj in rows:
        ts = to_epoch(obj.get("timestamp"))
        if ts is not None:
            last = ts if last is None else max(last, ts)
        msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
        if obj.get("type") == "assistant":
            text = text_of_blocks(content_blocks(msg.get("content")))
            if text.strip():
                reply = text
            if isinstance(msg.get("model"), str):
                model = msg["model"]
    try:
        rel = str(f.relative_to(main.parent))
    except ValueError:
        rel = f.name
    return SummarizerFile(rel, reply, last, model, len(rows))
