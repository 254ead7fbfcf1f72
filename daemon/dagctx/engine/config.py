"""Where the database lives, what the daemon was started with, and the files it reads
on a client's say-so before any session exists (the model config file).

A database is named the same way everywhere (``--db``, ``DAGCTX_DB``,
``initializationOptions.database``; SPEC §2.1): a ``postgresql://`` (or ``postgres://``)
URL is a PostgreSQL server, anything else is a SQLite file path.
"""

from __future__ import annotations

import errno
import os
import stat
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from dagctx.protocol.errors import DagctxError

#: ``initializationOptions.configFile`` larger than this is refused (SPEC §2).
MAX_CONFIG_FILE_BYTES = 1 << 20


def default_database() -> str:
    """``dagctx.db`` under the user's data directory (created when missing)."""
    return str(Path(platformdirs.user_data_dir("dagctx", appauthor=False)) / "dagctx.db")


def cache_dir() -> Path:
    """The daemon's own cache folder (platform user cache dir, ``dagctx``)."""
    return Path(platformdirs.user_cache_dir("dagctx", appauthor=False))


def contain_caches(environ: dict[str, str] | None = None) -> None:
    """Point tiktoken's download cache into the daemon's cache folder (SPEC §6).

    tiktoken otherwise writes to ``$TMPDIR/data-gym-cache``, shared with every user of
    the machine. It reads ``TIKTOKEN_CACHE_DIR`` (then ``DATA_GYM_CACHE_DIR``) when it
    loads an encoding, so this runs before the first token counter is made. A setting
    the user made — either variable, even empty (tiktoken's "no cache") — is kept.
    """
    env = os.environ if environ is None else environ
    if "TIKTOKEN_CACHE_DIR" in env or "DATA_GYM_CACHE_DIR" in env:
        return
    target = cache_dir() / "tiktoken"
    env["TIKTOKEN_CACHE_DIR"] = str(target)
    try:  # made now, private to the user, so tiktoken never falls back to the shared tmp
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        pass  # a read-only home: tiktoken reports it if it ever needs to write


def env_database() -> str | None:
    """``DAGCTX_DB``, when set: a path or URL the user named."""
    return os.environ.get("DAGCTX_DB") or None


#: initialize's ``capabilities.search``: the query language of search/query (SPEC §5), the
#: same on every backend — not the name of any engine's full-text extension.
SEARCH_CAPABILITY = "fulltext-cjk"


def redact_database(name: str) -> str:
    """A database name fit for a message: a URL loses its password."""
    if "://" not in name:
        return name
    try:
        parts = urllib.parse.urlsplit(name)
        if parts.password is None:
            return name
    except ValueError:  # not even a URL: show no more than its scheme
        return name.split("://", 1)[0] + "://…"
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass
class DaemonConfig:
    """Settings fixed when the process starts (command line); ``initialize`` may add more."""

    database: str | None = None
    max_frame_bytes: int = 64 * 1024 * 1024
    #: the most any connection may lift its frame limit to (``$/dagctx/attach``), so one
    #: client cannot make the daemon buffer without bound
    max_frame_cap: int = 256 * 1024 * 1024
    log_level: str = "WARNING"
    #: True in the per-user daemon: the client's environment reaches it only through
    #: the forwarder, so ``DAGCTX_DB`` of the daemon's own environment is ignored
    shared: bool = False
    extra: dict[str, object] = field(default_factory=dict)


def read_config_file(path: str, *, field_path: str = "initializationOptions.configFile") -> bytes:
    """The bytes of a model config file: a regular file of at most 1 MiB (SPEC §2).

    Opened non-blocking, so a FIFO (or a device) never stalls the event loop: it is
    refused by its type before anything is read; ``/dev/zero`` cannot grow memory, since
    at most ``MAX_CONFIG_FILE_BYTES + 1`` bytes are ever read. A missing file is
    ``FileNotFoundError`` for the caller to word.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DagctxError("InvalidParams", f"cannot open the model config file {path!r}: "
                          f"{exc.strerror or exc}", path=field_path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DagctxError("InvalidParams", f"the model config file {path!r} is not a regular file "
                              f"({_file_kind(st.st_mode)}); name a TOML or JSON file", path=field_path)
        if st.st_size > MAX_CONFIG_FILE_BYTES:
            raise DagctxError("InvalidParams", f"the model config file {path!r} is {st.st_size:,} bytes; "
                              f"at most {MAX_CONFIG_FILE_BYTES:,} are read", path=field_path)
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_CONFIG_FILE_BYTES:
            try:
                chunk = os.read(fd, MAX_CONFIG_FILE_BYTES + 1 - total)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise DagctxError("InvalidParams", f"cannot read the model config file {path!r}: "
                                  f"{exc.strerror or exc}", path=field_path) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_CONFIG_FILE_BYTES:  # it grew after fstat
            raise DagctxError("InvalidParams", f"the model config file {path!r} is larger than "
                              f"{MAX_CONFIG_FILE_BYTES:,} bytes", path=field_path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
