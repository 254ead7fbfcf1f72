"""When the daemon dies or cannot start, the client says why: its exit code and last
stderr lines; the daemon also logs to a file in its state directory (SPEC §1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dagctx.client import DagctxClient


async def test_a_daemon_that_cannot_start_shows_its_stderr() -> None:
    script = ("import sys; sys.stderr.write('Traceback (most recent call last):\\n'"
              " + ''.join(f'  line {i}\\n' for i in range(60)) + 'ImportError: no module named dagctx.server\\n');"
              " sys.exit(3)")
    with pytest.raises(ConnectionError) as e:
        await DagctxClient.spawn(None, command=[sys.executable, "-c", script])
    msg = str(e.value)
    assert msg.startswith("the daemon closed the connection (it exited with code 3); its last stderr lines:")
    assert msg.rstrip().endswith("ImportError: no module named dagctx.server") and "line 59" in msg
    assert "line 10\n" not in msg  # only the last lines


async def test_a_daemon_killed_mid_session_is_explained(tmp_path: Path) -> None:
    c = await DagctxClient.spawn(tmp_path / "k.db")
    await c.session_create("before the kill")
    assert c.process is not None
    os.kill(c.process.pid, signal.SIGKILL)
    with pytest.raises(ConnectionError) as e:
        await c.session_list()
    assert "killed by signal 9" in str(e.value)
    with pytest.raises(ConnectionError):  # later requests fail at once, with the same reason
        await c.history("x")
    await c.close()


async def test_the_daemon_logs_to_a_file_as_well(tmp_path: Path) -> None:
    log = tmp_path / "state" / "daemon.log"
    env = {**os.environ, "DAGCTX_LOG_FILE": str(log)}
    c = await DagctxClient.spawn(tmp_path / "l.db", env=env)
    await c.session_list()
    assert await c.close() == 0
    text = log.read_text(encoding="utf-8")
    assert "daemon started" in text and str(tmp_path / "l.db") in text and "exiting with code 0" in text


def test_the_cli_shows_the_daemon_stderr_when_it_cannot_start(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200", "DAGCTX_LOG_FILE": ""}
    blocker = tmp_path / "file"
    blocker.write_text("x")
    # a database path below a regular file: the daemon answers initialize with an error
    p = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "--db", str(blocker / "x.db"), "sessions"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and p.stdout.startswith("error: Cannot open the database"), p.stdout
    # a daemon that dies at start (here: a sitecustomize that ends `dagctx serve`)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "if 'serve' in sys.argv:\n"
        "    sys.stderr.write('Traceback (most recent call last):\\nsqlite3.DatabaseError: file is not a database\\n')\n"
        "    sys.stderr.flush()\n"
        "    import os; os._exit(7)\n", encoding="utf-8")
    env["PYTHONPATH"] = str(site) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "--db", str(tmp_path / "y.db"), "sessions"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.startswith("error: The daemon closed the connection (it exited with code 7); its last stderr lines")
    assert "sqlite3.DatabaseError: file is not a database" in p.stdout


async def test_a_second_daemon_start_takes_attrs_generated_code_from_its_private_cache(tmp_path: Path) -> None:
    """The code attrs generates for lsprotocol's classes is compiled by the first daemon
    and read back by the next (server/code_cache.py): the second start compiles none of
    it. The cache is private (a 0700 folder, a 0600 file), a corrupt one is rewritten,
    and either daemon answers as usual."""
    state = tmp_path / "state"
    env = {**os.environ, "DAGCTX_STATE_DIR": str(state), "DAGCTX_LOG_FILE": str(state / "d.log")}
    env.pop("DAGCTX_CODE_CACHE", None)

    async def start_once() -> str:
        c = await DagctxClient.spawn(tmp_path / "c.db", env=env)
        await c.session_create("cached")
        assert (await c.session_list()).total >= 1
        assert await c.close() == 0
        return [ln for ln in (state / "d.log").read_text(encoding="utf-8").splitlines() if "code cache:" in ln][-1]

    first = await start_once()
    cache_dir = state / "cache"
    (cache_file,) = cache_dir.glob("attrs-code-*.marshal")
    assert (cache_dir.stat().st_mode & 0o777) == 0o700 and (cache_file.stat().st_mode & 0o777) == 0o600
    def counts(line: str) -> tuple[int, int]:  # (from the cache, compiled)
        return int(line.split("code cache: ")[1].split()[0]), int(line.rsplit(", ", 1)[1].split()[0])

    assert counts(first)[0] == 0 and counts(first)[1] > 100  # lsprotocol's classes, all compiled
    total = counts(first)[1]
    written = cache_file.stat().st_mtime_ns
    hits, compiled = counts(await start_once())
    # one of cattrs' generated functions names an object's address: it differs per process
    assert hits + compiled == total and compiled <= 2
    assert cache_file.stat().st_mtime_ns == written  # nearly all found: the file is not rewritten

    cache_file.write_bytes(b"not a marshal file")
    assert counts(await start_once()) == (0, total)
    assert counts(await start_once())[0] >= total - 2  # rewritten whole
