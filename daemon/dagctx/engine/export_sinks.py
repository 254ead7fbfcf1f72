"""Where an exported text goes (SPEC §9 ``session/export``): a file written whole or not at
all (``write_atomic``), or the answer's ``content`` (``AnswerText``), which stops the export
as soon as the text could no longer fit the connection's answer (SPEC §1.4), so an export
without ``path`` never holds more than the frame limit.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError

__all__ = ["AnswerText", "write_atomic"]

_enc = msgspec.json.Encoder()

#: what an answer holds besides its ``content`` (the header, the envelope, the other
#: fields), kept free of the frame limit; an answer still over the limit is refused whole
#: by the server (SPEC §1.4)
ENVELOPE_ROOM = 1024


class AnswerText:
    """The export's text kept for the answer, counted as the answer will carry it (a JSON
    string: escapes included); past the connection's limit the export stops with
    ``ResponseTooLarge`` and the text kept so far is dropped."""

    def __init__(self, limit: int | None, fmt: str) -> None:
        self.limit, self.fmt = limit, fmt
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, piece: bytes) -> None:
        if self.limit is not None:
            # each piece is whole JSON text (a line, a message, the document's frame)
            self.size += len(_enc.encode(piece.decode("utf-8"))) - 2
            if self.size > self.limit - ENVELOPE_ROOM:
                self.parts.clear()
                raise DagctxError(
                    "ResponseTooLarge",
                    f"the {self.fmt} export is more than this connection's frame limit of {self.limit:,} bytes "
                    f"can carry in one answer (it passed {self.size:,} bytes and was stopped there; nothing was "
                    "sent). Export to a file with `path` (dagctx export -o FILE) instead of returning the content.",
                    details={"bytes": self.size, "limit": self.limit},
                )
        self.parts.append(piece)

    def text(self) -> str:
        data = b"".join(self.parts)
        self.parts.clear()
        return data.decode("utf-8")


def _exists_error(path: str) -> DagctxError:
    return DagctxError("InvalidParams", f"{path!r} already exists; pass overwrite: true (dagctx export --force) to "
                       "replace it, or choose another path", path="path")


def write_atomic(path: str, produce: Callable[[Callable[[bytes], Any]], int | None], overwrite: bool = False) -> int:
    """Write what ``produce(write)`` writes to ``path`` whole or not at all (SPEC §9
    ``session/export``): into a temp file beside it, then renamed (or linked) into place;
    a failure or a cancellation midway leaves no file behind. Returns what ``produce`` did."""
    if os.path.isdir(path):
        raise DagctxError("InvalidParams", f"{path!r} is a folder; give a file path to export to", path="path")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise DagctxError("InvalidParams", f"the folder {folder!r} does not exist; create it first", path="path")
    exists = os.path.lexists(path)
    if exists and not overwrite:
        raise _exists_error(path)
    if exists and not stat.S_ISREG(os.lstat(path).st_mode):
        raise DagctxError("InvalidParams", f"{path!r} is not a regular file; export only replaces regular files",
                          path="path")
    try:
        # An overwritten file keeps its permissions; a new one gets rw-r--r--.
        mode = stat.S_IMODE(os.stat(path).st_mode) if exists else 0o644
        fd, tmp = tempfile.mkstemp(prefix=".dagctx-export-", dir=folder)
        try:
            with os.fdopen(fd, "wb", buffering=1 << 16) as fh:
                done = produce(fh.write)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            if overwrite:
                os.replace(tmp, path)
            else:
                # link() fails when the name appeared meanwhile: never clobber a file.
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise _exists_error(path) from None
                os.unlink(tmp)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise DagctxError("InvalidParams", f"cannot write {path!r}: {exc.strerror or exc}", path="path") from exc
    return done or 0
