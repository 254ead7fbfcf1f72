"""Every variation point is one registry, and each registry names exactly what the wire
``Literal`` allows: a name added on one side only fails here."""

from __future__ import annotations

from typing import get_args

from dagctx.engine import summary_sources
from dagctx.protocol import messages as m


def test_summary_sources_are_the_wire_names() -> None:
    assert set(summary_sources.SOURCES) == set(get_args(m.SummarySourceName))
    assert set(summary_sources.DEFAULT_ORDER) == set(summary_sources.SOURCES)
    for name, source in summary_sources.SOURCES.items():
        assert source.name == name and source.missing


def test_transcript_readers_are_the_wire_import_formats() -> None:
    from dagctx.protocol.context_messages import ImportFormat
    from dagctx.transcripts import FORMATS
    from dagctx.transcripts.readers import readers

    assert set(readers()) == set(get_args(ImportFormat)) - {"auto"} == set(FORMATS)
    for name, reader in readers().items():
        assert reader.name == name and reader.label


def test_storage_backends_are_the_wire_storage_kinds() -> None:
    from dagctx.ledger import BACKENDS, backend_for, names_a_file
    from dagctx.ledger.postgres_backend import PostgresBackend
    from dagctx.ledger.sqlite_backend import SqliteBackend

    assert [b.name for b in BACKENDS] == ["postgresql", "sqlite"]
    assert {b.name for b in BACKENDS} == set(get_args(m.StorageKind))
    assert PostgresBackend.kind == "postgresql" and SqliteBackend.kind == "sqlite"
    for name, kind, is_file in (("postgresql://u@h/db", "postgresql", False), (" POSTGRES://h/db", "postgresql", False),
                                ("/tmp/x.db", "sqlite", True), ("x.db", "sqlite", True), (":memory:", "sqlite", False),
                                ("postgresql.db", "sqlite", True)):
        assert backend_for(name).name == kind, name
        assert names_a_file(name) is is_file, name
    assert backend_for(":memory:").open(":memory:", None, True, None).kind == "sqlite"


def test_only_the_format_modules_branch_on_a_format_name() -> None:
    """A render format is one module (ARCHITECTURE.md, What a newcomer touches): no code of
    the daemon outside ``context/formats/`` compares against a format's name. Defaults
    (``fmt="neutral"``) are choices, not knowledge, and stay allowed."""
    import re
    from pathlib import Path

    from dagctx.context.formats import FORMATS

    names = "|".join(re.escape(n) for n in FORMATS)
    branch = re.compile(rf"""(?:[=!]=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(?:[=!]=|\bin\b)""")
    daemon = Path(__file__).resolve().parents[2] / "daemon" / "dagctx"
    found = [f"{p.relative_to(daemon)}:{k}: {line.strip()}"
             for p in sorted(daemon.rglob("*.py")) if "formats" not in p.relative_to(daemon).parts
             for k, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1) if branch.search(line)]
    assert found == []


def test_the_format_branch_detector_sees_a_branch() -> None:
    import re

    branch = re.compile(r"""(?:[=!]=|\bin)\s*\(?\s*["'](openai|neutral)["']|["'](openai|neutral)["']\s*(?:[=!]=|\bin\b)""")
    for line in ('if format == "openai":', "if fmt in ('neutral', 'x'):", 'ok = "neutral" == fmt'):
        assert branch.search(line), line
    assert not branch.search('render(fmt="openai")')
