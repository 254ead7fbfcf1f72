"""The ledger's rules (SPEC §4) as plain functions over a session graph.

Every invariant a write must keep is decided here, before any storage is touched:
ids are unique, top-level turns name a predecessor (``PredecessorMissing``), edges
point at existing nodes of the right kind, a summary covers real conversation nodes,
HEAD names a conversation node on an intact chain, a rewind stays on HEAD's branch,
and only a running node may be finished. The store calls these inside its write
transaction; they read the graph and raise ``DagctxError``, nothing else.

Architecture Invariant: no I/O and no SQL here; tested without any database
(tests/unit/test_rules.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import (
    REASONING_KEY,
    ROOT_SENTINEL,
    SUMMARY_NAME,
    TERMINAL_STATUSES,
    Call,
    NodeInput,
    ReasoningBlock,
)

from .graph import SessionGraph, is_summary

_ID_RE = re.compile(r"^[^\x00-\x1f]{1,200}$")


def resolve(root_id: str, node_id: str | None) -> str | None:
    """The real id behind ``"ROOT"`` (SPEC §4), any other id as it is."""
    return root_id if node_id == ROOT_SENTINEL else node_id


def check_new_id(g: SessionGraph, node_id: str) -> None:
    """A fresh node id: well formed and unused in this session (nodes are never replaced)."""
    if not _ID_RE.match(node_id):
        raise DagctxError(
            "InvalidParams",
            "node.id must be 1–200 characters without control characters",
            path="node.id",
        )
    if node_id in g.nodes or node_id == ROOT_SENTINEL:
        raise DagctxError(
            "DuplicateNode",
            f"node {node_id!r} already exists in session {g.session_id!r}; ids are unique and "
            "nodes are never replaced — omit node.id to get a fresh one",
            node_id=node_id,
            session_id=g.session_id,
        )


def check_edges(
    g: SessionGraph,
    head: str,
    node_id: str | None,
    inp: NodeInput,
    predecessor: str | None,
    caller: str | None,
    *,
    spawn_ok: bool = False,
) -> None:
    """The edge rules of one append (SPEC §4); errors name the client's id, never a made-up one."""
    sid = g.session_id
    if inp.metadata.get("spawn_branch_root") and not (spawn_ok and predecessor is None and caller is not None):
        raise DagctxError(
            "InvalidEdge",
            "spawn-branch roots are created only by session/spawn, never by node/append",
            node_id=node_id,
            session_id=sid,
            path="node.metadata.spawn_branch_root",
        )
    if caller is not None and caller not in g.nodes:
        raise DagctxError(
            "NodeNotFound",
            f"node.caller {caller!r} does not exist in session {sid!r}",
            node_id=caller,
            session_id=sid,
            path="node.caller",
        )
    if predecessor is not None:
        pred = g.nodes.get(predecessor)
        if pred is None:
            raise DagctxError(
                "NodeNotFound",
                f"node.predecessor {predecessor!r} does not exist in session {sid!r}; "
                f"the current head is {head!r}",
                node_id=predecessor,
                session_id=sid,
                path="node.predecessor",
            )
        if not g.is_conversation(pred):
            raise DagctxError(
                "InvalidEdge",
                f"node.predecessor {predecessor!r} is a nested call, not a conversation node; "
                "a predecessor must be a user/llm turn, a top-level call, or ROOT",
                node_id=predecessor,
                session_id=sid,
                path="node.predecessor",
            )
    nested = caller is not None and caller != g.root_id and g.nodes[caller].role in ("code", "llm")
    if nested and predecessor is not None:
        raise DagctxError(
            "InvalidEdge",
            "a nested call (its caller is a function or an LLM call) has no predecessor: "
            "drop node.predecessor, or drop node.caller for a top-level turn",
            node_id=node_id,
            session_id=sid,
            path="node.predecessor",
        )
    ask_user_answer = inp.role == "user" and inp.input is not None and caller is not None
    if inp.role in ("user", "llm") and not nested and predecessor is None and not ask_user_answer:
        raise DagctxError(
            "PredecessorMissing",
            f"a top-level {inp.role} node needs node.predecessor: pass the current head "
            f"{head!r} to continue the branch, an earlier turn's id to fork, or \"ROOT\"",
            node_id=node_id,
            session_id=sid,
            path="node.predecessor",
            details={"head": head},
        )
    for rid in inp.reads:
        if rid not in g.nodes:
            raise DagctxError(
                "NodeNotFound",
                f"node.reads names {rid!r}, which does not exist in session {sid!r}",
                node_id=rid,
                session_id=sid,
                path="node.reads",
            )
    if inp.name == SUMMARY_NAME and inp.role == "llm":
        check_covers(g, node_id, inp.metadata.get("covers_ids"))
        check_summary_head(g, node_id, inp.metadata.get("head"))


def check_covers(g: SessionGraph, node_id: str | None, covers: object) -> None:
    """A summary names the ordered real conversation nodes it replaces (never a summary)."""
    if not isinstance(covers, list) or not covers:
        raise DagctxError(
            "InvalidEdge",
            "a context/summary node needs metadata.covers_ids: the ordered ids it replaces",
            node_id=node_id,
            session_id=g.session_id,
            path="node.metadata.covers_ids",
        )
    for cid in covers:
        c = g.nodes.get(cid) if isinstance(cid, str) else None
        if c is None or not g.is_conversation(c) or is_summary(c) or cid == g.root_id:
            raise DagctxError(
                "InvalidEdge",
                f"metadata.covers_ids names {cid!r}, which is not a real conversation "
                "node of this session (summaries never cover summaries)",
                node_id=node_id,
                session_id=g.session_id,
                path="node.metadata.covers_ids",
            )


def check_summary_head(g: SessionGraph, node_id: str | None, head: object) -> None:
    """A summary's ``metadata.head`` (the head it was made for), when given, names a
    conversation node of the session (SPEC §8, which summary a head uses)."""
    if head is None:
        return
    node = g.nodes.get(head) if isinstance(head, str) else None
    if node is None or not g.is_conversation(node) or is_summary(node):
        raise DagctxError(
            "InvalidEdge",
            f"metadata.head names {head!r}, which is not a conversation node of this session; "
            "give the head the summary was made for, or leave it out",
            node_id=node_id,
            session_id=g.session_id,
            path="node.metadata.head",
        )


def head_after_append(
    g: SessionGraph, head: str, call: Call, move_head: bool | None
) -> tuple[str, bool]:
    """Where HEAD is after ``call`` was added to ``g``: ``(head, moved)``.

    HEAD follows an append that extends it, or any conversation node appended with
    ``moveHead: true`` (a retry); a nested call never becomes HEAD.
    """
    if g.is_conversation(call) and not is_summary(call):
        extends = call.predecessor == head
        if move_head is True or (move_head is None and extends):
            return call.id, True
        return head, False
    if move_head is True:
        raise DagctxError(
            "InvalidEdge",
            "moveHead is only for conversation nodes (user/llm turns or top-level calls "
            "with a predecessor); a nested call never becomes HEAD",
            node_id=call.id,
            session_id=g.session_id,
        )
    return head, False


def check_head_target(g: SessionGraph, node: Call) -> None:
    """HEAD may only name a conversation node whose chain reaches the root intact."""
    if not g.is_conversation(node) or is_summary(node):
        raise DagctxError(
            "InvalidEdge",
            f"node {node.id!r} is not a conversation node; HEAD can only be a user/llm turn, "
            "a top-level call, a spawn root, or ROOT",
            node_id=node.id,
            session_id=g.session_id,
        )
    g.chain(node.id)  # refuses a head whose branch is broken


def rewind_target(g: SessionGraph, head: str, node_id: str | None, steps: int | None) -> str:
    """The node a rewind moves HEAD to: back along HEAD's own branch, never elsewhere."""
    if (node_id is None) == (steps is None):
        raise DagctxError("InvalidParams", "give exactly one of nodeId or steps", path="nodeId")
    chain = [g.root_id] + [n.id for n in g.chain(head)]
    if steps is not None:
        if steps < 1 or steps >= len(chain):
            raise DagctxError(
                "InvalidParams",
                f"steps must be between 1 and {len(chain) - 1} on this branch (got {steps})",
                path="steps",
            )
        return chain[-1 - steps]
    target = resolve(g.root_id, node_id)
    assert target is not None
    g.get(target)
    if target not in chain:
        raise DagctxError(
            "InvalidEdge",
            f"node {target!r} is not on the current branch; rewind moves back along "
            "HEAD's branch — use session/checkout to jump to another branch",
            node_id=target,
            session_id=g.session_id,
        )
    return target


def check_update(session_id: str, old: Call, status: str) -> None:
    """The one mutation: only a running node is finished, and only to a terminal status."""
    if status not in TERMINAL_STATUSES:
        raise DagctxError(
            "InvalidParams",
            f"status must be one of completed, error, cancelled (not {status!r})",
            path="status",
        )
    if old.status != "running":
        raise DagctxError(
            "NotRunning",
            f"node {old.id!r} is {old.status}, and only a running node may be updated "
            "(the ledger is append-only); append a new node instead",
            node_id=old.id,
            session_id=session_id,
        )


def move_branch_name(names: dict[str, str] | None, old_tip: str, new_tip: str) -> None:
    """A branch's name follows its tip when an append extends it."""
    if names and old_tip in names:
        names[new_tip] = names.pop(old_tip)


def check_range(offset: int, length: int | None) -> None:
    if offset < 0 or (length is not None and length < 0):
        raise DagctxError("InvalidParams", "range offset and length must be ≥ 0", path="range")


def check_list_window(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise DagctxError("InvalidParams", "limit and offset must be zero or positive")


#: the longest id prefix ``id/resolve`` takes (ids are far shorter)
MAX_ID_PREFIX = 256


def check_id_prefix(prefix: str, limit: int) -> None:
    if not prefix:
        raise DagctxError("InvalidParams", "prefix is empty: give the first characters of a session or node id",
                          path="prefix")
    if len(prefix) > MAX_ID_PREFIX:
        raise DagctxError("InvalidParams", f"prefix is {len(prefix)} characters long; ids are shorter than "
                          f"{MAX_ID_PREFIX}: give the start of one", path="prefix")
    if not 1 <= limit <= 1000:
        raise DagctxError("InvalidParams", "limit must be between 1 and 1000", path="limit")


def prefix_range(prefix: str) -> tuple[str, str | None]:
    """The ids that start with ``prefix`` are those in [lo, hi) in code point order (which
    is UTF-8 byte order): hi is the prefix with its last character one higher (None: no
    upper end, when every character is U+10FFFF)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are no characters: the next one is U+E000
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix, prefix[:i] + chr(code)
    return prefix, None


def check_search(query: str, limit: int) -> None:
    if not query.strip():
        raise DagctxError("InvalidQuery", "query is empty: give at least one word", path="query")
    if not 1 <= limit <= 1000:
        raise DagctxError("InvalidParams", "limit must be between 1 and 1000", path="limit")


def check_title(title: str) -> None:
    if not title.strip():
        raise DagctxError("InvalidParams", "title must not be empty")


def known(g: SessionGraph, ids: Sequence[str]) -> list[Call]:
    """The nodes named by ``ids`` (``"ROOT"`` allowed), or ``NodeNotFound`` for the first missing."""
    return [g.get(resolve(g.root_id, nid) or nid) for nid in ids]


def check_reasoning(role: str, metadata: dict[str, object], path: str = "node.metadata.reasoning") -> None:
    """``metadata.reasoning`` (SPEC §4): a list of reasoning blocks, on an llm node only."""
    if REASONING_KEY not in metadata or metadata[REASONING_KEY] is None:
        return
    if role != "llm":
        raise DagctxError(
            "InvalidParams",
            f"{path} belongs on an llm node (the call that produced the reasoning), not a {role} node",
            path=path,
        )
    try:
        msgspec.convert(metadata[REASONING_KEY], list[ReasoningBlock])
    except msgspec.ValidationError as err:
        raise DagctxError(
            "InvalidParams",
            f"{path} must be a list of reasoning blocks "
            "({type: thinking|redacted_thinking|reasoning, text?, signature?, data?, id?, summary?, "
            f"encryptedContent?}}): {err}",
            path=path,
        ) from None
