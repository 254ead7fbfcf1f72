"""The files and environment the daemon touches before any session exists (SPEC §2, §6)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dagctx.engine.config import MAX_CONFIG_FILE_BYTES, contain_caches, read_config_file
from dagctx.protocol.errors import DagctxError


def test_config_file_reader_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_CONFIG_FILE_BYTES + 1))
    for path, words in (("/dev/zero", "character device"), (fifo, "FIFO"), (tmp_path, "directory"), (big, "at most")):
        started = time.monotonic()
        with pytest.raises(DagctxError) as info:
            read_config_file(str(path))
        assert time.monotonic() - started < 1  # a FIFO with no writer must not block
        assert info.value.kind == "InvalidParams" and words in info.value.message
        assert info.value.path == "initializationOptions.configFile"
    ok = tmp_path / "m.json"
    ok.write_text('{"models": {}}')
    assert read_config_file(str(ok)) == b'{"models": {}}'
    with pytest.raises(FileNotFoundError):
        read_config_file(str(tmp_path / "missing.json"))


def test_tiktoken_cache_goes_under_the_daemons_cache_dir_unless_the_user_chose(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    env: dict[str, str] = {}
    contain_caches(env)
    assert Path(env["TIKTOKEN_CACHE_DIR"]).is_relative_to(tmp_path / "xdg")
    assert Path(env["TIKTOKEN_CACHE_DIR"]).is_dir()
    for mine in ({"TIKTOKEN_CACHE_DIR": "/mine"}, {"DATA_GYM_CACHE_DIR": "/gym"}, {"TIKTOKEN_CACHE_DIR": ""}):
        env = dict(mine)
        contain_caches(env)
        assert env == mine
