"""The daemon's log file in its state directory, beside stderr.

A client that spawns a standalone daemon may discard its stderr (an editor, a script);
when the daemon then dies, nothing would say why. So the standalone daemon also appends
its log — and the traceback of anything that ends it — to ``standalone.log`` in the
daemon's state directory (``transport.state_dir()``, where the shared daemon keeps its
own log), rotated at 5 MB. ``DAGCTX_LOG_FILE`` names
another file; set it empty to turn the file off (SPEC §1). The file gets INFO and up
(start, exit, warnings) whatever ``--log-level`` says; stderr keeps that level.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

from dagctx.protocol import transport

MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 2


def log_path() -> Path | None:
    """Where the daemon logs to (None: no file)."""
    env = os.environ.get("DAGCTX_LOG_FILE")
    if env is not None:
        return Path(env).expanduser() if env else None
    try:
        return Path(transport.state_dir()) / "standalone.log"
    except OSError:
        return None


def log_to_file(level: str) -> Path | None:
    """Attach the file handler to the root logger and log uncaught exceptions to it.
    A folder that cannot be made or a file that cannot be opened leaves stderr alone."""
    path = log_path()
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                                       encoding="utf-8", delay=True)
    except OSError as exc:
        print(f"dagctx: cannot log to {path}: {exc.strerror or exc}", file=sys.stderr)
        return None
    handler.setFormatter(logging.Formatter(f"%(asctime)s dagctx[{os.getpid()}] %(levelname)s %(name)s: %(message)s"))
    wanted = getattr(logging, level.upper(), logging.WARNING)
    if not isinstance(wanted, int):
        wanted = logging.WARNING
    root = logging.getLogger()
    # The file always gets INFO and up (it is read after the fact); stderr keeps the
    # level the command line asked for.
    for h in root.handlers:
        if h.level == logging.NOTSET:
            h.setLevel(wanted)
    handler.setLevel(min(wanted, logging.INFO))
    root.addHandler(handler)
    root.setLevel(min(wanted, logging.INFO))
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        logging.getLogger("dagctx").critical("the daemon stopped on an uncaught exception",
                                             exc_info=(kind, value, tb))  # type: ignore[arg-type]
        previous(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = hook
    return path
