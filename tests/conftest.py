"""Shared fixtures: a real daemon subprocess over stdio on a real SQLite file, and a real
PostgreSQL server (``pgserver.py``) for the tests parametrized over both backends."""

from __future__ import annotations

import functools
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagctx.client import DagctxClient

import pgserver

REPO = Path(__file__).resolve().parents[1]


def _cache_byte_code() -> None:
    """Compile once, not on every run: with PYTHONDONTWRITEBYTECODE set (as on this machine and
    CI) pytest re-rewrites every test module's asserts and every daemon a test spawns recompiles
    what it imports. The compiled files go to a cache folder, never into the tree; the spawned
    daemons inherit the setting through the environment."""
    if not (os.environ.get("PYTHONDONTWRITEBYTECODE") or sys.dont_write_bytecode):
        return
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(cache, "dagctx-tests", "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix


_cache_byte_code()

# The cycle collector of the test process runs its young pass every 50,000 new objects instead
# of every 700, and what collection built is frozen (``pytest_collection_finish``): the
# in-process tier spent 2.0-2.2 s of CPU in collector passes, 0.6 s now (gc.callbacks,
# 2026-12-02). Tests that need a collection ask for one (gc.collect()).
gc.set_threshold(50_000, 20, 10)


def _test_cache_dir(name: str) -> str:
    """A folder of the tests' own cache (beside the byte code cache, never in the tree)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "dagctx-tests", name)


_lsprotocol_imported = False


def _import_lsprotocol_through_the_code_cache() -> None:
    """Import ``lsprotocol.types`` the way a daemon start does (server/code_cache.py): the code
    attrs generates for its 554 classes compiled once, read back on later runs (about half of
    its 0.6 s import, which every run of the in-process tier paid). The cache file is the
    tests' own; anything wrong with it and attrs compiles as it would anyway."""
    global _lsprotocol_imported
    if _lsprotocol_imported:
        return
    _lsprotocol_imported = True
    if "lsprotocol.types" in sys.modules:
        return
    from dagctx.server.code_cache import FILE_NAME, cached_imports

    folder = _test_cache_dir("attrs-code")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return
    with cached_imports(os.path.join(folder, FILE_NAME)):
        import lsprotocol.types  # noqa: F401


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """Before the first unit test module is imported (they import the server, hence lsprotocol)."""
    if not _lsprotocol_imported and file_path.suffix == ".py" and file_path.is_relative_to(REPO / "tests" / "unit"):
        _import_lsprotocol_through_the_code_cache()


#: Where the shared transcript corpus is looked for when ``DAGCTX_CORPUS`` is not set.
DEFAULT_CORPUS = REPO.parent / "shared" / "corpus"


@functools.cache
def parsed_file(path: Path) -> tuple:
    """``parse_file(path)``, parsed once per test process for every test that reads the same
    file (the importers' checks, the exports' imports of the corpus): the transcripts are
    shared, so a test reads them and never changes them (one that must, parses its own;
    test_importers' determinism check compares a fresh parse with these)."""
    from dagctx.transcripts import parse_file

    return tuple(parse_file(path))


def corpus_dir() -> Path | None:
    env = os.environ.get("DAGCTX_CORPUS")
    path = Path(env) if env else DEFAULT_CORPUS
    return path if path.is_dir() else None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_corpus(path: Path | None = None) -> Path:
    """The corpus folder (or ``path`` in it): a skip naming the reason locally, a failure
    under ``CI=true`` — CI must never pass by skipping what it was meant to run."""
    root = corpus_dir()
    target = root if path is None or root is None else root / path
    if root is None or not target.exists():
        reason = corpus_missing_reason() if root is None else f"{target} is not in the corpus"
        if in_ci():
            pytest.fail(f"CI needs the shared transcript corpus: {reason}", pytrace=False)
        pytest.skip(reason)
    return target


def corpus_missing_reason() -> str:
    """Why a corpus test is skipped, and how to make it run."""
    env = os.environ.get("DAGCTX_CORPUS")
    where = f"DAGCTX_CORPUS={env}" if env else f"the default location {DEFAULT_CORPUS.resolve()}"
    return (f"the shared transcript corpus is not at {where}: point DAGCTX_CORPUS at the folder "
            "that holds claude-code/, codex/, sharegpt-zh/ … (e.g. DAGCTX_CORPUS=../shared/corpus)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.corpus``: the test reads the shared corpus (see ``require_corpus``)."""
    if item.get_closest_marker("corpus") is not None:
        require_corpus()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m "not slow"`` (the in-process tier) does not even import tests/integration: every
    test there is ``slow``, and importing them (the MCP SDK, Playwright …) costs seconds."""
    if config.getoption("markexpr", "") == "not slow" and collection_path == REPO / "tests" / "integration":
        return True
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (every module, class and test item: most of the objects a test
    run holds) stays for the whole run: frozen, the collector's full passes no longer walk it
    again and again while the tests allocate."""
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tier the suite: everything under tests/integration drives real processes, and every test
    that needs the PostgreSQL server talks to one (both ``slow``); the rest is the in-process tier."""
    integration = REPO / "tests" / "integration"
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_pg = "pg_server" in getattr(item, "fixturenames", ()) or (
            callspec is not None and callspec.params.get("database") == "postgresql")
        if Path(str(item.fspath)).is_relative_to(integration) or on_pg:
            item.add_marker(pytest.mark.slow)
    # The longest files first (a stable sort: every other file keeps its place): pytest-xdist's
    # ``--dist loadfile --no-loadscope-reorder`` (scripts/test.sh) hands out files in this order,
    # so the two workers start on these and finish together on short files. Without
    # ``--no-loadscope-reorder`` xdist re-sorts the files by their number of tests, most first,
    # which sends these (one to five long tests each) out LAST: in the full runs of 2026-12-02
    # one worker spent its last minutes on them alone while the other sat idle.
    rank = {name: k for k, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))


#: The test files that take longest, longest first (wall time per file in the full run of
#: 2026-12-02 03:00 on 2 loaded cores: 546, 406, 320, 250, 225, 186 and 178 s).
LONGEST_FILES = ("test_hermes_cli.py", "test_openclaw_gateway.py", "test_isolation.py", "test_hermes.py",
                 "test_openclaw.py", "test_migrate.py", "test_openclaw_memory.py")


@pytest.fixture(autouse=True, scope="session")
def _private_daemons(tmp_path_factory: pytest.TempPathFactory):
    """Every test runs its daemons standalone (``dagctx serve --standalone``: one private
    process per client, the exit codes and stdio rules of a single daemon), and in a
    runtime folder of its own, so no test can ever reach the user's shared daemon.
    Tests of the shared daemon (``shared_env``) turn standalone off."""
    base = tmp_path_factory.mktemp("rt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGCTX_STANDALONE", "1")
        mp.setenv("XDG_RUNTIME_DIR", str(base))
        mp.setenv("DAGCTX_STATE_DIR", str(base / "state"))
        yield


def short_tempdir(prefix: str) -> Path:
    """A fresh folder directly under /tmp, for a shared daemon's runtime folder.

    A Unix socket path may hold at most 103 bytes here, and pytest's own temporary folders
    (``/tmp/pytest-of-root/pytest-4/popen-gw0/test_<30 chars>0/...``) leave too little room
    for ``dagctx/dagctx-uid0-<hash>.sock`` under parallel workers. The caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="module")
def module_shared_daemon() -> Iterator[Path]:
    """One shared daemon for a module's command lines, as a user's commands share theirs:
    standalone off, a short runtime folder of the module's own (yielded); the first command
    starts the daemon, the others connect to it (a private daemon per command was most of
    such a module's time). Afterwards ``dagctx daemon stop``, then SIGTERM/SIGKILL of any
    daemon still running from that folder. Tests of standalone mode set
    ``DAGCTX_STANDALONE=1`` in their command's environment."""
    import signal
    import subprocess

    from daemon_stop import daemon_pids, exited

    run = short_tempdir("dxm-")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DAGCTX_STANDALONE", raising=False)
        mp.delenv("DAGCTX_DAEMON_TAG", raising=False)
        mp.setenv("XDG_RUNTIME_DIR", str(run))
        mp.setenv("DAGCTX_STATE_DIR", str(run / "state"))
        mp.setenv("DAGCTX_IDLE_TIMEOUT", "300")
        try:
            yield run
        finally:
            pids = daemon_pids(run)
            subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], capture_output=True,
                           timeout=60)
            for pid in pids:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if exited(pid):
                        break
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        break
                    for _ in range(250):
                        if exited(pid):
                            break
                        time.sleep(0.02)
    shutil.rmtree(run, ignore_errors=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short runtime folder (see ``short_tempdir``), removed after the test."""
    path = short_tempdir("dx-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "dagctx.db"


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server for the whole run (initdb into a temp folder, Unix socket only).

    Missing PostgreSQL: a skip naming the reason locally, a failure in CI (``CI=true``).
    """
    reason = pgserver.missing_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs PostgreSQL: {reason}")
        pytest.skip(reason)
    server = pgserver.start_server(durable=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server):
    """A fresh, empty database on the test server (dropped afterwards)."""
    url = pg_server.new_database()
    yield url
    pg_server.drop_database(url)


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file as ``Store`` leaves a new one: created, migrated to the current schema
    and closed (no rows but the schema version), made once per run."""
    from dagctx.ledger import Store

    path = tmp_path_factory.mktemp("migrated") / "dagctx.db"
    Store(path).close()
    return path


@pytest.fixture
def fresh_sqlite(_migrated_sqlite: Path, tmp_path: Path) -> Path:
    """A new SQLite database of the test's own, for in-process tests: a copy of the file a
    new ``Store`` writes. Creating and migrating a file took 15-50 ms of file creation and
    syncs (a third of the in-process store tests' time on a loaded disk); a copy, 2-4 ms.
    Tests of creating or migrating a database open a path where none exists yet."""
    path = tmp_path / "dagctx.db"
    shutil.copyfile(_migrated_sqlite, path)
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database name for each backend: a SQLite file path, then a PostgreSQL URL. The file
    of an in-process test (tests/unit) is ``fresh_sqlite``; a test that drives the daemon
    gets a path where no file is yet (the daemon creates it)."""
    if request.param == "sqlite":
        if request.node.path.is_relative_to(REPO / "tests" / "unit"):
            return str(request.getfixturevalue("fresh_sqlite"))
        return str(tmp_path / "dagctx.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
async def daemon(db_path: Path):
    """An initialized client of a fresh daemon; closed (shutdown + exit) afterwards."""
    client = await DagctxClient.spawn(db_path, initialization_options={"observeNodes": True})
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def corpus() -> Path:
    return require_corpus()
