"""A node's search text is built a piece at a time (``ledger/text.py``: other threads run
between pieces of a 50 MB text, SPEC §1.4) and is exactly the text built whole: every cut,
including cuts inside a JSON escape sequence, inside a multi-byte character and inside a
word, gives the same text."""

from __future__ import annotations

import re
from typing import Any

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


def test_small_document_vectors_are_the_full_build() -> None:
    """``document_vector``'s quick build of a small document gives the literal the full
    build gives (random texts of accents, CJK, repeated words, quotes and backslashes, up
    to past the quick build's token limit), and steps aside for a lexeme over PostgreSQL's
    limit."""
    import random

    from dagctx.ledger import pg_search
    from dagctx.ledger import search as fts

    rng = random.Random(3)
    words = ["Résumé", "naïve", "数据库", "迁移", "it's", "a\\b", "x", "ＡＢＣ", "ǅemal", "Ⱥ", "src/app.py", "😀", "7"]
    for _ in range(400):
        text = " ".join(rng.choices(words, k=rng.randint(0, 150)))
        grams = fts.cjk_grams(text)
        assert pg_search.document_vector(text, grams) == pg_search._vector(text, grams, 1 << 40), text
    long_word = "y" * (pg_search.MAX_LEXEME_BYTES + 1)
    assert pg_search._small_vector(long_word, "") is None
    assert pg_search.document_vector(long_word, "") == pg_search._vector(long_word, "", 1 << 40)


def test_cjk_grams_match_the_whole_grams_on_random_texts() -> None:
    """Random mixes of CJK (unigrams, radicals, kana with its punctuation, astral), Latin
    letters and digits, underscores, spaces and punctuation: the grams are the ones the
    straightforward build gives (bigrams, tokens glued to CJK, runs at token edges)."""
    import random

    from dagctx.ledger.search import cjk_grams

    rng = random.Random(5)
    alphabet = ["中", "文", "迁", "移", "⺀", "・", "カ", "ー", "한", "\U00020000", "a", "Z", "é", "7", "_", " ", "\n",
                "，", "。", ".", "/", "-", "😀"]
    for _ in range(500):
        weights = [rng.random() for _ in alphabet]
        text = "".join(rng.choices(alphabet, weights, k=rng.randint(0, 120)))
        assert cjk_grams(text) == _whole_grams(text), ascii(text)


SURROGATES = "a\ud800\udc00b\udfff\ud83d" + "é—中😀\x00" * 3


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 64])
def test_utf8_in_pieces_is_the_whole_encoding(piece: int) -> None:
    """``text.utf8`` (what the backends bind for a large text) gives the bytes of one
    ``encode``: strict for SQLite, ``surrogatepass`` for PostgreSQL's BYTEA, where a lone
    surrogate next to a cut is written as it is written whole."""
    mixed = "".join(f"ligne {k} déjà — “q” 第{k}行 😀\x00\n" for k in range(50))
    for text in (mixed, "plain ascii " * 20, ""):
        assert t.utf8(text, piece=piece) == text.encode("utf-8")
    assert t.utf8(SURROGATES, "surrogatepass", piece) == SURROGATES.encode("utf-8", "surrogatepass")
    with pytest.raises(UnicodeEncodeError):
        t.utf8(SURROGATES, piece=piece)  # as a str bind refuses it


def test_a_large_non_ascii_text_is_stored_in_sqlite_as_the_same_text(fresh_sqlite, tmp_path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A spilled non-ASCII output bound as UTF-8 bytes into ``CAST(? AS TEXT)`` is stored as
    the very TEXT a ``str`` bind stores (type, bytes), reads back as the same ``str`` and is
    found by search; the store compared binds every text as a ``str``."""
    import shutil
    import sqlite3

    from dagctx.ledger import Store
    from dagctx.ledger import sqlite_backend

    output = "".join(f"ligne {k} : déjà vérifié — “build” 第{k}行编译成功 😀\x00\n" for k in range(2_000))
    other = tmp_path / "str-bound.db"
    shutil.copyfile(fresh_sqlite, other)
    ids = {}
    encoded: list[int] = []

    def counted(text: str) -> bytes:
        encoded.append(len(text))
        return t.utf8(text)

    monkeypatch.setattr(sqlite_backend, "utf8", counted)
    for path, piece in ((fresh_sqlite, 64), (other, 1 << 40)):
        monkeypatch.setattr(sqlite_backend, "PIECE", piece)  # 64: every text here is bound as bytes
        encoded.clear()
        store = Store(path)
        try:
            sid, node = append_spilled(store, output)
            ids[path] = node.id
            assert (len(encoded) >= 3) == (piece == 64), encoded  # the blob, the text, the grams
        finally:
            store.close()
    rows = []
    for path in (fresh_sqlite, other):
        db = sqlite3.connect(path)
        rows.append((
            db.execute("SELECT typeof(data), hex(data) FROM blobs WHERE node_id=?", (ids[path],)).fetchone(),
            db.execute("SELECT typeof(text), hex(text), typeof(grams), hex(grams) FROM search "
                       "WHERE node_id=?", (ids[path],)).fetchone(),
        ))
        db.close()
    assert rows[0] == rows[1]
    assert rows[0][0][0] == rows[0][1][0] == rows[0][1][2] == "text"


def append_spilled(store: Any, output: str, word: str = "编译") -> tuple[str, Any]:
    """A session ``s1`` of ``store`` with a user turn and a tool result of ``output``, which
    must spill, read back whole and be found by ``word``: the session id and the node."""
    from dagctx.protocol.nodes import NodeInput

    sid = store.create_session("t", session_id="s1").session_id
    u = store.append(sid, NodeInput(role="user", input="go", predecessor=store.head(sid))).node
    node = store.append(sid, NodeInput(role="code", name="bash", caller=u.id, output=output)).node
    assert "spill" in node.metadata
    assert store.full_output(sid, node) == output
    assert [h.node_id for h in store.search(word, session_id=sid)] == [node.id]
    return sid, node


@pytest.mark.parametrize("piece", [1, 7, 64, 1000])
def test_pg_tokens_and_document_vector_in_pieces_are_the_whole_ones(piece: int) -> None:
    """PostgreSQL's tokens of a long text are split a piece at a time (cut after a space or
    a newline) and its document vector reads them a piece at a time: the same tokens, the
    same vector as whole (SPEC §1.4)."""
    from dagctx.ledger import pg_search
    from dagctx.ledger import search as fts

    long = piece >= 64  # the tiny pieces cut a shorter text (every cut is the same code; a third of a second)
    text = "".join(f"Ligne {k} déjà-vérifié — “Build” 第{k}行编译 😀 x{k % 7}\n  tail{k}"
                   for k in range(3_000 if long else 400))
    whole = pg_search.tokens(text, piece=1 << 40)
    assert pg_search.tokens(text, piece=piece) == whole and len(whole) > (20_000 if long else 2_000)
    grams = fts.cjk_grams(text)
    vec = pg_search.document_vector(text, grams, piece=1 << 40)
    assert pg_search.document_vector(text, grams, piece=piece) == vec
    assert not vec[1]  # incomplete: 400 of a word pass the 128 positions a lexeme keeps, 3,000 PostgreSQL's last
    short = text[:2_000]
    assert pg_search.document_vector(short, fts.cjk_grams(short), piece=piece) == \
        pg_search.document_vector(short, fts.cjk_grams(short), piece=1 << 40)
