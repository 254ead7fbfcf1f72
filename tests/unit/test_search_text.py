"""A node's search text is built a piece at a time (``ledger/text.py``: other threads run
between pieces of a 50 MB text, SPEC §1.4) and is exactly the text built whole: every cut,
including cuts inside a JSON escape sequence, inside a multi-byte character and inside a
word, gives the same text."""

from __future__ import annotations

import re

import msgspec
import pytest

from dagctx.ledger import text as t
from dagctx.ledger.text import _json_pieces, _unescape, joined, node_text
from dagctx.protocol.nodes import Call

_ESCAPE = re.compile(r"\\(\\|[nrtbf]|u[0-9a-fA-F]{4})")


def _whole_json_text(value) -> str:
    """``_json_text`` as it was built before: one decode, one substitution."""
    return _ESCAPE.sub(_unescape, msgspec.json.encode(value).decode())


VALUES = [
    {"code": "x = 1;\nnodeRepl.write(x)\t\\n not a newline \\\\u0001 \x01\x1f \"q\" 迁移脚本 é 😀 \\"},
    ["a\\", "\\\\n", "\u0000\u0007\u001b", {"k": "v\r\n" * 3}, "数据库迁移" * 5, "ü" * 7],
    {"deep": [[["\\u00e9", "\\\\\\\"", "tab\there"]]], "n": 12345, "f": 1.5, "b": True, "z": None},
]


@pytest.mark.parametrize("value", VALUES)
def test_json_text_in_pieces_is_the_whole_text_for_every_cut(value) -> None:
    data = msgspec.json.encode(value)
    whole = _whole_json_text(value)
    assert t._json_text(value) == whole
    for piece in range(1, len(data) + 2):  # every piece size: every cut position is met
        assert _json_pieces(data, piece) == whole, piece


def test_joined_in_pieces_is_the_join() -> None:
    parts = ["bash", "", "ascii " * 7, "迁移 é 😀 " * 5, "x"]
    for piece in range(1, 40):
        for sep in ("\n", "", " | "):
            assert joined(parts, sep, piece) == sep.join(parts), (piece, sep)
    assert joined([], "\n", 1) == ""


def test_a_large_node_text_is_built_in_pieces_and_is_the_whole_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """``node_text`` of a code node whose output and input are larger than a piece: the same
    text as the plain join (a small piece, so a few kilobytes make many pieces)."""
    out = "".join(f"line {k}: src/mod_{k % 7}.py ok 迁移\n" for k in range(400))
    args = {"cmd": "grep -n \"x\\ny\" *.py", "lines": out.splitlines(), "esc": "\\u0041\\\\"}
    node = Call(id="c", seq=1, created_at=0.0, role="code", name="bash", input=args,
                output=[{"type": "text", "text": out}, {"type": "image", "url": "u"}, {"x": out[:500]}])
    whole = "\n".join(["bash", _whole_json_text(args),
                       "\n".join([out, "[image]", _whole_json_text({"x": out[:500]})])])
    monkeypatch.setattr(t, "PIECE", 64)
    # the default arguments were bound at definition: rebind them to the small piece
    monkeypatch.setattr(t, "_json_text", lambda v: _json_pieces(msgspec.json.encode(v), 64))
    monkeypatch.setattr(t, "joined", lambda parts, sep="\n": joined(parts, sep, 64))
    assert node_text(node) == whole
    user = Call(id="u", seq=2, created_at=0.0, role="user", input=None, output=out * 3)
    assert node_text(user) == out * 3


def _whole_grams(text: str) -> str:
    """``search.cjk_grams`` as it was built before: each regular expression over the whole text."""
    from dagctx.ledger.search import _TOKEN, CJK_RUN

    if text.isascii() or CJK_RUN.search(text) is None:
        return ""
    parts: list[str] = []
    for run in CJK_RUN.findall(text):
        parts.extend(run)
        parts.extend(run[i: i + 2] for i in range(len(run) - 1))
    for token in _TOKEN.findall(text):
        if CJK_RUN.search(token) and not CJK_RUN.fullmatch(token):
            parts.extend(p for p in CJK_RUN.split(token) if p)
    return " ".join(parts)


GRAM_TEXTS = [
    "我用Python编程 and 数据库迁移脚本\n迁移 src/a.py 数据x库_y迁移 ⺀⺁radicals・カタカナ・テスト",
    "no cjk at all, only é and — “quotes”\nsecond line",
    "数据库迁移脚本" * 9 + "Python" + "编程" * 5,  # one long token without a space
    " 迁 \n移 a迁b \n\n ",
    "ascii only, nothing to add",
]


@pytest.mark.parametrize("text", GRAM_TEXTS)
def test_cjk_grams_in_pieces_are_the_whole_grams(text: str) -> None:
    from dagctx.ledger.search import cjk_grams

    whole = _whole_grams(text)
    assert cjk_grams(text) == whole
    for piece in range(1, len(text) + 2):  # every cut: after a space or newline, or none
        assert cjk_grams(text, piece) == whole, piece
    assert bool(whole) == ("迁" in text or "⺀" in text)  # the texts with CJK give grams
