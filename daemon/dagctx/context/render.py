"""The view function: which nodes of a session DAG a model sees, in which order.

``render_view(graph, head)`` is a pure function of the ledger (SPEC §6). It never writes and does no I/O; the same graph and arguments give
the same ``View``. A ``View`` is provider-neutral: ``formats.to_messages`` turns it
into OpenAI / Anthropic / neutral messages.

The rule
========

1. **Branch.** Walk ``graph.chain(head)`` (predecessor edges only). ROOT is never
   rendered and never expanded: its caller subtree holds every branch.
2. **Turn contents.** Each chain node is rendered with its *caller subtree*, filtered:

   - a callee that is itself a chain member (a top-level llm reply whose caller is
     its user node, a retry of it, a spawn-branch root) is never pulled in through
     the caller edge -- it is rendered only if it is on this chain. This is what
     keeps sibling branches and spawn branches from leaking into each other;
   - summary and system-prompt nodes are never callee content;
   - a **chain llm node** shows its text and its tool calls (code callees with
     ``metadata.toolCallId``) as real call/result pairs. When one llm node holds
     several calls with the same ``toolCallId`` (a tool retry, SPEC §4), the
     newest by seq is shown and the older ones are dropped (noted in ``repairs``);
   - a **code node** shows its own input and output. Its inner nodes (inner llm
     calls, the tool calls *those* made, sub-functions) are shown only when its
     ``metadata.expose`` (else ``expose_default``) is ``"full"``; ``"io"`` shows
     none of them, recursively (SPEC §6: hidden inner llm calls never
     leak their tool calls, because a hidden subtree is simply never walked);
   - an inner (nested) llm node renders its ``input`` as a user message (the prompt
     the function gave it) and its output as an assistant message with its own
     tool calls; an inner user node (an ask-user answer) renders as a text pair
     ``Asked the user: …`` / ``The user answered: …``;
   - a code node without ``toolCallId`` (a function the user ran, or one a function
     called) renders as a *text pair*: an assistant line ``Called name(args)`` and a
     user line ``Result of name:\\n…``. With exposed insides the two halves bracket
     them. A still-running text pair has no result half.
   - provider pairing forbids anything between an assistant message with tool calls
     and its results, so the exposed insides of tool calls (and any non-tool
     callees of the llm node) follow the llm node's result group, in seq order.
3. **Order.** The chain gives turn order; within a turn everything is in seq order
   (subject to the pairing constraint above).
4. **Summary substitution** (SPEC §8, which summary a head uses),
   ``summary_policy="active"``: a summary node (``role=llm``, ``name=context/summary``,
   not in ``exclude_summaries``, older than ``before_seq``) *applies* to the head when
   its ``covers_ids`` are a contiguous segment of *this* chain and the chain reaches
   the head the summary was made for (``metadata.head``): that head is on the chain,
   or the chain leaves that head's branch after the segment with nodes all written
   after the summary (a fork made after the compaction). A summary without
   ``metadata.head`` was made for its last covered node. Among the applicable ones
   the active one reaches furthest along the chain (ties: newest by seq); it renders
   in place of its segment; covered nodes and their caller subtrees are dropped. So a
   summary written while compacting one head never changes the render of a head that
   does not descend from it (``active_summary``). Other applicable summaries are
   superseded and never rendered (``View.superseded``).
   The summary renders as a **user** message ``[Previous conversation summary]\\n…``
   (a user message is valid at the start of every provider's message list and is
   merged with a following user turn by the Anthropic formatter).
5. **Turns.** Only real user chain nodes start a turn (defect 4). Turn numbers count
   the underlying conversation: a summary adds the user turns it covers and no turn
   of its own, so turn distance (``View.turn_count - item.turn``) is the same with or
   without the summary applied.

Status
======

Errors and cancellations are visible, never filtered (a failed turn is only on its
own branch anyway: a retry forks from the same predecessor, SPEC §4):

- tool result / text-pair result: ``[error] <output or error message>``,
  ``[cancelled] <output or [no result recorded]>``;
- a tool call that never finished (running, no output): the synthetic result
  ``[no result recorded]`` (recorded in ``View.repairs``);
- an llm node with status error: an assistant message with any partial output
  followed by ``[error] the model call failed: <message>``; cancelled:
  ``[cancelled] the model call was cancelled``;
- a running llm node without output renders nothing (it is the call being prepared).

Frame (``frame=<code node id>``)
================================

Render as seen from *inside* a running function F (SPEC §6, rendering inside a function):

- A = F's top-level ancestor (follow ``caller`` from F until a chain member). The
  branch is ``graph.chain(A)``; in frame mode ``head`` is not consulted (a checkout
  elsewhere while F runs does not change what F sees).
- History: every node of that branch with ``seq < F.seq`` ("before the frame
  started"), rendered by the normal rules (summaries apply; a summary covering A is
  not applicable).
- The call stack A → … → F is *open*: each code node on it shows its call half and
  its progress so far (its callees with ``seq < F.seq``) as if exposed ``full``, and
  no result half. A tool call on the stack gets the result
  ``[in progress: …]`` so the owner's call/result pair stays valid.
- F's own progress: its whole callee subtree so far (any seq), shown in full; F's
  inner llm calls show their tool calls; sub-functions follow their own expose.

``metadata.render_range`` (on a code node; our definition, SPEC §6)
==================================================================================

``{"callers": N, "subcalls": M}``, each a non-negative int; a missing, null or
negative value means "no limit".

- ``callers`` (read on the frame F only): how many enclosing levels F sees. The
  levels above F, innermost first, are the code nodes on its call stack, then the
  conversation (the whole branch history, A's turn included). ``0`` → F sees only
  its own call and progress; ``1`` → also its direct calling function's progress
  (or the conversation when F is called from a turn directly); and so on. When the
  conversation is hidden, the outermost visible function is rendered as a text pair
  call half (it has no visible llm owner to pair with).
- ``subcalls``: whenever a code node's inner nodes are shown (expose full, on the
  open stack, or the frame), only its last M direct callees (by seq) are shown.

Other parameters
================

- ``aged``: node id → replacement text for the output of code nodes (the aging
  layer's decision). Applied to tool results and text-pair results; recorded in
  ``View.aged``. Ids of non-code nodes are ignored.
- ``before_seq``: render the graph as it stood before seq N was appended (replay of
  a past call): nodes, summaries and system-prompt nodes with ``seq >= N`` are
  invisible. (A node that finished later still shows its final output: the only
  mutation the ledger allows.)
- ``system_node_id``: use this ``context/system_prompt`` node (replay); otherwise
  the newest such node with ``seq <= head.seq`` (frame mode: ``<=`` the newest seq in
  the frame's progress), and ``< before_seq`` when given.
- User nodes: text is ``output`` (``input`` when output is null).
  ``metadata.memory_prefetch`` and then ``metadata.prepend_context`` render as text
  blocks in front of the user's own content, inside the same user message (SPEC §4
  §7). Images and files stay references (``{"type": "image", "url"|"path"|"source"}``).

Architecture Invariant: no I/O, no writes, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Literal

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SYSTEM_PROMPT_NAME, Call

from .cancel import stop_if_cancelled
from .content import blocks_text, covers_of, message_blocks, render_range
from .render_items import ItemWriter
from .summary_choice import active_summary, is_chain_member, select_system_node, summary_candidates
from .view import View

__all__ = ["render_view", "system_text_of"]

_INF = float("inf")


def _invalid(message: str, node_id: str | None = None) -> DagctxError:
    return DagctxError("InvalidParams", message, node_id=node_id)


def _frame_path(graph: SessionGraph, frame: Call) -> list[Call]:
    """[A, …, F]: the frame's top-level ancestor A down to the frame F."""
    path = [frame]
    node = frame
    seen = {frame.id}
    while not is_chain_member(graph, node):
        caller = node.caller
        if caller is None or caller == graph.root_id or caller not in graph.nodes or caller in seen:
            raise _invalid(
                f"frame {frame.id!r} is not inside any conversation turn: its caller chain "
                f"ends at {node.id!r}; pass the id of a function call made within a turn",
                frame.id,
            )
        node = graph.nodes[caller]
        seen.add(node.id)
        path.append(node)
    path.reverse()
    return path


def render_view(
    graph: SessionGraph,
    head: str,
    *,
    frame: str | None = None,
    expose_default: Literal["io", "full"] = "io",
    summary_policy: Literal["active", "none"] = "active",
    exclude_summaries: set[str] | frozenset[str] = frozenset(),
    aged: Mapping[str, str] | None = None,
    system_node_id: str | None = None,
    before_seq: int | None = None,
    start_after: str | None = None,
    pending_system: tuple[str, str] | None = None,
) -> View:
    """The neutral view of ``head``'s branch (or of a running function ``frame``).

    See the module docstring for the rule. Raises ``DagctxError`` (``NodeNotFound``,
    ``BrokenPredecessorChain``, ``InvalidParams``) on bad ids or bad data.

    ``start_after`` (a chain node id) renders only the chain nodes after it: the
    suffix an incremental re-render appends to a cached prefix. It is refused
    (``InvalidParams``) when the active summary's segment reaches into the suffix;
    turn numbers of a suffix view are relative to its start.

    ``pending_system`` ``(node id, text)``: the system prompt of a request whose prompt
    node is written only when the request is handed out (SPEC §7); it replaces the
    stored selection.
    """
    if expose_default not in ("io", "full"):
        raise _invalid(f"expose must be 'io' or 'full', not {expose_default!r}")
    if summary_policy not in ("active", "none"):
        raise _invalid(f"summary policy must be 'active' or 'none', not {summary_policy!r}")
    before = _INF if before_seq is None else before_seq
    aged_map: Mapping[str, str] = {
        k: v for k, v in (aged or {}).items() if k in graph.nodes and graph.nodes[k].role == "code"
    }

    frame_node: Call | None = None
    path: list[Call] = []
    if frame is not None:
        frame_node = graph.get(frame)
        if frame_node.role != "code":
            raise _invalid(f"frame {frame!r} is a {frame_node.role} node; a frame is a function (code) call", frame)
        path = _frame_path(graph, frame_node)
        frame_ids = frozenset([frame_node.id, *(n.id for n in graph.subtree(frame_node.id))])
        chain = graph.chain(path[0].id)
        open_ids = frozenset(n.id for n in path if n.role == "code")
        seqs = [graph.nodes[i].seq for i in frame_ids if graph.nodes[i].seq < before]
        ref_seq: float = max(seqs) if seqs else frame_node.seq
    else:
        frame_ids = frozenset()
        open_ids = frozenset()
        chain = graph.chain(head)
        ref_seq = graph.get(head).seq
    stop_if_cancelled()

    r = ItemWriter(
        graph,
        expose_default=expose_default,
        aged=aged_map,
        before_seq=before,
        frame=frame_node,
        frame_set=frame_ids,
        open_ids=open_ids,
    )
    if frame_node is not None:
        chain = [n for n in chain if r.visible(n)]
    elif before_seq is not None:  # ``visible`` without a frame: only the seq bound
        chain = [n for n in chain if n.seq < before]
    # else every node is visible (``graph.chain`` gave a list of this walk's own)
    stop_if_cancelled()

    # ---- summary substitution (per branch)
    active: Call | None = None
    seg = (0, -1)
    superseded: list[str] = []
    if summary_policy == "active" and chain:
        protect = {path[0].id} if path else None
        # (a summary's covers are read only when a frame's outermost node must not be covered)
        candidates = [s for s in summary_candidates(graph)
                      if s.id not in exclude_summaries and s.seq < before
                      and not (protect is not None and protect.intersection(covers_of(s)))]
        picked = active_summary(graph, chain, candidates)
        if picked is not None:
            active, seg, superseded = picked

    # ---- render_range.callers on the frame
    start_at: Call | None = None
    if frame_node is not None:
        callers, _ = render_range(frame_node)
        if callers is not None:
            stack = [n for n in path[:-1] if n.role == "code"]  # outermost first
            if callers < len(stack) + 1:  # the conversation level is hidden
                start_at = stack[len(stack) - callers] if callers else frame_node

    begin = 0
    if start_after is not None:
        if frame_node is not None:
            raise _invalid("start_after cannot be combined with a frame")
        pos = next((k for k, n in enumerate(chain) if n.id == start_after), None)
        if pos is None:
            raise _invalid(f"start_after {start_after!r} is not on the branch of {head!r}", start_after)
        if active is not None and seg[1] > pos:
            raise _invalid("the active summary reaches past start_after; render the whole branch")
        begin = pos + 1

    # where the items of each chain node walked (and of the summary) begin (``View.parts``)
    starts: list[int] = []
    put = starts.append
    if start_at is not None:
        r.function(start_at, depth=0)
    else:
        items = r.items
        i = begin
        while i < len(chain):
            stop_if_cancelled()  # SPEC §1.4: a cancelled render stops within one turn
            put(len(items))
            if active is not None and i == seg[0]:
                covered_users = [n.role for n in chain[seg[0] : seg[1] + 1]].count("user")
                r.summary(active, covered_users)
                i = seg[1] + 1
                continue
            r.chain_node(chain[i])
            i += 1

    system_text, system_id = _system_prompt(graph, min(ref_seq, before - 1), system_node_id, pending_system)
    chain_ids = [n.id for n in chain]
    parts: tuple[list[int], list[str]] | None = None
    if frame_node is None:
        # the chain nodes walked, in order: the summary in place of its segment
        walked = (chain_ids[begin:] if active is None or seg[0] < begin
                  else [*chain_ids[begin:seg[0]], active.id, *chain_ids[seg[1] + 1:]])
        parts = (starts, walked)
    return View(
        head=head,
        items=r.items,
        reads=r.reads,
        turns=r.turns,
        turn_count=r.turn,
        frame=frame,
        summary_id=active.id if active is not None else None,
        covered=covers_of(active) if active is not None else [],
        superseded=superseded,
        system=system_text,
        system_node=system_id,
        aged=r.aged_used,
        repairs=r.repairs,
        expose_default=expose_default,
        summary_policy=summary_policy,
        before_seq=before_seq,
        excluded_summaries=sorted(exclude_summaries),
        chain=chain_ids,
        start_after=start_after,
        parts=parts,
    )


def _system_prompt(graph: SessionGraph, upto_seq: float, system_node_id: str | None,
                   pending_system: tuple[str, str] | None) -> tuple[str | None, str | None]:
    """``(text, node id)`` of the system prompt a view shows: the pending one, the named
    node, or the newest system-prompt node up to ``upto_seq``."""
    sys_node: Call | None
    if pending_system is not None:
        sys_node = None
    elif system_node_id is not None:
        sys_node = graph.get(system_node_id)
        if sys_node.name != SYSTEM_PROMPT_NAME:
            raise _invalid(f"node {system_node_id!r} is not a {SYSTEM_PROMPT_NAME} node", system_node_id)
    else:
        sys_node = select_system_node(graph, upto_seq)
    system_text: str | None = None
    system_id = sys_node.id if sys_node is not None else None
    if pending_system is not None:
        system_id, system_text = pending_system
    elif sys_node is not None:
        system_text = system_text_of(sys_node)
    return system_text, system_id


def system_text_of(node: Call) -> str | None:
    """The text a system-prompt node gives a view (None: it has no output)."""
    out = node.output
    if out is None:
        return None
    return out if isinstance(out, str) else blocks_text(message_blocks(out))


def with_system_prompt(view: View, graph: SessionGraph, system_node_id: str | None,
                       pending_system: tuple[str, str] | None) -> View:
    """A branch view (no frame, no ``start_after``) as ``render_view`` renders it with
    ``system_node_id`` / ``pending_system``: only its system prompt differs."""
    before = _INF if view.before_seq is None else view.before_seq
    text, node_id = _system_prompt(graph, min(graph.get(view.head).seq, before - 1), system_node_id, pending_system)
    return replace(view, system=text, system_node=node_id)


def age_view(view: View, graph: SessionGraph, aged: Mapping[str, str]) -> View | None:
    """``view``, rendered without aging, as ``render_view`` renders the same arguments
    with ``aged`` (SPEC §8): aging only replaces the result content of aged code nodes,
    so those items are rebuilt and every other item is kept. None when that cannot be
    told from the view (a frame or suffix view, one already aged, an aged result that
    was a synthetic one): render again then. Equal to the full render (tests compare
    the two); it saves the second walk of a branch whose aging was just planned."""
    if view.frame is not None or view.start_after is not None or view.aged:
        return None
    aged_map = {k: v for k, v in aged.items() if k in graph.nodes and graph.nodes[k].role == "code"}
    if not aged_map:
        return replace(view, items=list(view.items))
    w = ItemWriter(graph, expose_default=view.expose_default, aged=aged_map,
                   before_seq=_INF if view.before_seq is None else view.before_seq, frame=None,
                   frame_set=frozenset(), open_ids=frozenset())
    items = list(view.items)
    for k, it in enumerate(items):
        if it.node_id not in aged_map:
            continue
        node = graph.nodes[it.node_id]
        if it.kind == "tool_result":
            if it.synthetic:
                return None
            blocks, _ = w.result_blocks(node)
        elif it.kind == "text_pair" and it.part == "result":
            blocks = w.function_result_blocks(node)
        else:
            continue
        items[k] = replace(it, content=blocks, text=blocks_text(blocks), aged=True)
    return replace(view, items=items, aged=w.aged_used)
