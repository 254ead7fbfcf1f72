"""The demo's stand-in summarizer (``dagctx demo``): no model is configured, so the demo's
client answers the daemon's ``sampling/createMessage`` itself with a deterministic
extractive summary of the transcript it was sent, keeping identifiers (paths, ids,
hashes) verbatim so the daemon's fidelity gate can accept it. Labelled as such
(``STAND_IN_LABEL``) wherever it appears.
"""

from __future__ import annotations

import re
from collections import Counter

from dagctx.protocol import context_messages as c

STAND_IN_LABEL = "stand-in summarizer (no LLM configured)"


_IDENT_PATTERNS = [
    re.compile(r"\b(?:https?|wss?|ftp|file)://[^\s\"'<>)\]]+[^\s\"'<>)\].,;:!?]", re.ASCII),
    re.compile(r"(?<![\w/.])(?:~|\.{1,2})?/?(?:[\w.-]+/)+[\w.-]+(?:::\w+)?", re.ASCII),  # paths
    re.compile(r"\b[\w-]+\.(?:py|sql|toml|yaml|yml|json|md|txt|log|ts|js|sh|cfg|ini|lock)\b", re.ASCII),
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.ASCII),
    re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.ASCII),
    re.compile(r"`([^`\n]{3,80})`"),
    re.compile(r"\b[A-Za-z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b", re.ASCII),  # camelCase / CamelCase
    re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b", re.ASCII),  # snake_case
    re.compile(r"(?<![\w.])(?:localhost|\d{1,3}(?:\.\d{1,3}){3}):\d{2,5}\b", re.ASCII),
    re.compile(r"(?<![\w.])\d{5,}(?![\w.])", re.ASCII),
]

_ENTRY = re.compile(r"^\[(user|assistant|tool call: [^\]]*|tool result: [^\]]*|function call|function result|"
                    r"summary of the conversation before this point)\]$")


def identifiers(text: str) -> list[str]:
    """Identifier-like tokens, most frequent first (ties: first seen)."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for pat in _IDENT_PATTERNS:
        for m in pat.finditer(text):
            tok = (m.group(1) if m.groups() else m.group(0)).strip()
            if len(tok) < 3:
                continue
            counts[tok] += 1
            first.setdefault(tok, m.start())
    return sorted(counts, key=lambda t: (-counts[t], first[t]))


def _entries(text: str) -> list[tuple[str, str]]:
    """``(header, body)`` of the transcript entries the daemon sent (``[user]`` …)."""
    out: list[tuple[str, str]] = []
    header: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        m = _ENTRY.match(line.strip())
        if m:
            if header is not None:
                out.append((header, "\n".join(body).strip()))
            header, body = m.group(1), []
        elif header is not None:
            if line.startswith("</conversation>") or line.startswith("</new-messages>"):
                out.append((header, "\n".join(body).strip()))
                header, body = None, []
                continue
            body.append(line)
    if header is not None:
        out.append((header, "\n".join(body).strip()))
    return out


def _line(text: str, limit: int = 160) -> str:
    t = " ".join(text.split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def extractive_summary(text: str, max_chars: int) -> str:
    """A deterministic summary in the daemon's five sections, built only from ``text``."""
    headings = re.findall(r"^## (.+)$", text, flags=re.M)[:5]
    if len(headings) < 5:
        headings = ["1. User intent", "2. Decisions and constraints", "3. Work completed", "4. Outstanding",
                    "5. Active context"]
    prev = re.search(r"<previous-summary>\n(.*?)\n</previous-summary>", text, flags=re.S)
    entries = _entries(text)
    users = [b for h, b in entries if h == "user" and b]
    replies = [b for h, b in entries if h == "assistant" and b]
    calls = [(h.split(":", 1)[1].strip(), b) for h, b in entries if h.startswith("tool call")]
    results = [b for h, b in entries if h.startswith("tool result")]
    missing = re.search(r"copy each of these exactly where it belongs:\n((?:- .*\n?)+)", text)
    ids = identifiers(text.split("</conversation>")[0].split("</new-messages>")[0])
    if missing:
        wanted = [ln[2:].strip() for ln in missing.group(1).splitlines() if ln.startswith("- ")]
        ids = wanted + [i for i in ids if i not in wanted]

    intent = [f"- {_line(users[0], 240)}"] if users else ["none"]
    decisions = [f"- {_line(u)}" for u in users[1:]] or ["none"]
    work = []
    if prev:
        work += [f"- earlier: {_line(ln, 200)}" for ln in prev.group(1).splitlines() if ln.startswith("- ")][:12]
    for (name, args), res in zip(calls, results + [""] * len(calls)):
        work.append(f"- {name} {_line(args, 100)} → {_line(res.split(chr(10))[0] if res else '', 80)}")
    work += [f"- replied: {_line(r, 140)}" for r in replies[-3:]]
    outstanding = [f"- {_line(users[-1])}"] if users else ["none"]

    def build(n_ids: int, n_work: int) -> str:
        active = ", ".join(ids[:n_ids]) if ids else "none"
        sections = [intent, decisions, work[:n_work] or ["none"], outstanding, [active]]
        body = [f"[{STAND_IN_LABEL}: extractive, deterministic]"]
        for head, lines in zip(headings, sections):
            body += [f"## {head}", *lines]
        return "\n".join(body)

    n_ids, n_work = len(ids), len(work)
    out = build(n_ids, n_work)
    while len(out) > max_chars and (n_work > 3 or n_ids > 20):
        if n_work > 3:
            n_work = max(3, n_work - 4)
        else:
            n_ids = max(20, n_ids - 10)
        out = build(n_ids, n_work)
    return out[:max_chars]


class StandInSummarizer:
    """Answers ``sampling/createMessage`` without a model (see the module docstring)."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, params: c.CreateMessageParams) -> c.CreateMessageResult:
        self.requests += 1
        text = "\n".join(m.content.text for m in params.messages)
        limit = re.search(r"Keep the whole summary under (\d+) characters", text)
        max_chars = int(limit.group(1)) if limit else params.max_tokens * 2
        summary = extractive_summary(text, max(400, min(max_chars, params.max_tokens * 2)))
        return c.CreateMessageResult(
            role="assistant",
            content=c.SamplingContent(type="text", text=summary),
            model="dagctx-demo-stand-in",
            stop_reason="endTurn",
        )
