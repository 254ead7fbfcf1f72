"""The artifact trail of a compaction summary (SPEC §8): the files the summarized part
changed, named in a last line of the summary whatever the summarizer wrote. Pure.

A summarizer asked to keep file paths still drops many of them when the covered part is
long (``dagctx eval`` M3: an extractive summary of 288 nodes named 6 of the 15 files the
turns edited). The files an agent changed are what it most needs to find again, and they
are plain facts of the covered tool calls, so the summary node carries them itself:

* a tool call edits files when its tool is a known file writer (``Edit``, ``Write``,
  ``MultiEdit``, ``NotebookEdit``, ``write_file``, ``edit_file``, ``create_file``, …) with a
  path argument (``file_path``, ``path``, ``notebook_path``, ``filename``), or an editor
  tool (``str_replace_editor``, ``str_replace_based_edit_tool``, ``edit``) whose
  ``command`` is not ``view``; and wherever a call's input holds a patch in the
  ``*** Begin Patch`` form (Codex ``apply_patch``, also inside a shell command), the
  files its ``*** Update/Add/Delete File:`` headers name;
* the previous summary's trail (its own last line) is carried over, so a rolling summary
  keeps every file since the session's start;
* files in order of first change, at most ``MAX_FILES`` (the newest kept when more).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from itertools import repeat
from typing import Any

from .view import Item

#: the line that starts the trail
TRAIL_PREFIX = "Files changed in the summarized part:"
#: at most this many files are named (the most recently first changed ones)
MAX_FILES = 60

_WRITERS = frozenset({"edit", "write", "multiedit", "notebookedit", "write_file", "edit_file", "create_file",
                      "writefile", "editfile", "replace_in_file", "insert_in_file", "file_write", "file_edit"})
_EDITORS = frozenset({"str_replace_editor", "str_replace_based_edit_tool", "edit"})
_PATH_KEYS = ("file_path", "path", "notebook_path", "filename", "file")
_PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+?)\s*$", re.M)


def _decoded(value: Any) -> Any:
    if isinstance(value, str):
        t = value.strip()
        if t.startswith("{"):
            try:
                return json.loads(t)
            except ValueError:
                return value
    return value


def _strings(value: Any, out: list[str] | None = None) -> list[str]:
    """Every string in ``value`` (dict values and list items, depth first, in order);
    one list filled in place, not a generator per container (a compaction reads the
    arguments of every covered tool call)."""
    out = [] if out is None else out
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, (dict, list)):
        for v in (value.values() if isinstance(value, dict) else value):
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, (dict, list)):
                _strings(v, out)
    return out


def changed_files(name: str | None, arguments: Any) -> list[str]:
    """The files one tool call changes (see the module docstring); [] for any other call."""
    tool = (name or "").strip().casefold()
    args = _decoded(arguments)
    out: list[str] = []
    for text in _strings(args):
        # every marker starts with "*** ": one search rules all three out in most texts
        if "*** " in text and ("*** Begin Patch" in text or "*** Update File: " in text
                               or "*** Add File: " in text):
            out.extend(m.group(1) for m in _PATCH_FILE.finditer(text))
    if isinstance(args, dict) and (tool in _WRITERS or tool in _EDITORS):
        command = args.get("command")
        if tool in _EDITORS and isinstance(command, str) and command.casefold() == "view":
            return out
        if tool in _WRITERS or command is not None:
            for key in _PATH_KEYS:
                path = args.get(key)
                if isinstance(path, str) and path.strip():
                    out.append(path.strip())
                    break
    return list(dict.fromkeys(out)) if out else out


def previous_trail(text: str) -> list[str]:
    """The files a summary's own trail line names (the line ``TRAIL_PREFIX`` starts)."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith(TRAIL_PREFIX):
            out.extend(p.strip() for p in line[len(TRAIL_PREFIX):].split(", ") if p.strip())
    return out


def trail_files(items: Iterable[Item], bodies: Iterable[str] | None = None) -> list[str]:
    """The files the summarized items changed, the previous summary's trail first.

    ``bodies``: each item's transcript body (``summary_transcript.item_body``), when at
    hand. A call whose arguments are a JSON value has them as compact JSON there, where
    every string appears as written but for escapes, and neither ``*`` nor a space is
    ever escaped: a call of no file-writing tool whose body holds no ``"*** "`` has no
    patch header in any of its strings, and changes no file (``changed_files``)."""
    files: list[str] = []
    for it, body in zip(items, repeat(None) if bodies is None else bodies):
        if it.kind == "summary":
            files.extend(previous_trail(it.text or ""))
        elif it.kind == "tool_call" or (it.kind == "text_pair" and it.part == "call"):
            if (body is not None and it.kind == "tool_call" and isinstance(it.input, (dict, list))
                    and "*** " not in body and not _writes(it.name)):
                continue
            files.extend(changed_files(it.name, it.input))
    files = list(dict.fromkeys(files))
    return files[-MAX_FILES:]


def _writes(name: str | None) -> bool:
    """Whether ``changed_files`` reads a path argument of this tool (a writer or an editor)."""
    tool = (name or "").strip().casefold()
    return tool in _WRITERS or tool in _EDITORS


def with_trail(body: str, files: list[str]) -> str:
    """``body`` with the trail as its last line (an earlier trail line of the summarizer's
    copying is dropped: the one here is complete); ``body`` unchanged without files."""
    if not files:
        return body
    kept = "\n".join(line for line in body.rstrip().splitlines() if not line.startswith(TRAIL_PREFIX)).rstrip()
    return f"{kept}\n\n{TRAIL_PREFIX} {', '.join(files)}"


__all__ = ["MAX_FILES", "TRAIL_PREFIX", "changed_files", "previous_trail", "trail_files", "with_trail"]
