"""Pure parts of memory search (SPEC §5.1): chunking a file by tokens with overlap (line
ranges kept), keywords of a conversational query, temporal decay, and MMR re-ranking.

No I/O: the engine reads files and the ledger keeps rows; these are plain functions over
strings and numbers, tested in-process (tests/unit/test_memory_text.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .tokens import estimate_tokens

T = TypeVar("T")

_CJK = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f"
)
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(r"[^\W_]+")


@dataclass(frozen=True, slots=True)
class Chunk:
    start_line: int  # 1-based, inclusive
    end_line: int
    text: str

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def chunk_text(text: str, chunk_tokens: int, overlap_tokens: int) -> list[Chunk]:
    """Split ``text`` into chunks of at most ``chunk_tokens`` estimated tokens, each starting
    with the last whole lines (at most ``overlap_tokens``) of the one before. A line longer
    than a chunk is cut into pieces that keep its line number. Blank chunks are dropped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # (line number, text, tokens, continues the previous piece's line)
    pieces: list[tuple[int, str, int, bool]] = []
    for no, line in enumerate(lines, 1):
        t = estimate_tokens(line) + 1
        if t <= chunk_tokens:
            pieces.append((no, line, t, False))
            continue
        width = max(1, len(line) * (chunk_tokens - 1) // t)
        for k in range(0, len(line), width):
            part = line[k : k + width]
            pieces.append((no, part, estimate_tokens(part) + 1, k > 0))
    out: list[Chunk] = []
    start = 0
    while start < len(pieces):
        end, used = start, 0
        while end < len(pieces) and (end == start or used + pieces[end][2] <= chunk_tokens):
            used += pieces[end][2]
            end += 1
        body = ""
        for i in range(start, end):
            _, part, _, cont = pieces[i]
            body += part if (i == start or cont) else "\n" + part
        if body.strip():
            out.append(Chunk(pieces[start][0], pieces[end - 1][0], body))
        if end >= len(pieces):
            break
        nxt, kept = end, 0
        while nxt - 1 > start and kept + pieces[nxt - 1][2] <= overlap_tokens:
            nxt -= 1
            kept += pieces[nxt][2]
        start = nxt
    return out


_STOP = frozenset("""
a about above after again against all also am an and any are aren't as at be because been before being below
between both but by can can't cannot could did didn't do does doesn't doing don't down during each else ever
few for from further get got had has have having he her here hers herself him himself his how i i'm if in into
is isn't it it's its itself just let let's like me more most my myself no nor not now of off on once only or
other our ours ourselves out over own please same she should so some such than that that's the their theirs
them themselves then there these they this those through to too under until up us very was we we're were what
what's when where which while who whom why will with would you your yours yourself yourselves remember
recall tell know think said say says decide decided decision discuss discussed talk talked mention mentioned
anything something thing things one ones again yesterday today earlier last time
""".split())


def is_conversational(query: str) -> bool:
    """A query written as a sentence, not in the full-text syntax (no quotes, parentheses,
    column filters, prefix stars or upper-case operators)."""
    if any(ch in query for ch in '"()*:'):
        return False
    return not any(tok in ("AND", "OR", "NOT", "NEAR") for tok in query.split())


def keywords(query: str) -> list[str]:
    """The content words of a conversational query, in order, each once: stop words and
    single Latin letters dropped; a CJK run is kept as its character pairs (a query's run
    seldom appears whole in the text). All words when nothing else is left."""
    words: list[str] = []
    allw: list[str] = []
    for tok in _WORD.findall(query):
        low = tok.lower()
        if _CJK_RUN.search(tok):
            for part in re.split(f"([{_CJK}]+)", tok):
                if not part:
                    continue
                if _CJK_RUN.fullmatch(part):
                    grams = [part] if len(part) == 1 else [part[i : i + 2] for i in range(len(part) - 1)]
                    words.extend(grams)
                    allw.extend(grams)
                else:
                    allw.append(part.lower())
                    if len(part) > 1 and part.lower() not in _STOP:
                        words.append(part.lower())
            continue
        allw.append(low)
        if low in _STOP or (len(low) == 1 and low.isascii()):
            continue
        words.append(low)
    return list(dict.fromkeys(words or allw))


def expression(query: str) -> tuple[str, list[str]]:
    """The full-text expression a query runs as, and its keywords (empty when the query was
    used as written)."""
    if not is_conversational(query):
        return query, []
    words = keywords(query)
    if not words:
        return query, []
    return " OR ".join(words), words


def text_score(raw: float) -> float:
    """A backend's keyword score (higher is better, unbounded) mapped into [0, 1)."""
    return raw / (1.0 + raw) if raw > 0 else 0.0


#: the share of a conversational query's keywords a keyword hit holds is raised to this power
#: in its ``textScore`` (SPEC §5.1, hybrid search: why)
COVERAGE_POWER = 2


def coverage(text: str, words: Sequence[str]) -> float:
    """The share of ``words`` (a conversational query's keywords) found in ``text``, folded
    to lower case; at least one of them (the full-text index matched the hit on one, maybe
    through folding this does not repeat). 1 when the query was used as written (no words)."""
    if not words:
        return 1.0
    low = text.lower()
    found = sum(1 for w in words if w in low)
    return max(1, found) / len(words)


def keyword_score(raw: float, text: str, words: Sequence[str]) -> float:
    """A keyword hit's ``textScore``: the backend's score mapped into [0, 1) (``text_score``)
    times the query's keyword coverage of the hit to the power ``COVERAGE_POWER``. A
    conversational query runs as the ``OR`` of its keywords, so a chunk holding one rare
    word of six would otherwise score like one holding all six."""
    return text_score(raw) * coverage(text, words) ** COVERAGE_POWER


def decay(score: float, age_seconds: float, half_life_days: float) -> float:
    """``score · 0.5^(age/halfLife)``; a time in the future counts as age 0."""
    return score * 0.5 ** (max(0.0, age_seconds) / 86_400.0 / half_life_days)


def _words(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORD.findall(text))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def mmr(items: Sequence[T], score: Callable[[T], float], text: Callable[[T], str], lam: float,
        limit: int) -> list[T]:
    """Greedy maximal marginal relevance: repeatedly take the item maximising
    ``λ·relevance − (1−λ)·max Jaccard similarity to those taken``; relevance is the score
    over the best score. Ties keep the input order."""
    if not items:
        return []
    top = max(score(i) for i in items) or 1.0
    words = [_words(text(i)) for i in items]
    left = list(range(len(items)))
    chosen: list[int] = []
    while left and len(chosen) < limit:
        best, best_val = left[0], float("-inf")
        for i in left:
            sim = max((jaccard(words[i], words[j]) for j in chosen), default=0.0)
            val = lam * (score(items[i]) / top) - (1.0 - lam) * sim
            if val > best_val:
                best, best_val = i, val
        chosen.append(best)
        left.remove(best)
    return [items[i] for i in chosen]
