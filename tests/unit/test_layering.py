"""The architecture invariants of ARCHITECTURE.md, checked on the import graph.

Every rule names the folders it governs; a rule whose folder is missing (renamed,
moved) fails instead of passing over nothing. A module's folder path below its source
root is its import path, so a file's module name is read off its path.
"""

from __future__ import annotations

import ast
import functools
import gc
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: The source roots: each holds one portion of the ``dagctx`` namespace package.
ROOTS = ("protocol", "daemon", "cli", "clients/python")

#: Floors of the daemon, each a package; a floor never imports the floors listed.
FLOORS: dict[str, tuple[str, ...]] = {
    "dagctx.ledger": ("dagctx.context", "dagctx.engine", "dagctx.server", "dagctx.transcripts"),
    "dagctx.context": ("dagctx.engine", "dagctx.server", "dagctx.transcripts", "dagctx.ledger.store",
                       "dagctx.ledger.store_base", "dagctx.ledger.appends"),
    "dagctx.transcripts": ("dagctx.context", "dagctx.engine", "dagctx.server", "dagctx.ledger"),
    "dagctx.engine": ("dagctx.server",),
    # the server reaches the record only through the engine
    "dagctx.server": ("dagctx.ledger", "dagctx.transcripts"),
}

#: What each top-level area may import of ours (prefixes).
ALLOWED: dict[str, tuple[str, ...]] = {
    # the contract depends on no one
    "dagctx.protocol": ("dagctx.protocol",),
    # clients know only the protocol
    "dagctx.client": ("dagctx.protocol", "dagctx.client"),
    # the CLI is a client; it names the server package only to run the daemon
    "dagctx.cli": ("dagctx.protocol", "dagctx.client", "dagctx.cli", "dagctx.server"),
}

#: Third-party packages that speak JSON-RPC: only the server may import them.
JSON_RPC_MODULES = ("pygls", "lsprotocol", "dagctx.protocol.codec")
#: Database drivers: only the ledger may import them.
SQL_MODULES = ("sqlite3", "psycopg", "psycopg_pool", "apsw")
_SQL_TEXT = re.compile(
    r"\b(SELECT\s+[\w*(].*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX|VIRTUAL))\b",
    re.S,
)


def _module_of(path: Path) -> str:
    rel = path.relative_to(REPO)
    for root in sorted(ROOTS, key=len, reverse=True):
        root_parts = Path(root).parts
        if rel.parts[: len(root_parts)] == root_parts:
            parts = list(rel.parts[len(root_parts):])
            parts[-1] = parts[-1].removesuffix(".py")
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise AssertionError(f"{rel} is under no source root")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A source file parsed once for every rule of this module (the rules walk the same
    files; parsing them again per rule was most of this module's time). The collector of
    reference cycles pauses while a file is parsed: a syntax tree holds none, and its
    passes over the trees already kept were a third of the parsing time."""
    source = path.read_text(encoding="utf-8")
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body`` and of the blocks nested in it (functions, classes, if,
    loops, try, with, match): an import is a statement, so this finds each one without
    visiting the expressions that make up most of a tree."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from _statements(block)
        for part in getattr(node, "handlers", ()) or getattr(node, "cases", ()):
            yield from _statements(part.body)


@functools.cache
def _import_statements(path: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Every import of a file as ``(module, names)``: ``import a.b`` is ``("a.b", ())``,
    ``from P import x, y`` is ``(P, ("x", "y"))`` with relative imports resolved; type-only
    and function-level imports included. One walk of the tree per file."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in _statements(_tree(path).body):
        if isinstance(node, ast.Import):
            out.extend((a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.append((base, tuple(a.name for a in node.names)))
    return tuple(out)


@functools.cache
def _imports(path: Path, modules: frozenset[str] | None = None) -> frozenset[str]:
    """Absolute module names a file imports (relative imports resolved; type-only and
    function-level imports included). With ``modules`` (every module of ours), ``from P
    import x`` names ``P.x`` when that is a module, and ``P`` itself only for a name
    defined there; without it, both."""
    out: set[str] = set()
    for base, names in _import_statements(path):
        if not names:
            out.add(base)
            continue
        named = {f"{base}.{n}" for n in names}
        if modules is None:
            out.add(base)
            out.update(named)
        else:
            out.update(named & modules)
            if len(named & modules) < len(named):  # names defined in ``base`` itself
                out.add(base)
    return frozenset(out)


def _sources() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for root in ROOTS:
        assert (REPO / root / "dagctx").is_dir(), f"source root {root}/dagctx is missing"
        for path in sorted((REPO / root).rglob("*.py")):
            files[_module_of(path)] = path
    return files


SOURCES = _sources()


def _in(package: str) -> list[tuple[str, Path]]:
    found = [(m, p) for m, p in SOURCES.items() if m == package or m.startswith(package + ".")]
    assert found, f"the rule names {package}, which has no module: fix the rule or the layout"
    return found


def _ours(mods: frozenset[str] | set[str]) -> set[str]:
    return {m for m in mods if m == "dagctx" or m.startswith("dagctx.")}


def _starts(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_module_paths_are_import_paths() -> None:
    """No ``package-dir`` remapping: the folder path below a root is the import path."""
    import importlib.util

    for module, path in SOURCES.items():
        if module.count(".") > 2:
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        assert Path(spec.origin).resolve() == path.resolve(), f"{module} resolves to {spec.origin}, not {path}"


def test_the_namespace_has_no_owner() -> None:
    for root in ROOTS:
        assert not (REPO / root / "dagctx" / "__init__.py").exists(), f"{root}/dagctx/__init__.py makes it a regular package"


@pytest.mark.parametrize("area", sorted(ALLOWED))
def test_areas_import_only_what_they_may(area: str) -> None:
    for module, path in _in(area):
        bad = {m for m in _ours(_imports(path)) if not _starts(m, ALLOWED[area])}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_dependencies_point_one_way(floor: str) -> None:
    for forbidden in FLOORS[floor]:
        _in(forbidden)  # the floor it must not reach exists
    for module, path in _in(floor):
        bad = {m for m in _ours(_imports(path)) if _starts(m, FLOORS[floor])}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_the_daemon_never_imports_a_client_or_the_cli() -> None:
    for module, path in SOURCES.items():
        if path.is_relative_to(REPO / "daemon"):
            bad = {m for m in _ours(_imports(path)) if _starts(m, ("dagctx.client", "dagctx.cli"))}
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_only_the_ledger_runs_sql() -> None:
    _in("dagctx.ledger")
    for module, path in SOURCES.items():
        if _starts(module, ("dagctx.ledger",)):
            continue
        drivers = {m for m in _imports(path) if _starts(m, SQL_MODULES)}
        assert not drivers, f"{path.relative_to(REPO)} imports {sorted(drivers)}"
        if _starts(module, ("dagctx.cli",)):
            continue  # the demo's conversation talks about SQL; the CLI imports no driver
        for node in _strings(_tree(path)):
            if _SQL_TEXT.search(node.value):
                raise AssertionError(f"{path.relative_to(REPO)}:{node.lineno} holds SQL: {node.value[:60]!r}")


def _strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """Every string constant of a tree: ``ast.walk``'s nodes, reached in a third of its time
    (one loop over each node's fields; a constant has no children)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if type(node) is ast.Constant:
            if isinstance(node.value, str):
                yield node
            continue
        for field in node._fields:
            value = getattr(node, field, None)
            if type(value) is list:
                stack.extend(v for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append(value)


def test_only_the_server_knows_json_rpc() -> None:
    _in("dagctx.server")
    for module, path in SOURCES.items():
        if not path.is_relative_to(REPO / "daemon") or _starts(module, ("dagctx.server",)):
            continue
        bad = {m for m in _imports(path) if _starts(m, JSON_RPC_MODULES)}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_the_sql_detector_sees_sql() -> None:
    """The detector the SQL rule relies on must recognise the statements the ledger runs."""
    assert _SQL_TEXT.search("SELECT id FROM nodes WHERE session_id = ?")
    assert _SQL_TEXT.search("INSERT OR IGNORE INTO nodes VALUES (?)")
    assert not _SQL_TEXT.search("select the head from the branch")


def test_the_string_reader_sees_every_string_constant() -> None:
    """``_strings`` finds what ``ast.walk`` finds, wherever a string may stand."""
    source = '''
"""module doc"""
import a as b
from c import d
@deco("s1", k="s2")
def f(x: "s3" = "s4", *a: "s5", **kw) -> "s6":
    """s7"""
    g = {"s8": 1, **kw, None: "s9"}
    h = [f"s10{x!r:>{'s11'}}", lambda y="s12": y, ("s13",), {"s14"}]
    i = [z for z in "s15" if z != "s16"] + [{"s17": z} for z in ()]
    global q
    j: "s18" = x["s19":"s20"] if x else not "s21"
    match x:
        case {"s22": [1, "s23", *rest]} | Point(a="s24") if "s25":
            pass
        case "s26" as w:
            raise E("s27") from None
    try:
        assert x, "s28"
    except* ValueError as e:
        del e
    with open("s29") as fh, ctx():
        yield "s30"
    return await_(b"bytes", 1, 2.0, ..., True)
class C(Base, metaclass=M, flag="s31"):
    attr: int = "s32"
'''
    tree = ast.parse(source)
    walked = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    found = list(_strings(tree))
    assert sorted(map(id, found)) == sorted(map(id, walked))
    assert {n.value for n in found} >= {"module doc", *(f"s{i}" for i in range(1, 33))}


#: A repository path in backticks: it has a folder part (``a/b.py``, ``a/``); ``x.py:name`` allowed.
_PATH_TOKEN = re.compile(r"`([A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*)(?::\w+)?`")


def test_every_path_architecture_names_exists() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    from dagctx.protocol.methods import METHODS

    named = sorted({m.group(1) for m in _PATH_TOKEN.finditer(text)} - set(METHODS))
    assert len(named) > 10, "ARCHITECTURE.md names too few paths for this check to mean anything"
    missing = [p for p in named if not (REPO / p).exists()]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_the_version_is_declared_once_in_code_and_matches_the_package() -> None:
    import tomllib

    from dagctx.protocol.version import __version__

    meta = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["version"] == __version__


def _edges() -> dict[str, set[str]]:
    """Module → the modules of ours it imports, at run time or for types alike (a
    ``TYPE_CHECKING`` import still ties the two files together for a reader)."""
    modules = frozenset(SOURCES)
    return {module: {m for m in _imports(path, modules) if m in modules and m != module}
            for module, path in SOURCES.items()}


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_of_ours_imports_itself_back() -> None:
    """Zero import circles (ARCHITECTURE.md): a helper types against a port
    (``engine/ports.py``), never against the module that composes it."""
    circles = _circles(_edges())
    detail = [" ↔ ".join(c) for c in circles]
    assert circles == [], "import circles:\n" + "\n".join(detail)


def test_the_circle_detector_sees_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_in_every_block() -> None:
    """``_statements`` reaches an import wherever a statement may stand."""
    source = """
import a
def f():
    import b
    class C:
        import c
async def g():
    async with x:
        import d
    async for y in z:
        import e
    else:
        import f
if t:
    import g
elif u:
    import h
else:
    import i
while v:
    import j
else:
    import k
for w in q:
    import l
try:
    import m
except E:
    import n
else:
    import o
finally:
    import p
try:
    pass
except* E:
    import q
with r:
    import r
match s:
    case 1:
        import s
"""
    tree = ast.parse(source)
    found = sorted(a.name for n in _statements(tree.body) if isinstance(n, ast.Import) for a in n.names)
    assert found == sorted(a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names)
    assert found == list("abcdefghijklmnopqrs")
