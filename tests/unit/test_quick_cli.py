"""``dagctx sessions``' quick path (cli/quick.py) draws what rich draws, or steps aside.

The quick path answers without importing rich; these tests hold its table, title and
"more" line byte-equal to rich's for the same rows at many widths, on a terminal and in
a pipe, and check that it declines (None) exactly where it cannot be equal.
"""

from __future__ import annotations

import io

from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from dagctx.cli import quick
from dagctx.cli.cmd_sessions import sessions_table

ASCII = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=70)


def rich_text(renderable: object, width: int, styled: bool) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=styled, color_system="standard" if styled else None,
            soft_wrap=False, emoji=False).print(renderable)
    return buf.getvalue()


row = st.tuples(
    st.uuids().map(str) | st.text(alphabet="abcdef0123456789-", min_size=1, max_size=40),
    ASCII,
    st.integers(0, 10**7).map(str),
    st.sampled_from(["2026-12-01 18:00", "1970-01-01 00:00"]),
    st.sampled_from(["", "0c8e1a3e", "toolu_01NUB6cF"]),
    st.sampled_from(["native", "claude-code", "codex", "openhands"]),
).map(list)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(row, max_size=6), width=st.integers(60, 220), styled=st.booleans(),
       total=st.integers(0, 10**6), db=st.text(alphabet="abc/._-0123456789", min_size=1, max_size=120))
def test_the_table_equals_richs_or_the_quick_path_steps_aside(rows: list[list[str]], width: int, styled: bool,
                                                               total: int, db: str) -> None:
    title = f"{total} sessions in {db}"
    mine = quick.table(title, rows, width, max(16, width - 103), styled=styled)
    if mine is not None:
        assert mine == rich_text(sessions_table(title, rows, width), width, styled)


def test_the_common_table_is_drawn_here_in_a_pipe_and_on_a_terminal() -> None:
    rows = [["0c8e1a3e-9a35-4b7a-8f5e-0a8c6c7a1e2b", "a title long enough to be cut by the column's maximum width",
             "12", "2026-12-01 18:00", "0c8e1a3e", "native"],
            ["5f0c", "short", "1234", "2026-12-01 18:00", "", "claude-code"]]
    for width, styled in ((140, False), (120, True), (200, True)):
        mine = quick.table("2 sessions in /tmp/x.db", rows, width, max(16, width - 103), styled=styled)
        assert mine is not None, (width, styled)
        assert mine == rich_text(sessions_table("2 sessions in /tmp/x.db", rows, width), width, styled)
    assert "…" in quick.table("t", rows, 140, 37)  # the long title was cut, as rich cuts it


def test_it_steps_aside_where_rich_measures_or_reads_markup() -> None:
    row = ["5f0c", "重构缓存", "1", "2026-12-01 18:00", "", "native"]
    assert quick.table("1 sessions in /x", [row], 140, 37) is None  # wide characters
    assert quick.table("1 sessions in /x[1]", [], 140, 37) is None  # markup in the title
    assert quick.table("1 sessions in /x", [["5f0c", "t", "1", "d", "h", "native"]], 60, 16) is None  # too narrow

    # backslashes, brackets and emoji codes print as stored on both paths (ui.escape, emoji=False)
    for text in ("a \\[1] b", "x\\[y", "\\[", "ends \\", ":smile: :100:", "a \\[b] c", "a [b]", "a \\ b"):
        rows = [["5f0c", text, "1", "d", "h", "native"]]
        mine = quick.table("1 sessions in /x", rows, 140, 37)
        assert mine is not None and text in mine, text
        assert mine == rich_text(sessions_table("1 sessions in /x", rows, 140), 140, False)
        shown = quick.node_text("node 0 in s (0c8e)", [("role", "user"), ("name", text)], [("output", text)], 80)
        assert shown is not None and shown.count(text) == 2, text
        assert shown == rich_show("node 0 in s (0c8e)", [("role", "user"), ("name", text)], [("output", text)], 80,
                                  False)


def test_the_more_line_equals_richs() -> None:
    for styled in (False, True):
        buf = io.StringIO()
        Console(file=buf, width=140, force_terminal=styled, color_system="standard" if styled else None,
                soft_wrap=False).print("… 17 more (--limit)")
        assert quick.more_line(17, styled=styled) == buf.getvalue()


def test_only_its_own_arguments_take_the_quick_path() -> None:
    assert quick.parse(["sessions"]) == {"db": None, "limit": 50, "json": False}
    assert quick.parse(["--db", "x.db", "sessions", "--limit", "5", "--json"]) == {"db": "x.db", "limit": 5, "json": True}
    assert quick.parse(["sessions", "--db=y.db", "--limit=7"]) == {"db": "y.db", "limit": 7, "json": False}
    for argv in (["sessions", "--source", "codex"], ["sessions", "-h"], ["sessions", "--standalone"],
                 ["show", "sessions"], ["sessions", "sessions"], ["sessions", "--limit", "x"], ["history", "s"]):
        assert quick.parse(argv) is None, argv


# ---------------------------------------------------------------- dagctx show


def rich_show(title: str, rows: list[tuple[str, str]], sections: list[tuple[str, str]], width: int,
              styled: bool) -> str:
    from dagctx.cli.cmd_sessions import node_table
    from dagctx.cli.ui import escape

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=styled, color_system="standard" if styled else None,
                      soft_wrap=False, emoji=False)
    console.print(node_table(title, rows))
    for label, text in sections:  # as cmd_show prints them
        console.print(f"[bold]{label}[/bold]")
        console.print(escape(text), markup=True, highlight=False, soft_wrap=True)
    return buf.getvalue()


CELL = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("é—…’“ü×"),
               max_size=300) | st.sampled_from(
    ["—", "", "2026-12-01 18:00", '{"timestamp":1778500076.074,"model":"gpt-5","usage":{"input":12}}',
     "a b  c   " + "x" * 90 + "  d", "call_" + "Q" * 250, ":smile: and :100:", "[bold]not markup[/bold]"])
BODY = st.text(alphabet=st.characters(min_codepoint=9, max_codepoint=0x2FF), max_size=400) | st.sampled_from(
    ["line 1\n  line 2   \n", "ends with a backslash \\", "[red]x[/red] and \\[y]", "✓ done", "a" * 300 + "   "])


@settings(max_examples=60, deadline=None)
# the cases random draws reach least often: values with leading spaces, or runs of spaces past
# the column (wrap_fold drops the trailing spaces), and a section line past the width that ends
# in a space (rich drops it: stepped aside)
@example(ref="0c8e", session_title="t", values=["x" * 20 + "     " * 6 + "  y  z", "  a", "b", "c", "d", "e", "f"],
         bodies=[], width=40, styled=False)
@example(ref="0c8e", session_title="t", values=["a", "b", "c", "d", "e", "f", "g"],
         bodies=["fits", "w" * 60 + " "], width=50, styled=True)
@given(ref=st.text(alphabet="abcdef0123456789-", min_size=1, max_size=40), session_title=CELL,
       values=st.lists(CELL, min_size=7, max_size=9), bodies=st.lists(BODY, max_size=2),
       width=st.integers(30, 220), styled=st.booleans())
def test_show_equals_richs_or_the_quick_path_steps_aside(ref: str, session_title: str, values: list[str],
                                                         bodies: list[str], width: int, styled: bool) -> None:
    fields = ["role", "name", "status", "seq", "created", "caller", "predecessor", "reads", "metadata"]
    rows = list(zip(fields, values))
    sections = list(zip(["input", "output"], bodies))
    title = f"node {ref} in {session_title} (0c8e1a3e-9a35-4b7a-8f5e-0a8c6c7a1e2b)"
    mine = quick.node_text(title, rows, sections, width, styled=styled)
    if mine is not None:
        assert mine == rich_show(title, rows, sections, width, styled)


def test_a_common_node_is_drawn_here_folded_in_a_pipe_and_on_a_terminal() -> None:
    meta = '{"timestamp":1778500076.074,"reasoning":[{"type":"reasoning","encryptedContent":"' + "gAAAAB" * 60 + '"}]}'
    rows = [("role", "llm"), ("name", "unknown"), ("status", "completed"), ("seq", "62"),
            ("created", "2026-05-11 11:47"), ("caller", "—"), ("predecessor", "codex-89"), ("metadata", meta)]
    sections = [("output", "I could not inspect the tab.\n\n**8-Minute Demo**\n- filters by time period")]
    for width, styled in ((140, False), (80, True), (200, False)):
        title = "node codex-98 in analyze transcript (d993d1a6-1ca0-45cc-8460-aa01add34b65)"
        mine = quick.node_text(title, rows, sections, width, styled=styled)
        assert mine is not None, (width, styled)
        assert mine == rich_show(title, rows, sections, width, styled)
        assert mine.count("\n") > 12  # the metadata was folded over several lines


def test_wrap_fold_cuts_long_words_and_keeps_short_ones_whole() -> None:
    assert quick.wrap_fold("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]
    assert quick.wrap_fold("x" * 10, 4) == ["xxxx", "xxxx", "xx"]
    assert quick.wrap_fold("", 5) == [""]
