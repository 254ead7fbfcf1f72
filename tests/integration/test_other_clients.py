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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["DAGCTX_COMMAND"] = json.dumps([sys.executable, "-P", "-m", "dagctx.cli", "serve"])
    env["DAGCTX_PYTHON"] = sys.executable
    return env


@pytest.mark.skipif(not (TS / "package.json").exists(), reason="no TypeScript client")
def test_typescript_client_suite() -> None:
    _need("npm")
    if not (TS / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, capture_output=True)
    proc = subprocess.run(["npm", "test"], cwd=TS, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "# fail 0" in proc.stdout


@pytest.mark.skipif(not (TS / "package.json").exists(), reason="no TypeScript client")
def test_typescript_types_match_the_schema() -> None:
    _need("npm")
    if not (TS / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, capture_output=True)
    proc = subprocess.run(["npm", "run", "check-types"], cwd=TS, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.skipif(not (NVIM / "test" / "run.sh").exists(), reason="no Neovim client")
def test_neovim_client_headless() -> None:
    _need("nvim")
    proc = subprocess.run(["bash", str(NVIM / "test" / "run.sh")], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert " passed, 0 failed" in out
