"""The stdio JSON-RPC server (pygls + msgspec). Only this package knows JSON-RPC.

``run_stdio`` is the daemon's entry point for the command line: the CLI names this
package and nothing below it, so it never reaches the engine or the ledger itself.
"""

from __future__ import annotations

import logging
import os


def run_stdio(*, database: str | None, max_frame_bytes: int, log_level: str) -> int:
    """Serve one client on stdin/stdout until ``exit`` or EOF; the process exit code."""
    from dagctx.engine.config import DaemonConfig

    from .jsonrpc_server import serve
    from .logfile import log_to_file

    log_to_file(log_level)
    log = logging.getLogger("dagctx.server")
    log.info("daemon started (pid %d, database %s)", os.getpid(), database or "from initialize or the default")
    code = serve(DaemonConfig(database=database, max_frame_bytes=max_frame_bytes, log_level=log_level))
    log.info("daemon exiting with code %d", code)
    return code
