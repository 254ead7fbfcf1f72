"""The one system-prompt assembler (SPEC §7).

Every system prompt the daemon hands to a model is built here, from an inline
identity, a few workspace files, an inline agent prompt, a skills index and a memory
file. The function is pure apart from reading files under one workspace root, and it
is deterministic: the same files and options give the same bytes and therefore the
same ``hash``. That hash is what the engine compares to decide whether a new
``context/system_prompt`` node must be recorded, so replay can reproduce exactly what
a model saw. Nothing time-dependent (dates, mtimes, absolute host paths) ever goes
into the text.

Order, most stable first::

    prepend            (hook: prependSystemContext)
    identity           who the agent is; changes almost never
    ## AGENTS.md       project rules; changes rarely
    ## SOUL.md         persona / tone
    ## USER.md         facts about the user
    agent prompt       inline, per agent
    ## Skills          index of skills/*/SKILL.md; changes when skills are added
    ## Memory          MEMORY.md; changes often
    append             (hook: appendSystemContext)

Providers cache prompts by prefix. Putting what changes least at the front means an
edit to MEMORY.md (the most frequently edited input) invalidates only the tail of the
prompt, and the identity and workspace prefix keep hitting the cache.

Modes: ``full`` is everything above; ``minimal`` (sub-agents, cheap runs) keeps only
identity, AGENTS.md and the inline agent prompt; ``none`` leaves only the prepend and
append hook texts.

Limits: each workspace file is cut at ``per_file_chars`` characters and all workspace
file content together at ``total_chars``; a cut is marked in the text itself so the
model knows it is not seeing the whole file. The skills index is capped by entry
count and by characters. "Characters" are Unicode code points of the text after
newline normalisation.

Confinement (SPEC §7): every file is read through ``workspace_files.py`` (its docstring
says what is guaranteed); the skills index is ``skills.py``. Refused, missing and
unreadable files are skipped and reported in ``notes``; assembling never raises because
of the workspace's contents.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from dagctx.protocol.context_messages import PromptLayer
from dagctx.protocol.errors import DagctxError

from .skills import SKILLS_DIR, build_skills_index, discover_skills
from .workspace_files import clean_block, read_workspace_text, resolve_inside

__all__ = [
    "DEFAULT_IDENTITY",
    "AssembledPrompt",
    "PromptMode",
    "PromptOptions",
    "Section",
    "assemble_system_prompt",
    "prompt_layers",
]

PromptMode = Literal["full", "minimal", "none"]

#: Used when ``identity`` is None in full and minimal modes. Deliberately short and
#: neutral: the workspace files and the agent prompt carry the specifics.

DEFAULT_IDENTITY = "You are a helpful coding agent working in the user's workspace."

#: Workspace files read before the inline agent prompt, in this order.
WORKSPACE_FILES: tuple[str, ...] = ("AGENTS.md", "SOUL.md", "USER.md")
#: The subset of WORKSPACE_FILES read in minimal mode.
MINIMAL_WORKSPACE_FILES: tuple[str, ...] = ("AGENTS.md",)
MEMORY_FILE = "MEMORY.md"

MEMORY_HEADING = "## Memory (MEMORY.md)"

#: Never read more than this many bytes of a workspace file (raised automatically
#: when ``per_file_chars`` needs more). A runaway 2 GB MEMORY.md costs one bounded
#: read, not the daemon's memory.
_READ_CEILING_BYTES = 8 * 1024 * 1024

_SEPARATOR = "\n\n"


# ---------------------------------------------------------------- public types


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
    read = read_workspace_text(root, rel, ceiling)
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

    Pure apart from reading ``AGENTS.md``, ``SOUL.md``, ``USER.md``, ``MEMORY.md`` and
    ``skills/*/SKILL.md`` inside the workspace root. Raises only for invalid options
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

    add("prepend", clean_block(opts.prepend))

    if opts.mode != "none":
        identity = DEFAULT_IDENTITY if opts.identity is None else opts.identity
        add("identity", clean_block(identity))

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

        add("agent_prompt", clean_block(opts.agent_prompt))

        if opts.mode == "full" and root is not None:
            entries, skill_notes, skill_files = discover_skills(root)
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

            block, section, used = _file_block(
                root, MEMORY_FILE, MEMORY_HEADING, "memory", per_file, remaining, total_limit, notes, files
            )
            remaining -= used
            if block is not None and section is not None:
                parts.append(block)
                sections.append(section)

    add("append", clean_block(opts.append))

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
