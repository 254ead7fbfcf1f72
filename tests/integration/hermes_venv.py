"""hermes-agent's own virtualenv for the Hermes tests and bench/bench_hermes.py.

hermes-agent pins its dependencies exactly, so it gets its own virtualenv under the user
cache directory, built once and reused between runs, the way a user installs dagctx
beside Hermes: ``hermes-agent[mcp]`` at the version tested (which pins ``mcp==1.26.0``),
``dagctx[mcp]`` and dagctx-hermes (editable), resolved together by ONE pip install and
checked with ``pip check`` — dagctx must not break Hermes's own MCP support — plus pytest,
to run the MCP face's tests on that SDK. Locally a venv that cannot be built is a skip
with the reason; in CI (``CI`` set) it is a failure.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERMES_VERSION = "0.19.0"
MARKER = f"hermes-agent[mcp]=={HERMES_VERSION} dagctx[mcp] dagctx-hermes=editable v2 {REPO}"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dagctx-tests"


def _fail_or_skip(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the Hermes virtualenv is required in CI: {why}")
    pytest.skip(f"hermes-agent {HERMES_VERSION} could not be installed into its own virtualenv: {why}")


def hermes_python() -> Path:
    """The cached virtualenv's interpreter, building the venv when it is missing or stale."""
    # one venv per checkout: its editable installs point into this repository
    tag = hashlib.sha1(str(REPO).encode()).hexdigest()[:8]
    root = _cache_root() / f"hermes-venv-{HERMES_VERSION}-{tag}"
    py = root / "bin" / "python"
    marker = root / "dagctx-ready"
    if py.exists() and marker.exists() and marker.read_text() == MARKER:
        return py
    root.parent.mkdir(parents=True, exist_ok=True)
    # two test workers may ask at once: one builds, the other waits and then finds it built
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if py.exists() and marker.exists() and marker.read_text() == MARKER:
            return py
        _build(root, py, marker)
    return py


def _build(root: Path, py: Path, marker: Path) -> None:
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(root)
            pip = [str(py), "-m", "pip"]
        except (subprocess.CalledProcessError, OSError):
            # no ensurepip (Debian without python3-venv): this pip installs into the venv
            venv.EnvBuilder(with_pip=False, clear=True).create(root)
            pip = [sys.executable, "-m", "pip", "--python", str(py)]
        together = [f"hermes-agent[mcp]=={HERMES_VERSION}", "-e", f"{REPO}[mcp]", "-e", str(REPO / "clients" / "hermes")]
        for args in (together, ["pytest>=8", "pytest-asyncio>=0.24"]):
            proc = subprocess.run(pip + ["install", "-q", "--disable-pip-version-check", *args],
                                  capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                _fail_or_skip(f"pip install {' '.join(args)} failed: {proc.stderr[-1500:]}")
        check = subprocess.run(pip + ["check"], capture_output=True, text=True, timeout=300)
        if check.returncode != 0:  # a conflict is dagctx's bug, not the machine's: always a failure
            pytest.fail(f"dagctx[mcp] beside hermes-agent[mcp] breaks requirements: {check.stdout}{check.stderr}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        _fail_or_skip(str(exc))
    marker.write_text(MARKER)
