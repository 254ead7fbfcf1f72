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

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from dagctx.ledger.graph import SessionGraph, is_spawn_root, is_summary
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import REASONING_KEY, SUMMARY_MARKER, SUMMARY_NAME, SYSTEM_PROMPT_NAME, Call

#: Bumped whenever the rule above changes what a model sees (recorded in manifests).
RENDER_POLICY_VERSION = 2

NO_RESULT = "[no result recorded]"
NO_OUTPUT = "(no output)"
IN_PROGRESS = "[in progress: this call is still running; its progress so far follows]"

ItemKind = Literal["user", "assistant", "tool_call", "tool_result", "text_pair", "summary"]

_IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})
_FILE_TYPES = frozenset({"file", "document", "input_file"})
#: Blocks in a stored llm output that are not replayed as text: tool calls are their
#: own code nodes; reasoning is sent only from ``metadata.reasoning`` (``Item.reasoning``).
_SKIP_TYPES = frozenset(
    {"tool_use", "tool_call", "function_call", "tool_result", "thinking", "redacted_thinking", "reasoning"}
)
_INF = float("inf")


# ---------------------------------------------------------------- data


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


def json_text(value: Any) -> str:
    """Compact JSON of a stored value, keys in stored order (deterministic)."""
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image_block(block: dict[str, Any]) -> dict[str, Any]:
    """Normalise an image reference to ``{"type": "image", url|path|source, …}``."""
    out: dict[str, Any] = {"type": "image"}
    kind = block.get("type")
    if kind == "image_url":
        ref = block.get("image_url")
        if isinstance(ref, dict):
            ref = ref.get("url")
        if ref is not None:
            out["url"] = ref
    elif kind == "input_image":
        ref = block.get("image_url") or block.get("url")
        if ref is not None:
            out["url"] = ref
    for key in ("source", "url", "path", "data", "media_type", "mediaType", "mimeType", "name", "alt", "detail", "bytes", "sha256"):
        if key in block and key not in out:
            out[key] = block[key]
    return out


def _file_block(block: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k != "type"}
    return {"type": "file", **out}


def _is_block_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in value
    )


def _blocks_from_list(blocks: list[dict[str, Any]], *, lenient: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        kind = b["type"]
        if kind in ("text", "input_text", "output_text"):
            text = b.get("text")
            if isinstance(text, str):
                if text:
                    out.append(_text_block(text))
            elif text is not None:
                out.append(_text_block(json_text(text)))
        elif kind in _IMAGE_TYPES:
            out.append(_image_block(b))
        elif kind in _FILE_TYPES:
            out.append(_file_block(b))
        elif kind in _SKIP_TYPES:
            continue
        elif lenient and isinstance(b.get("text"), str):
            if b["text"]:
                out.append(_text_block(b["text"]))
        else:
            out.append(_text_block(json_text(b)))
    return out


def message_blocks(value: Any) -> list[dict[str, Any]]:
    """Blocks of a user/llm message value: str, block list, or a dict with text/content."""
    if value is None:
        return []
    if isinstance(value, str):
        return [_text_block(value)] if value else []
    if _is_block_list(value):
        return _blocks_from_list(value, lenient=True)
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            return _blocks_from_list([value], lenient=True)
        for key in ("text", "content", "prompt", "message"):
            if key in value and value[key] is not None:
                inner = value[key]
                if isinstance(inner, str | list | dict):
                    return message_blocks(inner)
        return [_text_block(json_text(value))]
    return [_text_block(json_text(value))]


def value_blocks(value: Any) -> list[dict[str, Any]]:
    """Blocks of a function result, literal: str as is, block lists, anything else JSON."""
    if value is None:
        return []
    if isinstance(value, str):
        return [_text_block(value)] if value else []
    if _is_block_list(value):
        return _blocks_from_list(value, lenient=False)
    if isinstance(value, dict) and value.get("type") in _IMAGE_TYPES | _FILE_TYPES:
        return _blocks_from_list([value], lenient=False)
    return [_text_block(json_text(value))]


def block_text(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    ref = block.get("url") or block.get("path") or block.get("name") or block.get("sha256")
    if ref is None and isinstance(block.get("source"), dict):
        src = block["source"]
        ref = src.get("url") or src.get("path") or src.get("file_id") or src.get("media_type") or "inline"
    return f"[{kind}: {ref}]" if ref is not None else f"[{kind}]"


def blocks_text(blocks: list[dict[str, Any]]) -> str:
    return "\n\n".join(block_text(b) for b in blocks)


def _meta(node: Call, *keys: str) -> Any:
    for key in keys:
        if key in node.metadata and node.metadata[key] is not None:
            return node.metadata[key]
    return None


def tool_call_id_of(node: Call) -> str | None:
    tid = _meta(node, "toolCallId", "tool_call_id")
    return str(tid) if tid not in (None, "") else None


def reasoning_of(node: Call) -> list[dict[str, Any]]:
    """The reasoning blocks of an llm node (``metadata.reasoning``, SPEC §4), as stored."""
    got = node.metadata.get(REASONING_KEY) if node.role == "llm" else None
    if not isinstance(got, list):
        return []
    return [b for b in got if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking", "reasoning")]


def covers_of(node: Call) -> list[str]:
    covers = _meta(node, "covers_ids", "coversIds")
    return [str(c) for c in covers] if isinstance(covers, list) else []


def _error_message(node: Call) -> str:
    err = _meta(node, "error", "error_message", "errorMessage")
    if isinstance(err, dict):
        msg = err.get("message") or err.get("type")
        return str(msg) if msg else json_text(err)
    if err is not None:
        return str(err)
    etype = _meta(node, "error_type", "errorType")
    return str(etype) if etype is not None else ""


def _render_range(node: Call) -> tuple[int | None, int | None]:
    rr = _meta(node, "render_range", "renderRange")
    if not isinstance(rr, dict):
        return None, None

    def limit(key: str) -> int | None:
        v = rr.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
        return v

    return limit("callers"), limit("subcalls")


def _invalid(message: str, node_id: str | None = None) -> DagctxError:
    return DagctxError("InvalidParams", message, node_id=node_id)


# ---------------------------------------------------------------- graph helpers


def is_chain_member(graph: SessionGraph, node: Call) -> bool:
    """A node that belongs to a predecessor chain (never content of a caller subtree)."""
    if node.id == graph.root_id:
        return False
    if node.name in (SUMMARY_NAME, SYSTEM_PROMPT_NAME) and node.role in ("llm", "code"):
        return False
    if is_spawn_root(node):
        return True
    return graph.is_conversation(node) and not graph.is_nested(node)


def _beside(node: Call) -> bool:
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


def _summary_candidates(graph: SessionGraph) -> list[Call]:
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
    for k, cid in enumerate(covers):
        if chain[first + k].id != cid:
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


def active_summary(graph: SessionGraph, chain: list[Call],
                   candidates: list[Call]) -> tuple[Call, tuple[int, int], list[str]] | None:
    """The summary the branch ``chain`` uses, its segment and the applicable summaries it
    supersedes (SPEC §8): among the applicable ones, the one that reaches furthest along
    the branch (ties: the newest)."""
    if not candidates:
        return None
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
    candidates = [s for s in _summary_candidates(graph)
                  if s.id not in exclude and s.seq < before_seq and not protect.intersection(covers_of(s))]
    picked = active_summary(graph, chain, candidates)
    if picked is None:
        return SummaryChoice()
    active, (lo, hi), superseded = picked
    return SummaryChoice(active, lo, hi, superseded)


# ---------------------------------------------------------------- renderer


class _Renderer:
    def __init__(
        self,
        graph: SessionGraph,
        *,
        expose_default: str,
        aged: Mapping[str, str],
        before_seq: float,
        frame: Call | None,
        frame_set: frozenset[str],
        open_ids: frozenset[str],
    ) -> None:
        self.g = graph
        self.expose_default = expose_default
        self.aged_map = aged
        self.before = before_seq
        self.frame = frame
        self.frame_set = frame_set
        self.open_ids = open_ids
        self.items: list[Item] = []
        self.reads: list[str] = []
        self.turns: list[tuple[str, int]] = []
        self._read_set: set[str] = set()
        self.turn = 0
        self.repairs: list[str] = []
        self.aged_used: list[str] = []

    # -------------------------------------------------- basics

    def visible(self, node: Call) -> bool:
        if node.seq >= self.before:
            return False
        if self.frame is not None and node.seq > self.frame.seq and node.id not in self.frame_set:
            return False
        return True

    def callees(self, node_id: str) -> list[Call]:
        out = []
        for cid in self.g.callees.get(node_id, ()):
            c = self.g.nodes[cid]
            if _beside(c) or is_chain_member(self.g, c) or not self.visible(c):
                continue
            out.append(c)
        return out

    def emit_blocks(self, kind: str, node: Call, role: str, blocks: list[dict[str, Any]], **fields: Any) -> None:
        """Emit an item whose content is ``blocks`` (its text derived from them)."""
        self.emit(Item(kind=kind, node_id=node.id, role=role, seq=node.seq, content=blocks,
                       text=blocks_text(blocks), **fields))

    def emit(self, item: Item) -> None:
        item.turn = self.turn
        self.items.append(item)
        if item.node_id not in self._read_set:
            self._read_set.add(item.node_id)
            self.reads.append(item.node_id)
            self.turns.append((item.node_id, self.turn))

    def shows_insides(self, node: Call) -> bool:
        if node.id in self.open_ids:
            return True
        expose = node.metadata.get("expose")
        if expose not in ("io", "full"):
            expose = self.expose_default
        return expose == "full"

    # -------------------------------------------------- chain nodes

    def chain_node(self, node: Call) -> None:
        if node.role == "user":
            self.turn += 1
            self.user_turn(node)
            self.inner(self.callees(node.id), 1)
        elif node.role == "llm":
            self.llm(node, depth=0, nested=False)
        else:
            self.function(node, depth=0)

    def user_turn(self, node: Call) -> None:
        value = node.output if node.output is not None else node.input
        blocks: list[dict[str, Any]] = []
        for key in (("memory_prefetch", "memoryPrefetch"), ("prepend_context", "prependContext")):
            extra = _meta(node, *key)
            if isinstance(extra, str) and extra:
                blocks.append(_text_block(extra))
        blocks.extend(message_blocks(value))
        if not blocks:
            return  # an empty user message contributes nothing (the turn still counts)
        self.emit_blocks("user", node, "user", blocks, name=node.name, status=node.status)

    def summary(self, node: Call, covered_users: int) -> None:
        self.turn += covered_users
        blocks = message_blocks(node.output)
        text = blocks_text([b for b in blocks if b.get("type") == "text"])
        if not text.startswith(SUMMARY_MARKER):
            text = f"{SUMMARY_MARKER}\n{text}"
        self.emit_blocks("summary", node, "user", [_text_block(text)], name=node.name, status=node.status)

    # -------------------------------------------------- llm

    def llm(self, node: Call, *, depth: int, nested: bool) -> None:
        if nested and node.input is not None:
            prompt = message_blocks(node.input)
            if prompt:
                self.emit_blocks("user", node, "user", prompt, name=node.name, status=node.status, depth=depth)
        blocks = message_blocks(node.output)
        if node.status == "error":
            msg = _error_message(node)
            blocks.append(_text_block("[error] the model call failed" + (f": {msg}" if msg else "")))
        elif node.status == "cancelled":
            blocks.append(_text_block("[cancelled] the model call was cancelled"))

        tools: list[Call] = []
        others: list[Call] = []
        by_tid: dict[str, int] = {}
        for c in self.callees(node.id):
            tid = tool_call_id_of(c) if c.role == "code" else None
            if tid is None:
                others.append(c)
                continue
            if tid in by_tid:
                old = tools[by_tid[tid]]
                self.repairs.append(
                    f"tool call {tid} of {node.id}: retry {c.id} supersedes {old.id}"
                )
                tools[by_tid[tid]] = c
            else:
                by_tid[tid] = len(tools)
                tools.append(c)
        tools.sort(key=lambda n: n.seq)
        reasoning = reasoning_of(node) if not nested else []

        if blocks or tools or reasoning:
            self.emit_blocks(
                "assistant",
                node,
                "assistant",
                blocks,
                name=node.name,
                status=node.status,
                depth=depth,
                reasoning=reasoning,
            )
        for t in tools:
            self.emit(
                Item(
                    kind="tool_call",
                    node_id=t.id,
                    role="assistant",
                    seq=t.seq,
                    name=t.name,
                    input=t.input,
                    tool_call_id=tool_call_id_of(t),
                    owner=node.id,
                    status=t.status,
                    depth=depth,
                )
            )
        for t in tools:
            self.tool_result(t, node.id, depth)

        tool_ids = {t.id for t in tools}
        after = [t for t in tools if self.shows_insides(t)] + others
        after.sort(key=lambda n: n.seq)
        for c in after:
            if c.id in tool_ids:
                self.insides(c, depth + 1)
            else:
                self.inner([c], depth + 1)

    def tool_result(self, t: Call, owner: str, depth: int) -> None:
        tid = tool_call_id_of(t)
        synthetic = False
        if t.id in self.open_ids:
            blocks = [_text_block(IN_PROGRESS)]
            status = "running"
        else:
            blocks, synthetic = self.result_blocks(t)
            status = t.status
            if synthetic:
                self.repairs.append(f"synthetic result for unfinished tool call {tid} (node {t.id})")
        self.emit_blocks(
            "tool_result",
            t,
            "tool",
            blocks,
            name=t.name,
            tool_call_id=tid,
            owner=owner,
            status=status,
            depth=depth,
            aged=t.id in self.aged_map,
            synthetic=synthetic,
        )

    def result_blocks(self, node: Call) -> tuple[list[dict[str, Any]], bool]:
        """Result content of a code node with its status marker; (blocks, synthetic)."""
        if node.id in self.aged_map:
            blocks = [_text_block(str(self.aged_map[node.id]))]
            self.aged_used.append(node.id)
        else:
            blocks = value_blocks(node.output)
        synthetic = False
        if node.status == "error":
            msg = _error_message(node) if not blocks else ""
            prefix = "[error]" + (f" {msg}" if msg else "")
            blocks = _prefixed(prefix, blocks or [])
            if len(blocks) == 1 and blocks[0]["text"] == "[error]":
                blocks = [_text_block("[error] the call failed")]
        elif node.status == "cancelled":
            blocks = _prefixed("[cancelled]", blocks or [_text_block(NO_RESULT)])
        elif node.status == "running" and not blocks:
            blocks = [_text_block(NO_RESULT)]
            synthetic = True
        elif not blocks:
            blocks = [_text_block(NO_OUTPUT)]
        return blocks, synthetic

    # -------------------------------------------------- functions

    def function(self, node: Call, *, depth: int) -> None:
        """A code node as a text pair (no llm owner to pair a tool call with)."""
        args = "" if node.input is None else json_text(node.input)
        call = f"Called {node.name or 'function'}({args})"
        self.emit_blocks(
            "text_pair",
            node,
            "assistant",
            [_text_block(call)],
            name=node.name,
            input=node.input,
            tool_call_id=tool_call_id_of(node),
            status=node.status,
            part="call",
            depth=depth,
        )
        if self.shows_insides(node):
            self.insides(node, depth + 1)
        if node.id in self.open_ids:
            return
        if node.status == "running" and node.output is None:
            return
        blocks, _ = self.result_blocks(node)
        head = f"Result of {node.name or 'function'}:"
        if blocks and blocks[0].get("type") == "text":
            blocks = [_text_block(f"{head}\n{blocks[0]['text']}")] + blocks[1:]
        else:
            blocks = [_text_block(head)] + blocks
        self.emit_blocks(
            "text_pair",
            node,
            "user",
            blocks,
            name=node.name,
            tool_call_id=tool_call_id_of(node),
            status=node.status,
            part="result",
            depth=depth,
            aged=node.id in self.aged_map,
        )

    def ask_user(self, node: Call, *, depth: int) -> None:
        question = message_blocks(node.input)
        q = f"Asked the user: {blocks_text(question)}"
        self.emit_blocks(
            "text_pair",
            node,
            "assistant",
            [_text_block(q)],
            name="ask_user",
            input=node.input,
            status=node.status,
            part="call",
            depth=depth,
        )
        if node.output is None and node.status == "running":
            return
        answer = message_blocks(node.output)
        head = "The user answered:"
        if node.status in ("error", "cancelled") and not answer:
            answer = [_text_block(f"[{node.status}]")]
        if answer and answer[0].get("type") == "text":
            answer = [_text_block(f"{head} {answer[0]['text']}")] + answer[1:]
        else:
            answer = [_text_block(head)] + answer
        self.emit_blocks(
            "text_pair",
            node,
            "user",
            answer,
            name="ask_user",
            status=node.status,
            part="result",
            depth=depth,
        )

    def insides(self, node: Call, depth: int) -> None:
        callees = self.callees(node.id)
        _, subcalls = _render_range(node)
        if subcalls is not None:
            callees = callees[len(callees) - subcalls :] if subcalls else []
        self.inner(callees, depth)

    def inner(self, nodes: list[Call], depth: int) -> None:
        for c in nodes:
            if c.role == "llm":
                self.llm(c, depth=depth, nested=True)
            elif c.role == "code":
                self.function(c, depth=depth)
            else:
                self.ask_user(c, depth=depth)


def added_text(node: Call, side: str, aged: bool = False) -> str:
    """The text a render adds around a node's own content, so token counts include it
    (SPEC §6): status markers and placeholders of a tool result (``side="result"``),
    of a failed or cancelled reply (``"reply"``), the summary marker (``"summary"``).

    Mirrors ``result_blocks``, ``llm`` and ``summary`` above; a prefix is counted on its
    own, beside the content (within a token of the joined text).
    """
    if side == "summary":
        text = node.output if isinstance(node.output, str) else ""
        return "" if text.startswith(SUMMARY_MARKER) else SUMMARY_MARKER + "\n"
    if side == "reply":
        if node.status == "error":
            msg = _error_message(node)
            return "\n[error] the model call failed" + (f": {msg}" if msg else "")
        if node.status == "cancelled":
            return "\n[cancelled] the model call was cancelled"
        return ""
    if node.status == "completed" and node.output not in (None, "", []):
        return ""
    has = aged or bool(value_blocks(node.output))
    if node.status == "error":
        if has:
            return "[error] "
        msg = _error_message(node)
        return f"[error] {msg}" if msg else "[error] the call failed"
    if node.status == "cancelled":
        return "[cancelled] " if has else f"[cancelled] {NO_RESULT}"
    if not has:
        return NO_RESULT if node.status == "running" else NO_OUTPUT
    return ""


def _prefixed(prefix: str, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if blocks and blocks[0].get("type") == "text":
        text = blocks[0]["text"]
        return [_text_block(f"{prefix} {text}" if text else prefix)] + blocks[1:]
    return [_text_block(prefix)] + blocks


# ---------------------------------------------------------------- entry point


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

    r = _Renderer(
        graph,
        expose_default=expose_default,
        aged=aged_map,
        before_seq=before,
        frame=frame_node,
        frame_set=frame_ids,
        open_ids=open_ids,
    )
    chain = [n for n in chain if r.visible(n)]

    # ---- summary substitution (per branch)
    active: Call | None = None
    seg = (0, -1)
    superseded: list[str] = []
    if summary_policy == "active" and chain:
        protect = {path[0].id} if path else set()
        candidates = [s for s in _summary_candidates(graph)
                      if s.id not in exclude_summaries and s.seq < before and not protect.intersection(covers_of(s))]
        picked = active_summary(graph, chain, candidates)
        if picked is not None:
            active, seg, superseded = picked

    # ---- render_range.callers on the frame
    start_at: Call | None = None
    if frame_node is not None:
        callers, _ = _render_range(frame_node)
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

    if start_at is not None:
        r.function(start_at, depth=0)
    else:
        i = begin
        while i < len(chain):
            if active is not None and i == seg[0]:
                covered_users = sum(1 for n in chain[seg[0] : seg[1] + 1] if n.role == "user")
                r.summary(active, covered_users)
                i = seg[1] + 1
                continue
            r.chain_node(chain[i])
            i += 1

    # ---- system prompt
    sys_node: Call | None
    if pending_system is not None:
        sys_node = None
    elif system_node_id is not None:
        sys_node = graph.get(system_node_id)
        if sys_node.name != SYSTEM_PROMPT_NAME:
            raise _invalid(f"node {system_node_id!r} is not a {SYSTEM_PROMPT_NAME} node", system_node_id)
    else:
        sys_node = select_system_node(graph, min(ref_seq, before - 1))
    system_text: str | None = None
    system_id = sys_node.id if sys_node is not None else None
    if pending_system is not None:
        system_id, system_text = pending_system
    elif sys_node is not None and sys_node.output is not None:
        out = sys_node.output
        system_text = out if isinstance(out, str) else blocks_text(message_blocks(out))

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
        chain=[n.id for n in chain],
        start_after=start_after,
    )
