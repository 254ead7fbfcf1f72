"""Where the per-user daemon listens, and how a client reaches it (SPEC §1.2).

The socket lives in ``$XDG_RUNTIME_DIR/dagctx`` (else ``<tmp>/dagctx-<uid>``), a 0700
directory of the user; the socket itself is 0600. Its name carries the user and a hash
of the dagctx version, the protocol version and the ledger's schema version (plus
``DAGCTX_DAEMON_TAG`` when set), so builds that could disagree never share a daemon.
Before connecting, a client checks the socket's owner is itself and refuses otherwise.

``connect_or_start`` is what ``dagctx serve`` (the forwarder), the CLI and the Python
client use: connect; else take the start lock, connect again (a racing client may have
started it), remove a stale socket, start the daemon detached (its own session, logs
in the state directory) and connect with bounded, growing waits.

Stdlib only and no msgspec: the forwarder and ``dagctx sessions``' quick path import this,
and their start-up must stay close to a bare Python start (``subprocess`` and ``tempfile``
are imported only when needed).
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import sys
import time

from .version import LEDGER_SCHEMA_VERSION, PROTOCOL_VERSION, __version__

#: Seconds a client waits for a daemon it started to listen.
START_TIMEOUT = 20.0
#: Longest socket path every platform accepts (sun_path is 104–108 bytes).
MAX_SOCKET_PATH = 103
#: Connections a client makes before giving up when each daemon it reaches dies before
#: answering the handshake (a daemon killed while a client connected; SPEC §1.2).
HANDSHAKE_ATTEMPTS = 3
#: Seconds a client waits for the daemon that dropped its handshake to be gone.
GONE_TIMEOUT = 2.0


class DaemonUnavailable(OSError):
    """The per-user daemon cannot be reached or started; the message says why and what to do."""


def client_database(name: str | None) -> str | None:
    """The database a client names, as the daemon must see it (SPEC §2.1): a file path is
    made absolute against the client's working directory (the daemon has its own); a
    server URL (``postgresql://…``) and ``:memory:`` pass unchanged."""
    if not name or name == ":memory:" or "://" in name:
        return name
    return os.path.abspath(name)


def supported() -> bool:
    """Whether this platform has Unix sockets (else clients run standalone)."""
    return hasattr(socket, "AF_UNIX") and os.name == "posix"


def build_hash() -> str:
    """Short hash of everything that must match for two processes to share a daemon."""
    tag = os.environ.get("DAGCTX_DAEMON_TAG", "")
    text = f"dagctx {__version__}|protocol {PROTOCOL_VERSION}|ledger {LEDGER_SCHEMA_VERSION}|{tag}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _user() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    safe = "".join(ch for ch in name if ch.isalnum() or ch in "-_.")[:32]
    return safe or f"uid{os.getuid()}"


def _private_dir(path: str) -> str:
    """``path`` as a 0700 directory owned by this user (created when missing)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    import stat as _stat

    if not _stat.S_ISDIR(st.st_mode):
        raise DaemonUnavailable(f"{path} is not a directory; remove it so dagctx can create its runtime folder")
    if st.st_uid != os.getuid():
        raise DaemonUnavailable(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); refusing to use a daemon "
            "another user controls — set XDG_RUNTIME_DIR to a folder of your own"
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def runtime_dir() -> str:
    """The user's private folder for the daemon's socket, lock and pid file."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return _private_dir(os.path.join(xdg, "dagctx"))
    import tempfile  # only without XDG_RUNTIME_DIR: the common path skips its imports

    return _private_dir(os.path.join(tempfile.gettempdir(), f"dagctx-{os.getuid()}"))


def state_dir() -> str:
    """Where the daemon writes its log: ``$DAGCTX_STATE_DIR``, else ``$XDG_STATE_HOME/dagctx``,
    else ``~/.local/state/dagctx``."""
    base = os.environ.get("DAGCTX_STATE_DIR")
    if not base:
        home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        base = os.path.join(home, "dagctx")
    os.makedirs(base, mode=0o700, exist_ok=True)
    return base


def socket_path() -> str:
    return os.path.join(runtime_dir(), f"dagctx-{_user()}-{build_hash()}.sock")


def pid_path(sock: str) -> str:
    return sock[: -len(".sock")] + ".pid" if sock.endswith(".sock") else sock + ".pid"


def log_path(sock: str) -> str:
    name = os.path.basename(sock)
    return os.path.join(state_dir(), (name[: -len(".sock")] if name.endswith(".sock") else name) + ".log")


def check_owner(path: str) -> None:
    """Refuse a socket that another user owns (someone could listen in on every client)."""
    st = os.lstat(path)
    if st.st_uid != os.getuid():
        raise DaemonUnavailable(
            f"the dagctx socket {path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
            "refusing to connect — remove it, or use `dagctx serve --standalone`"
        )


def try_connect(path: str) -> socket.socket | None:
    """A connected socket, or None when nobody listens there (missing or stale)."""
    try:
        check_owner(path)
    except FileNotFoundError:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as exc:
        s.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
            return None
        raise
    return s


def peer_pid(s: socket.socket, sock: str | None = None) -> int | None:
    """The pid of the daemon ``s`` reached, or None when it cannot be told.

    The kernel's word first (Linux ``SO_PEERCRED``, macOS ``LOCAL_PEERPID``): the process
    that listens on the socket, even when the connection still waits in its backlog.
    Else the pid file beside the socket ``sock`` (read right after connecting: it names
    the daemon that listens there, unless another started since)."""
    try:
        if hasattr(socket, "SO_PEERCRED"):
            import struct

            pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            if pid > 0:
                return pid
        elif sys.platform == "darwin":
            pid = int.from_bytes(s.getsockopt(0, 2, 4), sys.byteorder)  # SOL_LOCAL, LOCAL_PEERPID
            if pid > 0:
                return pid
    except (OSError, ValueError):
        pass
    if sock is None:
        return None
    try:
        import json

        with open(pid_path(sock)) as f:
            pid = int(json.load(f)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if pid > 0 else None


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: False once it is gone or a zombie (it exited and its parent
    has not reaped it yet — the client that started a daemon is its parent); True when
    unsure (another user's process, no ``/proc`` to tell a zombie: assume it lives)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] != "Z"
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # with /proc, no entry: it is gone
    except (OSError, IndexError):
        return True


def daemon_gone(pid: int | None, timeout: float = GONE_TIMEOUT) -> bool:
    """True when the daemon ``pid`` no longer runs, within ``timeout`` seconds (a killed
    daemon closes its connections a moment before its process is gone). An unknown pid is
    never gone: a client retries only when it knows the daemon it reached is dead."""
    if pid is None:
        return False
    deadline = time.monotonic() + timeout
    delay = 0.005
    while _running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    return True


def died_before_answering(sock: str, attempts: int, pid: int | None, gone: bool) -> str:
    """Why a client gives up its handshake: every daemon it reached died before answering
    (``attempts`` of them), or the last one closed the connection and runs still (or its
    pid could not be read, so it may) — a client never retries then."""
    log = log_path(sock)
    if pid is None:
        return (f"the dagctx daemon on {sock} closed the connection before answering `initialize`, and its "
                f"pid could not be read to tell whether it died, so nothing was retried; see its log {log}, "
                "then retry (or stop it with `dagctx daemon stop`)")
    if not gone:
        return (f"the dagctx daemon on {sock} (pid {pid}) closed the connection before answering `initialize` "
                f"and still runs; see its log {log} for why, or stop it with `dagctx daemon stop` and retry")
    return (f"{attempts} dagctx daemons on {sock} in a row died before answering `initialize` (the last was "
            f"pid {pid}); see the log {log} for why they die (memory, a crash), or use `--standalone`")


def daemon_command(sock: str) -> list[str]:
    return [sys.executable, "-P", "-m", "dagctx.cli", "daemon", "run", "--socket", sock]


def start_daemon(sock: str) -> int:
    """Start the daemon detached: its own session, stdin from /dev/null, output to its log."""
    import subprocess  # only to start a daemon: connecting to a running one skips it

    log = log_path(sock)
    with open(log, "ab", buffering=0) as out, open(os.devnull, "rb") as devnull:
        os.chmod(log, 0o600)
        proc = subprocess.Popen(
            daemon_command(sock),
            stdin=devnull,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    return proc.pid


def connect_or_start(sock: str | None = None, *, start: bool = True, timeout: float = START_TIMEOUT) -> socket.socket:
    """A socket connected to the per-user daemon, starting one when none listens."""
    if not supported():
        raise DaemonUnavailable("this platform has no Unix sockets; use `dagctx serve --standalone`")
    sock = sock or socket_path()
    if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
        raise DaemonUnavailable(
            f"the socket path {sock} is longer than Unix sockets allow ({MAX_SOCKET_PATH} bytes); "
            "set XDG_RUNTIME_DIR to a shorter folder, or use `dagctx serve --standalone`"
        )
    s = try_connect(sock)
    if s is not None or not start:
        if s is None:
            raise DaemonUnavailable(f"no dagctx daemon listens on {sock}")
        return s
    import fcntl

    lock_file = sock + ".lock"
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:  # the start lock: racing clients start exactly one daemon
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                s = try_connect(sock)
                if s is not None:
                    return s
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(f"timed out waiting for another client to start the daemon ({lock_file})")
                time.sleep(0.02)
        s = try_connect(sock)
        if s is not None:
            return s
        try:
            os.unlink(sock)  # stale: nobody listens (a daemon killed with -9)
        except FileNotFoundError:
            pass
        pid = start_daemon(sock)
        delay = 0.005
        while time.monotonic() < deadline:
            s = try_connect(sock)
            if s is not None:
                return s
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = 0
            if done:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise DaemonUnavailable(
            f"the dagctx daemon did not start listening on {sock}; see its log {log_path(sock)} "
            "(or run `dagctx serve --standalone`)"
        )
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
