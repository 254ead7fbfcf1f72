"""``session/graph``: a session as rows an editor can draw (SPEC §4.1).

A pure function of the ledger, like the render: nodes in seq order with both edges,
paged by seq, plus what the graph marks on them. Every statement about coverage is a
restatement of stored data, never derived from seq arithmetic or from where HEAD is:

* which summary a head uses is ``summary_choice.select_summary`` over that head's chain — the
  render's own rule, so the graph and the request can never disagree;
* an active summary's ``coversIds`` are its ``metadata.covers_ids`` plus the caller
  subtrees of the covered nodes (a covered turn folds with its tool calls), minus ids
  that no longer exist;
* a summary that applies to some head's chain but is active for none of them is
  ``supersededSummary``; it carries no coverage;
* ``agedBy`` names the newest llm node whose recorded request (``renderManifest.aged``)
  showed that result aged; ``spilledChars`` is the node's ``metadata.spill``.

Architecture Invariant: no I/O, no writes (like every module of this layer).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dagctx.ledger.graph import SessionGraph, is_spawn_root, is_summary
from dagctx.protocol import messages as m
from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME, Call

from .content import covers_of, tool_call_id_of
from .summary_choice import SummaryChoice, active_summary, select_summary, summary_head

PREVIEW_CHARS = 160
_encoder = msgspec.json.Encoder()


@dataclass
class Coverage:
    """What the summaries of a session mean for a set of heads."""

    #: head → the summary its render uses (None: none)
    by_head: dict[str, str | None] = field(default_factory=dict)
    #: active summary → its coverage (covers_ids + caller subtrees, existing ids only)
    covers: dict[str, list[str]] = field(default_factory=dict)
    #: active summary → the heads it is active for
    active_for: dict[str, list[str]] = field(default_factory=dict)
    superseded: set[str] = field(default_factory=set)


def coverage(graph: SessionGraph, heads: Sequence[str], memo: ChoiceMemo | None = None) -> Coverage:
    """Which summary each head uses, and what each active summary folds. With ``memo``
    (the choices of an earlier state of this graph) only what may have changed is asked."""
    out = Coverage()
    lost: set[str] = set()
    if not graph.summaries:
        choices: dict[str, SummaryChoice] = {}
    elif memo is not None:
        choices = memo.choices_for(graph, heads)
    else:
        choices = choices_by_head(graph, heads)
    for head in heads:
        if head in out.by_head:
            continue
        choice = choices.get(head)
        active = choice.active if choice is not None else None
        out.by_head[head] = active.id if active is not None else None
        if choice is None:
            continue
        lost.update(choice.superseded)
        if active is not None:
            out.active_for.setdefault(active.id, []).append(head)
            if active.id not in out.covers:
                out.covers[active.id] = folded_ids(graph, covers_of(active))
    out.superseded = lost - out.covers.keys()
    return out


def choices_by_head(graph: SessionGraph, heads: Sequence[str]) -> dict[str, SummaryChoice]:
    """``select_summary(graph, graph.chain(head))`` for every head, in one walk.

    A session with many tips (retries, forks) would walk each tip's chain from the root
    and index it again; the chains share their prefixes, so one depth-first walk of the
    predecessor tree holds each head's chain (and its index) when it reaches the head,
    and the render's own rule (``active_summary``) is asked there. A summary is only
    asked about a chain that holds the first and the last of its covered ids (without
    both it cannot apply: SPEC §8). A head the walk does not reach (a broken chain)
    takes the plain path, which raises ``BrokenPredecessorChain`` like a render.
    """
    want = set(heads)
    out: dict[str, SummaryChoice] = {}
    root = graph.root_id
    if root in want:
        out[root] = SummaryChoice()  # ROOT's chain is empty: nothing applies
    summaries = [graph.nodes[nid] for nid in graph.summaries]
    ends: list[tuple[Call, str, str]] = []
    for s in summaries:
        covers = covers_of(s)
        if covers and s.status == "completed":
            ends.append((s, covers[0], covers[-1]))
    nodes, kids = graph.nodes, graph.conv_children
    path: list[Call] = []
    index: dict[str, int] = {}
    starts = [n.id for n in graph.by_seq if n.predecessor is None and n.id != root
              and is_spawn_root(n) and graph.is_conversation(n)]
    starts += kids.get(root, ())
    # the walk: ``(id, True)`` enters a node, ``(id, False)`` leaves it
    stack: list[tuple[str, bool]] = [(nid, True) for nid in reversed(starts)]
    remaining = len(want - out.keys())
    while stack and remaining:
        nid, enter = stack.pop()
        if not enter:
            del index[nid]
            path.pop()
            continue
        if nid in index:  # a loop: never on a chain (the plain path names it)
            continue
        node = nodes[nid]
        index[nid] = len(path)
        path.append(node)
        stack.append((nid, False))
        if nid in want and nid not in out:
            candidates = [s for s, first, last in ends if first in index and last in index]
            picked = active_summary(graph, path, candidates, index=index) if candidates else None
            out[nid] = SummaryChoice() if picked is None else SummaryChoice(picked[0], *picked[1], picked[2])
            remaining -= 1
        for child in reversed(kids.get(nid, ())):
            stack.append((child, True))
    for head in heads:
        if head not in out:
            out[head] = select_summary(graph, graph.chain(head))
    return out


@dataclass
class ChoiceMemo:
    """The summary choice of each head at one state of one ``SessionGraph``, carried to a
    later state where it cannot have changed.

    A head's choice is a function of its chain and of the summaries (SPEC §8). Predecessor
    edges never change and nodes are never removed from a graph, so the chain of a node
    that already existed stays what it was; what can change a choice is a summary added
    or replaced, a node appearing under an id a summary recorded as its ``head``, or a
    replaced node that starts a chain (no predecessor: whether it is a spawn root decides
    where chains end). Any of those, a graph rebuilt, or rows that did not arrive in seq
    order: every head is asked again. Otherwise only heads not asked before are.
    """

    #: ``(graph, node count, last seq, replacements, choices)`` of the state last asked,
    #: replaced as a whole (handlers of several connections may ask at once); the counts
    #: are read before the choices are computed, so a write during the walk is new next time.
    #: The graph is held weakly: the store's cache decides how long a graph lives.
    state: tuple[weakref.ref[SessionGraph], int, int, int, dict[str, SummaryChoice]] | None = None

    @staticmethod
    def _still_valid(graph: SessionGraph, state: tuple[weakref.ref[SessionGraph], int, int, int, Any]) -> bool:
        known_graph, count, last_seq, updates, _ = state
        if known_graph() is not graph:
            return False
        by_seq = graph.by_seq
        if len(by_seq) < count or len(graph.updates) < updates:
            return False
        if count and by_seq[count - 1].seq != last_seq:
            return False  # a row arrived out of seq order: the new ones are not the tail
        recorded = {h for nid in graph.summaries if (h := summary_head(graph.nodes[nid])) is not None}
        for node in by_seq[count:]:
            if is_summary(node) or node.id in recorded:
                return False
        for nid in graph.updates[updates:]:
            node = graph.nodes[nid]
            if is_summary(node) or node.id in recorded or node.predecessor is None:
                return False
        return True

    def choices_for(self, graph: SessionGraph, heads: Sequence[str]) -> dict[str, SummaryChoice]:
        by_seq = graph.by_seq
        count, updates = len(by_seq), len(graph.updates)
        last_seq = by_seq[count - 1].seq if count else -1
        state = self.state
        known = state[4] if state is not None and self._still_valid(graph, state) else {}
        missing = [h for h in heads if h not in known]
        fresh: dict[str, SummaryChoice] = {}
        if len(missing) > 8:
            fresh = choices_by_head(graph, missing)
        else:
            for h in missing:
                fresh[h] = select_summary(graph, graph.chain(h))
        out = {h: known[h] if h in known else fresh[h] for h in heads}
        self.state = (weakref.ref(graph), count, last_seq, updates, out)
        return out


def folded_ids(graph: SessionGraph, covers: Sequence[str]) -> list[str]:
    """``covers`` plus every node below each covered node by the caller edge (seq order
    within each turn), each once; ids that no longer exist are left out."""
    seen: set[str] = set()
    out: list[str] = []
    for cid in covers:
        if cid not in graph.nodes or cid in seen:
            continue
        seen.add(cid)
        out.append(cid)
        for n in graph.subtree(cid):
            if n.id not in seen and not is_summary(n) and n.name != SYSTEM_PROMPT_NAME:
                seen.add(n.id)
                out.append(n.id)
    return out


def aged_by(graph: SessionGraph) -> dict[str, str]:
    """Result id → the newest llm node whose recorded request aged it (``renderManifest.aged``)."""
    out: dict[str, str] = {}
    for n in graph.by_seq:
        if n.role != "llm":
            continue
        manifest = n.metadata.get("renderManifest")
        if not isinstance(manifest, dict):
            continue
        aged = manifest.get("aged")
        if isinstance(aged, list):
            for nid in aged:
                if isinstance(nid, str):
                    out[nid] = n.id
    return out


def preview(value: Any) -> str:
    """A short one-line text of a node's content (never the whole of a huge value)."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value[: PREVIEW_CHARS * 4]
    elif isinstance(value, list):
        parts = []
        for block in value[:8]:
            if isinstance(block, dict):
                t = block.get("text") or block.get("content") or block.get("type") or ""
                parts.append(t if isinstance(t, str) else _short_json(t))
            else:
                parts.append(block if isinstance(block, str) else _short_json(block))
        text = " ".join(parts)[: PREVIEW_CHARS * 4]
    else:
        text = _short_json(value)
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _short_json(value: Any) -> str:
    try:
        return _encoder.encode(value)[: PREVIEW_CHARS * 4].decode("utf-8", "replace")
    except (TypeError, ValueError, OverflowError):
        return str(value)[: PREVIEW_CHARS * 4]


def node_preview(node: Call) -> str:
    if node.role == "code" and node.name != SYSTEM_PROMPT_NAME:
        args = preview(node.input)
        head = f"{node.name}({args})" if args else node.name
        out = preview(node.output)
        return preview(f"{head} → {out}" if out else head)
    if node.role == "llm" and node.caller is not None and node.predecessor is None and node.output is None:
        return preview(node.input)
    return preview(node.output if node.output is not None else node.input)


def graph_row(graph: SessionGraph, node: Call, cov: Coverage, aged: dict[str, str]) -> m.GraphNode:
    summary = is_summary(node)
    spill = node.metadata.get("spill")
    aged_calls = spilled_calls = 0
    if graph.callees.get(node.id) and node.id != graph.root_id:  # ROOT's subtree holds every branch
        for c in graph.subtree(node.id):
            aged_calls += c.id in aged
            spilled_calls += "spill" in c.metadata
    covers = cov.covers.get(node.id) if summary else None
    return m.GraphNode(
        id=node.id,
        seq=node.seq,
        role=node.role,
        created_at=node.created_at,
        name=node.name,
        status=node.status,
        caller=node.caller,
        predecessor=node.predecessor,
        preview=node_preview(node),
        conversation=graph.is_conversation(node),
        callees=len(graph.callees.get(node.id, ())),
        tool_call_id=tool_call_id_of(node) if node.role == "code" else None,
        spawn_root=is_spawn_root(node),
        spawned_from=(graph.owner(node.caller) if is_spawn_root(node) and node.caller in graph.nodes else None),
        summary=summary,
        system_prompt=node.name == SYSTEM_PROMPT_NAME,
        covers_ids=covers,
        active_for=cov.active_for.get(node.id) if covers is not None else None,
        superseded_summary=summary and node.id in cov.superseded,
        spilled_chars=int(spill["chars"]) if isinstance(spill, dict) and isinstance(spill.get("chars"), int) else None,
        aged_by=aged.get(node.id),
        replayable=node.role == "llm" and isinstance(node.metadata.get("renderManifest"), dict),
        aged_calls=aged_calls,
        spilled_calls=spilled_calls,
    )


def graph_page(
    graph: SessionGraph,
    heads: Sequence[str],
    *,
    after_seq: int = -1,
    limit: int = 2_000,
    conversation_only: bool = False,
    cov: Coverage | None = None,
    aged: dict[str, str] | None = None,
) -> tuple[list[m.GraphNode], int | None, Coverage]:
    """One page of rows (``seq > after_seq``, at most ``limit``) and the cursor of the next.
    ``cov`` and ``aged`` may be given when already computed for this graph state."""
    cov = coverage(graph, heads) if cov is None else cov
    aged = aged_by(graph) if aged is None else aged
    rows: list[m.GraphNode] = []
    by_seq = graph.by_seq
    lo, hi = 0, len(by_seq)
    while lo < hi:  # the first node with seq > after_seq
        mid = (lo + hi) // 2
        if by_seq[mid].seq <= after_seq:
            lo = mid + 1
        else:
            hi = mid
    i = lo
    while i < len(by_seq) and len(rows) < limit:
        node = by_seq[i]
        i += 1
        if conversation_only and not (
            graph.is_conversation(node) or is_summary(node) or node.name == SYSTEM_PROMPT_NAME
        ):
            continue
        rows.append(graph_row(graph, node, cov, aged))
    # (with ``conversation_only`` the next page may turn out empty: it is the last)
    return rows, (by_seq[i - 1].seq if i < len(by_seq) else None), cov
