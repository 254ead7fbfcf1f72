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

__all__ = ["SKILLS_DIR", "SKILL_SOURCES", "SkillEntry", "SkillLimits", "SkillRoot", "SkillsIndex", "build_skills_index",
           "discover_skill_roots", "discover_skills", "format_skills_block",
           "parse_skill_file"]

SKILLS_DIR = "skills"
PROJECT_SKILLS_DIR = ".agents/skills"
SKILL_FILE = "SKILL.md"
#: Skill sources, highest precedence first (SPEC §7).
SKILL_SOURCES: tuple[str, ...] = ("workspace", "project-agent", "personal-agent", "managed", "bundled", "extra")
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


class SkillRoot(msgspec.Struct, frozen=True):
    """A folder of skills outside the workspace: ``source`` (one of :data:`SKILL_SOURCES`),
    its absolute ``path``, and ``shown``, how its skills' paths are written in the prompt."""

    source: str
    path: str
    shown: str
    #: named by the caller (a missing folder gets a note) rather than a default
    explicit: bool = True


class SkillLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-skill and per-root limits of discovery (SPEC §7)."""

    max_description_chars: int = 1024
    max_file_bytes: int = 256_000
    max_candidates_per_root: int = 300


def _discover_root(base: Path, dir_rel: str, shown: str, limits: SkillLimits,
                   notes: list[str], files: list[str]) -> list[SkillEntry]:
    """The skills of one root, ``base/dir_rel`` (``dir_rel`` is ``"."`` for a root outside the
    workspace, then ``base`` is the root itself), in folder-name order; each SKILL.md is read
    under ``base``'s confinement and shown as ``shown/<folder>/SKILL.md``."""
    try:
        names = folder_names(base, dir_rel)
    except DagctxError as err:
        notes.append(f"{shown}/: refused: {err.message}")
        return []
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        notes.append(f"{shown}: not a directory; no skills listed from it")
        return []
    except OSError as err:
        notes.append(f"{shown}/: cannot list ({err.strerror or type(err).__name__}); no skills listed from it")
        return []
    names = [n for n in names if not n.startswith(".")]
    cap = max(0, limits.max_candidates_per_root)
    if len(names) > cap:
        notes.append(f"{shown}/: {len(names)} folders, only the first {cap} (by name) looked at "
                     f"(skills.maxCandidatesPerRoot)")
        names = names[:cap]
    entries: list[SkillEntry] = []
    for folder in names:
        if not _is_text(folder):
            # An undecodable name cannot be shown to a model or sent as JSON (SPEC §1).
            bad = folder.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            notes.append(f"{shown}/{bad}/: the folder name is not valid UTF-8; skipped")
            continue
        folder_rel = folder if dir_rel == "." else f"{dir_rel}/{folder}"
        where = f"{shown}/{folder}"
        try:
            folder_real = resolve_inside(base, folder_rel)
        except DagctxError as err:
            notes.append(f"{where}/: refused: {err.message}")
            continue
        if not folder_real.is_dir():
            continue
        rel = f"{folder_rel}/{SKILL_FILE}"
        read = read_workspace_text(base, rel, _SKILL_READ_BYTES)
        if read.text is None:
            if read.status == "missing":
                notes.append(f"{where}/: no {SKILL_FILE}; skipped")
            else:
                notes.append((read.note or f"{rel}: skipped").replace(rel, f"{where}/{SKILL_FILE}", 1))
            continue
        if read.size_bytes > limits.max_file_bytes:
            notes.append(f"{where}/{SKILL_FILE}: {read.size_bytes:,} bytes, over the limit of "
                         f"{limits.max_file_bytes:,} (skills.maxSkillFileBytes); skipped")
            continue
        if read.note:
            notes.append(read.note.replace(rel, f"{where}/{SKILL_FILE}", 1))
        files.append(f"{where}/{SKILL_FILE}")
        entry = parse_skill_file(read.text, folder, f"{where}/{SKILL_FILE}")
        dcap = max(1, limits.max_description_chars)
        if len(entry.description) > dcap:
            notes.append(f"{entry.path}: description cut from {len(entry.description):,} to {dcap:,} characters "
                         "(skills.maxDescriptionChars)")
            entry = SkillEntry(name=entry.name, description=entry.description[: dcap - 1] + "…", path=entry.path)
        entries.append(entry)
    return entries


def discover_skill_roots(workspace: str | os.PathLike[str] | None, roots: tuple[SkillRoot, ...] = (),
                         limits: SkillLimits | None = None) -> tuple[list[SkillEntry], list[str], list[str]]:
    """Every skill of every root, highest precedence first (``<workspace>/skills``,
    ``<workspace>/.agents/skills``, then ``roots``): (entries sorted by name, notes, files read).
    A name found in a lower root than the first that has it is left out with a note; two
    skills of one name in the same root are both listed. Each root is confined to itself."""
    lim = limits if limits is not None else SkillLimits()
    notes: list[str] = []
    files: list[str] = []
    plan: list[tuple[str, Path, str, str]] = []  # (source, base, dir below base, shown)
    if workspace is not None:
        ws = Path(os.path.realpath(os.fspath(workspace)))
        plan += [("workspace", ws, SKILLS_DIR, SKILLS_DIR), ("project-agent", ws, PROJECT_SKILLS_DIR, PROJECT_SKILLS_DIR)]
    for root in roots:
        base = Path(os.path.realpath(root.path))
        if not base.is_dir():
            if os.path.lexists(root.path):
                notes.append(f"{root.shown}: not a directory; no {root.source} skills listed")
            elif root.explicit:
                notes.append(f"{root.shown}: no such folder; no {root.source} skills listed")
            continue
        plan.append((root.source, base, ".", root.shown))
    chosen: dict[str, tuple[str, str]] = {}
    out: list[SkillEntry] = []
    for source, base, dir_rel, shown in plan:
        here: set[str] = set()
        for entry in _discover_root(base, dir_rel, shown, lim, notes, files):
            first = chosen.get(entry.name)
            if first is not None and entry.name not in here:
                notes.append(f"skill {entry.name!r}: {entry.path} ({source}) is shadowed by {first[1]} ({first[0]}), "
                             "which takes precedence")
                continue
            chosen.setdefault(entry.name, (source, entry.path))
            here.add(entry.name)
            out.append(entry)
    out.sort(key=_skill_sort_key)
    seen: dict[str, str] = {}
    for entry in out:
        if entry.name in seen:
            notes.append(f"skill name {entry.name!r} appears twice ({seen[entry.name]} and {entry.path}); both listed")
        else:
            seen[entry.name] = entry.path
    return out, notes, files


def discover_skills(root: str | os.PathLike[str]) -> tuple[list[SkillEntry], list[str], list[str]]:
    """The skills of the workspace ``root`` (``skills/`` and ``.agents/skills/``) with the
    default limits; see :func:`discover_skill_roots`."""
    return discover_skill_roots(root)


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
