"""Full-text search text preparation: CJK-aware FTS5 documents and queries.

SQLite's ``unicode61`` tokenizer makes a whole unspaced CJK run one token, and
``trigram`` needs three characters, so neither finds the two-character word 迁移
inside 数据库迁移脚本. We index every CJK run a second time, in a ``grams``
column, as its character unigrams followed by its bigrams; a CJK query run becomes
a phrase of bigrams (or one unigram) on that column. English words and code
identifiers stay intact in the ``text`` column; a Latin run glued to CJK text
(我用Python编程) is added to ``grams`` on its own, and a query splits its Latin runs from
its CJK runs the same way, so ``python`` finds it.

Architecture Invariant: pure functions; no SQL runs here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from dagctx.protocol.errors import DagctxError

from .text import PIECE, joined

_CJK = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f"
)
CJK_RUN = re.compile(f"[{_CJK}]+")

_OPERATORS = {"AND", "OR", "NOT"}
# A query token: a quoted phrase, a paren, or a run of anything else.
_QUERY_TOKEN = re.compile(r'"(?:[^"]|"")*"|[()]|[^\s()"]+')
_BAREWORD = re.compile(r"^[\w]+\*?$", re.UNICODE)


# What ``unicode61`` takes for one token: a run of letters and digits (CJK included).
_TOKEN = re.compile(r"[^\W_]+")
#: every two characters in a row (overlapping: a lookahead that captures them)
_BIGRAMS = re.compile(r"(?=(..))", re.S)


#: characters scanned by one regular expression call at a time (a quarter of a MiB: a
#: character-class scan costs tens of nanoseconds a character)
SCAN_PIECE = PIECE // 4


def _latin1(chunk: str) -> bool:
    """True when every character is below U+0100, so none is CJK (a copy, not a scan)."""
    try:
        chunk.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def cjk_grams(text: str, piece: int = SCAN_PIECE) -> str:
    """The ``grams`` column: per CJK run, its unigrams then its bigrams; then every Latin
    (non-CJK) run that is glued to CJK text, space-separated.

    ``unicode61`` reads 我用Python编程 as one token, so ``python`` would not find it in the
    ``text`` column: the ``Python`` glued inside is indexed again here, on its own, and an
    unqualified query word matches either column (SPEC §5).

    A long text is scanned ``piece`` characters at a time, each cut after a space or a
    newline (no run or token spans one), so one regular expression never holds the
    interpreter lock over a whole 50 MB text (SPEC §1.4); the result is the same.
    """
    if text.isascii():  # no CJK (most tool output): nothing to add
        return ""
    runs: list[str] = []
    glued: list[str] = []
    for chunk in _pieces(text, piece):
        if _latin1(chunk) or CJK_RUN.search(chunk) is None:
            continue
        parts: list[str] = []
        for run in CJK_RUN.findall(chunk):
            parts.extend(run)
            parts.extend(_BIGRAMS.findall(run))  # its bigrams, with no loop in Python
        if parts:
            runs.append(" ".join(parts))
        parts = []
        for token in _TOKEN.findall(chunk):
            if token.isascii():  # no CJK in it (most words): no regular expression
                continue
            m = CJK_RUN.search(token)
            if m is not None and (m.start() or m.end() < len(token)):  # CJK, and not only CJK
                parts.extend(p for p in CJK_RUN.split(token) if p)
        if parts:
            glued.append(" ".join(parts))
    return joined(runs + glued, " ")


def _pieces(text: str, piece: int) -> Iterator[str]:
    """``text`` in slices of about ``piece`` characters, each ending with a space or a
    newline (neither is part of a token or a CJK run); a slice without one runs on to the
    next, or to the end."""
    i, n = 0, len(text)
    while i < n:
        at = i + piece
        if at >= n:
            yield text[i:]
            return
        cut = max(text.rfind(" ", i, at), text.rfind("\n", i, at))
        if cut < i:
            later = [k for k in (text.find(" ", at), text.find("\n", at)) if k >= 0]
            cut = min(later) if later else n - 1
        yield text[i : cut + 1]
        i = cut + 1


def _cjk_phrase(run: str) -> str:
    if len(run) == 1:
        return f'grams : "{run}"'
    grams = " ".join(run[i : i + 2] for i in range(len(run) - 1))
    return f'grams : "{grams}"'


def _split_cjk(token: str) -> list[str]:
    """Split a bareword into CJK runs (as grams phrases) and other parts (kept)."""
    out: list[str] = []
    pos = 0
    for m in CJK_RUN.finditer(token):
        if m.start() > pos:
            out.append(_quote_if_needed(token[pos : m.start()]))
        # No parentheses: FTS5's implicit AND joins phrases, not groups, so "(a) b" is a
        # syntax error; a column-filtered phrase joins its neighbours like any phrase.
        out.append(_cjk_phrase(m.group()))
        pos = m.end()
    if pos < len(token):
        out.append(_quote_if_needed(token[pos:]))
    return [p for p in out if p]


def _quote_if_needed(word: str) -> str:
    word = word.strip()
    if not word:
        return ""
    if _BAREWORD.match(word) or word in _OPERATORS:
        return word
    # Paths, dotted names, hyphens and other punctuation: a quoted phrase, which the
    # tokenizer splits into adjacent tokens (so src/app.py finds "src app py").
    return '"' + word.replace('"', '""') + '"'


def fts_query(query: str) -> str:
    """Translate a user query into an FTS5 expression over ``text`` and ``grams``.

    Barewords, AND/OR/NOT, NEAR, parentheses, quoted phrases and prefix ``*`` keep
    their FTS5 meaning; words with punctuation are quoted; CJK runs become bigram
    phrases on the ``grams`` column. Invalid FTS5 syntax (an unbalanced parenthesis,
    a dangling operator) is left for SQLite to reject, which the store reports as
    ``InvalidQuery``; CJK text inside ``NEAR(…)`` is refused here (``InvalidQuery``),
    the same on every backend.
    """
    out: list[str] = []
    tokens = _QUERY_TOKEN.findall(query)
    depth = 0
    near: int | None = None  # the parenthesis depth of the NEAR group we are in
    for i, tok in enumerate(tokens):
        if tok == "(":
            depth += 1
            out.append(tok)
        elif tok == ")":
            if near == depth:
                near = None
            depth -= 1
            out.append(tok)
        elif tok in _OPERATORS:
            out.append(tok)
        elif tok == "NEAR" and i + 1 < len(tokens) and tokens[i + 1] == "(":
            out.append(tok)
            near = depth + 1
        elif near is not None and CJK_RUN.search(tok):
            raise DagctxError(
                "InvalidQuery",
                f"NEAR(…) takes Latin words and phrases only, not {tok!r} in {query!r}: CJK text is "
                "indexed as character pairs, where a distance means nothing; join CJK words with AND",
                path="query",
            )
        elif near == depth and "," in tok and not tok.startswith('"'):
            # NEAR(a b, 5): the comma ends the phrases and comes before the distance,
            # wherever the spaces are ("b," "5", "b" ",5", "b,5")
            phrase, _, distance = tok.partition(",")
            if phrase:
                out.extend(_split_cjk(phrase))
            out.append(",")
            if distance:
                out.append(distance)
        elif tok.startswith('"'):
            inner = tok[1:-1] if tok.endswith('"') and len(tok) > 1 else tok[1:]
            if CJK_RUN.search(inner):
                out.extend(_split_cjk(inner.replace('""', '"')))
            else:
                out.append(tok)
        else:
            out.extend(_split_cjk(tok))
    return " ".join(out)


def query_terms(query: str) -> list[str]:
    """Plain terms of a query, for building snippets in Python (no operators, no NEAR
    distance: in ``NEAR(a b, 5)`` the terms are ``a`` and ``b``)."""
    terms: list[str] = []
    distance_next = False  # a bare "," was seen: the next token is a NEAR distance
    for tok in _QUERY_TOKEN.findall(query):
        if tok in ("(", ")") or tok.upper() in _OPERATORS or tok.upper() == "NEAR":
            distance_next = False
            continue
        if distance_next and tok.isdigit():
            distance_next = False
            continue
        if not tok.startswith('"') and "," in tok:
            tok, _, distance = tok.partition(",")
            distance_next = not distance
        tok = tok.strip('"').rstrip("*")
        terms.extend(t for t in re.split(r"\s+", tok) if t)
    return terms


def snippet(text: str, terms: list[str], width: int = 160) -> str:
    """A window of ``text`` around the first matching term, matches in ``[...]``."""
    if not text:
        return ""
    low = text.lower()
    first = -1
    for t in terms:
        i = low.find(t.lower())
        if i >= 0 and (first < 0 or i < first):
            first = i
    if first < 0:
        start = 0
    else:
        start = max(0, first - width // 3)
    end = min(len(text), start + width)
    window = text[start:end]
    for t in sorted({t for t in terms if t}, key=len, reverse=True):
        window = re.sub(re.escape(t), lambda m: f"[{m.group()}]", window, flags=re.IGNORECASE)
    window = " ".join(window.split())
    return ("…" if start > 0 else "") + window + ("…" if end < len(text) else "")
