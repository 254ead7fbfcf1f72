"""The numbers and lists ARCHITECTURE.md states, checked against the code where they can
be: a claim that stops being true fails here, not in a newcomer's head."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCH = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _stated(pattern: str) -> str:
    m = re.search(pattern, ARCH, re.S)
    assert m, f"ARCHITECTURE.md no longer says {pattern!r}"
    return m.group(1)


def test_the_backend_primitives_are_counted_right() -> None:
    from dagctx.ledger.backend import Backend

    primitives = [n for n, v in vars(Backend).items() if not n.startswith("_") and callable(v)]
    assert int(_stated(r"the `Backend` Protocol — (\d+) primitives")) == len(primitives), primitives


def test_the_server_answers_itself_exactly_what_architecture_lists() -> None:
    source = "".join((REPO / "daemon/dagctx/server" / name).read_text(encoding="utf-8")
                     for name in ("jsonrpc_server.py", "incoming.py", "requests.py"))
    handled = set(re.findall(r'self\.handlers\["([^"]+)"\] =', source))
    stated = set(re.findall(r"`([^`]+)`", _stated(r"but six\s+the connection answers itself — (.*?) — and")))
    assert handled == stated and len(stated) == 6
    notes = set(re.findall(r'method == "([^"]+)"', source)) | set(re.findall(r'method\.startswith\("(\$/)"\)', source))
    stated_notes = set(re.findall(r"`([^`]+)`", _stated(r"handles four\s+notifications itself — (.*?)\s+\(")))
    assert stated_notes <= notes and len(stated_notes) == 4, (stated_notes, notes)


def test_the_context_layer_reads_files_only_where_architecture_says() -> None:
    reads = re.compile(r"\bopen\(|read_bytes\(|read_text\(|os\.open\(|os\.scandir\(|os\.listdir\(")
    found = sorted(p.name for p in (REPO / "daemon/dagctx/context").rglob("*.py")
                   if reads.search(p.read_text(encoding="utf-8")))
    stated = re.findall(r"`daemon/dagctx/context/(\w+\.py)`", _stated(r"It reads files in exactly three modules(.*?);\n`tests"))
    assert found == sorted(stated) and len(stated) == 3, found


def test_every_number_behind_a_choice_is_the_constant_in_the_code() -> None:
    import importlib

    table = _stated(r"## Numbers behind the choices\n(.*?)\n## ")
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ") and "`dagctx." in line]
    assert len(rows) >= 10
    for _, number, constant, _why in rows:
        values = [float(v.replace(",", "")) for v in re.findall(r"[\d.,]+", number)]
        names = [n.strip("` ") for n in constant.split("/")]
        module, _, first = names[0].rpartition(".")
        mod = importlib.import_module(module)
        got = [getattr(mod, first)] + [getattr(mod, n) for n in names[1:]]
        assert [float(v) for v in got] == values[: len(got)], (constant, number, got)


def test_every_module_over_600_lines_is_named_with_its_reason() -> None:
    table = _stated(r"## Modules over 600 lines\n(.*?)\n## ")
    kept = dict(re.findall(r"^\| `([^`]+\.py)` \| (\d+) \|", table, re.M))
    long = {}
    for root in ("protocol", "daemon", "cli", "clients/python", "clients/hermes"):
        for path in (REPO / root).rglob("*.py"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > 600:
                long[str(path.relative_to(REPO))] = lines
    assert set(long) <= set(kept), f"split these by job, or say in ARCHITECTURE.md why not: {sorted(set(long) - set(kept))}"
    assert set(kept) <= set(long), f"no longer over 600 lines, drop their rows: {sorted(set(kept) - set(long))}"
    for name, lines in long.items():  # the stated size is within a few dozen lines of the real one
        assert abs(int(kept[name]) - lines) <= 40, (name, lines, kept[name])

