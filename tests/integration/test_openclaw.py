"""The OpenClaw context-engine plugin's own suite (clients/openclaw, `npm test`), against the
real daemon. The build type-checks the plugin against the pinned `openclaw` package's
exported plugin types. In CI a missing toolchain is a failure, not a skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "clients" / "openclaw"
TS = REPO / "clients" / "typescript"


def _npm_ready(folder: Path) -> None:
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("npm is required in CI (scripts/test.sh installs the Node packages)")
        pytest.skip("npm is not installed")
    if not (folder / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=folder, check=True,
                       capture_output=True, timeout=600)


def test_openclaw_plugin_suite() -> None:
    _npm_ready(TS)
    if not (TS / "dist" / "index.js").exists():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=TS, check=True, capture_output=True, timeout=300)
    _npm_ready(PLUGIN)
    env = {**os.environ, "DAGCTX_COMMAND": json.dumps([sys.executable, "-P", "-m", "dagctx.cli", "serve"])}
    proc = subprocess.run(["npm", "test"], cwd=PLUGIN, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout
