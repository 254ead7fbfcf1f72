"""What a render produces: ``View``, the provider-neutral view of one head, and its ``Item``s.

Plain data, built by ``render.render_view`` (the rule is in that module's docstring) and
turned into provider messages by ``formats``. ``RENDER_POLICY_VERSION`` is recorded in
every manifest, so a past call can be replayed by the rule it was rendered with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Bumped whenever the rule of ``render.py`` changes what a model sees (recorded in manifests).
RENDER_POLICY_VERSION = 2

NO_RESULT = "[no result recorded]"
NO_OUTPUT = "(no output)"
IN_PROGRESS = "[in progress: this call is still running; its progress so far follows]"

ItemKind = Literal["user", "assistant", "tool_call", "tool_result", "text_pair", "summary"]


@dataclass(slots=True)
class Item:
    """One neutral piece of the view.

    ``kind``: ``user`` (a user turn, or an inner llm call's prompt), ``assistant``
    (llm text; its tool calls follow as ``tool_call`` items with ``owner`` = this
    node), ``tool_call`` / ``tool_result`` (a code node with a ``toolCallId``; both
    carry the code node's id), ``text_pair`` (a function call without a tool call id:
    two items, ``part="call"`` with role assistant and ``part="result"`` with role
    user), ``summary`` (the active summary, role user).

    ``content`` holds neutral blocks: ``{"type": "text", "text"}``, ``{"type":
    "image", …reference}``, ``{"type": "file", …reference}``. ``text`` is the plain
    text projection (images as ``[image: ref]``).
    """

    kind: ItemKind
    node_id: str
    role: Literal["user", "assistant", "tool"]
    seq: int
    content: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    name: str = ""
    input: Any = None
    tool_call_id: str | None = None
    owner: str | None = None
    status: str = "completed"
    part: Literal["call", "result"] | None = None
    depth: int = 0
    turn: int = 0
    aged: bool = False
    synthetic: bool = False
    #: an assistant item of a top-level llm node: its reasoning blocks (``metadata.reasoning``,
    #: SPEC §6), which the formatter sends or not by the render's reasoning mode
    reasoning: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class View:
    """What a model sees for one head: neutral items plus provenance."""

    head: str
    items: list[Item]
    #: ids of every node that contributed, first appearance order (summary included, ROOT never)
    reads: list[str]
    #: ``(node id, turn number)`` parallel to ``reads``
    turns: list[tuple[str, int]]
    #: number of the newest real user turn (covered turns included, summaries not)
    turn_count: int = 0
    frame: str | None = None
    summary_id: str | None = None
    #: the active summary's ``covers_ids`` (chain ids dropped from this render)
    covered: list[str] = field(default_factory=list)
    #: applicable summaries that lost to the active one (never rendered)
    superseded: list[str] = field(default_factory=list)
    system: str | None = None
    system_node: str | None = None
    #: ids whose output was replaced by ``aged`` text
    aged: list[str] = field(default_factory=list)
    #: data repairs and notable decisions (synthetic results, dropped tool retries)
    repairs: list[str] = field(default_factory=list)
    expose_default: str = "io"
    summary_policy: str = "active"
    before_seq: int | None = None
    excluded_summaries: list[str] = field(default_factory=list)
    policy_version: int = RENDER_POLICY_VERSION
    #: ids of the branch's chain nodes (oldest first) that this view walked
    chain: list[str] = field(default_factory=list)
    #: with ``start_after``: the chain node after which this (suffix) view starts
    start_after: str | None = None
    #: ``(starts, ids)``: where the items of each chain node the walk rendered (and of the
    #: active summary) begin, in order — ``items[starts[k]:starts[k + 1]]`` are what the
    #: turn part of chain node ``ids[k]`` rendered (``aging.owner_chain_id`` of each one's
    #: node), so a compaction reads each item's group by position. None when not known:
    #: a frame view, or items rearranged after the walk (a request checkpoint).
    parts: tuple[list[int], list[str]] | None = None

    def manifest(self) -> dict[str, Any]:
        """Everything needed to reproduce this render from the same graph (SPEC §6, the render manifest)."""
        out: dict[str, Any] = {
            "policyVersion": self.policy_version,
            "head": self.head,
            "frame": self.frame,
            "exposeDefault": self.expose_default,
            "summaryPolicy": self.summary_policy,
            "summaryId": self.summary_id,
            "coversIds": list(self.covered),
            "supersededSummaries": list(self.superseded),
            "excludedSummaries": list(self.excluded_summaries),
            "systemNode": self.system_node,
            "aged": list(self.aged),
            "beforeSeq": self.before_seq,
        }
        return out


# ---------------------------------------------------------------- content helpers
