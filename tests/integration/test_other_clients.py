"""The TypeScript (vscode-jsonrpc) and Neovim (vim.lsp.rpc) clients' own suites,
run against the real daemon. In CI a missing toolchain is a failure, not a skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TS = REPO / "clients" / "typescript"
NVIM = REPO / "clients" / "nvim"


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is required in CI (scripts/test.sh installs it)")
        pytest.skip(f"{tool} is not installed")


def _env(run: Path) -> dict[str, str]:
    """The clients' default: `dagctx serve` forwarding to a shared daemon — private to
    this test (its own runtime folder), stopped afterwards by ``_stop``."""
    env = dict(os.environ)
    env.pop("DAGCTX_STANDALONE", None)
    env["XDG_RUNTIME_DIR"] = str(run)
    env["DAGCTX_STATE_DIR"] = str(run / "state")
    env["DAGCTX_IDLE_TIMEOUT"] = "60"
    env["DAGCTX_COMMAND"] = json.dumps([sys.executable, "-P", "-m", "dagctx.cli", "serve"])
    env["DAGCTX_PYTHON"] = sys.executable
    return env


def _stop(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], env=env, capture_output=True,
                   timeout=60)


@pytest.mark.skipif(not (TS / "package.json").exists(), reason="no TypeScript client")
def test_typescript_client_suite(short_dir: Path) -> None:
    _need("npm")
    if not (TS / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, capture_output=True)
    env = _env(short_dir)
    try:
        proc = subprocess.run(["npm", "test"], cwd=TS, env=env, capture_output=True, text=True, timeout=300)
    finally:
        _stop(env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "# fail 0" in proc.stdout and "# skipped 0" in proc.stdout


@pytest.mark.skipif(not (TS / "package.json").exists(), reason="no TypeScript client")
def test_typescript_types_match_the_schema() -> None:
    _need("npm")
    if not (TS / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, capture_output=True)
    proc = subprocess.run(["npm", "run", "check-types"], cwd=TS, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.skipif(not (NVIM / "test" / "run.sh").exists(), reason="no Neovim client")
def test_neovim_client_headless(short_dir: Path) -> None:
    _need("nvim")
    env = _env(short_dir)
    try:
        proc = subprocess.run(["bash", str(NVIM / "test" / "run.sh")], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=180)
    finally:
        _stop(env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert " passed, 0 failed" in out
