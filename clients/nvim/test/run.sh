#!/usr/bin/env bash
# Run the headless Neovim test of dagctx.nvim against a real daemon.
# Usage (from anywhere; the paths are resolved from the repo root):
#   bash clients/nvim/test/run.sh
# $DAGCTX_PYTHON: the python that runs `-P -m dagctx.cli serve` (default python3).
# $NVIM: the nvim binary (default nvim). Exit code 0 = all passed, 1 = a failure.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
nvim_bin="${NVIM:-nvim}"

if ! command -v "$nvim_bin" >/dev/null 2>&1; then
  echo "nvim not found (apt-get install neovim, or set \$NVIM)" >&2
  exit 1
fi

cd "$root" || exit 1
# A private XDG tree: no user config, shada, swap or lsp.log is touched.
xdg="$(mktemp -d)"
trap 'rm -rf "$xdg"' EXIT
export XDG_CONFIG_HOME="$xdg/config" XDG_DATA_HOME="$xdg/data" XDG_STATE_HOME="$xdg/state" XDG_CACHE_HOME="$xdg/cache"

timeout 30 "$nvim_bin" --headless -u NONE -i NONE -n \
  -c "luafile clients/nvim/test/test_dagctx.lua" </dev/null
code=$?
if [ "$code" -eq 124 ]; then
  echo "FAIL - nvim did not exit within 30 s" >&2
  exit 1
fi
[ "$code" -eq 0 ] && exit 0
exit 1
