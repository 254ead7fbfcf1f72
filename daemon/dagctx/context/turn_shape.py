"""The turn a request reduces (SPEC §8): its user node, its steps, and the unit every
rendered item belongs to.

Kept apart from the rest of reduction within a turn because every other part reads it:
the check counts the protected part by unit, result summaries skip the newest step,
a checkpoint covers a prefix of the steps. Outside a frame the steps are the turn's
top-level model and code calls after the user's message; inside a running function
(``View.frame``) they are that function's own inner calls.

Architecture Invariant: no I/O, no clock, no store (ARCHITECTURE.md context layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagctx.ledger.graph import SessionGraph

from .aging import owner_cache, owner_chain_id
from .summary_choice import is_chain_member
from .view import View


@dataclass(frozen=True, slots=True)
class TurnShape:
    """The current user turn of a view: its user node and its steps, oldest first.

    In a frame (``View.frame``, a running function F, SPEC §6) the steps are F's own
    inner calls — its direct callees — and every item belongs to a *unit*: a chain node
    (the turn's earlier steps, the user's message), a direct callee of a function or
    call on the open stack A → … → F (a finished inner call, reducible like a step), or
    an open stack node itself (protected with F's newest step, SPEC §8)."""

    user: str | None
    steps: tuple[str, ...]
    #: the unit of every item (parallel to ``view.items``); the chain owner outside a frame
    owners: tuple[str, ...]
    #: the running function of a frame, else None
    frame: str | None = None
    #: the open call stack of a frame, A … F (chain node down to the function)
    stack: frozenset[str] = frozenset()


def frame_stack(graph: SessionGraph, frame: str) -> list[str]:
    """[A, …, F]: the chain node down to the running function ``frame`` by ``caller``."""
    out = [frame]
    node = graph.nodes[frame]
    while not is_chain_member(graph, node) and node.caller in graph.nodes and node.caller != graph.root_id:
        if node.caller in out:
            break
        node = graph.nodes[node.caller]
        out.append(node.id)
    out.reverse()
    return out


def unit_of(graph: SessionGraph, shape: TurnShape, node_id: str, cache: dict[str, str]) -> str:
    """The unit ``node_id`` belongs to (see ``TurnShape``): its chain owner outside a frame."""
    if shape.frame is None:
        return owner_chain_id(graph, node_id, cache)
    if node_id in cache:
        return cache[node_id]
    path: list[str] = []
    nid = node_id
    out = node_id
    while nid in graph.nodes:
        if nid in cache:
            out = cache[nid]
            break
        node = graph.nodes[nid]
        path.append(nid)
        if (nid in shape.stack or node.caller in shape.stack or is_chain_member(graph, node)
                or node.caller is None or node.caller == graph.root_id):
            out = nid
            break
        nid = node.caller
    for x in path:
        cache[x] = out
    return out


def turn_shape(view: View, graph: SessionGraph) -> TurnShape:
    user: str | None = None
    start = 0
    for i in range(len(view.chain) - 1, -1, -1):
        node = graph.nodes.get(view.chain[i])
        if node is not None and node.role == "user" and not node.metadata.get("spawn_branch_root"):
            user, start = node.id, i + 1
            break
    cache: dict[str, str] = {}
    if view.frame is not None and view.frame in graph.nodes:
        # inside a running function: its own inner calls are the steps (SPEC §8)
        stack = frozenset(frame_stack(graph, view.frame))
        shape = TurnShape(user, (), (), view.frame, stack)
        owners = tuple(unit_of(graph, shape, it.node_id, cache) for it in view.items)
        inner = {o for o in owners if o in graph.nodes and graph.nodes[o].caller == view.frame and o not in stack}
        steps = tuple(sorted(inner, key=lambda o: graph.nodes[o].seq))
        return TurnShape(user, steps, owners, view.frame, stack)
    owned = owner_cache(graph)
    owners = tuple(owner_chain_id(graph, it.node_id, owned) for it in view.items)
    steps = tuple(
        nid for nid in view.chain[start:]
        if nid in graph.nodes and graph.nodes[nid].role in ("llm", "code") and nid != user
    )
    return TurnShape(user, steps, owners)


__all__ = ["TurnShape", "frame_stack", "turn_shape", "unit_of"]
