"""Search on PostgreSQL with SQLite's semantics: the same tokens, the same query language.

The token preparation is shared, not copied: documents go through ``search.cjk_grams``
and queries through ``search.fts_query`` exactly as on SQLite. What SQLite's FTS5 then
does itself is done here, in Python:

* ``tokens`` splits text the way FTS5's ``unicode61 remove_diacritics 2`` does, from a
  table read out of SQLite (``unicode61.py``), so a word is the same word on both.
* ``document_vector`` writes a ``tsvector`` literal: the ``text`` column's tokens with
  weight A at odd positions, the ``grams`` column's with weight B at even ones (weights
  keep the columns apart, interleaving keeps their positions distinct; a phrase is a
  chain of ``<2>``). PostgreSQL keeps positions up to 16,383 and 256 per lexeme (128
  per column here), so a phrase past the first ~8,000 tokens of one huge document, or
  past a word's 128th occurrence, may be missed; single words are always found.
* ``parse`` reads the FTS5 expression (phrases, ``prefix*``, ``col : …`` filters,
  implicit AND, AND/OR/NOT with FTS5's precedence, NEAR groups, parentheses) and writes
  a ``tsquery`` literal. ``NEAR(a b, N)`` of two words becomes every ``<k>`` distance up
  to N+1 in both orders; a NEAR group of more phrases is read as AND of them. A document
  too big to keep every position is matched by a position-free superset of the query and
  then checked exactly against its whole text (``verify``), so it is never missed.
  Syntax FTS5 rejects is rejected here too (``InvalidQuery``).

No dictionary or stemmer runs: lexemes are given literally (``::tsvector`` /
``::tsquery`` casts), so nothing Debian does not package is needed.

Architecture Invariant: pure functions; no SQL runs here.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from dagctx.protocol.errors import DagctxError

from .search import SCAN_PIECE, _pieces
from .unicode61 import FOLD, LAST_CODEPOINT, TOKEN_RANGES

_STARTS = [a for a, _ in TOKEN_RANGES]
_ENDS = [b for _, b in TOKEN_RANGES]
MAX_POS = 16383
#: PostgreSQL refuses lexemes of 2 KB or more; FTS5 has no such limit (nobody searches them).
MAX_LEXEME_BYTES = 2046
#: a tsvector must stay under 1 MB; beyond this budget new lexemes are left out.
MAX_VECTOR_BYTES = 900_000


def is_token_char(ch: str) -> bool:
    cp = ord(ch)
    if cp > LAST_CODEPOINT:
        return True
    i = bisect.bisect_right(_STARTS, cp) - 1
    return i >= 0 and cp <= _ENDS[i]


def _char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


#: a run of token characters (``TOKEN_RANGES`` and everything past ``LAST_CODEPOINT``),
#: so splitting runs at C speed: a 50 MB output is tokenized in seconds, not minutes
_TOKEN_RUN = re.compile(f"[{_char_class(TOKEN_RANGES)}\\U{LAST_CODEPOINT + 1:08x}-\\U0010ffff]+")
#: the same for text without characters beyond U+FFFF (almost all): a class the regex
#: engine keeps as one bitmap, four times faster
_TOKEN_RUN_BMP = re.compile(
    f"[{_char_class(tuple((a, min(b, 0xFFFF)) for a, b in TOKEN_RANGES if a <= 0xFFFF))}]+")
_ASTRAL = re.compile("[\\U00010000-\\U0010ffff]")


_FOLD_BMP: list[int] = []


def _fold_bmp() -> list[int]:
    """``FOLD`` as a list by code point of the Basic Multilingual Plane: ``str.translate``
    looks each character up, and a dict answers a character it does not map (every CJK
    one) by raising KeyError inside, three times the time of a list index (12 us instead
    of 32 us for the grams of a 120-character Chinese message). Built on first use."""
    global _FOLD_BMP
    if not _FOLD_BMP:
        _FOLD_BMP = [FOLD.get(c, c) for c in range(0x10000)]
    return _FOLD_BMP


def token_pieces(text: str, piece: int = SCAN_PIECE) -> Iterator[list[str]]:
    """FTS5 ``unicode61 remove_diacritics 2`` tokens of ``text``, folded (``is_token_char``
    decides what a token character is; ``FOLD`` what it becomes), a list per piece.

    A long text is split ``piece`` characters at a time, each cut after a space or a
    newline (no token spans one): over 50 MB of accented text one ``findall`` and one
    ``translate`` held the interpreter lock for seconds, and freeing one list of its
    millions of tokens a third of a second (SPEC §1.4). The same tokens, in order."""
    for chunk in _pieces(text, piece):
        astral = _ASTRAL.search(chunk) is not None
        runs = (_TOKEN_RUN if astral else _TOKEN_RUN_BMP).findall(chunk)
        if runs:
            # NUL is no token character and FOLD never maps it: fold every run in one pass
            part = [t for t in "\x00".join(runs).translate(FOLD if astral else _fold_bmp()).split("\x00") if t]
            if part:
                yield part


def tokens(text: str, piece: int = SCAN_PIECE) -> list[str]:
    """Every token of ``text`` (``token_pieces`` joined): for queries and short texts."""
    out: list[str] = []
    for part in token_pieces(text, piece):
        out.extend(part)
    return out


def _lexeme(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


#: a column of at most this many tokens cannot give one lexeme more positions than
#: PostgreSQL keeps (128 per column, ``document_vector``)
SMALL_COLUMN_TOKENS = 128
#: the characters of a document small enough for ``_small_vector`` (text and grams): a
#: column has fewer tokens than characters, so none reaches a position past ``MAX_POS``
SMALL_DOCUMENT_CHARS = 16 * SMALL_COLUMN_TOKENS


def document_vector(text: str, grams: str, piece: int = SCAN_PIECE) -> tuple[str, bool]:
    """The ``tsvector`` literal of one document (``text`` tokens weight A, ``grams`` weight B)
    and whether it holds every position (False for a huge document: see ``verify``).
    Tokens are read a piece at a time (``token_pieces``): a list of a huge text's tokens
    is never built."""
    if len(text) + len(grams) <= SMALL_DOCUMENT_CHARS:
        small = _small_vector(text, grams)
        if small is not None:
            return small, True
    return _vector(text, grams, piece)


#: the position of a small document's i-th token of each column, as the literal writes it
_LABELS = {w: [f"{first + 2 * i}{w}" for i in range(SMALL_DOCUMENT_CHARS)] for w, first in (("A", 1), ("B", 2))}


def _small_vector(text: str, grams: str) -> str | None:
    """``_vector``'s literal of a document that meets none of its limits (every appended
    message, most tool results, CJK ones included), built with a fraction of the work a
    token: no lexeme is too long, the literal stays small, no lexeme has more than 128
    positions in a column (what PostgreSQL keeps), none is past ``MAX_POS`` (the document
    is short). The lexemes and their positions come in the same order, so the literal is
    the same. None: a limit may apply."""
    entries: dict[str, list[str]] = {}
    count = 0
    for weight, column in (("A", text), ("B", grams)):
        toks = tokens(column)
        if len(toks) > SMALL_COLUMN_TOKENS and max(Counter(toks).values()) > SMALL_COLUMN_TOKENS:
            return None
        count += len(toks)
        get = entries.get
        for tok, label in zip(toks, _LABELS[weight]):
            plist = get(tok)
            if plist is None:
                entries[tok] = [label]
            else:
                plist.append(label)
    keys = "\x00".join(entries)
    size = 2 * count + len(keys.encode()) - len(entries) + 1 + 8 * len(entries)
    if size > MAX_VECTOR_BYTES or any(len(tok) * 4 > MAX_LEXEME_BYTES and len(tok.encode()) > MAX_LEXEME_BYTES
                                      for tok in entries):
        return None
    if "'" in keys or "\\" in keys:
        return " ".join(f"{_lexeme(t)}:{','.join(p)}" for t, p in entries.items())
    return " ".join([f"'{t}':{','.join(p)}" for t, p in entries.items()])


def _vector(text: str, grams: str, piece: int) -> tuple[str, bool]:
    """``document_vector`` of any document: each limit of PostgreSQL's applied as it is met."""
    entries: dict[str, list[str]] = {}
    size = 0
    complete = True
    for weight, column, first in (("A", text, 1), ("B", grams, 2)):
        # Interleaved positions (text odd, grams even): PostgreSQL keeps one entry per
        # position, so the two columns must never share one; phrases step by 2. Each
        # column gets half of the 256 positions PostgreSQL keeps per lexeme.
        used: dict[str, int] = {}
        # Tokens past PostgreSQL's last position all sit at MAX_POS, where one entry per
        # lexeme is all PostgreSQL keeps: only their distinct lexemes are walked.
        cut = max(0, (MAX_POS - first) // 2 + 1)
        head: list[str] = []
        tail: dict[str, None] = {}
        for part in token_pieces(column, piece):
            room = cut - len(head)
            if room > 0:
                head.extend(part[:room])
            if len(part) > room:
                tail.update(dict.fromkeys(part[max(room, 0):]))
        for i, tok in enumerate(head):
            plist = entries.get(tok)
            if plist is None:
                nbytes = len(tok.encode())
                if nbytes > MAX_LEXEME_BYTES or size + nbytes + 8 > MAX_VECTOR_BYTES:
                    complete = False
                    continue
                size += nbytes + 8
                plist = entries[tok] = []
            n = used.get(tok, 0)
            pos = first + 2 * i
            if n < 128:
                used[tok] = n + 1
                plist.append(f"{min(pos, MAX_POS)}{weight}")
                size += 2
            if n >= 128 or pos > MAX_POS:
                complete = False
        if tail:
            complete = False
        for tok in tail:
            plist = entries.get(tok)
            if plist is None:
                nbytes = len(tok.encode())
                if nbytes > MAX_LEXEME_BYTES or size + nbytes + 8 > MAX_VECTOR_BYTES:
                    continue
                size += nbytes + 8
                plist = entries[tok] = []
            if used.get(tok, 0) < 128:
                used[tok] = used.get(tok, 0) + 1
                plist.append(f"{MAX_POS}{weight}")
                size += 2
    return " ".join(f"{_lexeme(t)}:{','.join(p)}" for t, p in entries.items()), complete


# ---------------------------------------------------------------- the FTS5 expression


@dataclass
class Phrase:
    words: list[str]
    prefix: bool = False
    column: str | None = None  # None: any column; "text" or "grams"


@dataclass
class Near:
    """``NEAR(a b, N)``: both phrases in one column, at most N tokens between them."""

    left: Phrase
    right: Phrase
    distance: int = 10


@dataclass
class Op:
    op: str  # "&", "|", "!" (a NOT b = a & !b)
    left: object
    right: object


_LEX = re.compile(r'\s*(?:(?P<str>"(?:[^"]|"")*")|(?P<op>[():,*{}+^-])|(?P<word>[^\s():,*{}+^"-]+))')
_COLUMNS = ("text", "grams")


def _invalid(expr: str, why: str) -> DagctxError:
    return DagctxError(
        "InvalidQuery",
        f"the search query is not valid full-text syntax ({why} in {expr!r}); quote phrases "
        'with "…", balance parentheses, and put AND/OR/NOT between terms',
        path="query",
    )


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while pos < len(expr):
            if expr[pos:].strip() == "":
                break
            m = _LEX.match(expr, pos)
            if m is None or m.end() == pos:
                raise _invalid(expr, f"unexpected {expr[pos:pos + 10]!r}")
            kind = m.lastgroup or "op"
            self.toks.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str] | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _invalid(self.expr, "unexpected end")
        self.i += 1
        return tok

    def is_word(self, value: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok is not None and tok[0] == "word" and tok[1] == value

    def parse(self) -> object:
        if not self.toks:
            raise _invalid(self.expr, "empty query")
        node = self.or_()
        if self.peek() is not None:
            raise _invalid(self.expr, f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def or_(self) -> object:
        node = self.and_()
        while self.is_word("OR"):
            self.take()
            node = Op("|", node, self.and_())
        return node

    def and_(self) -> object:
        node = self.not_()
        while self.is_word("AND"):
            self.take()
            node = Op("&", node, self.not_())
        return node

    def not_(self) -> object:
        node = self.seq()
        while self.is_word("NOT"):
            self.take()
            node = Op("!", node, self.seq())
        return node

    def seq(self) -> object:
        """Adjacent phrases (FTS5's implicit AND), or one parenthesised group."""
        column = self.column_filter()
        tok = self.peek()
        if tok == ("op", "("):
            self.take()
            node = self.or_()
            if self.take() != ("op", ")"):
                raise _invalid(self.expr, "unbalanced parenthesis")
            if self.starts_item():
                raise _invalid(self.expr, "a group followed by a term without an operator")
            return _with_column(node, column) if column else node
        node = self.item(column)
        while self.starts_item():
            if self.peek() == ("op", "("):
                raise _invalid(self.expr, "a term followed by a group without an operator")
            node = Op("&", node, self.item(self.column_filter()))
        return node

    def starts_item(self) -> bool:
        tok = self.peek()
        if tok is None:
            return False
        if tok[0] == "str":
            return True
        if tok[0] == "word":
            return tok[1] not in ("AND", "OR", "NOT")
        return tok[1] in ("(", "{")

    def column_filter(self) -> str | None:
        tok, nxt = self.peek(), self.peek(1)
        if tok is not None and tok[0] == "word" and nxt == ("op", ":"):
            if tok[1] not in _COLUMNS:
                raise _invalid(self.expr, f"no such column: {tok[1]}")
            self.i += 2
            return tok[1]
        return None

    def item(self, column: str | None) -> object:
        tok = self.take()
        if tok[0] == "word" and tok[1] == "NEAR" and self.peek() == ("op", "("):
            self.take()
            parts: list[Phrase] = []
            distance = 10
            while self.peek() is not None and self.peek() != ("op", ")"):
                if self.peek() == ("op", ","):
                    self.take()
                    num = self.take()
                    if num[0] != "word" or not num[1].isdigit():
                        raise _invalid(self.expr, "NEAR distance must be a number")
                    distance = int(num[1])
                    continue
                parts.append(self.phrase(self.take(), column))
            if self.take() != ("op", ")") or not parts:
                raise _invalid(self.expr, "unbalanced NEAR group")
            if len(parts) == 2 and all(len(p.words) == 1 and not p.prefix for p in parts):
                return Near(parts[0], parts[1], distance)
            node: object = parts[0]
            for p in parts[1:]:  # longer groups: all of them, anywhere (documented)
                node = Op("&", node, p)
            return node
        return self.phrase(tok, column)

    def phrase(self, tok: tuple[str, str], column: str | None) -> Phrase:
        kind, value = tok
        if kind == "str":
            words = tokens(value[1:-1].replace('""', '"'))
        elif kind == "word" and value not in ("AND", "OR", "NOT"):
            words = tokens(value)
        else:
            raise _invalid(self.expr, f"unexpected {value!r}")
        ph = Phrase(words, column=column)
        if self.peek() == ("op", "*"):
            self.take()
            ph.prefix = True
        return ph


def _with_column(node: object, column: str) -> object:
    if isinstance(node, Phrase):
        node.column = node.column or column
    elif isinstance(node, Near):
        _with_column(node.left, column)
        _with_column(node.right, column)
    elif isinstance(node, Op):
        _with_column(node.left, column)
        _with_column(node.right, column)
    return node


_WEIGHT = {"text": "A", "grams": "B"}


def _phrase_query(words: list[str], prefix: bool, weight: str) -> str:
    parts = []
    for i, w in enumerate(words):
        star = "*" if prefix and i == len(words) - 1 else ""
        flags = star + weight
        parts.append(_lexeme(w) + (f":{flags}" if flags else ""))
    return parts[0] if len(parts) == 1 else "(" + " <2> ".join(parts) + ")"


def _simple(node: object) -> bool:
    """Only single words (no phrase, no NEAR): exact even without positions."""
    if isinstance(node, Phrase):
        return len(node.words) <= 1
    if isinstance(node, Op):
        return _simple(node.left) and _simple(node.right)
    return False


def _render(node: object, relaxed: bool) -> str | None:
    """tsquery text of ``node``; None for a phrase without tokens (it matches nothing).

    ``relaxed``: a superset of the exact query that needs no positions — phrases and NEARs
    become ANDs of their words and a ``NOT`` of anything but single words is dropped — for
    documents too big for PostgreSQL to keep every position (``verify`` then decides).
    """
    if isinstance(node, Phrase):
        if not node.words:
            return None
        if relaxed and len(node.words) > 1:
            w = _WEIGHT[node.column] if node.column else ""
            return "(" + " & ".join(_phrase_query([x], node.prefix and i == len(node.words) - 1, w)
                                    for i, x in enumerate(node.words)) + ")"
        if node.column is not None:
            return _phrase_query(node.words, node.prefix, _WEIGHT[node.column])
        if len(node.words) == 1:
            return _phrase_query(node.words, node.prefix, "")
        # A phrase matches inside one column.
        return "(" + " | ".join(_phrase_query(node.words, node.prefix, w) for w in ("A", "B")) + ")"
    if isinstance(node, Near):
        a, b = _lexeme(node.left.words[0]), _lexeme(node.right.words[0])
        col = node.left.column or node.right.column
        if relaxed:
            w = f":{_WEIGHT[col]}" if col else ""
            return f"({a}{w} & {b}{w})"
        alts = []
        for c in [col] if col else ["text", "grams"]:
            w = _WEIGHT[c]
            for k in range(1, node.distance + 2):  # k tokens apart = 2k positions (interleaved)
                alts.append(f"{a}:{w} <{2 * k}> {b}:{w}")
                alts.append(f"{b}:{w} <{2 * k}> {a}:{w}")
        return "(" + " | ".join(alts) + ")"
    assert isinstance(node, Op)
    left, right = _render(node.left, relaxed), _render(node.right, relaxed)
    if node.op == "|":
        if left is None or right is None:
            return left if right is None else right
        return f"({left} | {right})"
    if node.op == "&":
        if left is None or right is None:
            return None
        return f"({left} & {right})"
    if left is None:
        return None
    if right is None or (relaxed and not _simple(node.right)):
        return left
    return f"({left} & !{right})"


@dataclass
class Query:
    """A parsed FTS5 expression: the exact ``tsquery``, its position-free superset, and
    the tree itself for ``verify``. ``exact`` is None when nothing can match."""

    tree: object
    exact: str | None
    relaxed: str | None


def parse(fts5_expression: str) -> Query:
    tree = _Parser(fts5_expression).parse()
    return Query(tree, _render(tree, False), _render(tree, True))


def tsquery(fts5_expression: str) -> str | None:
    """The exact ``tsquery`` literal of an FTS5 expression (from ``search.fts_query``)."""
    return parse(fts5_expression).exact


# ---------------------------------------------------------------- exact check of one document


class _Doc:
    def __init__(self, text: str, grams: str) -> None:
        self.cols = {"text": tokens(text), "grams": tokens(grams)}
        self.where: dict[str, dict[str, list[int]]] = {}
        for name, toks in self.cols.items():
            idx: dict[str, list[int]] = {}
            for i, t in enumerate(toks):
                idx.setdefault(t, []).append(i)
            self.where[name] = idx

    def phrase(self, ph: Phrase, col: str) -> bool:
        toks, idx = self.cols[col], self.where[col]
        words, n = ph.words, len(ph.words)
        if n == 1 and ph.prefix:
            return any(t.startswith(words[0]) for t in idx)
        starts = idx.get(words[0], []) if not (n == 1 and ph.prefix) else []
        for i in starts:
            if i + n > len(toks):
                continue
            if all(toks[i + j] == words[j] for j in range(1, n - 1)) and (
                n == 1 or (toks[i + n - 1].startswith(words[-1]) if ph.prefix else toks[i + n - 1] == words[-1])
            ):
                return True
        return False

    def eval(self, node: object) -> bool:
        if isinstance(node, Phrase):
            if not node.words:
                return False
            return any(self.phrase(node, c) for c in ([node.column] if node.column else self.cols))
        if isinstance(node, Near):
            col = node.left.column or node.right.column
            for c in [col] if col else self.cols:
                pa = self.where[c].get(node.left.words[0], [])
                pb = self.where[c].get(node.right.words[0], [])
                if any(abs(a - b) - 1 <= node.distance for a in pa for b in pb if a != b):
                    return True
            return False
        assert isinstance(node, Op)
        if node.op == "|":
            return self.eval(node.left) or self.eval(node.right)
        if node.op == "&":
            return self.eval(node.left) and self.eval(node.right)
        return self.eval(node.left) and not self.eval(node.right)


def verify(query: Query, text: str, grams: str) -> bool:
    """Whether a document matches exactly as FTS5 would decide, from its whole text."""
    return _Doc(text, grams).eval(query.tree)
