"""Whether a summarizer's answer may be written (SPEC §8), and the structural fallback.

``validate_summary`` refuses an empty answer, one longer than allowed, one that would
not make the context smaller, and one that keeps too few of the identifiers the
summarized part depends on (``fidelity_terms``; ``lowFidelity`` gets one retry with
``summarizer_input.retry_messages``). ``structural_summary`` is the opt-in fallback
that needs no model. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .compaction_plan import CutPlan, strip_marker
from .content import json_text
from .references import distinctive_identifiers
from .summarizer_input import Transcript, item_body

__all__ = [
    "EMPTY",
    "LOW_FIDELITY",
    "MIN_RETENTION",
    "NOT_SMALLER",
    "TOO_LONG",
    "Validation",
    "fidelity_terms",
    "structural_summary",
    "validate_summary",
]

#: Default share of identifiers a summary must keep.
MIN_RETENTION = 0.5

# Validation reasons.
EMPTY = "empty"
TOO_LONG = "tooLong"
NOT_SMALLER = "notSmaller"
LOW_FIDELITY = "lowFidelity"


# ---------------------------------------------------------------- validation


@dataclass(frozen=True, slots=True)
class Validation:
    ok: bool
    #: None when ok, else ``empty`` | ``tooLong`` | ``notSmaller`` | ``lowFidelity``
    reason: str | None
    #: share of ``identifiers`` the summary keeps (1.0 when there are none)
    retention: float
    #: identifiers the summary left out (for ``retry_messages``)
    missing: list[str] = field(default_factory=list)


def _kept(ident: str, text: str, folded: str) -> bool:
    if ident in text:
        return True
    if ident.endswith("()") and ident[:-2] in text:
        return True
    return ident.casefold() in folded


def validate_summary(
    text: str | None,
    plan: CutPlan | None = None,
    *,
    tokens_before: int,
    candidate_tokens_after: int,
    max_chars: int | None,
    identifiers: Sequence[str],
    min_retention: float = MIN_RETENTION,
) -> Validation:
    """May this summary be written? Checks, in order: non-empty after stripping (the
    marker alone is empty) → ``empty``; at most ``max_chars`` → ``tooLong``; the
    candidate render (summary applied, same aging boundary) strictly smaller than
    before → ``notSmaller``; keeps at least ``min_retention`` of ``identifiers``
    (``fidelity_terms(plan)``) → ``lowFidelity`` with the ``missing`` list.
    ``plan`` is accepted for symmetry with the pipeline and not needed otherwise."""
    del plan
    body = strip_marker(text or "")
    if not body:
        return Validation(False, EMPTY, 0.0, list(identifiers))
    if max_chars is not None and len(body) > max_chars:
        return Validation(False, TOO_LONG, 0.0, [])
    if candidate_tokens_after >= tokens_before:
        return Validation(False, NOT_SMALLER, 0.0, [])
    idents = list(dict.fromkeys(identifiers))
    if not idents:
        return Validation(True, None, 1.0, [])
    folded = body.casefold()
    missing = [i for i in idents if not _kept(i, body, folded)]
    retention = (len(idents) - len(missing)) / len(idents)
    if retention < min_retention:
        return Validation(False, LOW_FIDELITY, retention, missing)
    return Validation(True, None, retention, missing)


_CONTENT_WORD = re.compile(r"\b[A-Za-z][a-z]{6,}\b", re.ASCII)
_COMMON_WORDS = frozenset(
    """
    because between through without another already however something anything everything nothing
    should would could please thanks believe example following instead actually whether further
    include including different possible currently running results result question answer assistant
    message messages conversation summary function functions command commands output outputs
    """.split()
)


def fidelity_terms(plan: CutPlan, top: int = 20, *, min_identifiers: int = 5, fill_to: int = 10,
                   transcript: Transcript | None = None) -> list[str]:
    """What the fidelity gate checks: the ``top`` most distinctive identifiers of the
    summarizer input (``references.distinctive_identifiers``). When fewer than
    ``min_identifiers`` exist (plain chat), the list is topped up to ``fill_to`` with the
    most frequent long English content words, so a non-answer ("I'm ready to help")
    still fails. Text without either (e.g. Chinese prose) has no gate. ``transcript``:
    the bodies built once for the whole compaction."""
    texts = ([item_body(it) for it in plan.input_items] if transcript is None
             else transcript.bodies(plan.input_items))
    idents = distinctive_identifiers(texts, top)
    if len(idents) >= min_identifiers:
        return idents
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    n = 0
    for t in texts:
        for m in _CONTENT_WORD.finditer(t):
            w = m.group(0).lower()
            if w in _COMMON_WORDS:
                continue
            counts[w] = counts.get(w, 0) + 1
            first.setdefault(w, n)
            n += 1
    have = {i.casefold() for i in idents}
    words = [w for w in sorted(counts, key=lambda w: (-counts[w], first[w])) if counts[w] >= 2 and w not in have]
    return idents + words[: max(0, fill_to - len(idents))]


# ---------------------------------------------------------------- structural fallback

_KEY_ARGS = ("file_path", "path", "filePath", "filename", "command", "cmd", "pattern", "query", "url", "name", "id")
STRUCTURAL_HEADER = (
    "[Structural summary: generated mechanically, without a model. It lists what happened in the "
    "earlier conversation; it is not a written summary.]"
)


def _one_line(text: str, limit: int) -> str:
    t = " ".join(text.split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def _key_args(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        keys = [k for k in _KEY_ARGS if k in value][:2] or list(value)[:2]
        parts = []
        for k in keys:
            v = value[k]
            s = v if isinstance(v, str) else json_text(v)
            parts.append(f"{k}={_one_line(s, 120)!r}" if isinstance(v, str) else f"{k}={_one_line(s, 120)}")
        return ", ".join(parts)
    s = value if isinstance(value, str) else json_text(value)
    return _one_line(s, 120)


def structural_summary(plan: CutPlan) -> str:
    """The deterministic fallback (``fallback: "structural"``, opt-in only): the earlier
    summary verbatim, the user's requests, the tool calls made (name and key
    arguments), the files and identifiers mentioned, and the last assistant reply.
    Clearly labelled as structural. Same plan, same text."""
    items = plan.input_items
    out = [STRUCTURAL_HEADER]
    if plan.previous_summary_text:
        out += ["", "Earlier summary (verbatim):", plan.previous_summary_text]
    requests = [it.text for it in items if it.kind == "user" and it.depth == 0 and it.text.strip()]
    if requests:
        out += ["", f"User requests ({len(requests)}):"]
        shown = list(enumerate(requests, 1))
        if len(shown) > 40:
            shown = shown[:10] + [(0, f"… {len(requests) - 40} requests omitted …")] + shown[-30:]
        out += [f"{n}. {_one_line(t, 300)}" if n else t for n, t in shown]
    calls = [it for it in items if it.kind == "tool_call" or (it.kind == "text_pair" and it.part == "call")]
    if calls:
        out += ["", f"Tool calls ({len(calls)}):"]
        lines = [f"- {c.name or 'function'}({_key_args(c.input)})" for c in calls]
        if len(lines) > 60:
            lines = lines[:20] + [f"- … {len(lines) - 60} calls omitted …"] + lines[-40:]
        out += lines
    # a superset of fidelity_terms(plan): the fallback keeps what the gate checks
    idents = fidelity_terms(plan, 40, fill_to=20)
    if idents:
        out += ["", "Files, identifiers and key terms mentioned:", ", ".join(idents)]
    last = next((it for it in reversed(items) if it.kind == "assistant" and it.depth == 0 and it.text.strip()), None)
    if last is not None:
        out += ["", "Last assistant reply:", _one_line(last.text, 800)]
    return "\n".join(out)
