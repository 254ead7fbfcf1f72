"""Reading transcripts from a file or a folder: dispatch to the format's parser, one
transcript at a time, and the walk that finds transcript files below a folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


from dagctx.protocol.limits import MAX_JSON_DEPTH

from .base import FORMATS, Transcript
from .detect import detect_format


# --------------------------------------------------------------------------- dispatch


def parse_file(path: str | Path, format: str = "auto") -> list[Transcript]:  # noqa: A002
    """Parse one transcript file into one or more ``Transcript`` values.

    A Claude Code session file brings its ``<session>/subagents/agent-*.jsonl`` files (and
    legacy ``agent-*.jsonl`` siblings with the same ``sessionId``) in as spawn branches; a
    ShareGPT file gives one transcript per conversation, an OpenHands ``output.jsonl`` one
    per run.
    """
    return list(iter_file(path, format))


def iter_file(path: str | Path, format: str = "auto") -> Iterator[Transcript]:  # noqa: A002
    """``parse_file`` one transcript at a time: formats with one session a line (ShareGPT,
    OpenHands output) are streamed, so memory is bounded by the largest session."""
    p = Path(path)
    for t in _iter_as(p, detect_format(p) if format == "auto" else format):
        t.source_path = str(p)
        yield t


def _iter_as(p: Path, fmt: str) -> Iterator[Transcript]:
    if fmt == "claude-code":
        from . import claude_code

        yield claude_code.parse(p)
    elif fmt == "codex":
        from . import codex

        yield codex.parse(p)
    elif fmt == "openclaw":
        from . import openclaw

        yield openclaw.parse(p)
    elif fmt == "swe-agent":
        from . import swe_agent

        yield swe_agent.parse(p)
    elif fmt == "openhands":
        from . import openhands

        yield from openhands.iter_parse(p)
    elif fmt == "sharegpt":
        from . import sharegpt

        yield from sharegpt.iter_parse(p)
    else:
        raise ValueError(f"unknown transcript format {fmt!r}; expected one of {', '.join(FORMATS)}")


_SUFFIXES = (".jsonl", ".json", ".traj")


def parse_path(path: str | Path, format: str = "auto", errors: list[tuple[str, str]] | None = None) -> list[Transcript]:  # noqa: A002
    """Parse a file, or every transcript file below a folder (``~/.claude/projects``-style).

    Subagent files are folded into their parent session and not returned on their own.
    Files whose format cannot be told are left out; pass ``errors`` to collect
    ``(path, message)`` for them.
    """
    return list(iter_path(path, format, errors))


def transcript_files(path: str | Path, errors: list[tuple[str, str]] | None = None) -> list[Path]:
    """The files ``iter_path`` reads below a folder, subagent files folded away.

    A Claude Code compaction summarizer's own transcript (``agent-acompact-*``) is folded
    too: it is not a turn of anyone's conversation (the parent's parser records it as the
    compaction's provenance).
    """
    p = Path(path)
    files = _transcript_files(p, errors)
    from . import claude_code

    folded: set[Path] = set()
    for f in files:
        if f.suffix == ".jsonl" and not claude_code.is_agent_file(f):
            folded.update(claude_code.subagent_files(f))
            folded.update(claude_code.compaction_files(f))
    return [f for f in files if f not in folded]


def iter_path(path: str | Path, format: str = "auto", errors: list[tuple[str, str]] | None = None) -> Iterator[Transcript]:  # noqa: A002
    """``parse_path`` one transcript at a time (see ``iter_file``)."""
    p = Path(path)
    if p.is_file():
        yield from iter_file(p, format)
        return
    for f in transcript_files(p, errors):
        try:
            yield from iter_file(f, format)
        except (ValueError, OSError, RecursionError) as exc:
            if errors is not None:
                errors.append((str(f), str(exc) if not isinstance(exc, RecursionError)
                               else f"nested deeper than {MAX_JSON_DEPTH} levels; not a transcript"))


#: how many unreadable folders one import reports by name
_MAX_WALK_ERRORS = 20


def _transcript_files(root: Path, errors: list[tuple[str, str]] | None) -> list[Path]:
    """Transcript files below ``root``, sorted; symlinked folders are not entered.

    A folder that cannot be listed (``/proc/1/cwd``, a permission-denied subtree) is
    reported in ``errors`` (the first ``_MAX_WALK_ERRORS`` by name, then a count) and
    the walk goes on, so one unreadable corner never fails the whole import.
    """
    failed: list[OSError] = []
    found: list[Path] = []
    for folder, _dirs, names in os.walk(root, onerror=failed.append, followlinks=False):
        for name in names:
            f = Path(folder, name)
            if f.suffix in _SUFFIXES and f.is_file():
                found.append(f)
    if errors is not None:
        for exc in failed[:_MAX_WALK_ERRORS]:
            errors.append((str(exc.filename or root), f"cannot list: {exc.strerror or exc}"))
        if len(failed) > _MAX_WALK_ERRORS:
            errors.append((str(root), f"{len(failed) - _MAX_WALK_ERRORS} more folders could not be listed"))
    return sorted(found)
