"""Where the per-user daemon lives and what a forwarder imports (SPEC §1.2, §1.3)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from dagctx.protocol import transport

HEAVY = ("pygls", "lsprotocol", "tiktoken", "sqlite3", "_sqlite3", "msgspec", "asyncio", "cattrs", "rich")


def test_the_socket_name_carries_user_and_build(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("USER", "alice")
    path = transport.socket_path()
    folder = os.path.dirname(path)
    assert folder == str(tmp_path / "dagctx")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert os.path.basename(path) == f"dagctx-alice-{transport.build_hash()}.sock"


def test_the_build_hash_changes_with_every_version(monkeypatch: pytest.MonkeyPatch) -> None:
    base = transport.build_hash()
    for name in ("__version__", "PROTOCOL_VERSION", "LEDGER_SCHEMA_VERSION"):
        with monkeypatch.context() as mp:
            mp.setattr(transport, name, "changed")
            assert transport.build_hash() != base, name
    monkeypatch.setenv("DAGCTX_DAEMON_TAG", "x")
    assert transport.build_hash() != base


def test_without_xdg_the_folder_is_private_under_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    folder = transport.runtime_dir()
    assert folder == str(tmp_path / f"dagctx-{os.getuid()}")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_stale_socket_is_not_a_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import socket

    path = str(tmp_path / "s.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # bound, never listening: what kill -9 leaves behind
    assert transport.try_connect(path) is None


@pytest.mark.slow  # starts an interpreter
def test_the_forwarder_imports_nothing_heavy() -> None:
    code = ("import sys; import dagctx.cli; from dagctx.server import forward; "
            "from dagctx.protocol import transport; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the forwarder's imports pull in {out.stdout.strip()}"


def test_a_socket_path_too_long_for_unix_sockets_is_a_clear_error(tmp_path) -> None:
    long = str(tmp_path / ("d" * 120) / "x.sock")
    with pytest.raises(transport.DaemonUnavailable, match="longer than Unix sockets allow"):
        transport.connect_or_start(long)
