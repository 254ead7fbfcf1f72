"""The system-prompt assembler: order, modes, caps, skills index, confinement, hash."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from dagctx.context.skills import SkillEntry, build_skills_index, format_skills_block, parse_skill_file
from dagctx.context.system_prompt import DEFAULT_IDENTITY, PromptOptions, assemble_system_prompt
from dagctx.context.workspace_files import resolve_inside
from dagctx.protocol.errors import DagctxError


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def skill(root: Path, folder: str, name: str | None, description: str) -> None:
    if name is None:
        write(root, f"skills/{folder}/SKILL.md", description)
    else:
        write(root, f"skills/{folder}/SKILL.md", f"---\nname: {name}\ndescription: {description}\n---\n\n# {name}\nBody.\n")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    write(root, "AGENTS.md", "agents rules\n")
    write(root, "SOUL.md", "soul text\n")
    write(root, "TOOLS.md", "tool notes\n")
    write(root, "IDENTITY.md", "identity card\n")
    write(root, "USER.md", "user facts\n")
    write(root, "HEARTBEAT.md", "heartbeat checklist\n")
    write(root, "BOOTSTRAP.md", "first run ritual\n")
    write(root, "MEMORY.md", "remembered things\n")
    skill(root, "beta", "beta", "Second skill")
    skill(root, "alpha", "alpha", "First skill")
    return root


def names(result) -> list[str]:
    return [s.name for s in result.sections]


# ---------------------------------------------------------------- order and modes


def test_full_order_most_stable_first(ws: Path) -> None:
    opts = PromptOptions(identity="I am the agent.", agent_prompt="Inline prompt.", prepend="PRE", append="POST")
    result = assemble_system_prompt(ws, opts)
    assert names(result) == [
        "prepend",
        "identity",
        "AGENTS.md",
        "SOUL.md",
        "TOOLS.md",
        "IDENTITY.md",
        "USER.md",
        "HEARTBEAT.md",
        "BOOTSTRAP.md",
        "agent_prompt",
        "skills",
        "memory",
        "append",
    ]
    text = result.text
    markers = ["PRE", "I am the agent.", "## AGENTS.md", "agents rules", "## SOUL.md", "## TOOLS.md", "tool notes",
               "## IDENTITY.md", "## USER.md", "## HEARTBEAT.md", "heartbeat checklist", "## BOOTSTRAP.md",
               "first run ritual", "Inline prompt.", "## Skills", "## Memory (MEMORY.md)", "remembered things", "POST"]
    positions = [text.index(m) for m in markers]
    assert positions == sorted(positions)
    assert text.startswith("PRE\n\n")
    assert text.endswith("POST")
    # Section lengths account for the whole text (blocks joined by one blank line).
    assert sum(s.chars for s in result.sections) + 2 * (len(result.sections) - 1) == len(text)
    assert result.files == ["AGENTS.md", "SOUL.md", "TOOLS.md", "IDENTITY.md", "USER.md", "HEARTBEAT.md", "BOOTSTRAP.md",
                            "skills/alpha/SKILL.md", "skills/beta/SKILL.md", "MEMORY.md"]
    assert result.notes == []
    sources = {s.name: s.source for s in result.sections}
    assert sources["AGENTS.md"] == "AGENTS.md" and sources["memory"] == "MEMORY.md" and sources["identity"] is None


def test_default_identity_when_none(ws: Path) -> None:
    result = assemble_system_prompt(ws, PromptOptions())
    assert result.text.startswith(DEFAULT_IDENTITY)
    assert len(DEFAULT_IDENTITY) < 120
    # An explicit empty identity means none at all.
    assert "identity" not in names(assemble_system_prompt(ws, PromptOptions(identity="")))


def test_minimal_mode(ws: Path) -> None:
    result = assemble_system_prompt(ws, PromptOptions(mode="minimal", agent_prompt="Inline."))
    assert names(result) == ["identity", "AGENTS.md", "TOOLS.md", "agent_prompt"]
    for other in ("soul text", "user facts", "identity card", "heartbeat checklist", "first run ritual"):
        assert other not in result.text
    assert "## Skills" not in result.text and "remembered" not in result.text
    assert result.files == ["AGENTS.md", "TOOLS.md"]


def test_none_mode(ws: Path) -> None:
    assert assemble_system_prompt(ws, PromptOptions(mode="none", agent_prompt="x")).text == ""
    result = assemble_system_prompt(ws, PromptOptions(mode="none", prepend="PRE", append="POST"))
    assert result.text == "PRE\n\nPOST"
    assert names(result) == ["prepend", "append"]
    assert result.files == []


def test_unknown_mode_rejected(ws: Path) -> None:
    with pytest.raises(DagctxError) as info:
        assemble_system_prompt(ws, PromptOptions(mode="weird"))  # type: ignore[arg-type]
    assert info.value.kind == "InvalidParams"


def test_no_workspace(tmp_path: Path) -> None:
    result = assemble_system_prompt(None, PromptOptions(agent_prompt="Inline."))
    assert names(result) == ["identity", "agent_prompt"]
    assert any("no workspace" in n for n in result.notes)
    missing = assemble_system_prompt(tmp_path / "does-not-exist", PromptOptions())
    assert names(missing) == ["identity"]
    assert any("not a directory" in n for n in missing.notes)


def test_missing_files_noted(tmp_path: Path) -> None:
    write(tmp_path, "AGENTS.md", "only agents\n")
    result = assemble_system_prompt(tmp_path, PromptOptions())
    assert names(result) == ["identity", "AGENTS.md"]
    for rel in ("SOUL.md", "USER.md", "MEMORY.md"):
        assert f"{rel}: not found; skipped" in result.notes
    assert result.files == ["AGENTS.md"]


def test_empty_and_unreadable_files(tmp_path: Path) -> None:
    write(tmp_path, "AGENTS.md", "  \n\n")
    (tmp_path / "SOUL.md").mkdir()
    (tmp_path / "USER.md").write_bytes(b"caf\xe9 ok\n")
    result = assemble_system_prompt(tmp_path, PromptOptions())
    assert "AGENTS.md: empty; skipped" in result.notes
    assert "SOUL.md: not a regular file; skipped" in result.notes
    assert any(n.startswith("USER.md: not valid UTF-8") for n in result.notes)
    assert "caf\ufffd ok" in result.text


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() == 0, reason="root can read anything")
def test_permission_denied_noted(tmp_path: Path) -> None:
    path = write(tmp_path, "AGENTS.md", "secret\n")
    path.chmod(0)
    try:
        result = assemble_system_prompt(tmp_path, PromptOptions())
    finally:
        path.chmod(0o644)
    assert "AGENTS.md: permission denied; skipped" in result.notes
    assert "secret" not in result.text


# ---------------------------------------------------------------- caps


def test_per_file_truncation_marker(tmp_path: Path) -> None:
    write(tmp_path, "AGENTS.md", "a" * 40_000)
    result = assemble_system_prompt(tmp_path, PromptOptions(per_file_chars=12_345))
    marker = "[… truncated: 12,345 of 40,000 characters shown — file AGENTS.md, per-file limit 12,345]"
    assert marker in result.text
    assert result.text.count("a" * 12_345) == 1 and "a" * 12_346 not in result.text
    section = next(s for s in result.sections if s.name == "AGENTS.md")
    assert section.truncated
    assert any("AGENTS.md: truncated to 12,345 characters" in n for n in result.notes)


def test_total_cap_later_files_get_remainder(tmp_path: Path) -> None:
    write(tmp_path, "AGENTS.md", "A" * 60)
    write(tmp_path, "SOUL.md", "S" * 60)
    write(tmp_path, "USER.md", "U" * 60)
    write(tmp_path, "MEMORY.md", "M" * 60)
    result = assemble_system_prompt(tmp_path, PromptOptions(per_file_chars=50, total_chars=120))
    text = result.text
    assert "A" * 50 in text and "A" * 51 not in text
    assert "S" * 50 in text and "S" * 51 not in text
    assert "U" * 20 in text and "U" * 21 not in text
    assert "total workspace-file limit 120 reached" in text
    assert "M" not in text.replace("MEMORY", "")
    assert "MEMORY.md: skipped: the total workspace-file limit of 120 characters is used up" in result.notes
    assert "MEMORY.md" not in result.files
    # Content characters of all workspace files stay within the total.
    shown = sum(len(run) for run in re.findall(r"A{10,}|S{10,}|U{10,}", text))
    assert shown == 120


# ---------------------------------------------------------------- skills


def test_skills_index_lines_sorted(ws: Path) -> None:
    skill(ws, "zeta", None, "# Zeta heading\n\nDoes zeta things.\nMore.\n")
    result = assemble_system_prompt(ws, PromptOptions())
    block = next(p for p in result.text.split("\n\n") if p.startswith("## Skills"))
    lines = [line for line in block.split("\n") if line.startswith("- ")]
    assert lines == [
        "- alpha: First skill (path: skills/alpha/SKILL.md)",
        "- beta: Second skill (path: skills/beta/SKILL.md)",
        "- zeta: Does zeta things. (path: skills/zeta/SKILL.md)",
    ]


def test_description_first_line_and_quotes() -> None:
    folded = "---\nname: 'fold'\ndescription: >\n\n  First line here.\n  Second line.\n---\nbody\n"
    assert parse_skill_file(folded, "x", "skills/x/SKILL.md").description == "First line here."
    literal = '---\nname: "lit"\ndescription: |-\n  Line one\n  Line two\nother: 1\n---\n'
    entry = parse_skill_file(literal, "x", "skills/x/SKILL.md")
    assert (entry.name, entry.description) == ("lit", "Line one")
    quoted = "---\nname: q\ndescription: \"Say \\\"hi\\\" please\"\n---\n"
    assert parse_skill_file(quoted, "x", "p").description == 'Say "hi" please'
    single = "---\nname: s\ndescription: 'it''s fine' # comment\n---\n"
    assert parse_skill_file(single, "x", "p").description == "it's fine"
    plain_comment = "---\nname: c # the name\ndescription: text\n---\n"
    assert parse_skill_file(plain_comment, "x", "p").name == "c"
    no_desc = "---\nname: nd\n---\n# Title\n\nFirst body line.\n"
    assert parse_skill_file(no_desc, "x", "p").description == "First body line."
    no_front = "\n# Heading\n\n  Plain first line  \n"
    entry = parse_skill_file(no_front, "folder-name", "p")
    assert (entry.name, entry.description) == ("folder-name", "Plain first line")
    crlf = "---\r\nname: w\r\ndescription: windows\r\n---\r\n"
    assert parse_skill_file(crlf, "x", "p").description == "windows"


def test_skills_binary_search_char_limit(tmp_path: Path) -> None:
    many = 200  # over the count limit (150) too: the character limit binds first
    for i in range(many):
        skill(tmp_path, f"s{i:03d}", f"skill-{i:03d}", f"Description number {i} " + "x" * (i % 37))
    cap = 2_000
    result = assemble_system_prompt(tmp_path, PromptOptions(skills_max_chars=cap, skills_max_candidates_per_root=many))
    block = next(p for p in result.text.split("\n\n") if p.startswith("## Skills"))
    section = next(s for s in result.sections if s.name == "skills")
    assert section.truncated and section.chars == len(block)
    assert len(block) <= cap
    shown = [line for line in block.split("\n") if line.startswith("- ")]
    assert 0 < len(shown) < 150
    assert block.endswith(f"+{many - len(shown)} more skills not listed")
    assert shown[0].startswith("- skill-000:")  # sorted, prefix kept
    # One more entry would not fit.
    entries = [parse_skill_file((tmp_path / f"skills/s{i:03d}/SKILL.md").read_text(), f"s{i:03d}",
                                f"skills/s{i:03d}/SKILL.md") for i in range(many)]
    assert format_skills_block(entries[: len(shown)], many - len(shown)) == block
    assert len(format_skills_block(entries[: len(shown) + 1], many - len(shown) - 1)) > cap
    assert any("skills index:" in n and "character limit 2,000" in n for n in result.notes)


def test_skills_count_limit() -> None:
    entries = [SkillEntry(name=f"n{i}", description="d", path=f"skills/n{i}/SKILL.md") for i in range(10)]
    index = build_skills_index(entries, max_count=3, max_chars=30_000)
    assert (index.shown, index.omitted, index.reason) == (3, 7, "count")
    assert index.text.endswith("+7 more skills not listed")
    everything = build_skills_index(entries, max_count=150, max_chars=30_000)
    assert (everything.shown, everything.omitted, everything.reason) == (10, 0, None)
    assert "more skills" not in everything.text


def test_skills_index_matches_linear_search() -> None:
    entries = [SkillEntry(name=f"k{i:02d}", description="w" * (i * 7 % 23), path=f"skills/k{i:02d}/SKILL.md")
               for i in range(40)]
    for cap in range(0, 1_400, 13):
        index = build_skills_index(entries, max_count=150, max_chars=cap)
        fitting = [k for k in range(41) if len(format_skills_block(entries[:k], 40 - k)) <= cap]
        expected = max(fitting) if fitting else None
        if expected is None:
            assert index.text == "" and index.shown == 0
        else:
            assert index.shown == expected
            assert len(index.text) <= cap


def test_skills_index_dropped_when_nothing_fits(tmp_path: Path) -> None:
    skill(tmp_path, "a", "a", "desc")
    result = assemble_system_prompt(tmp_path, PromptOptions(skills_max_chars=5))
    assert "## Skills" not in result.text
    assert any("skills index left out" in n for n in result.notes)


def test_skill_folder_without_skill_md(tmp_path: Path) -> None:
    (tmp_path / "skills" / "empty").mkdir(parents=True)
    skill(tmp_path, "ok", "ok", "fine")
    result = assemble_system_prompt(tmp_path, PromptOptions())
    assert "skills/empty/: no SKILL.md; skipped" in result.notes
    assert "- ok: fine (path: skills/ok/SKILL.md)" in result.text


# ---------------------------------------------------------------- confinement


def test_symlinked_agents_outside_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    secret = write(tmp_path, "outside/secret.txt", "TOP SECRET\n")
    (root / "AGENTS.md").symlink_to(secret)
    result = assemble_system_prompt(root, PromptOptions())
    assert "TOP SECRET" not in result.text
    assert "AGENTS.md" not in names(result)
    assert any(n.startswith("AGENTS.md: refused:") for n in result.notes)
    assert "AGENTS.md" not in result.files


def test_symlink_to_absolute_system_file_refused(tmp_path: Path) -> None:
    if not Path("/etc/passwd").exists():
        pytest.skip("no /etc/passwd")
    (tmp_path / "USER.md").symlink_to("/etc/passwd")
    result = assemble_system_prompt(tmp_path, PromptOptions())
    assert "root:" not in result.text
    assert any(n.startswith("USER.md: refused:") for n in result.notes)


def test_symlink_inside_workspace_allowed(tmp_path: Path) -> None:
    write(tmp_path, "docs/rules.md", "inner rules\n")
    (tmp_path / "AGENTS.md").symlink_to(tmp_path / "docs" / "rules.md")
    result = assemble_system_prompt(tmp_path, PromptOptions())
    assert "inner rules" in result.text


def test_skills_dir_symlinked_outside_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    outside = tmp_path / "elsewhere"
    skill(outside, "leak", "leak", "LEAKED DESCRIPTION")
    (root / "skills").symlink_to(outside / "skills")
    result = assemble_system_prompt(root, PromptOptions())
    assert "LEAKED" not in result.text
    assert any(n.startswith("skills/: refused:") for n in result.notes)


def test_single_skill_folder_symlinked_outside_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    skill(root, "good", "good", "fine")
    outside = tmp_path / "elsewhere"
    skill(outside, "leak", "leak", "LEAKED DESCRIPTION")
    (root / "skills" / "leak").symlink_to(outside / "skills" / "leak")
    result = assemble_system_prompt(root, PromptOptions())
    assert "LEAKED" not in result.text
    assert "- good: fine" in result.text
    assert any(n.startswith("skills/leak/: refused:") for n in result.notes)


def test_resolve_inside(tmp_path: Path) -> None:
    write(tmp_path, "a/b.md", "x")
    assert resolve_inside(tmp_path, "a/b.md") == (tmp_path / "a" / "b.md").resolve()
    assert resolve_inside(tmp_path, "not/yet/there.md").is_relative_to(tmp_path.resolve())
    for bad in ("../etc/passwd", "a/../../x", "a/../b.md", "/etc/passwd"):
        with pytest.raises(DagctxError) as info:
            resolve_inside(tmp_path, bad)
        assert info.value.kind == "WorkspaceEscape"
        assert info.value.path == bad
    (tmp_path / "link").symlink_to(tmp_path.parent)
    with pytest.raises(DagctxError) as info:
        resolve_inside(tmp_path, "link/anything")
    assert info.value.kind == "WorkspaceEscape"


# ---------------------------------------------------------------- determinism


def test_hash_stable_and_sensitive(ws: Path) -> None:
    opts = PromptOptions(agent_prompt="Inline.")
    first = assemble_system_prompt(ws, opts)
    second = assemble_system_prompt(ws, opts)
    assert first.text == second.text and first.hash == second.hash
    assert first.hash == hashlib.sha256(first.text.encode("utf-8")).hexdigest()
    write(ws, "MEMORY.md", "remembered other things\n")
    third = assemble_system_prompt(ws, opts)
    assert third.hash != first.hash
    # Only the tail changed: the prefix up to the memory block is byte-identical.
    prefix = first.text[: first.text.index("## Memory")]
    assert third.text.startswith(prefix)


def test_crlf_and_bom_normalised(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_bytes(b"\xef\xbb\xbfline one\r\nline two\r\n")
    crlf = assemble_system_prompt(tmp_path, PromptOptions())
    (tmp_path / "AGENTS.md").write_bytes(b"line one\nline two\n")
    lf = assemble_system_prompt(tmp_path, PromptOptions())
    assert crlf.text == lf.text and crlf.hash == lf.hash
    assert "\r" not in crlf.text and "\ufeff" not in crlf.text


def test_bounded_read_of_huge_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dagctx.context.system_prompt as sp

    monkeypatch.setattr(sp, "_READ_CEILING_BYTES", 64)
    write(tmp_path, "AGENTS.md", "é" * 1_000)  # 2,000 bytes; only a prefix is read
    result = assemble_system_prompt(tmp_path, PromptOptions(per_file_chars=10))
    assert "[… truncated: 10 characters of a 2,000-byte file shown — file AGENTS.md, per-file limit 10]" in result.text
    assert "\ufffd" not in result.text and not any("UTF-8" in n for n in result.notes)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "AGENTS.md")
    result = assemble_system_prompt(tmp_path, PromptOptions())
    assert "AGENTS.md: not a regular file; skipped" in result.notes


# ---------------------------------------------------------------- issue 13: hard links, swapped folders


def test_hard_linked_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    secret = write(tmp_path, "outside/secret.txt", "TOP SECRET\n")
    os.link(secret, root / "AGENTS.md")
    write(root, "SOUL.md", "kind\n")
    result = assemble_system_prompt(root, PromptOptions())
    assert "TOP SECRET" not in result.text and "kind" in result.text
    assert any(n.startswith("AGENTS.md: refused:") and "hard links" in n for n in result.notes), result.notes


def test_folder_swapped_for_a_symlink_after_the_check_is_not_followed(tmp_path: Path, monkeypatch) -> None:
    """The race of issue 13: the path check passed, then ``docs`` became a symlink to a
    folder outside. The descriptor walk opens each component with O_NOFOLLOW, so the
    open fails instead of reading the outside file."""
    from dagctx.context import workspace_files as sp

    root = tmp_path / "ws"
    write(root, "docs/AGENTS.md", "inside\n")
    write(tmp_path, "outside/AGENTS.md", "TOP SECRET\n")
    real_check = sp.resolve_inside

    def check_then_swap(r: object, rel: object) -> Path:
        result = real_check(r, rel)  # checked while docs/ is a real folder …
        (root / "docs" / "AGENTS.md").unlink()
        (root / "docs").rmdir()
        (root / "docs").symlink_to(tmp_path / "outside")  # … swapped before the open
        return result

    monkeypatch.setattr(sp, "resolve_inside", check_then_swap)
    read = sp.read_workspace_text(root.resolve(), "docs/AGENTS.md", 1000)
    assert read.text is None and read.status == "refused", read
    assert "symlink" in (read.note or "")


def test_skill_folder_with_an_undecodable_name_is_skipped_with_a_note(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    skill(root, "good", "good", "fine")
    bad = os.path.join(os.fsencode(root), b"skills", b"bad\xff")
    os.makedirs(bad)
    with open(os.path.join(bad, b"SKILL.md"), "w") as fh:
        fh.write("---\nname: bad\ndescription: x\n---\n")
    result = assemble_system_prompt(root, PromptOptions())
    assert "good" in result.text
    result.text.encode("utf-8")  # encodable: no surrogates reach the wire
    assert any("bad\\xff" in n for n in result.notes), result.notes
