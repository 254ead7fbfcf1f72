"""A throwaway PostgreSQL server for the tests: ``initdb`` into a temporary folder,
listening on a Unix socket only (no TCP), stopped at the end.

The Debian package's binaries are looked up on PATH and in /usr/lib/postgresql/*/bin.
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user
(created by the Debian package) or, failing that, a ``dagctx-test`` system user made here.
``scripts/test.sh`` installs the package when it is missing. Without it the tests that
need it are skipped with the reason, except in CI (``CI=true``) where that is a failure.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for cand in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return cand
    return None


def missing_reason() -> str | None:
    """Why no PostgreSQL can be started here, or None when it can."""
    for tool in ("initdb", "pg_ctl"):
        if find_bin(tool) is None:
            return (f"PostgreSQL is not installed ({tool} not found on PATH or in /usr/lib/postgresql/*/bin): "
                    "apt-get install postgresql, or run scripts/test.sh which installs it")
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg is not installed: pip install -e '.[test]' (it brings psycopg[binary] and psycopg-pool)"
    return None


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "dagctx-test"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "dagctx-test"],
                   check=True, capture_output=True)
    return pwd.getpwnam("dagctx-test")


@dataclass
class PgServer:
    root: Path
    socket_dir: Path
    user: pwd.struct_passwd | None
    port: int = 5432
    durable: bool = True

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def url(self, database: str) -> str:
        user = self.user.pw_name if self.user else pwd.getpwuid(os.geteuid()).pw_name
        return f"postgresql:///{database}?host={self.socket_dir}&port={self.port}&user={user}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.split("///", 1)[1].split("?", 1)[0]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _cmd(self, argv: list[str]) -> list[str]:
        if self.user is None:
            return argv
        return ["runuser", "-u", self.user.pw_name, "--", *argv]

    def start(self) -> None:
        initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        assert initdb and pg_ctl
        data = self.root / "data"
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
            os.chown(self.socket_dir, self.user.pw_uid, self.user.pw_gid)
        subprocess.run(self._cmd([initdb, "-D", str(data), "--auth=trust", "-E", "UTF8", "--no-sync",
                                  "--locale=C"]), check=True, capture_output=True)
        opts = (f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}' -p {self.port} "
                f"-c fsync={'on' if self.durable else 'off'} -c max_connections=200 -c shared_buffers=32MB")
        subprocess.run(self._cmd([pg_ctl, "-D", str(data), "-l", str(self.root / "log"), "-o", opts, "-w",
                                  "-t", "60", "start"]), check=True, capture_output=True)

    def stop(self) -> None:
        pg_ctl = find_bin("pg_ctl")
        subprocess.run(self._cmd([pg_ctl, "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def start_server(*, durable: bool = True) -> PgServer:
    """A throwaway server. ``durable=False`` turns fsync off: the suite never survives an
    operating-system crash anyway, and with fsync on every DROP DATABASE waits for a checkpoint
    (~2 s a test database under load). Benchmarks keep it on: commit latency is what they time."""
    root = Path(tempfile.mkdtemp(prefix="dagctx-pg-"))
    os.chmod(root, 0o755)
    sock = root / "sock"
    sock.mkdir()
    server = PgServer(root=root, socket_dir=sock, user=_run_as(), durable=durable)
    try:
        server.start()
    except subprocess.CalledProcessError as exc:
        log = root / "log"
        detail = (exc.stderr or b"").decode(errors="replace") + (log.read_text() if log.exists() else "")
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {detail[-2000:]}") from exc
    return server
