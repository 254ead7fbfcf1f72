"""Stored text prints as stored: backslashes, brackets and emoji codes in a title or a
node's words come out of ``sessions``, ``history``, ``show`` and ``render`` unchanged, on
the quick paths and through rich (cli/ui.py ``escape``, consoles with ``emoji=False``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli import ok

TRICKY = "emoji :smile: path C:\\dir\\ x\\[y] \\[1] [bold]b[/bold] a\\\\[i]z end\\"
REPLY = "ok :thumbs_up: a\\"


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """Every command of this module goes to the module's shared daemon."""


def test_backslashes_brackets_and_emoji_codes_print_as_stored(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    src = tmp_path / "chat.json"
    src.write_text(json.dumps([{"id": "c1", "conversations": [{"from": "human", "value": TRICKY},
                                                             {"from": "gpt", "value": REPLY}]}]))
    ok("import", str(src), "--db", db)
    sid = json.loads(ok("sessions", "--db", db, "--json"))["sessions"][0]["sessionId"]
    head = json.loads(ok("history", sid, "--db", db, "--json"))["nodes"]
    user = next(n["id"] for n in head if n["role"] == "user")
    reply = next(n["id"] for n in head if n["role"] == "llm")
    for args in (("history", sid), ("render", sid), ("show", user), ("show", user, "--session", sid)):
        out = ok(*args, "--db", db)
        assert TRICKY in out, (args, out)
        assert "😄" not in out and "👍" not in out
    assert REPLY in ok("show", reply, "--db", db)  # a final backslash stays single
    assert REPLY in ok("history", sid, "--db", db)
    listing = ok("sessions", "--db", db)  # the quick path
    assert "emoji :smile: path C:\\dir\\ x\\[y]" in listing
