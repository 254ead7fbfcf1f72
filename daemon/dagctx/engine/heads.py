"""The check every walk from a client-named ``head`` starts with (SPEC §4).

A head names a conversation node: walks follow ``predecessor`` from it. A nested
node (a tool call, an inner llm call) has no predecessor by design, so a walk from
it would stop at once and report ``BrokenPredecessorChain`` — a false corruption
alarm: the data is fine, the request named the wrong node. This check answers
``InvalidParams`` instead, naming the node whose turn the nested one belongs to.
"""

from __future__ import annotations

from dagctx.ledger.graph import SessionGraph
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import ROOT_SENTINEL


def check_head(graph: SessionGraph, head: str | None, *, path: str = "head") -> None:
    """Raise ``InvalidParams`` unless ``head`` (when given) is a conversation node.

    A missing node stays ``NodeNotFound``; ``None`` means the session's HEAD.
    """
    if head is None or head == ROOT_SENTINEL or head == graph.root_id:
        return
    node = graph.get(head)
    if graph.is_conversation(node):
        return
    if node.caller is not None and node.caller in graph.nodes:
        caller = graph.nodes[node.caller]
        what = "a tool call" if node.role == "code" else f"a nested {node.role} call"
        turn = graph.owner(head)
        raise DagctxError(
            "InvalidParams",
            f"head must be a conversation node; this is {what} of {caller.id} ({caller.role} node). "
            f"Pass the id of the turn it belongs to ({turn}) or omit head for the session's HEAD",
            path=path, node_id=head, session_id=graph.session_id,
        )
    raise DagctxError(
        "InvalidParams",
        f"head must be a conversation node; {head!r} ({node.role} {node.name!r}) sits beside the chain "
        "and is never a branch tip. Pass a user/llm node of the branch or omit head",
        path=path, node_id=head, session_id=graph.session_id,
    )
