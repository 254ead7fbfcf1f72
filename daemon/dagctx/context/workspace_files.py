"""Reading files inside a workspace, confined to it (SPEC §7): the system prompt's workspace
files and skills (``system_prompt.py``, ``skills.py``) and the memory files the engine indexes
(``engine/memory.py``) are read only through here.

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
import os
import stat
from pathlib import Path, PurePath
from typing import Literal

import msgspec

from dagctx.protocol.errors import DagctxError

__all__ = ["ReadResult", "clean_block", "folder_names", "normalise_newlines", "open_beneath", "read_capped",
           "read_workspace_text", "resolve_inside"]


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


class ReadResult(msgspec.Struct):
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


def read_workspace_text(root: Path, rel: str, max_bytes: int) -> ReadResult:
    """Read at most ``max_bytes`` of ``root/rel`` as text under confinement (module
    docstring); never raises for file problems: a missing, refused or unreadable file is a
    ``ReadResult`` with its ``status`` and a ``note``."""

    try:
        fd = open_beneath(root, rel)
    except DagctxError as err:
        return ReadResult(status="refused", note=f"{rel}: refused: {err.message}")
    except FileNotFoundError:
        return ReadResult(status="missing", note=f"{rel}: not found; skipped")
    except PermissionError:
        return ReadResult(status="unreadable", note=f"{rel}: permission denied; skipped")
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            return ReadResult(status="refused", note=f"{rel}: refused: a path component changed into a "
                               "symlink while it was opened; not followed")
        return ReadResult(status="unreadable", note=f"{rel}: cannot open ({err.strerror or type(err).__name__}); skipped")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ReadResult(status="unreadable", note=f"{rel}: not a regular file; skipped")
        if info.st_nlink > 1:
            return ReadResult(status="refused", note=f"{rel}: refused: it has {info.st_nlink} hard links, and a "
                               "hard link may be a file outside the workspace; copy it instead")
        data = read_capped(fd, max_bytes)
    except OSError as err:
        return ReadResult(status="unreadable", note=f"{rel}: read failed ({err.strerror or type(err).__name__}); skipped")
    finally:
        os.close(fd)
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
    return ReadResult(
        text=normalise_newlines(text),
        note=note,
        size_bytes=max(info.st_size, len(data)),
        partial=partial,
    )


def read_capped(fd: int, max_bytes: int) -> bytes:
    """The open file ``fd`` read up to ``max_bytes`` + 1 bytes (one past the cap, so a
    caller sees that the file is larger without reading it whole), 1 MiB at a time.
    Raises ``OSError``; the caller closes ``fd``."""
    chunks: list[bytes] = []
    got = 0
    while got <= max_bytes:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def normalise_newlines(text: str) -> str:
    # A file checked out with CRLF on one machine and LF on another must give the
    # same prompt bytes.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def clean_block(text: str | None) -> str:
    """Newlines normalised, leading blank lines and trailing whitespace removed."""

    if not text:
        return ""
    # Leading whitespace-only lines go; indentation of the first real line stays.
    lines = normalise_newlines(text).rstrip().split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


def folder_names(root: str | os.PathLike[str], rel: str) -> list[str]:
    """The sorted names in the folder ``root/rel``, listed through a descriptor opened by
    ``open_beneath`` (the same confinement as a read). Raises ``DagctxError``
    (``WorkspaceEscape``), ``FileNotFoundError``, ``NotADirectoryError`` or ``OSError``."""
    fd = open_beneath(root, rel, directory=True)
    try:
        with os.scandir(fd) as it:
            return sorted(entry.name for entry in it)
    finally:
        os.close(fd)
