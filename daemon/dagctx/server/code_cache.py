"""A cache of the code ``attrs`` generates while the daemon imports ``lsprotocol``.

Why: ``lsprotocol.types`` defines 554 attrs classes, and for each one attrs writes the
source of ``__init__``, ``__eq__``, ``__repr__``… and compiles it. Python keeps the byte
code of modules in ``__pycache__`` but never that generated source, so every daemon
start compiled it again: 0.62 s of CPU for the import on a quiet machine, 0.3 s of it in
``compile`` (ARCHITECTURE.md, "What a daemon start costs"). Each standalone client starts a
daemon, so this is time every editor, agent and CI job waits for.

The cache keeps the compiled code objects in one ``marshal`` file, keyed by a hash of the
generated source and its file name, so a different attrs or a different class simply
misses. It is trusted as a ``.pyc`` is: it lives in the user's private (0700) state
folder, written 0600 by an atomic rename, one file per Python version. Anything wrong
with it — unreadable, corrupt, written by another Python, a folder that cannot be made —
and compile runs as it would without the cache; nothing here can stop a daemon.
``DAGCTX_CODE_CACHE=0`` turns it off (SPEC §1).

How: attrs compiles through the name ``compile`` in its ``attr._make`` module; this
module binds that name to a caching function for the duration of the heavy imports only
(``cached_imports``), then puts the builtin back.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import marshal
import os
import sys
from collections.abc import Iterator
from types import CodeType

log = logging.getLogger("dagctx.server")

#: The marshal format belongs to the interpreter: one file per implementation and version.
FILE_NAME = f"attrs-code-{sys.implementation.cache_tag}.marshal"


class CodeCache:
    """Code objects by (file name, source), loaded from and saved to one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.hits = 0
        self.compiled = 0
        self._codes: dict[bytes, CodeType] = {}
        self._used: dict[bytes, CodeType] = {}
        try:
            with open(path, "rb") as f:
                loaded = marshal.load(f)
        except FileNotFoundError:
            return
        except Exception as exc:  # corrupt, truncated, another format: start empty
            log.info("code cache %s ignored (%s); it will be rewritten", path, type(exc).__name__)
            return
        if isinstance(loaded, dict):
            self._codes = {k: v for k, v in loaded.items()
                           if isinstance(k, bytes) and isinstance(v, CodeType)}

    @staticmethod
    def key(source: str, filename: str) -> bytes:
        return hashlib.blake2b(f"{filename}\0{source}".encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def compile(self, source, filename, mode, *args, **kwargs):  # noqa: A003 - stands in for the builtin
        """``compile`` for attrs: a code object from the cache, else compiled and kept.
        Anything but plain ``exec`` of a string goes to the builtin untouched."""
        if args or kwargs or mode != "exec" or not isinstance(source, str) or not isinstance(filename, str):
            return compile(source, filename, mode, *args, **kwargs)
        k = self.key(source, filename)
        code = self._codes.get(k)
        if code is not None:
            self.hits += 1
        else:
            code = compile(source, filename, mode)
            self.compiled += 1
        self._used[k] = code
        return code

    def save(self) -> bool:
        """Write what this start used (atomic, 0600) when most of it was compiled — a
        first start, or another attrs or lsprotocol; whether it wrote. A start that
        found nearly everything does not rewrite the file for the odd function whose
        generated source differs between processes (one of cattrs' names an address)."""
        if self.compiled <= self.hits:
            return False
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                marshal.dump(self._used, f)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.info("code cache %s not written: %s", self.path, exc.strerror or exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        return True


def default_path() -> str | None:
    """The cache file in the daemon's private state folder; None when turned off or the
    folder cannot be made."""
    if os.environ.get("DAGCTX_CODE_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    from dagctx.protocol import transport

    try:
        folder = os.path.join(transport.state_dir(), "cache")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.stat(folder).st_mode & 0o077:
            os.chmod(folder, 0o700)
    except OSError:
        return None
    return os.path.join(folder, FILE_NAME)


@contextlib.contextmanager
def cached_imports(path: str | None = None) -> Iterator[CodeCache | None]:
    """Run the heavy imports with attrs compiling through the cache, then save it.
    With no usable path (or no attrs) the imports run as they would anyway."""
    if path is None:
        path = default_path()
    try:
        import attr._make as attrs_make
    except ImportError:  # pragma: no cover - attrs comes with cattrs and lsprotocol
        attrs_make = None
    if path is None or attrs_make is None:
        yield None
        return
    cache = CodeCache(path)
    had = "compile" in vars(attrs_make)
    before = vars(attrs_make).get("compile")
    attrs_make.compile = cache.compile
    try:
        yield cache
    finally:
        if had:
            attrs_make.compile = before
        else:
            with contextlib.suppress(AttributeError):
                del attrs_make.compile
        cache.save()
