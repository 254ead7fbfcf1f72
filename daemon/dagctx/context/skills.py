"""The skills index of the system prompt (SPEC §7): ``skills/*/SKILL.md`` under the
workspace, each a name and a one-line description from its front matter, listed by name
within a count and a character limit. Read through ``workspace_files`` (confined)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import msgspec

from dagctx.protocol.errors import DagctxError

from .workspace_files import folder_names, normalise_newlines, read_workspace_text, resolve_inside

__all__ = ["SKILLS_DIR", "SkillEntry", "SkillsIndex", "build_skills_index", "discover_skills", "format_skills_block",
           "parse_skill_file"]

SKILLS_DIR = "skills"
SKILL_FILE = "SKILL.md"
SKILLS_HEADING = "## Skills"
SKILLS_INTRO = "Each skill's full instructions are in its SKILL.md; read one only when it clearly applies."
#: Front matter and the first body line sit at the top of a SKILL.md.
_SKILL_READ_BYTES = 64 * 1024


class SkillEntry(msgspec.Struct, frozen=True):
    """One line of the skills index. ``path`` is workspace-relative, POSIX style."""

    name: str
    description: str
    path: str

    def line(self) -> str:
        if self.description:
            return f"- {self.name}: {self.description} (path: {self.path})"
        return f"- {self.name} (path: {self.path})"


class SkillsIndex(msgspec.Struct, frozen=True):
    """The rendered skills block; ``text`` is empty when nothing fits."""

    text: str
    shown: int
    omitted: int
    reason: Literal["count", "chars"] | None = None


_FRONT_MATTER_FENCE = "---"
_BLOCK_SCALAR = re.compile(r"^[|>][+-]?[0-9]?[+-]?$")
_KEY_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)\s*:(?:\s+(.*)|\s*)$")
_WHITESPACE = re.compile(r"\s+")


def _one_line(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _unquote(value: str) -> str:
    """Strip YAML-style quotes from a scalar written on one line, tolerantly."""

    value = value.strip()
    if not value:
        return ""
    quote = value[0]
    if quote in ("'", '"'):
        body = value[1:]
        end = _closing_quote(body, quote)
        if end is not None:
            body = body[:end]
        # An unclosed quote: the value continues on later lines; keep this line.
        if quote == "'":
            return body.replace("''", "'")
        return body.replace('\\"', '"').replace("\\\\", "\\")
    # Plain scalar: " #" starts a comment.
    cut = value.find(" #")
    return value[:cut].rstrip() if cut >= 0 else value


def _closing_quote(body: str, quote: str) -> int | None:
    i = 0
    while i < len(body):
        ch = body[i]
        if quote == '"' and ch == "\\":
            i += 2
            continue
        if ch == quote:
            if quote == "'" and body[i + 1 : i + 2] == "'":
                i += 2
                continue
            return i
        i += 1
    return None


def _parse_front_matter(lines: list[str]) -> dict[str, str]:
    """Top-level ``key: value`` pairs, first line of each value only.

    Handles plain, quoted, block (``>``/``|`` with indicators) and indented
    continuation values; ignores comments and nested mappings' inner keys.
    """

    result: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#") or line[:1].isspace():
            continue
        match = _KEY_LINE.match(line.rstrip())
        if match is None:
            continue
        key = match.group(1).lower()
        raw = (match.group(2) or "").strip()
        if raw and not _BLOCK_SCALAR.match(raw):
            value = _unquote(raw)
        else:
            # Block scalar or empty value: the value is the following indented lines.
            value = ""
            while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
                if not value and lines[i].strip():
                    value = lines[i].strip()
                    if not raw:  # a plain multi-line scalar may be quoted
                        value = _unquote(value)
                i += 1
        if key not in result:
            result[key] = _one_line(value)
    return result


def _first_body_line(lines: list[str]) -> str:
    for line in lines:
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped != _FRONT_MATTER_FENCE:
            return _one_line(stripped)
    return ""


def parse_skill_file(text: str, folder: str, path: str) -> SkillEntry:
    """Name and first description line of one SKILL.md.

    With front matter (a first line ``---`` up to the next ``---`` or ``...``), use
    its ``name`` and ``description``; a missing name falls back to the folder name
    and a missing description to the body's first non-empty, non-heading line. An
    unclosed front matter block is read to the end of the file.
    """

    lines = normalise_newlines(text.lstrip("\ufeff")).split("\n")
    meta: dict[str, str] = {}
    body = lines
    if lines and lines[0].rstrip() == _FRONT_MATTER_FENCE:
        end = len(lines)
        for j in range(1, len(lines)):
            if lines[j].rstrip() in (_FRONT_MATTER_FENCE, "..."):
                end = j
                break
        meta = _parse_front_matter(lines[1:end])
        body = lines[end + 1 :]
    name = meta.get("name") or _one_line(folder)
    description = meta.get("description") or _first_body_line(body)
    return SkillEntry(name=name, description=description, path=path)


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _skill_sort_key(entry: SkillEntry) -> tuple[str, str, str]:
    return (entry.name.casefold(), entry.name, entry.path)


def discover_skills(root: str | os.PathLike[str]) -> tuple[list[SkillEntry], list[str], list[str]]:
    """Find ``skills/*/SKILL.md`` under ``root``: (entries sorted by name, notes, files read).

    A ``skills`` folder whose real path is outside the root is refused as a whole;
    each skill folder and SKILL.md is checked again, so one symlinked skill cannot
    escape either. Hidden folders and plain files in ``skills/`` are ignored.
    """

    root_path = Path(os.path.realpath(os.fspath(root)))
    notes: list[str] = []
    files: list[str] = []
    try:
        names = folder_names(root_path, SKILLS_DIR)
    except DagctxError as err:
        return [], [f"{SKILLS_DIR}/: refused: {err.message}"], []
    except FileNotFoundError:
        return [], [], []
    except NotADirectoryError:
        return [], [f"{SKILLS_DIR}: not a directory; no skills listed"], []
    except OSError as err:
        return [], [f"{SKILLS_DIR}/: cannot list ({err.strerror or type(err).__name__}); no skills listed"], []

    entries: list[SkillEntry] = []
    for folder in names:
        if folder.startswith("."):
            continue
        if not _is_text(folder):
            # An undecodable name cannot be shown to a model or sent as JSON (SPEC §1).
            shown = folder.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            notes.append(f"{SKILLS_DIR}/{shown}/: the folder name is not valid UTF-8; skipped")
            continue
        folder_rel = f"{SKILLS_DIR}/{folder}"
        try:
            folder_real = resolve_inside(root_path, folder_rel)
        except DagctxError as err:
            notes.append(f"{folder_rel}/: refused: {err.message}")
            continue
        if not folder_real.is_dir():
            continue
        rel = f"{folder_rel}/{SKILL_FILE}"
        read = read_workspace_text(root_path, rel, _SKILL_READ_BYTES)
        if read.text is None:
            if read.status == "missing":
                notes.append(f"{folder_rel}/: no {SKILL_FILE}; skipped")
            else:
                notes.append(read.note or f"{rel}: skipped")
            continue
        if read.note:
            notes.append(read.note)
        files.append(rel)
        entries.append(parse_skill_file(read.text, folder, rel))

    entries.sort(key=_skill_sort_key)
    seen: dict[str, str] = {}
    for entry in entries:
        if entry.name in seen:
            notes.append(f"skill name {entry.name!r} appears twice ({seen[entry.name]} and {entry.path}); both listed")
        else:
            seen[entry.name] = entry.path
    return entries, notes, files


def format_skills_block(entries: list[SkillEntry], omitted: int) -> str:
    """The skills section text for these entries plus an ``+N more`` line if any are left out."""

    lines = [SKILLS_HEADING, SKILLS_INTRO]
    lines.extend(entry.line() for entry in entries)
    if omitted > 0:
        lines.append(f"+{omitted} more skills not listed")
    return "\n".join(lines)


def build_skills_index(entries: list[SkillEntry], max_count: int, max_chars: int) -> SkillsIndex:
    """Largest prefix of ``entries`` within ``max_count`` entries and ``max_chars`` characters.

    ``max_chars`` bounds the whole block (heading, intro, entries and the ``+N more``
    line). Every truncated block carries that line; with it, a block's length grows
    strictly with the number of entries (one more entry adds its line and the count
    shrinks by at most one digit), so the largest prefix that fits is found by binary
    search over the count: O(log n) renders instead of n. If not even the heading and
    the ``+N more`` line fit, the index is left out.
    """

    total = len(entries)
    if total == 0:
        return SkillsIndex(text="", shown=0, omitted=0)
    limit = max(0, min(max_count, total))
    reason: Literal["count", "chars"] | None = "count" if limit < total else None

    def render(k: int) -> str:
        return format_skills_block(entries[:k], total - k)

    full = render(limit)
    if len(full) <= max_chars:
        return SkillsIndex(text=full, shown=limit, omitted=total - limit, reason=reason)
    # render(limit) does not fit; every candidate below has at least one omitted
    # entry, so render(k) is monotonic on [0, limit - 1].
    if len(render(0)) > max_chars:
        return SkillsIndex(text="", shown=0, omitted=total, reason="chars")
    lo, hi = 0, limit - 1  # invariant: render(lo) fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(render(mid)) <= max_chars:
            lo = mid
        else:
            hi = mid - 1
    return SkillsIndex(text=render(lo), shown=lo, omitted=total - lo, reason="chars")
