"""server/code_cache.py: code attrs generates, compiled once and read back by the next
process; classes built from cached code behave as freshly compiled ones. Each case runs
in a fresh interpreter, because attrs names its generated code per process. (A hashable
class's ``__hash__`` source carries a per-process salt, so it is compiled every time;
the classes here have none.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dagctx.server import code_cache

pytestmark = pytest.mark.slow  # each case starts interpreters

SCRIPT = r"""
import json, sys
from dagctx.server.code_cache import cached_imports
with cached_imports(sys.argv[1]) as cache:
    import attr
    @attr.define
    class Point:
        x: int
        y: int = 0
    @attr.define(eq=False)
    class Label:
        text: str
p = Point(1, 2)
print(json.dumps({"hits": cache.hits, "compiled": cache.compiled, "repr": repr(p), "eq": p == Point(1, 2),
                  "ne": p != Point(1, 3), "label": repr(Label("a")) == "Label(text='a')",
                  "restored": "compile" not in vars(attr._make)}))
"""


def _run(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_next_process_takes_every_generated_function_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.marshal"
    first = _run(path)
    assert first["hits"] == 0 and first["compiled"] >= 2
    assert (path.stat().st_mode & 0o777) == 0o600
    second = _run(path)
    assert second["hits"] == first["compiled"] and second["compiled"] == 0
    for run in (first, second):
        assert run["repr"] == "Point(x=1, y=2)" and run["eq"] and run["ne"] and run["label"] and run["restored"]


def test_a_corrupt_or_foreign_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "c.marshal"
    compiled = _run(path)["compiled"]
    for junk in (b"", b"\x00garbage", b"[1, 2]"):
        path.write_bytes(junk)
        again = _run(path)
        assert again["hits"] == 0 and again["compiled"] == compiled and again["eq"]
        assert _run(path)["hits"] == compiled


def test_turned_off_it_finds_no_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DAGCTX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DAGCTX_CODE_CACHE", "0")
    assert code_cache.default_path() is None
    monkeypatch.delenv("DAGCTX_CODE_CACHE")
    path = code_cache.default_path()
    assert path is not None and Path(path).parent == tmp_path / "state" / "cache"
    assert os.stat(Path(path).parent).st_mode & 0o777 == 0o700
