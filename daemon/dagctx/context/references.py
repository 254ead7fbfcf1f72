"""The reference tracker: distinctive identifiers in text, and who mentions them later.

SPEC §8. A tool result is *cited* when one of its distinctive identifiers (a
path, an id, a hash, a URL, a port, a class or function name) shows up again in a
later message: the agent or the user is still working with that output, so aging
must leave it alone. The same extraction picks the identifiers a compaction summary
must keep verbatim (the fidelity gate, ``distinctive_identifiers``).

The tracker aims at catching the large majority of real references cheaply, not at
precision: a false "cited" only keeps an old result a little longer.

What counts as a reference (``extract_references``)
====================================================

Patterns are ASCII-only (``re.ASCII``): a CJK character next to an identifier is a
separator, so ``请修改src/app.py文件`` yields ``src/app.py``.

==============  ====================================================================
kind            matches
==============  ====================================================================
url             ``scheme://…`` for http(s), ws(s), ftp, file; trailing punctuation
                (``.,;:!?``, closing quotes/brackets) is not part of it
host:port       ``localhost:8080``, ``127.0.0.1:5432``, ``db.example.com:6379``
                (the host is localhost, an IPv4 address or a dotted name whose last
                label is not a source-file extension, so ``app.py:42`` is not one)
port            a bare ``:5432`` (2–5 digits) not glued to a word, digit or path
path            ``/etc/x.conf``, ``./a/b``, ``../x``, ``~/.bashrc``, ``src/app.py``:
                absolute or ``./``/``../``/``~/`` paths; relative paths with at least
                two segments that have a file extension or are 8+ characters long
                (``and/or``, ``I/O``, ``1/2``, dates are not paths)
file            a bare file name with a common extension (``render.py``,
                ``package.json``, ``Dockerfile`` is not matched)
uuid            ``8-4-4-4-12`` hex
hex             7+ hex characters containing at least one digit and one letter
                (git shas, hashes, hex ids), not glued to other word characters
number          5+ digits (long numeric ids, PIDs, ports, timestamps), not part of a
                decimal number
snippet         the inside of a single-backtick span, 3–80 characters, that is not a
                plain word (`` `foo_bar()` `` → ``foo_bar()``; `` `name` `` is not one)
camel           CamelCase / camelCase words of 4+ characters with an internal capital
                (``SessionGraph``, ``toolCallId``, ``HTTPServer``)
snake           snake_case / SCREAMING_SNAKE words of 5+ characters
                (``render_view``, ``MAX_TOKENS``)
==============  ====================================================================

Words that are never references (``True``, ``None``, ``JSON``, message-structure
names, brand names such as ``GitHub``/``JavaScript``, …) are dropped everywhere; ``distinctive_identifiers`` additionally skips
*trivial* names (``README``, ``LICENSE``, ``TODO``, ``main.py``, ``localhost``) and
phrase-like snippets (containing whitespace).

What "appears later" means (``cited_later``)
============================================

A reference ``r`` appears in a text when ``r`` occurs there as a substring that is
not glued to other ASCII word characters (``[A-Za-z0-9_]``) at an end where ``r``
itself has a word character: ``src/app.py`` appears in ``/work/src/app.py:42`` and in
``edit src/app.py.``; ``12345`` does not appear in ``123456``; ``:5432`` appears in
``localhost:5432``. ``MentionIndex`` answers this for many references over many texts
without rescanning: it indexes the ASCII words of every text once and verifies only
the texts that contain the reference's longest word.

Architecture Invariant: pure functions, no I/O. (Per-text extraction is memoized in
LRU caches bounded by the characters they hold; a cache changes cost, never results.)
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left, bisect_right
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

__all__ = [
    "MentionIndex",
    "TRIVIAL_IDENTIFIERS",
    "cited_later",
    "distinctive_identifiers",
    "extract_references",
    "occurs_in",
    "reference_counts",
    "top_references",
    "STORED_REFERENCES",
]

# ---------------------------------------------------------------- patterns

_A = re.ASCII

#: File extensions that make a bare name a file reference (and a dotted "host" not a host).
_FILE_EXTENSIONS = (
    "py pyi pyx ipynb js mjs cjs ts tsx jsx json jsonl md mdx rst txt toml yaml yml cfg conf ini "
    "env sh bash zsh fish ps1 bat rs go c h cc cpp cxx hpp hh java kt kts scala rb php pl lua vim "
    "swift m mm cs fs sql html htm css scss sass less vue svelte xml csv tsv log lock gradle "
    "proto graphql gql tf hcl nix ex exs erl hs ml r jl dart zig sol wasm db sqlite patch diff "
    "png jpg jpeg gif svg webp pdf zip tar gz tgz whl so dylib dll exe jar mk cmake dockerfile"
).split()
_EXT_SET = frozenset(_FILE_EXTENSIONS)

_URL = re.compile(r"\b(?:https?|wss?|ftp|file)://[^\s<>\"'`]+", _A)
_URL_TRAIL = ".,;:!?'\")]}>"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: host:port is found from its port: ``:NNNN`` right after a host character, then the
#: host token is read backwards and checked whole.
_PORT_AFTER_HOST = re.compile(r"(?<=[A-Za-z0-9]):(\d{2,5})(?![\w])", _A)
_HOST = re.compile(r"localhost|(?:\d{1,3}\.){3}\d{1,3}|" + _LABEL + r"(?:\." + _LABEL + r")+", _A)
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")
_PORT = re.compile(r"(?<![\w:/.\])])(:\d{2,5})(?![\w:.]|/\w)", _A)

_SEG = r"[\w@+-][\w.@+-]*"
_PATH = re.compile(
    r"(?<![\w.~/:-])"
    r"((?:~|\.\.?)?/?\.?" + _SEG + r"(?:/\.?" + _SEG + r")+/?|(?:~|\.\.?)/\.?" + _SEG + r"/?|/\.?" + _SEG + r")",
    _A,
)
_FILE = re.compile(r"(?<![\w./-])[\w-]+(?:\.[\w-]+)*\.([A-Za-z][A-Za-z0-9]{0,9})(?![\w/-])", _A)
_UUID = re.compile(
    r"(?<![0-9A-Za-z_-])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![0-9A-Za-z_-])",
    _A,
)
_HEX = re.compile(r"(?<![0-9A-Za-z_-])[0-9a-fA-F]{7,}(?![0-9A-Za-z_-])", _A)
_NUMBER = re.compile(r"(?<![\w.])\d{5,}(?!\w|\.\d)", _A)
_SNIPPET = re.compile(r"(?<!`)`([^`\n]{3,80})`(?!`)", _A)
#: words of 4+ characters with an internal capital (``aB``/``1B``) or ``ABc``
_CAMEL = re.compile(
    r"\b(?=[A-Za-z0-9]*(?:[a-z0-9][A-Z]|[A-Z]{2}[a-z]))[A-Za-z][A-Za-z0-9]{3,}\b", _A
)
#: words with an inner underscore
_SNAKE = re.compile(r"\b_*[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*\b", _A)
_SNAKE_OK = re.compile(r"[A-Za-z0-9]_+[A-Za-z0-9]", _A)
_ASCII_WORD = re.compile(r"[A-Za-z0-9_]+", _A)

#: Never references (compared lower-case): literals and message-structure names.
_STOPWORDS = frozenset(
    """
    true false none null nil nan undefined self this that json http https url uri api ok
    textcontent imagecontent assistantmessage usermessage systemmessage toolmessage
    toolresult tooluse toolcall
    javascript typescript github gitlab bitbucket openai chatgpt anthropic macos ios ipados
    iphone ipad youtube linkedin wordpress powershell nodejs
    """.split()
)

#: Skipped by ``distinctive_identifiers`` (compared lower-case, file names by stem).
TRIVIAL_IDENTIFIERS = frozenset(
    """
    readme license licence changelog contributing authors notice todo fixme xxx note
    makefile dockerfile index main init __init__ __main__ setup localhost
    """.split()
) | _STOPWORDS

#: At most this many characters long; longer matches are data, not identifiers.
MAX_REFERENCE_CHARS = 200


# ---------------------------------------------------------------- extraction


def _path_ok(p: str) -> bool:
    if len(p) < 2:
        return False
    segs = [s for s in p.split("/") if s not in ("", ".", "..", "~")]
    if not segs:
        return False
    if all(s.replace(".", "").replace("-", "").isdigit() for s in segs):
        return False  # 2024/01/02, 1/2, 3.5/10
    anchored = p.startswith(("/", "./", "../", "~/"))
    last = segs[-1]
    has_ext = "." in last.strip(".")
    if anchored:
        if p.startswith("/") and len(segs) == 1:
            return has_ext and len(p) >= 4  # /x.conf yes, /compact (a slash command) no
        return True
    if len(segs) < 2:
        return False
    return has_ext or len(p) >= 8


def _host_ok(host: str) -> bool:
    if host == "localhost" or host[0].isdigit() and host.replace(".", "").isdigit():
        return True
    last = host.rsplit(".", 1)[-1].lower()
    return last.isalpha() and len(last) >= 2 and last not in _EXT_SET


def _is_stopword(ref: str) -> bool:
    return ref.lower() in _STOPWORDS


#: A character every match of a pattern needs (an ASCII digit / capital is looked for
#: with a search): a text without it skips that pattern's scan. Only cost changes.
_HAS_DIGIT = re.compile(r"[0-9]", _A)
_HAS_CAPITAL = re.compile(r"[A-Z]", _A)


def _iter_references(text: str) -> Iterable[tuple[int, str]]:
    """Every reference occurrence as ``(position, reference)``, unordered, overlaps allowed."""
    if not text:
        return
    has_digit = _HAS_DIGIT.search(text) is not None
    has_colon = has_digit and ":" in text
    url_spans: list[tuple[int, int]] = []
    for m in (_URL.finditer(text) if "://" in text else ()):
        url = m.group(0).rstrip(_URL_TRAIL)
        if len(url) > len(m.group(0).split("://", 1)[0]) + 3:
            url_spans.append((m.start(), m.start() + len(url)))
            yield m.start(), url
    for m in (_PORT_AFTER_HOST.finditer(text) if has_colon else ()):
        end = i = m.start()
        while i > 0 and end - i < 255 and text[i - 1] in _HOST_CHARS:
            i -= 1
        if i > 0 and text[i - 1] == "_":
            continue
        host, port = text[i:end], m.group(1)
        if _HOST.fullmatch(host) and _host_ok(host) and 0 < int(port) <= 65535:
            yield i, f"{host}:{port}"
    for m in (_PORT.finditer(text) if has_colon else ()):
        if 0 < int(m.group(1)[1:]) <= 65535:
            yield m.start(), m.group(1)

    # URL matches come in order and never overlap: the span that may hold ``pos`` is the
    # last one starting at or before it (a bisect, not a scan: texts can hold 10^5 URLs).
    url_starts = [a for a, _ in url_spans]

    def in_url(pos: int) -> bool:
        i = bisect_right(url_starts, pos) - 1
        return i >= 0 and pos < url_spans[i][1]

    for m in (_PATH.finditer(text) if "/" in text else ()):
        p = m.group(1).rstrip(".")
        if not in_url(m.start()) and _path_ok(p):
            yield m.start(), p
    for m in (_FILE.finditer(text) if "." in text else ()):
        if m.group(1).lower() in _EXT_SET and not in_url(m.start()):
            yield m.start(), m.group(0)
    for m in (_UUID.finditer(text) if "-" in text else ()):
        yield m.start(), m.group(0)
    for m in (_HEX.finditer(text) if has_digit else ()):
        h = m.group(0)
        if any(c.isdigit() for c in h) and any(c.isalpha() for c in h):
            yield m.start(), h
    for m in (_NUMBER.finditer(text) if has_digit else ()):
        yield m.start(), m.group(0)
    for m in (_SNIPPET.finditer(text) if "`" in text else ()):
        s = m.group(1).strip().strip("\"'")
        # a plain word in backticks (`name`, `cli`) is a keyword, not an identifier;
        # CamelCase words are caught below anyway
        if len(s) >= 3 and not s.isalpha() and not _is_stopword(s):
            yield m.start(1), s
    for m in (_CAMEL.finditer(text) if _HAS_CAPITAL.search(text) else ()):
        w = m.group(0)
        if not _is_stopword(w):
            yield m.start(), w
    for m in (_SNAKE.finditer(text) if "_" in text else ()):
        w = m.group(0)
        if len(w) >= 5 and _SNAKE_OK.search(w) and not _is_stopword(w):
            yield m.start(), w


#: Texts longer than this are not memoized (the caches hold their keys).
_CACHE_MAX_CHARS = 256 * 1024


def reference_counts(text: str) -> tuple[Counter[str], dict[str, int]]:
    """``(occurrences per reference, first position per reference)`` of one text."""
    counts, first = _reference_counts(text)
    return Counter(counts), dict(first)


def _reference_counts(text: str) -> tuple[Counter[str], dict[str, int]]:
    # Memoized: extraction is a pure function of the text and costs ~0.5 ms per KB;
    # the engine asks again for the same old results at every prepare.
    if len(text) > _CACHE_MAX_CHARS:
        return _reference_counts_uncached(text)
    return _reference_counts_cached(text)


def _reference_counts_many(texts: list[str]) -> list[tuple[Counter[str], dict[str, int]]]:
    """``[_reference_counts(t) for t in texts]``."""
    if max(map(len, texts), default=0) <= _CACHE_MAX_CHARS:
        return _reference_counts_cached.many(texts)
    return [_reference_counts(t) for t in texts]


def _reference_counts_uncached(text: str) -> tuple[Counter[str], dict[str, int]]:
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for pos, ref in _iter_references(text):
        if len(ref) > MAX_REFERENCE_CHARS:
            continue
        counts[ref] += 1
        if ref not in first or pos < first[ref]:
            first[ref] = pos
    return counts, first


class _TextMemo:
    """A thread-safe LRU memo of a pure function of a text, bounded by the characters
    of the texts it holds (plus a small charge per entry), not by a count of entries:
    a 10k-node session's texts all fit, where a fixed count of entries made a scan over
    them evict each text just before it was asked for again. Changes cost, never results."""

    __slots__ = ("_fn", "_max_chars", "_chars", "_data", "_lock")

    ENTRY_CHARGE = 256  # the tuple, dict and result objects beside the key

    def __init__(self, fn: Callable[[str], Any], max_chars: int) -> None:
        self._fn = fn
        self._max_chars = max_chars
        self._chars = 0
        self._data: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, text: str) -> Any:
        with self._lock:
            hit = self._data.get(text, _MISSING)
            if hit is not _MISSING:
                self._data.move_to_end(text)
                return hit
        value = self._fn(text)
        with self._lock:
            if text not in self._data:
                self._data[text] = value
                self._chars += len(text) + self.ENTRY_CHARGE
                while self._chars > self._max_chars and self._data:
                    old, _ = self._data.popitem(last=False)
                    self._chars -= len(old) + self.ENTRY_CHARGE
        return value

    def many(self, texts: list[str]) -> list[Any]:
        """``[self(t) for t in texts]``, the held ones looked up under one lock (a
        compaction asks for thousands at once)."""
        with self._lock:
            data = self._data
            out: list[Any] = list(map(data.get, texts, repeat(_MISSING)))
            # each one held renewed in the order asked (the order the per-text lookups
            # leave); when every one is held, in one pass of C
            missing = _MISSING in out
            if not missing:
                deque(map(data.move_to_end, texts), maxlen=0)
            else:
                for t, hit in zip(texts, out):
                    if hit is not _MISSING:
                        data.move_to_end(t)
        if missing:  # (every one held, the usual case of a compaction: nothing more to do)
            for i, got in enumerate(out):
                if got is _MISSING:
                    out[i] = self(texts[i])
        return out

    def cache_clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._chars = 0


_MISSING = object()

#: Characters of text each memo holds at most (about as many bytes for ASCII text,
#: plus the results): enough for every text of a 10k-node session.
_MEMO_MAX_CHARS = 16 * 1024 * 1024

_reference_counts_cached = _TextMemo(_reference_counts_uncached, _MEMO_MAX_CHARS)


def extract_references(text: str) -> set[str]:
    """The distinctive references in ``text`` (see the module docstring for the patterns)."""
    return set(_reference_counts(text)[0])


#: A result longer than this is mined for its top references in its first and last half
#: of this many characters only (SPEC §8): the citation gate's cost per result is bounded,
#: whatever a tool printed (a 1 MB log costs what a 64 KB one does).
TOP_REFERENCE_SCAN_CHARS = 64 * 1024


#: How many of a tool result's ranked references are mined once, when the result is
#: written, and kept beside its token counts (SPEC §8): the citation gate reads its
#: first ``maxRefsPerResult`` (at most this many), and "a later result repeats the
#: reference" means the reference is among that later result's kept ones.
STORED_REFERENCES = 256


def top_references(text: str, limit: int) -> list[str]:
    """At most ``limit`` references of ``text``: most frequent first, ties by first position.

    Of a text longer than ``TOP_REFERENCE_SCAN_CHARS``, its head and tail are mined."""
    if len(text) > TOP_REFERENCE_SCAN_CHARS:
        half = TOP_REFERENCE_SCAN_CHARS // 2
        text = f"{text[:half]}\n{text[-half:]}"
    counts, first = _reference_counts(text)
    ranked = sorted(counts, key=lambda r: (-counts[r], first[r], r))
    return ranked[:limit] if limit >= 0 else ranked


def _word_set(text: str) -> frozenset[str]:
    if len(text) > _CACHE_MAX_CHARS:
        return frozenset(_ASCII_WORD.findall(text))
    return _word_set_cached(text)


def _word_set_uncached(text: str) -> frozenset[str]:
    return frozenset(_ASCII_WORD.findall(text))


_word_set_cached = _TextMemo(_word_set_uncached, _MEMO_MAX_CHARS)


# ---------------------------------------------------------------- "appears in"


def _is_word_char(c: str) -> bool:
    return c == "_" or ("0" <= c <= "9") or ("A" <= c <= "Z") or ("a" <= c <= "z")


def occurs_in(ref: str, text: str) -> bool:
    """True when ``ref`` occurs in ``text`` not glued to ASCII word characters at a word end."""
    if not ref:
        return False
    need_left = _is_word_char(ref[0])
    need_right = _is_word_char(ref[-1])
    n = len(ref)
    i = text.find(ref)
    while i >= 0:
        ok_left = not need_left or i == 0 or not _is_word_char(text[i - 1])
        end = i + n
        ok_right = not need_right or end == len(text) or not _is_word_char(text[end])
        if ok_left and ok_right:
            return True
        i = text.find(ref, i + 1)
    return False


class MentionIndex:
    """Texts in order, indexed by their ASCII words, to ask "is ``ref`` mentioned after i?".

    Building costs one word scan of every text; each query verifies only the texts that
    contain the reference's longest ASCII word as a whole word (a necessary condition
    of ``occurs_in``), newest first, stopping at the first hit.
    """

    __slots__ = ("texts", "_postings")

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)
        self._postings: dict[str, list[int]] = {}
        for idx, text in enumerate(self.texts):
            for w in _word_set(text):
                self._postings.setdefault(w, []).append(idx)

    def last_mention(self, ref: str, after: int = -1) -> int | None:
        """Index of the newest text with index ``> after`` in which ``ref`` occurs, or None."""
        for idx in reversed(self._candidates(ref)):
            if idx <= after:
                break
            if occurs_in(ref, self.texts[idx]):
                return idx
        return None

    def mentioned_after(self, ref: str, after: int = -1) -> bool:
        return self.last_mention(ref, after) is not None

    def _candidates(self, ref: str) -> Sequence[int]:
        words = _ASCII_WORD.findall(ref)
        if words:
            return self._postings.get(max(words, key=len), ())
        return range(len(self.texts))

    def first_mention(self, ref: str, after: int = -1) -> int | None:
        """Index of the oldest text with index ``> after`` in which ``ref`` occurs, or None."""
        cands = self._candidates(ref)
        for idx in cands[bisect_right(cands, after) :]:
            if occurs_in(ref, self.texts[idx]):
                return idx
        return None

    def mentioned_between(self, ref: str, lo: int, hi: int) -> bool:
        """True when ``ref`` occurs in a text with index in ``[lo, hi)``."""
        cands = self._candidates(ref)
        for idx in cands[bisect_left(cands, lo) :]:
            if idx >= hi:
                return False
            if occurs_in(ref, self.texts[idx]):
                return True
        return False


def cited_later(result_text: str, later_texts: Sequence[str] | Iterable[str]) -> set[str]:
    """The references of ``result_text`` that appear in any of ``later_texts``."""
    refs = extract_references(result_text)
    if not refs:
        return set()
    index = MentionIndex(list(later_texts))
    return {r for r in refs if index.mentioned_after(r)}


# ---------------------------------------------------------------- fidelity


#: any character ``str.isspace`` calls whitespace (``\s`` of a str pattern is the same test)
_WHITESPACE = re.compile(r"\s")


def _trivial(ref: str) -> bool:
    if _WHITESPACE.search(ref) is not None:
        return True  # a phrase in backticks, not an identifier
    low = ref.lower()
    if low in TRIVIAL_IDENTIFIERS or low in _STOPWORDS:
        return True
    base = low.rstrip("/").rsplit("/", 1)[-1]
    stem = base.split(".", 1)[0]
    if "/" not in low and "." in base and stem in TRIVIAL_IDENTIFIERS:
        return True  # README.md, LICENSE.txt, main.py — but src/main.py stays
    return False


#: ``distinctive_identifiers`` reads at most this many characters in all: the most
#: frequent identifiers of a long prefix show up in any even sample of it, and mining
#: 11 MB of transcript took seconds (the compaction bench).
IDENTIFIER_SAMPLE_CHARS = 300_000


def _even_sample(texts: list[str], budget: int) -> list[str]:
    """Every text, each cut to an equal share of ``budget`` (shares unused by short
    texts go to the long ones). Deterministic; no cut when everything fits."""
    lens = list(map(len, texts))
    if sum(lens) <= budget:
        return texts
    # shortest first, each whole while it fits its equal share of what is left; the first
    # that does not fixes the share, and it and every longer one are cut to it. The
    # shares only grow along the way, so the texts kept whole are exactly those not
    # longer than the last share
    remaining, n = budget, len(lens)
    share = 0
    for k, length in enumerate(sorted(lens)):
        share = remaining // (n - k)
        if length > share:
            break
        remaining -= length
    return [t[:share] if length > share else t for t, length in zip(texts, lens)]


def distinctive_identifiers(texts: Iterable[str], top: int = 20,
                            sample_chars: int | None = IDENTIFIER_SAMPLE_CHARS) -> list[str]:
    """The ``top`` most frequently mentioned distinctive identifiers of ``texts``.

    Same patterns as ``extract_references``; trivial names (``TRIVIAL_IDENTIFIERS``,
    phrase-like snippets) are skipped. Ordered by total occurrences (descending), then
    by first appearance (text order, then position). Deterministic. Past
    ``sample_chars`` characters in all, each text is read up to an equal share.
    """
    texts = list(texts)
    if sample_chars is not None:
        texts = _even_sample(texts, sample_chars)
    # a plain dict and one lookup per reference (not ``in`` then ``+=`` on a Counter): a
    # compaction merges the counts of thousands of texts
    total: dict[str, int] = {}
    first: dict[str, tuple[int, int]] = {}
    seen = total.get
    for ti, (counts, pos) in enumerate(_reference_counts_many(texts)):
        for ref, n in counts.items():
            got = seen(ref)
            if got is None:
                total[ref] = n
                first[ref] = (ti, pos[ref])
            else:
                total[ref] = got + n
    # trivial names are dropped after counting, walking the ranking until ``top`` are found
    out: list[str] = []
    if top <= 0:
        return out
    # The ranking's head first: every name counted at least as often as the 4·top-th most
    # frequent one ranks before all the others, so ranking only those gives the same head;
    # the whole ranking is walked only when they hold fewer than ``top`` non-trivial names.
    ranked: list[str] = []
    most = sorted(total.values(), reverse=True)
    if len(most) > 4 * top:
        least = most[4 * top - 1]
        ranked = sorted((r for r, n in total.items() if n >= least), key=lambda r: (-total[r], first[r], r))
        out = [r for r in ranked if not _trivial(r)][:top]
    if len(out) < top:
        out = []
        for r in sorted(total, key=lambda r: (-total[r], first[r], r)):
            if not _trivial(r):
                out.append(r)
                if len(out) == top:
                    break
    return out
