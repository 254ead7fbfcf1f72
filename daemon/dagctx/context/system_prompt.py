"""The one system-prompt assembler (SPEC §7).

Every system prompt the daemon hands to a model is built here, from an inline
identity, a few workspace files, an inline agent prompt, a skills index and a memory
file. The function is pure apart from reading files under one workspace root, and it
is deterministic: the same files and options give the same bytes and therefore the
same ``hash``. That hash is what the engine compares to decide whether a new
``context/system_prompt`` node must be recorded, so replay can reproduce exactly what
a model saw. Nothing time-dependent (dates, mtimes) ever goes into the text, and no
host path except a skill root outside the workspace, written as the caller named it.

Order, most stable first::

    prepend            (hook: prependSystemContext)
    identity           who the agent is; changes almost never
    ## AGENTS.md       project rules; changes rarely
    ## SOUL.md         persona / tone
    ## TOOLS.md        the user's notes on using tools (it grants no tool)
    ## IDENTITY.md     the agent's name and manner
    ## USER.md         facts about the user
    ## HEARTBEAT.md    what a periodic check-in looks at
    ## BOOTSTRAP.md    first-run instructions of a new workspace
    agent prompt       inline, per agent
    ## Skills          index of SKILL.md files from every skill root; changes when skills are added
    ## Memory          MEMORY.md (memory.md when there is no MEMORY.md); changes often
    append             (hook: appendSystemContext)

The bootstrap files keep their documented order (AGENTS, SOUL, TOOLS, IDENTITY, USER,
HEARTBEAT, BOOTSTRAP, MEMORY); only the inline agent prompt and the skills index sit
between the last of them and MEMORY.md, so the most edited file stays at the end.

Providers cache prompts by prefix. Putting what changes least at the front means an
edit to MEMORY.md (the most frequently edited input) invalidates only the tail of the
prompt, and the identity and workspace prefix keep hitting the cache.

Modes: ``full`` is everything above; ``minimal`` (sub-agents, cheap runs) keeps only
identity, AGENTS.md, TOOLS.md and the inline agent prompt (no skills, no memory);
``none`` leaves only the prepend and append hook texts.

Limits: each workspace file is cut at ``per_file_chars`` characters and all workspace
file content together at ``total_chars``; a cut is marked in the text itself so the
model knows it is not seeing the whole file. The skills index is capped by entry
count and by characters (the largest prefix that fits, by binary search), each
description at ``skills_max_description_chars``; a SKILL.md over
``skills_max_file_bytes`` and folders past ``skills_max_candidates_per_root`` in one
root are skipped with a note. "Characters" are Unicode code points of the text after
newline normalisation.

Skill roots (``skill_roots``, highest precedence first): ``<workspace>/skills``,
``<workspace>/.agents/skills``, then the roots the caller names (personal agent,
managed, bundled, extra folders). A skill name found in several roots is listed once,
from the highest root; the others get a note. A root outside the workspace is confined
to itself the same way the workspace is (no symlink out of it is followed), and its
skills are shown by the path the caller gave for it (``~/…`` for the home folder).

Confinement (SPEC §7). A cloned repository can contain an ``AGENTS.md`` symlinked to
``~/.ssh/id_rsa``; its content must never reach a model provider. What is guaranteed:

* a path is first resolved to its real path (symlinks followed) and refused unless it
  lies inside the workspace root — symlinks that stay inside keep working;
* the file is then opened by walking that real path from a descriptor of the root,
  one component at a time, each with ``O_NOFOLLOW`` (directories also
  ``O_DIRECTORY``): if any component was swapped for a symlink after the check, the
  open fails instead of following it, so the descriptor read is always a file below
  the root's descriptor (no time-of-check/time-of-use window through symlinks);
* the opened file must be a regular file (a FIFO or device is never read; opened
  ``O_NONBLOCK`` so a FIFO cannot hang the daemon) with exactly one link: a hard link
  passes any path check and may be the same file as one outside the workspace
  (``st_nlink > 1`` is refused, whatever the other names are);
* the skills folder is listed through the same descriptor walk.

Not guaranteed: a workspace root that is itself moved while the daemon reads it (the
root is whatever the descriptor opened at the start names), and a directory renamed
inside the workspace by a concurrent local process (it stays inside the root either
way). Refused, missing and unreadable files are skipped and reported in ``notes``;
assembling never raises because of the workspace's contents.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import Any, Literal

import msgspec

from dagctx.protocol.context_messages import PromptLayer
from dagctx.protocol.errors import DagctxError

__all__ = [
    "DEFAULT_IDENTITY",
    "AssembledPrompt",
    "PromptMode",
    "PromptOptions",
    "Section",
    "SkillEntry",
    "SkillsIndex",
    "assemble_system_prompt",
    "build_skills_index",
    "discover_skill_roots",
    "discover_skills",
    "format_skills_block",
    "parse_skill_file",
    "resolve_inside",
]

PromptMode = Literal["full", "minimal", "none"]

#: Used when ``identity`` is None in full and minimal modes. Deliberately short and
#: neutral: the workspace files and the agent prompt carry the specifics.
DEFAULT_IDENTITY = "You are a helpful coding agent working in the user's workspace."

#: Bootstrap files read before the inline agent prompt, in this (the documented) order.
WORKSPACE_FILES: tuple[str, ...] = ("AGENTS.md", "SOUL.md", "TOOLS.md", "IDENTITY.md", "USER.md", "HEARTBEAT.md",
                                    "BOOTSTRAP.md")
#: The subset of WORKSPACE_FILES read in minimal mode (sub-agents).
MINIMAL_WORKSPACE_FILES: tuple[str, ...] = ("AGENTS.md", "TOOLS.md")
MEMORY_FILE = "MEMORY.md"
#: read when the workspace has no MEMORY.md
MEMORY_FILE_ALT = "memory.md"
SKILLS_DIR = "skills"
PROJECT_SKILLS_DIR = ".agents/skills"
SKILL_FILE = "SKILL.md"
#: Skill sources, highest precedence first (SPEC §7).
SKILL_SOURCES: tuple[str, ...] = ("workspace", "project-agent", "personal-agent", "managed", "bundled", "extra")

SKILLS_HEADING = "## Skills"
SKILLS_INTRO = "Each skill's full instructions are in its SKILL.md; read one only when it clearly applies."
MEMORY_HEADING = "## Memory (MEMORY.md)"

#: Never read more than this many bytes of a workspace file (raised automatically
#: when ``per_file_chars`` needs more). A runaway 2 GB MEMORY.md costs one bounded
#: read, not the daemon's memory.
_READ_CEILING_BYTES = 8 * 1024 * 1024
#: Front matter and the first body line sit at the top of a SKILL.md.
_SKILL_READ_BYTES = 64 * 1024

_SEPARATOR = "\n\n"


# ---------------------------------------------------------------- public types


class SkillRoot(msgspec.Struct, frozen=True):
    """A folder of skills outside the workspace: ``source`` (one of :data:`SKILL_SOURCES`),
    its absolute ``path``, and ``shown``, how its skills' paths are written in the prompt."""

    source: str
    path: str
    shown: str
    #: named by the caller (a missing folder gets a note) rather than a default
    explicit: bool = True


class PromptOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What to assemble and within which limits.

    ``identity``: None means :data:`DEFAULT_IDENTITY` (full and minimal modes); an
    empty string means no identity section at all. ``prepend`` / ``append`` are the
    ``prependSystemContext`` / ``appendSystemContext`` hook texts and survive every
    mode, including ``none``.
    """

    mode: PromptMode = "full"
    identity: str | None = None
    agent_prompt: str | None = None
    per_file_chars: int = 20_000
    total_chars: int = 150_000
    skills_max_count: int = 150
    skills_max_chars: int = 30_000
    skills_max_description_chars: int = 1024
    skills_max_file_bytes: int = 256_000
    skills_max_candidates_per_root: int = 300
    #: skill roots outside the workspace, highest precedence first (after the workspace's own two)
    skill_roots: tuple[SkillRoot, ...] = ()
    prepend: str | None = None
    append: str | None = None


class Section(msgspec.Struct, frozen=True):
    """One block of the assembled text.

    ``chars`` is the block's length in the text, heading and truncation marker
    included; blocks are joined by a blank line, so ``len(text)`` equals the sum of
    ``chars`` plus two per gap. ``source`` is the workspace-relative path the block
    came from (``"skills"`` for the index), None for inline text.
    """

    name: str
    chars: int
    truncated: bool = False
    source: str | None = None


class AssembledPrompt(msgspec.Struct, frozen=True):
    """The result: ``text`` and its sha256 ``hash``, plus an account of how it was made.

    ``notes`` explains everything that was left out or cut (missing, refused or
    unreadable files, truncations, skipped skills), in a fixed order, so a caller can
    show why the prompt looks the way it does. ``files`` lists the workspace-relative
    paths that were opened and read, in read order.
    """

    text: str
    hash: str
    sections: list[Section]
    notes: list[str]
    files: list[str]


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


# ---------------------------------------------------------------- confinement


def resolve_inside(root: str | os.PathLike[str], relative: str | os.PathLike[str]) -> Path:
    """Return the real path of ``root/relative``, or raise ``WorkspaceEscape``.

    ``relative`` must be relative and must not contain ``..``; after following every
    symlink, the result must be the root itself or lie below the root's own real path.
    The file need not exist. Checking the real path (not the spelled one) is what
    stops a symlinked file or folder from pointing outside the workspace.
    """

    rel_text = os.fspath(relative)
    if "\x00" in rel_text:
        raise DagctxError("WorkspaceEscape", f"path {rel_text!r} contains a NUL byte", path=rel_text)
    rel = PurePath(rel_text)
    if rel.is_absolute() or rel.anchor:
        raise DagctxError(
            "WorkspaceEscape",
            f"path {rel_text!r} is absolute; give a path relative to the workspace root",
            path=rel_text,
        )
    if ".." in rel.parts:
        raise DagctxError(
            "WorkspaceEscape",
            f"path {rel_text!r} contains '..'; paths must stay inside the workspace root",
            path=rel_text,
        )
    root_real = Path(os.path.realpath(os.fspath(root)))
    target = Path(os.path.realpath(root_real / rel))
    if target != root_real and not target.is_relative_to(root_real):
        raise DagctxError(
            "WorkspaceEscape",
            f"path {rel_text!r} resolves outside the workspace root (through a symlink); refusing to read it",
            path=rel_text,
        )
    return target


class _ReadResult(msgspec.Struct):
    text: str | None = None  # None: not read (see note)
    note: str | None = None
    status: Literal["ok", "missing", "refused", "unreadable"] = "ok"
    size_bytes: int = 0
    partial: bool = False  # only the first max_bytes were read


_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))
_FILE_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))


def open_beneath(root: str | os.PathLike[str], rel: str, *, directory: bool = False) -> int:
    """A descriptor of ``root/rel`` opened without following any symlink on the way.

    ``rel`` is checked by ``resolve_inside`` (``WorkspaceEscape`` when it leaves the
    root); its real path below the root is then walked from a descriptor of the root,
    each component opened relative to the previous one with ``O_NOFOLLOW``. A symlink
    swapped in after the check makes the walk fail (``OSError``, ``ELOOP``/``ENOTDIR``)
    instead of leaving the root. Raises ``FileNotFoundError`` for a missing file.
    """
    root_real = Path(os.path.realpath(os.fspath(root)))
    real = resolve_inside(root_real, rel)
    parts = real.relative_to(root_real).parts
    fd = os.open(root_real, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = _DIR_FLAGS if (not last or directory) else _FILE_FLAGS
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_workspace_text(root: Path, rel: str, max_bytes: int) -> _ReadResult:
    """Read ``root/rel`` as text under confinement (module docstring); never raises
    for file problems."""

    try:
        fd = open_beneath(root, rel)
    except DagctxError as err:
        return _ReadResult(status="refused", note=f"{rel}: refused: {err.message}")
    except FileNotFoundError:
        return _ReadResult(status="missing", note=f"{rel}: not found; skipped")
    except PermissionError:
        return _ReadResult(status="unreadable", note=f"{rel}: permission denied; skipped")
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            return _ReadResult(status="refused", note=f"{rel}: refused: a path component changed into a "
                               "symlink while it was opened; not followed")
        return _ReadResult(status="unreadable", note=f"{rel}: cannot open ({err.strerror or type(err).__name__}); skipped")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _ReadResult(status="unreadable", note=f"{rel}: not a regular file; skipped")
        if info.st_nlink > 1:
            return _ReadResult(status="refused", note=f"{rel}: refused: it has {info.st_nlink} hard links, and a "
                               "hard link may be a file outside the workspace; copy it instead")
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as err:
        return _ReadResult(status="unreadable", note=f"{rel}: read failed ({err.strerror or type(err).__name__}); skipped")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    partial = len(data) > max_bytes
    if partial:
        data = data[:max_bytes]
    note = None
    try:
        # utf-8-sig drops a leading BOM; final=False on a partial read keeps a
        # multi-byte character split at the cut from counting as invalid.
        text = codecs.getincrementaldecoder("utf-8-sig")("strict").decode(data, final=not partial)
    except UnicodeDecodeError:
        text = codecs.getincrementaldecoder("utf-8-sig")("replace").decode(data, final=not partial)
        note = f"{rel}: not valid UTF-8; invalid bytes shown as U+FFFD"
    return _ReadResult(
        text=_normalise_newlines(text),
        note=note,
        size_bytes=max(info.st_size, len(data)),
        partial=partial,
    )


def _normalise_newlines(text: str) -> str:
    # A file checked out with CRLF on one machine and LF on another must give the
    # same prompt bytes.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _clean_block(text: str | None) -> str:
    """Newlines normalised, leading blank lines and trailing whitespace removed."""

    if not text:
        return ""
    # Leading whitespace-only lines go; indentation of the first real line stays.
    lines = _normalise_newlines(text).rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


# ---------------------------------------------------------------- skills


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

    lines = _normalise_newlines(text.lstrip("\ufeff")).split("\n")
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


def _discover_root(base: Path, dir_rel: str, shown: str, opts: PromptOptions,
                   notes: list[str], files: list[str]) -> list[SkillEntry]:
    """The skills of one root, ``base/dir_rel`` (``dir_rel`` is ``"."`` for a root outside the
    workspace, then ``base`` is the root itself), in folder-name order; each SKILL.md is read
    under ``base``'s confinement and shown as ``shown/<folder>/SKILL.md``."""
    try:
        dir_fd = open_beneath(base, dir_rel, directory=True)
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
    try:
        with os.scandir(dir_fd) as it:
            names = sorted(entry.name for entry in it)
    except OSError as err:
        notes.append(f"{shown}/: cannot list ({err.strerror or type(err).__name__}); no skills listed from it")
        return []
    finally:
        os.close(dir_fd)

    names = [n for n in names if not n.startswith(".")]
    limit = max(0, opts.skills_max_candidates_per_root)
    if len(names) > limit:
        notes.append(f"{shown}/: {len(names)} folders, only the first {limit} (by name) looked at "
                     f"(skills.maxCandidatesPerRoot)")
        names = names[:limit]
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
        read = _read_workspace_text(base, rel, _SKILL_READ_BYTES)
        if read.text is None:
            if read.status == "missing":
                notes.append(f"{where}/: no {SKILL_FILE}; skipped")
            else:
                notes.append((read.note or f"{rel}: skipped").replace(rel, f"{where}/{SKILL_FILE}", 1))
            continue
        if read.size_bytes > opts.skills_max_file_bytes:
            notes.append(f"{where}/{SKILL_FILE}: {read.size_bytes:,} bytes, over the limit of "
                         f"{opts.skills_max_file_bytes:,} (skills.maxSkillFileBytes); skipped")
            continue
        if read.note:
            notes.append(read.note.replace(rel, f"{where}/{SKILL_FILE}", 1))
        files.append(f"{where}/{SKILL_FILE}")
        entry = parse_skill_file(read.text, folder, f"{where}/{SKILL_FILE}")
        cap = max(1, opts.skills_max_description_chars)
        if len(entry.description) > cap:
            notes.append(f"{entry.path}: description cut from {len(entry.description):,} to {cap:,} characters "
                         "(skills.maxDescriptionChars)")
            entry = SkillEntry(name=entry.name, description=entry.description[: cap - 1] + "…", path=entry.path)
        entries.append(entry)
    return entries


def discover_skill_roots(workspace: str | os.PathLike[str] | None,
                         options: PromptOptions | None = None) -> tuple[list[SkillEntry], list[str], list[str]]:
    """Every skill of every root, highest precedence first (module docstring): (entries
    sorted by name, notes, files read). A name found in a lower root than the first that
    has it is left out with a note; two skills of one name in the same root are both listed."""
    opts = options if options is not None else PromptOptions()
    notes: list[str] = []
    files: list[str] = []
    roots: list[tuple[str, Path, str, str]] = []  # (source, base, dir below base, shown)
    if workspace is not None:
        ws = Path(os.path.realpath(os.fspath(workspace)))
        roots += [("workspace", ws, SKILLS_DIR, SKILLS_DIR), ("project-agent", ws, PROJECT_SKILLS_DIR, PROJECT_SKILLS_DIR)]
    for root in opts.skill_roots:
        base = Path(os.path.realpath(root.path))
        if not base.is_dir():
            if os.path.lexists(root.path):
                notes.append(f"{root.shown}: not a directory; no {root.source} skills listed")
            elif root.explicit:
                notes.append(f"{root.shown}: no such folder; no {root.source} skills listed")
            continue
        roots.append((root.source, base, ".", root.shown))
    chosen: dict[str, tuple[str, str]] = {}  # name → (source, path) of the root that has it first
    out: list[SkillEntry] = []
    for source, base, dir_rel, shown in roots:
        mine = _discover_root(base, dir_rel, shown, opts, notes, files)
        here: set[str] = set()
        for entry in mine:
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
    """Find ``skills/*/SKILL.md`` and ``.agents/skills/*/SKILL.md`` under the workspace ``root``:
    (entries sorted by name, notes, files read); see :func:`discover_skill_roots`."""

    return discover_skill_roots(root, PromptOptions())


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


# ---------------------------------------------------------------- assembly


def _file_block(
    root: Path,
    rel: str,
    heading: str,
    section_name: str,
    per_file: int,
    remaining: int,
    total_limit: int,
    notes: list[str],
    files: list[str],
) -> tuple[str | None, Section | None, int]:
    """One workspace file as a section; returns (block, section, characters used)."""

    allowance = min(per_file, remaining)
    if allowance <= 0:
        # Not read: nothing of it could be shown. Still say why it is absent.
        try:
            exists = os.path.lexists(resolve_inside(root, rel))
        except DagctxError as err:
            notes.append(f"{rel}: refused: {err.message}")
            return None, None, 0
        if not exists:
            notes.append(f"{rel}: not found; skipped")
        elif per_file <= 0:
            notes.append(f"{rel}: skipped: the per-file limit is 0 characters")
        else:
            notes.append(f"{rel}: skipped: the total workspace-file limit of {total_limit:,} characters is used up")
        return None, None, 0

    ceiling = max(_READ_CEILING_BYTES, 4 * allowance + 8)
    read = _read_workspace_text(root, rel, ceiling)
    if read.text is None:
        notes.append(read.note or f"{rel}: skipped")
        return None, None, 0
    files.append(rel)
    if read.note:
        notes.append(read.note)
    content = read.text.rstrip()
    if not content.strip():
        notes.append(f"{rel}: empty; skipped")
        return None, None, 0

    truncated = read.partial or len(content) > allowance
    if not truncated:
        block = f"{heading}\n{content}"
        return block, Section(name=section_name, chars=len(block), source=rel), len(content)

    shown = content[:allowance]
    if len(content) > allowance and allowance < per_file:
        why = f"total workspace-file limit {total_limit:,} reached"
    else:
        why = f"per-file limit {per_file:,}"
    if read.partial:
        # Only a bounded prefix was read, so the character total is unknown.
        of = f"characters of a {read.size_bytes:,}-byte file"
    else:
        of = f"of {len(content):,} characters"
    marker = f"[… truncated: {len(shown):,} {of} shown — file {rel}, {why}]"
    notes.append(f"{rel}: truncated to {len(shown):,} characters ({why})")
    sep = "" if shown.endswith("\n") else "\n"
    block = f"{heading}\n{shown}{sep}{marker}"
    return block, Section(name=section_name, chars=len(block), truncated=True, source=rel), len(shown)


def assemble_system_prompt(workspace: str | os.PathLike[str] | None, options: PromptOptions | None = None) -> AssembledPrompt:
    """Build the system prompt for ``workspace`` (None: inline parts only).

    Pure apart from reading the bootstrap files (``AGENTS.md`` … ``MEMORY.md``) inside the
    workspace root and the ``SKILL.md`` files of the skill roots. Raises only for invalid options
    (``InvalidParams``); problems with files become ``notes``.
    """

    opts = options if options is not None else PromptOptions()
    if opts.mode not in ("full", "minimal", "none"):
        raise DagctxError(
            "InvalidParams",
            f"unknown prompt mode {opts.mode!r}; use 'full', 'minimal' or 'none'",
        )

    parts: list[str] = []
    sections: list[Section] = []
    notes: list[str] = []
    files: list[str] = []

    def add(name: str, block: str, *, truncated: bool = False, source: str | None = None) -> None:
        if block:
            parts.append(block)
            sections.append(Section(name=name, chars=len(block), truncated=truncated, source=source))

    add("prepend", _clean_block(opts.prepend))

    if opts.mode != "none":
        identity = DEFAULT_IDENTITY if opts.identity is None else opts.identity
        add("identity", _clean_block(identity))

        root: Path | None = None
        if workspace is None:
            notes.append("no workspace given; workspace files, skills and memory skipped")
        else:
            candidate = Path(os.path.realpath(os.fspath(workspace)))
            if candidate.is_dir():
                root = candidate
            else:
                notes.append("workspace root is not a directory; workspace files, skills and memory skipped")

        per_file = max(0, opts.per_file_chars)
        total_limit = max(0, opts.total_chars)
        remaining = total_limit
        names = WORKSPACE_FILES if opts.mode == "full" else MINIMAL_WORKSPACE_FILES

        if root is not None:
            for rel in names:
                block, section, used = _file_block(root, rel, f"## {rel}", rel, per_file, remaining, total_limit, notes, files)
                remaining -= used
                if block is not None and section is not None:
                    parts.append(block)
                    sections.append(section)

        add("agent_prompt", _clean_block(opts.agent_prompt))

        if opts.mode == "full" and root is not None:
            entries, skill_notes, skill_files = discover_skill_roots(root, opts)
            notes.extend(skill_notes)
            files.extend(skill_files)
            index = build_skills_index(entries, opts.skills_max_count, max(0, opts.skills_max_chars))
            if index.omitted and index.text:
                limit = (
                    f"count limit {opts.skills_max_count:,}"
                    if index.reason == "count"
                    else f"character limit {opts.skills_max_chars:,}"
                )
                notes.append(f"skills index: {index.shown} of {len(entries)} skills listed ({limit})")
            elif index.omitted:
                notes.append(
                    f"skills index left out: even an empty index exceeds the {opts.skills_max_chars:,}-character limit"
                )
            add("skills", index.text, truncated=index.omitted > 0, source=SKILLS_DIR)

            memory_file = MEMORY_FILE
            if not os.path.lexists(root / MEMORY_FILE) and os.path.lexists(root / MEMORY_FILE_ALT):
                memory_file = MEMORY_FILE_ALT
            heading = MEMORY_HEADING if memory_file == MEMORY_FILE else f"## Memory ({MEMORY_FILE_ALT})"
            block, section, used = _file_block(
                root, memory_file, heading, "memory", per_file, remaining, total_limit, notes, files
            )
            remaining -= used
            if block is not None and section is not None:
                parts.append(block)
                sections.append(section)

    add("append", _clean_block(opts.append))

    text = _SEPARATOR.join(parts)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return AssembledPrompt(text=text, hash=digest, sections=sections, notes=notes, files=files)


def prompt_layers(text: str, sections: Sequence[Any], count: Callable[[str], int]) -> list[PromptLayer]:
    """The layers of an assembled prompt and their sizes (``BudgetExceeded``, SPEC §7).

    ``sections`` are ``Section`` structs or their stored form (a ``context/system_prompt``
    node's ``metadata.sections``); each layer is its section's slice of ``text`` (blocks
    are joined by a blank line), counted with ``count``. Sections that do not add up to
    ``text`` (a node written by someone else) give one layer for the whole text.
    """
    rows: list[tuple[str, int, bool, str | None]] = []
    for s in sections:
        if isinstance(s, Section):
            rows.append((s.name, s.chars, s.truncated, s.source))
        elif isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("chars"), int):
            rows.append((s["name"], s["chars"], bool(s.get("truncated")), s.get("source")))
    gaps = len(_SEPARATOR) * max(0, len(rows) - 1)
    if not rows or sum(r[1] for r in rows) + gaps != len(text):
        return [PromptLayer(name="system prompt", chars=len(text), tokens=count(text))] if text else []
    out: list[PromptLayer] = []
    pos = 0
    for name, chars, truncated, source in rows:
        block = text[pos : pos + chars]
        pos += chars + len(_SEPARATOR)
        out.append(PromptLayer(name=name, chars=chars, tokens=count(block), source=source, truncated=truncated))
    return out
