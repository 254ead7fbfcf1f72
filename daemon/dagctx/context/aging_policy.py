"""The aging policy and what a plan records (SPEC §8), and the texts that replace an aged
tool result: a soft trim (head + marker + tail), a hard clear (a one-line placeholder), a
cap for one result larger than its share of the window. ``aging.py`` decides which results
age (the gates) and exports these names with its own. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgspec

from dagctx.protocol.messages import AgingOptions
from dagctx.protocol.nodes import Call

from .content import blocks_text, value_blocks
from .references import STORED_REFERENCES, top_references


#: Bumped whenever a rule of ``aging.py`` changes which results age or what replaces them.
AGING_POLICY_VERSION = 1

#: Tools whose results are the agent's working memory and never age (case-insensitive):
#: todo lists and plans (Claude Code ``TodoWrite``/``TodoRead``, Codex ``update_plan``,
#: OpenClaw/OpenProgram ``todo_*``), memory tools (``memory``, ``memory_search``,
#: ``memory_get``, ``save_memory``, ``read_memory``), and asking the user.
DEFAULT_EXEMPT_TOOLS: frozenset[str] = frozenset(
    {
        "TodoWrite",
        "TodoRead",
        "todo_write",
        "todo_read",
        "todowrite",
        "todoread",
        "update_plan",
        "memory",
        "memory_search",
        "memory_get",
        "memory_read",
        "save_memory",
        "read_memory",
        "ask_user",
        "AskUserQuestion",
    }
)

# Decisions (values of ``AgingPlan.decisions``).
SOFT_TRIM = "softTrim"
HARD_CLEAR = "hardClear"
CAPPED = "capped"
GATE_EXEMPT = "exempt"
GATE_FIRST = "protectedFirst"
GATE_BOUNDARY = "boundary"
GATE_TURN = "recentTurn"
GATE_AGE = "tooRecent"
GATE_SIZE = "tooSmall"
GATE_CITED = "cited"
NO_GAIN = "noGain"
NO_RESULT = "noResult"

TURN_UNITS: tuple[str, ...] = ("user", "step")

GATES: tuple[str, ...] = (GATE_EXEMPT, GATE_FIRST, GATE_TURN, GATE_BOUNDARY, GATE_AGE, GATE_SIZE, GATE_CITED)


@dataclass(frozen=True, slots=True)
class AgingPolicy:
    """Aging parameters (SPEC §8; OpenClaw's soft-trim / hard-clear / single-result guard)."""

    keep_recent_turns: int = 4
    min_age_seconds: float = 60.0
    min_tokens: int = 800
    protect_first: int = 2
    exempt_tools: frozenset[str] = DEFAULT_EXEMPT_TOOLS
    soft_trim_head_chars: int = 1500
    soft_trim_tail_chars: int = 1500
    hard_clear_after_turns: int = 8
    max_single_result_share: float = 0.5
    #: references per result checked by the citation gate (SPEC §8: 32)
    max_refs_per_result: int = 32
    #: what a "turn" is for distances: ``"user"`` (a real user turn, SPEC §8) or
    #: ``"step"`` (one top-level model call, SPEC §8)
    turn_unit: str = "user"
    #: with ``turn_unit="user"``: a current user turn of at least this many steps also
    #: ages its own older steps, step by step (0 turns this off; SPEC §8, aging within a turn)
    long_turn_steps: int = 24
    #: ... with its step boundary advancing only every this many steps
    step_quantum: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.max_refs_per_result <= STORED_REFERENCES:
            raise ValueError(f"max_refs_per_result must be between 0 and {STORED_REFERENCES}")
        if self.turn_unit not in TURN_UNITS:
            raise ValueError(f"turn_unit must be one of {TURN_UNITS}, not {self.turn_unit!r}")
        if self.long_turn_steps < 0 or self.step_quantum < 1:
            raise ValueError("long_turn_steps must be >= 0 and step_quantum >= 1")

    @classmethod
    def from_options(cls, options: AgingOptions) -> AgingPolicy:
        """The default policy with the fields ``options`` sets (the wire type, SPEC §8)."""
        fields = {k: v for k, v in msgspec.structs.asdict(options).items() if v is not None}
        if "exempt_tools" in fields:
            fields["exempt_tools"] = frozenset(fields["exempt_tools"])
        return cls(**fields)

    def is_exempt(self, tool: str) -> bool:
        low = tool.lower()
        try:
            return low in _lowered(self.exempt_tools)
        except TypeError:  # a policy built with an unhashable collection
            return any(low == t.lower() for t in self.exempt_tools)

    def as_dict(self) -> dict[str, Any]:
        """camelCase form for manifests and decision paths."""
        return {
            "version": AGING_POLICY_VERSION,
            "keepRecentTurns": self.keep_recent_turns,
            "minAgeSeconds": self.min_age_seconds,
            "minTokens": self.min_tokens,
            "protectFirst": self.protect_first,
            "exemptTools": sorted(self.exempt_tools),
            "softTrimHeadChars": self.soft_trim_head_chars,
            "softTrimTailChars": self.soft_trim_tail_chars,
            "hardClearAfterTurns": self.hard_clear_after_turns,
            "maxSingleResultShare": self.max_single_result_share,
            "maxRefsPerResult": self.max_refs_per_result,
            "turnUnit": self.turn_unit,
            "longTurnSteps": self.long_turn_steps,
            "stepQuantum": self.step_quantum,
        }


DEFAULT_POLICY = AgingPolicy()


@dataclass(slots=True)
class AgingStats:
    #: results replaced (soft trims + hard clears + caps)
    tool_results_aged: int = 0
    #: sum over replaced results of (original tokens − replacement tokens)
    tokens_freed_by_aging: int = 0
    #: results that passed every other gate but were cited later
    references_protected: int = 0
    soft_trimmed: int = 0
    hard_cleared: int = 0
    capped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "toolResultsAged": self.tool_results_aged,
            "tokensFreedByAging": self.tokens_freed_by_aging,
            "referencesProtected": self.references_protected,
            "softTrimmed": self.soft_trimmed,
            "hardCleared": self.hard_cleared,
            "capped": self.capped,
        }


@dataclass(slots=True)
class AgingPlan:
    #: node id → replacement text: pass as ``render_view(..., aged=plan.aged)``
    aged: dict[str, str] = field(default_factory=dict)
    #: node id → ``softTrim`` | ``hardClear`` | ``capped`` (for the manifest / replay)
    kinds: dict[str, str] = field(default_factory=dict)
    stats: AgingStats = field(default_factory=AgingStats)
    #: every result in the view → its outcome or the first gate that blocked it
    decisions: dict[str, str] = field(default_factory=dict)
    #: node id → the references that protected it (gate ``cited``)
    cited: dict[str, list[str]] = field(default_factory=dict)
    boundary_seq: int | None = None
    policy_version: int = AGING_POLICY_VERSION

    def manifest(self) -> dict[str, Any]:
        """What a render manifest needs to rebuild ``aged`` exactly (``rebuild_aged``)."""
        return {
            "agingPolicyVersion": self.policy_version,
            "agingBoundary": self.boundary_seq,
            "agingKinds": dict(self.kinds),
        }

    def decision_path(self) -> list[str]:
        """Human-readable lines for ``context/prepare``'s decision path."""
        s = self.stats
        out = [
            f"aging: {s.tool_results_aged} results aged ({s.soft_trimmed} soft-trimmed, "
            f"{s.hard_cleared} hard-cleared, {s.capped} capped), {s.tokens_freed_by_aging} tokens freed, "
            f"{s.references_protected} protected by later references, boundary seq {self.boundary_seq}"
        ]
        return out


# ---------------------------------------------------------------- replacement texts


def result_text(node: Call) -> str:
    """The plain text of a code node's stored result (images as ``[image: ref]``)."""
    return blocks_text(value_blocks(node.output))


def stored_references(output: Any) -> list[str]:
    """The ranked references of a code node's stored output that the ledger keeps
    (SPEC §8): at most ``STORED_REFERENCES``, most frequent first. Mined on what the store
    keeps (after spilling), as token counts are, so a lazily mined list equals a stored one."""
    return top_references(blocks_text(value_blocks(output)), STORED_REFERENCES)


def soft_trim_text(text: str, policy: AgingPolicy = DEFAULT_POLICY) -> str | None:
    """Head + marker + tail, or None when the text is not longer than head + tail."""
    head, tail = policy.soft_trim_head_chars, policy.soft_trim_tail_chars
    m = len(text)
    if m <= head + tail:
        return None
    omitted = m - head - tail
    tail_part = text[m - tail :] if tail > 0 else ""
    return (
        f"{text[:head]}\n[… aged: {omitted} of {m} characters omitted from this old tool result …]\n{tail_part}"
    )


def hard_clear_text(tool: str, chars: int, tokens: int) -> str:
    return (
        f"[tool result aged out: {tool or 'function'}, {chars} characters / {tokens} tokens removed; "
        "call the tool again if you need it]"
    )


def cap_text(text: str, tokens: int, limit: int, share: float, count: Callable[[str], int]) -> str:
    """``text`` cut to head + marker + tail so that ``count`` of the result is ``<= limit``."""
    m = len(text)
    pct = _pct(share)
    keep = math.floor(m * limit / tokens * 0.9) if tokens > 0 else 0
    keep = max(0, min(keep, m - 1))
    for _ in range(12):
        head = (keep + 1) // 2
        tail = keep - head
        omitted = m - keep
        out = (
            f"{text[:head]}\n[… truncated: {omitted} of {m} characters omitted; one tool result may use "
            f"at most {pct} % of the context window …]\n{text[m - tail :] if tail else ''}"
        )
        if count(out) <= limit or keep == 0:
            return out
        keep = math.floor(keep * 0.8)
    return out


def _pct(share: float) -> str:
    v = share * 100
    return str(int(v)) if v == int(v) else f"{v:g}"


def cap_limit(policy: AgingPolicy, window: int) -> int:
    return max(1, math.floor(window * policy.max_single_result_share))


@lru_cache(maxsize=64)
def _lowered(tools: frozenset[str]) -> frozenset[str]:
    """``tools`` in lower case (asked once per result of every aging plan)."""
    return frozenset(t.lower() for t in tools)
