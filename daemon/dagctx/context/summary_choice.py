"""Which summary and which system prompt a branch uses (SPEC §8, SPEC §6).

``select_summary`` is the render's own rule for the active summary of a chain, so
``session/graph`` (``graph_view.py``) and exports restate exactly what a request does;
``render.render_view`` applies it. ``is_chain_member`` says which nodes belong to a
predecessor chain (never content of a caller subtree). Pure functions over a
``SessionGraph``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dagctx.ledger.graph import SessionGraph, is_spawn_root
from dagctx.protocol.nodes import SUMMARY_NAME, SYSTEM_PROMPT_NAME, Call

from .content import covers_of

_INF = float("inf")


def is_chain_member(graph: SessionGraph, node: Call) -> bool:
    """A node that belongs to a predecessor chain (never content of a caller subtree)."""
    if node.id == graph.root_id:
        return False
    if node.name in (SUMMARY_NAME, SYSTEM_PROMPT_NAME) and node.role in ("llm", "code"):
        return False
    if is_spawn_root(node):
        return True
    return graph.is_conversation(node) and not graph.is_nested(node)


def beside_chain(node: Call) -> bool:
    return node.role in ("llm", "code") and node.name in (SUMMARY_NAME, SYSTEM_PROMPT_NAME)


def select_system_node(graph: SessionGraph, max_seq: float) -> Call | None:
    """The newest ``context/system_prompt`` node with ``seq <= max_seq``.

    SPEC §4 allows ``role=code``; importers write ``role=llm``: both count.
    """
    for nid in reversed(graph.system_prompts):
        node = graph.nodes[nid]
        if node.seq <= max_seq and node.role in ("code", "llm"):
            return node
    return None


def summary_candidates(graph: SessionGraph) -> list[Call]:
    return [graph.nodes[nid] for nid in graph.summaries]


def summary_head(node: Call) -> str | None:
    """The head a summary was made for (``metadata.head``, SPEC §8), or None."""
    h = node.metadata.get("head")
    return h if isinstance(h, str) and h else None


def summary_reach(graph: SessionGraph, summary: Call, chain: list[Call], index: Mapping[str, int],
                  newer_from: Callable[[int], int]) -> tuple[int, int] | None:
    """``(first, reach)`` when ``summary`` applies to the branch ``chain``, else None.

    SPEC §8, which summary a head uses: its ``covers_ids`` are a contiguous run of the
    branch starting at ``first``, and the branch reaches the head the summary was made
    for — that head is on the branch (``reach`` = its position), or the branch leaves
    that head's branch after the covered run and holds past that point only nodes
    written after the summary (a fork made after the compaction; ``reach`` = the last
    shared node). A summary without a recorded head (imported, or appended by a client)
    was made for its last covered node. ``newer_from(seq)`` is the first chain position
    from which every node is newer than ``seq``.
    """
    if summary.status != "completed":
        return None
    covers = covers_of(summary)
    if not covers:
        return None
    first = index.get(covers[0])
    if first is None or first + len(covers) > len(chain):
        return None
    if [n.id for n in chain[first:first + len(covers)]] != covers:
        return None  # another branch (or not contiguous): renders raw there
    last = first + len(covers) - 1
    h = summary_head(summary)
    if h is None or h not in graph.nodes:
        return first, last
    at = index.get(h)
    if at is not None:
        return (first, at) if at >= last else None
    # the branch left the summary's head's branch: find the last shared node
    node = graph.nodes[h]
    floor = chain[last].seq
    seen = 0
    while node.id not in index:
        pred = node.predecessor
        if pred is None or pred not in graph.nodes or node.seq <= floor or seen > len(graph.nodes):
            return None
        node = graph.nodes[pred]
        seen += 1
    shared = index[node.id]
    if shared < last or shared >= len(chain) - 1 or newer_from(summary.seq) > shared + 1:
        return None  # an older branch, or an ancestor of the summary's head
    return first, shared


def active_summary(graph: SessionGraph, chain: list[Call], candidates: list[Call], *,
                   index: Mapping[str, int] | None = None) -> tuple[Call, tuple[int, int], list[str]] | None:
    """The summary the branch ``chain`` uses, its segment and the applicable summaries it
    supersedes (SPEC §8): among the applicable ones, the one that reaches furthest along
    the branch (ties: the newest). ``index`` (node id → position in ``chain``) may be
    given when the caller already holds it."""
    if not candidates:
        return None
    if index is None:
        index = {n.id: i for i, n in enumerate(chain)}
    suffix_min: list[float] | None = None

    def newer_from(seq: int) -> int:
        nonlocal suffix_min
        if suffix_min is None:  # the oldest seq from each position on (non-decreasing)
            suffix_min = [_INF] * (len(chain) + 1)
            for i in range(len(chain) - 1, -1, -1):
                suffix_min[i] = min(suffix_min[i + 1], chain[i].seq)
        return bisect.bisect_right(suffix_min, seq)

    applicable: list[tuple[Call, int, int, int]] = []
    for s in candidates:
        got = summary_reach(graph, s, chain, index, newer_from)
        if got is not None:
            first, reach = got
            applicable.append((s, first, first + len(covers_of(s)) - 1, reach))
    if not applicable:
        return None
    best = max(applicable, key=lambda t: (t[3], t[0].seq))
    return best[0], (best[1], best[2]), [t[0].id for t in applicable if t[0] is not best[0]]


def summary_applies(graph: SessionGraph, summary: Call, chain: list[Call]) -> bool:
    """True when ``summary`` applies to the branch ``chain`` (SPEC §8)."""
    return active_summary(graph, chain, [summary]) is not None


@dataclass(frozen=True)
class SummaryChoice:
    """Which summary a branch uses (SPEC §8): the active one and its segment of the chain."""

    active: Call | None = None
    #: indexes into the chain of the first and last covered node (``-1`` when none)
    first: int = 0
    last: int = -1
    #: summaries that applied to this chain but lost to the active one
    superseded: list[str] = field(default_factory=list)


def select_summary(
    graph: SessionGraph,
    chain: list[Call],
    *,
    before_seq: float = _INF,
    exclude: set[str] | frozenset[str] = frozenset(),
    protect: set[str] | frozenset[str] = frozenset(),
) -> SummaryChoice:
    """``active_summary`` over the session's summaries, as ``render_view`` chooses them:
    what ``session/graph`` restates per head (SPEC §4.1), so the graph follows the render's
    rule whatever it is."""
    if not chain:
        return SummaryChoice()
    candidates = [s for s in summary_candidates(graph)
                  if s.id not in exclude and s.seq < before_seq and not protect.intersection(covers_of(s))]
    picked = active_summary(graph, chain, candidates)
    if picked is None:
        return SummaryChoice()
    active, (lo, hi), superseded = picked
    return SummaryChoice(active, lo, hi, superseded)
