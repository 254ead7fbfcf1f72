"""The JSON-RPC server (pygls + msgspec). Only this package knows JSON-RPC.

Three entry points for the command line, each importing only what it runs: the CLI
names this package and nothing below it, so it never reaches the engine or the ledger
itself.

* ``run_forwarder`` — ``dagctx serve``: relay stdio to the per-user daemon (SPEC §1.3);
  imports nothing heavy.
* ``run_daemon`` — ``dagctx daemon run``: the per-user daemon on its Unix socket.
* ``run_stdio`` — ``dagctx serve --standalone``: one client on stdio, in-process.
"""

from __future__ import annotations

import logging
import os


def one_blas_thread() -> None:
    """numpy's BLAS (OpenBLAS) runs one thread in the daemon unless the environment says
    otherwise: a memory search's matrix-vector product (``engine/memory_vectors.py``) is a
    millisecond of work that two BLAS threads made 5x slower on a busy 2-core machine (their
    hand-off and spinning, which also took a core from every other request; ARCHITECTURE.md),
    and with one thread a row's similarity no longer depends on which thread's share of the
    rows it fell in. Read when numpy is first imported, which the daemon does lazily: so
    this runs first thing."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


#: objects allocated (less those freed) between two young collections of the daemon;
#: Python's default is 700
YOUNG_COLLECTION_EVERY = 20_000


def rarer_young_collections() -> None:
    """The cyclic GC's youngest generation collected every ``YOUNG_COLLECTION_EVERY``
    allocations instead of 700. A daemon with many requests in flight (8 clients pipelining
    appends, 128 at a time) holds thousands of young objects that are alive — futures,
    tasks, contexts, rows — and a young collection walks every one of them, then walks
    them again in the middle generation; at 700 that was a collection every two appends,
    30-40 us of CPU an append with the GIL held, and the promotions it made brought a full
    collection (0.05-0.1 s, every connection stalled) every thousand appends. Most of what
    a request allocates is freed by reference counting before a rarer collection comes;
    cyclic garbage waits a little longer (bench/bench_append.py: 323 collections in 3,000
    appends became 9)."""
    import gc

    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


def run_stdio(*, database: str | None, max_frame_bytes: int, log_level: str) -> int:
    """Serve one client on stdin/stdout until ``exit`` or EOF; the process exit code."""
    one_blas_thread()
    rarer_young_collections()
    from .code_cache import cached_imports

    with cached_imports() as cache:
        from dagctx.engine.config import DaemonConfig

        from .jsonrpc_server import serve
    from .logfile import log_to_file

    log_to_file(log_level)
    log = logging.getLogger("dagctx.server")
    log.info("daemon started (pid %d, database %s)", os.getpid(), database or "from initialize or the default")
    _log_cache(log, cache)
    code = serve(DaemonConfig(database=database, max_frame_bytes=max_frame_bytes, log_level=log_level))
    log.info("daemon exiting with code %d", code)
    return code


def run_forwarder(*, database: str | None, max_frame_bytes: int | None = None) -> int:
    """Relay stdio to the per-user daemon, starting it when needed; the exit code."""
    from .forward import run_forwarder as forward

    return forward(database, max_frame_bytes)


def run_daemon(*, socket_path: str, idle_timeout: float | None, max_queue_bytes: int | None,
               log_path: str | None, max_frame_cap: int | None = None) -> int:
    """Serve every client of this user on ``socket_path``; the exit code."""
    one_blas_thread()
    rarer_young_collections()
    from .code_cache import cached_imports

    with cached_imports() as cache:
        from .unix_daemon import MAX_FRAME_CAP, MAX_QUEUE_BYTES, run_daemon as run
    _log_cache(logging.getLogger("dagctx.server"), cache)
    return run(socket_path, idle_timeout=idle_timeout, max_queue_bytes=max_queue_bytes or MAX_QUEUE_BYTES,
               log_path=log_path, max_frame_cap=max_frame_cap or MAX_FRAME_CAP)


def _log_cache(log: logging.Logger, cache) -> None:
    """One line saying what the attrs code cache (``code_cache``) did at start."""
    if cache is not None:
        log.info("code cache: %d generated functions from %s, %d compiled", cache.hits, cache.path, cache.compiled)
