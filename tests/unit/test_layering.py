"""The architecture invariants of ARCHITECTURE.md, checked on the import graph."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved to dagctx.*)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = _package_of(path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                out.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                out.add(node.module)
    return out


def _package_of(path: Path) -> str:
    rel = path.relative_to(REPO)
    top = {"protocol": "dagctx.protocol", "daemon": "dagctx", "cli": "dagctx.cli"}
    if rel.parts[0] == "clients":
        parts = ["dagctx.client", *rel.parts[2:-1]]
    else:
        parts = [top[rel.parts[0]], *rel.parts[1:-1]]
    return ".".join(parts)


def _files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _ours(mods: set[str]) -> set[str]:
    return {m for m in mods if m == "dagctx" or m.startswith("dagctx.")}


@pytest.mark.parametrize("path", _files("protocol"), ids=lambda p: p.name)
def test_protocol_imports_nothing_of_ours(path: Path) -> None:
    bad = {m for m in _ours(_imports(path)) if not m.startswith("dagctx.protocol")}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", [p for p in _files("daemon") if p.name != "__main__.py"], ids=str)
def test_daemon_never_imports_a_client_or_the_cli(path: Path) -> None:
    bad = {m for m in _ours(_imports(path)) if m.startswith(("dagctx.client", "dagctx.cli"))}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", _files("clients/python"), ids=lambda p: p.name)
def test_python_client_knows_only_the_protocol(path: Path) -> None:
    bad = {m for m in _ours(_imports(path)) if not m.startswith(("dagctx.protocol", "dagctx.client"))}
    assert not bad, f"{path.name} imports {bad}"


# ledger → context → engine → server: each floor imports only the floors below it
FLOORS = {
    "daemon/ledger": ("dagctx.context", "dagctx.engine", "dagctx.server", "dagctx.importers"),
    "daemon/context": ("dagctx.engine", "dagctx.server", "dagctx.importers"),
    "daemon/importers": ("dagctx.context", "dagctx.engine", "dagctx.server", "dagctx.ledger"),
    "daemon/engine": ("dagctx.server",),
}


@pytest.mark.parametrize("folder", sorted(FLOORS))
def test_dependencies_point_one_way(folder: str) -> None:
    for path in _files(folder):
        bad = {m for m in _ours(_imports(path)) if m.startswith(FLOORS[folder])}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_only_the_ledger_runs_sql() -> None:
    for folder in ("daemon", "protocol", "clients/python", "cli"):
        for path in _files(folder):
            if "sqlite3" in _imports(path):
                assert path.relative_to(REPO).parts[:2] == ("daemon", "ledger"), path


def test_only_the_server_knows_json_rpc() -> None:
    for path in _files("daemon"):
        rel = path.relative_to(REPO)
        mods = _imports(path)
        if rel.parts[:2] != ("daemon", "server"):
            assert not {m for m in mods if m.startswith(("pygls", "lsprotocol", "dagctx.protocol.codec"))}, rel
