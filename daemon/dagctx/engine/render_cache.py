"""Incremental re-rendering: reuse the last render of a branch when the new head extends it.

A render is a pure function of the data, so a cached render of head H stays valid
for the part of a new head H' that H' shares with it, as long as nothing that part
depends on changed: no node appended under (or updated within) a prefix turn, no
new summary over the prefix, the same system-prompt node and the same aging
decisions. Then only the chain suffix after H is rendered (``render_view(...,
start_after=H)``) and appended — the cost is proportional to what changed (SPEC §6, incremental rendering).
Anything else falls back to a full render, which is always correct.

Architecture Invariant: a cache hit returns exactly what a full render would; the
tests compare the two byte for byte.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Any

from dagctx.context.content import covers_of
from dagctx.context.view import View
from dagctx.ledger import SessionGraph
from dagctx.protocol.nodes import SUMMARY_NAME, SYSTEM_PROMPT_NAME


@dataclass
class Snapshot:
    """Where a cached computation stood in the graph."""

    chain: list[str]
    chain_set: frozenset[str]
    max_seq: int
    n_updates: int
    #: the graph's ``lineage``: ``n_updates`` counts that lineage's replacements only
    lineage: object = None

    @classmethod
    def of(cls, graph: SessionGraph, chain: list[str]) -> Snapshot:
        last = graph.by_seq[-1].seq if graph.by_seq else 0
        return cls(chain, frozenset(chain), last, len(graph.updates), graph.lineage)


def still_valid_prefix(graph: SessionGraph, snap: Snapshot, new_chain: list[str]) -> bool:
    """True when ``new_chain`` extends ``snap.chain`` and nothing the prefix renders changed
    (a graph loaded anew — ``SessionGraph.lineage`` — may have any node changed)."""
    if snap.lineage is not graph.lineage:
        return False
    n = len(snap.chain)
    if len(new_chain) < n or new_chain[:n] != snap.chain:
        return False
    prefix = snap.chain_set
    # nodes appended since the snapshot
    start = bisect.bisect_right(graph.by_seq, snap.max_seq, key=lambda n: n.seq)
    for node in graph.by_seq[start:]:
        if node.name == SYSTEM_PROMPT_NAME:
            return False
        if node.name == SUMMARY_NAME and prefix.intersection(covers_of(node)):
            return False
        if node.id in prefix or graph.owner(node.id) in prefix:
            return False
    # the one mutation (running → finished) inside a prefix turn
    for nid in graph.updates[snap.n_updates :]:
        if nid in graph.nodes and graph.owner(nid) in prefix:
            return False
    return True


@dataclass
class CachedRender:
    key: tuple[Any, ...]
    snap: Snapshot
    view: View
    aged: dict[str, str]
    system: str | None
    messages: list[Any]
    node_ids: list[list[str]]
    per_message: list[int]
    repairs: list[str]
    #: every tool call id ``messages`` use: an extension renames a repeated one (SPEC §6)
    call_ids: frozenset[str] = frozenset()
    #: where the format's last pass's repairs begin in ``repairs`` (``Rendered.built_at``)
    built_at: int = 0


def join_views(prefix: View, suffix: View, new_chain: list[str]) -> View:
    """The full view of the new head: the cached prefix view plus the suffix view.

    The suffix was walked from the prefix's head on, so it numbers its turns from 0: its
    items, like its ``turns``, are shifted by the prefix's turn count, or the joined view
    would tell the newest items from the oldest by ``View.turn_count - item.turn`` (aging by
    user turns, the current turn of ``context/prepare``) differently from a cold walk of
    the same head. ``suffix`` is the caller's own fresh walk: its items are renumbered in
    place."""
    shift = prefix.turn_count
    if shift:
        for it in suffix.items:
            it.turn += shift
    parts = None
    if prefix.parts is not None and suffix.parts is not None:
        (starts, ids), (more, more_ids), at = prefix.parts, suffix.parts, len(prefix.items)
        parts = (starts + [k + at for k in more], ids + more_ids)
    return replace(
        prefix,
        head=suffix.head,
        items=prefix.items + suffix.items,
        reads=prefix.reads + suffix.reads,
        turns=prefix.turns + [(nid, t + shift) for nid, t in suffix.turns],
        turn_count=shift + suffix.turn_count,
        aged=prefix.aged + [a for a in suffix.aged if a not in prefix.aged],
        repairs=prefix.repairs + suffix.repairs,
        chain=new_chain,
        start_after=None,
        parts=parts,
    )


@dataclass
class CachedAging:
    key: tuple[Any, ...]
    snap: Snapshot
    turn_start: str | None
    aged: dict[str, str]
    stats: dict[str, Any]
    #: the branch's newest request (llm node) when the plan was made: a plan that may hold a
    #: change back compares with it (SPEC §8)
    previous: str | None = None
    #: the numbers of a change to that request's aging made because it paid (``_deferred``)
    paid: dict[str, Any] | None = None
