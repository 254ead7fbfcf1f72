"""The artifact trail of a compaction summary (SPEC §8): which files the summarized tool
calls changed, the previous summary's carried over, named on the summary's last line."""

from __future__ import annotations

import json

from dagctx.context import artifact_trail as at
from dagctx.context.view import Item

PATCH = ("*** Begin Patch\n*** Update File: src/app.py\n@@\n-a\n+b\n*** Add File: docs/new.md\n+hi\n"
         "*** Delete File: old/gone.txt\n*** End Patch")


def call(name: str, args: object, n: int = 0) -> Item:
    return Item(kind="tool_call", node_id=f"c{n}", role="assistant", seq=n, name=name, input=args)


def test_which_calls_change_which_files() -> None:
    assert at.changed_files("Edit", {"file_path": "/w/lib/a.ex", "old_string": "x", "new_string": "y"}) == ["/w/lib/a.ex"]
    assert at.changed_files("Write", json.dumps({"file_path": "/w/config.exs", "content": "c"})) == ["/w/config.exs"]
    assert at.changed_files("NotebookEdit", {"notebook_path": "n.ipynb"}) == ["n.ipynb"]
    assert at.changed_files("str_replace_editor", {"command": "create", "path": "/repo/x.py"}) == ["/repo/x.py"]
    # reading is not changing: a viewer command, a read tool, a search naming a path
    assert at.changed_files("str_replace_editor", {"command": "view", "path": "/repo/x.py"}) == []
    assert at.changed_files("Read", {"file_path": "/w/lib/a.ex"}) == []
    assert at.changed_files("Grep", {"path": "/w", "pattern": "Edit"}) == []
    # a patch names its files, under any tool, also inside a shell command's arguments
    assert at.changed_files("apply_patch", {"input": PATCH}) == ["src/app.py", "docs/new.md", "old/gone.txt"]
    assert at.changed_files("shell", {"command": ["apply_patch", PATCH]}) == ["src/app.py", "docs/new.md",
                                                                              "old/gone.txt"]
    assert at.changed_files("apply_patch", PATCH) == ["src/app.py", "docs/new.md", "old/gone.txt"]


def test_the_trail_carries_the_previous_summarys_files_and_replaces_a_copied_line() -> None:
    earlier = f"[summary]\nDid things.\n\n{at.TRAIL_PREFIX} a.py, b.py"
    items = [Item(kind="summary", node_id="s", role="user", seq=1, text=earlier),
             call("Edit", {"file_path": "c.py"}, 2), call("Write", {"file_path": "a.py"}, 3),
             call("Read", {"file_path": "z.py"}, 4)]
    files = at.trail_files(items)
    assert files == ["a.py", "b.py", "c.py"]
    body = at.with_trail(f"What happened.\n{at.TRAIL_PREFIX} a.py", files)
    assert body == f"What happened.\n\n{at.TRAIL_PREFIX} a.py, b.py, c.py"
    assert at.previous_trail(body) == files
    # nothing changed: the summary is left as written
    assert at.with_trail("Just chat.", []) == "Just chat."


def test_at_most_max_files_the_most_recent_kept() -> None:
    items = [call("Write", {"file_path": f"f{k}.txt"}, k) for k in range(at.MAX_FILES + 5)]
    files = at.trail_files(items)
    assert len(files) == at.MAX_FILES and files[0] == "f5.txt" and files[-1] == f"f{at.MAX_FILES + 4}.txt"


def _strings_as_before(value: object) -> list[str]:
    """``artifact_trail._strings`` as it was written before (a generator per container)."""
    def walk(v: object):  # type: ignore[no-untyped-def]
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from walk(x)
        elif isinstance(v, list):
            for x in v:
                yield from walk(x)
    return list(walk(value))


def test_the_strings_of_arguments_are_read_as_before() -> None:
    patch = "*** Begin Patch\n*** Update File: src/a.py\n@@\n*** Add File: b.md\n*** End Patch"
    shapes: list[object] = [
        "plain", patch, None, 3, ("tuple", "ignored"), {"k": "v", "n": 1, "t": ("x",)},
        {"cmd": ["bash", "-lc", f"apply_patch <<'EOF'\n{patch}\nEOF"], "env": {"A": "1", "B": [["deep", {"k": "***"}]]}},
        [{"a": "1"}, ["2", ["3", {"b": "4"}]], "5"], {"***": "keys are not read"}, [], {},
    ]
    for value in shapes:
        assert at._strings(value) == _strings_as_before(value)
    assert at.changed_files("shell", {"command": ["bash", "-lc", patch]}) == ["src/a.py", "b.md"]
    assert at.changed_files("shell", {"command": "echo '*** not a patch'"}) == []


def test_the_trail_read_with_the_bodies_is_the_trail() -> None:
    """Given each item's transcript body, calls of no writing tool whose JSON arguments
    hold no "*** " are passed over: the same files, for every kind of call."""
    from dagctx.context.summary_transcript import item_body

    escaped = json.dumps({"input": PATCH}).replace("*", "\\u002a")  # a patch only once decoded
    args: list[object] = [
        {"file_path": "/w/a.ex", "old_string": "x"}, {"command": "view", "path": "/r/v.py"},
        {"command": "create", "path": "/r/x.py"}, {"input": PATCH}, {"command": ["apply_patch", PATCH]},
        [PATCH, {"nested": {"deeper": [PATCH]}}], PATCH, escaped, json.dumps({"file_path": "/w/s.txt"}),
        {"note": "*** not a patch"}, {"k": "no star"}, [], {}, None, "plain text", {"path": "/r/read.py"},
    ]
    names = ["Edit", "str_replace_editor", "str_replace_editor", "apply_patch", "shell", "bash", "apply_patch",
             "exec", "Write", "bash", "bash", "bash", "bash", "bash", "bash", "Read", " EDIT ", None, "write_file"]
    items = [Item(kind="summary", node_id="s", role="user", seq=0,
                  text=f"[summary]\nearlier\n\n{at.TRAIL_PREFIX} z.py, a.py")]
    n = 1
    for name in names:
        for a in args:
            items.append(call(name or "", a, n) if name is not None else
                         Item(kind="tool_call", node_id=f"c{n}", role="assistant", seq=n, name=None, input=a))
            n += 1
    items.append(Item(kind="text_pair", node_id="tp", role="assistant", seq=n, name="apply_patch", part="call",
                      input={"input": PATCH}, text="call"))
    bodies = [item_body(it) for it in items]
    assert at.trail_files(items, bodies) == at.trail_files(items)
    assert len(at.trail_files(items)) > 5
    # one call at a time as well
    for it, body in zip(items, bodies):
        assert at.trail_files([it], [body]) == at.trail_files([it])
