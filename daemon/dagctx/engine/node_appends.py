"""``node/append`` and ``node/appendBatch``: handed to the database's writer before the
handler returns (SPEC §4.2).

A pipelining client's appends reach the writer's queue as their frames are dispatched
(``StoreCalls.start_unit``), in order, without a turn of the event loop each; their token
counts are left to whoever runs the unit (``AppendRequest.derive``: the writer thread,
beside the loop, or the loop itself for a lone append committed there). A big payload is
counted in a thread first, then appended as before. The answer announces the nodes
(``EngineCore.announce``) and is the request's result.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from dagctx.ledger import AppendOutcome, AppendRequest, NodeDerived
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError

from .shared import ALONE_APPEND_CHARS, BIG_PAYLOAD_CHARS, OpenDatabase

T = TypeVar("T")


class EngineCore(Protocol):
    """What appending needs of the engine (``core.EngineCore``)."""

    def _with_render(self, session_id: str, render_id: str, node: Any, path: str) -> Any: ...

    @staticmethod
    def _payload_chars(*values: Any, limit: int = ...) -> int: ...

    def derive_node(self, role: str, input: Any, output: Any, name: str = "", *,  # noqa: A002
                    known: dict[str, tuple[int, int]] | None = None) -> NodeDerived: ...

    def announce(self, session_id: str, nodes: list[Any], head: str) -> None: ...

    def _db(self) -> OpenDatabase: ...

    async def write_node_async(self, session_id: str, node: Any, *, move_head: bool | None = None,
                               derived: NodeDerived | None = None) -> AppendOutcome: ...


def node_append(e: EngineCore, p: m.NodeAppendParams) -> Awaitable[m.NodeResult]:
    if not _loop_running():  # asyncio.run(engine.node_append(p)): started in that loop
        return _in_loop(lambda: node_append(e, p))
    node = p.node
    if p.render_id is not None:
        node = e._with_render(p.session_id, p.render_id, node, "renderId")
    size = e._payload_chars(node.input, node.output)  # one walk answers both limits below
    if size > BIG_PAYLOAD_CHARS:
        return _counted_first(e, p.session_id, node, p.move_head)
    sid = p.session_id

    def finish(outs: list[AppendOutcome]) -> m.NodeResult:
        out = outs[0]
        e.announce(sid, [out.node], out.head)
        return m.NodeResult(node=out.node, head=out.head)

    derive = functools.partial(e.derive_node, node.role, node.input, node.output, node.name)
    unit = AppendRequest(sid, (node,), p.move_head, (None,), derive=lambda: (derive(),))
    return e._db().calls.start_unit(unit, size <= ALONE_APPEND_CHARS, finish)


async def _counted_first(e: EngineCore, session_id: str, node: Any, move_head: bool | None) -> m.NodeResult:
    out = await e.write_node_async(session_id, node, move_head=move_head)
    return m.NodeResult(node=out.node, head=out.head)


def node_append_batch(e: EngineCore, p: m.NodeAppendBatchParams) -> Awaitable[m.NodeBatchResult]:
    """A whole turn (or an importer's run of nodes) in one unit of the next group commit:
    all or none."""
    if not _loop_running():
        return _in_loop(lambda: node_append_batch(e, p))
    if not p.nodes:
        raise DagctxError("InvalidParams", "nodes is empty: give at least one node", path="nodes")
    nodes = [e._with_render(p.session_id, p.render_id, n, "renderId") if p.render_id is not None
             and n.role == "llm" else n for n in p.nodes]
    values = [*[n.input for n in nodes], *[n.output for n in nodes]]
    sid = p.session_id

    def derive() -> list[NodeDerived | None]:
        return [e.derive_node(n.role, n.input, n.output, n.name) for n in nodes]

    def finish(outs: list[AppendOutcome]) -> m.NodeBatchResult:
        head = outs[-1].head
        e.announce(sid, [o.node for o in outs], head)
        return m.NodeBatchResult(nodes=[o.node for o in outs], head=head)

    size = e._payload_chars(*values)
    alone = size <= ALONE_APPEND_CHARS
    if size > BIG_PAYLOAD_CHARS:
        return _batch_counted_first(e, sid, nodes, p.move_head, derive, alone, finish)
    unit = AppendRequest(sid, tuple(nodes), p.move_head, None, batch=True, derive=derive)
    return e._db().calls.start_unit(unit, alone, finish)


async def _batch_counted_first(e: EngineCore, sid: str, nodes: list[Any], move_head: bool | None,
                               derive: Callable[[], list[NodeDerived | None]], alone: bool,
                               finish: Callable[[list[AppendOutcome]], m.NodeBatchResult]) -> m.NodeBatchResult:
    derived = await asyncio.to_thread(derive)
    return finish(await e._db().calls.append_batch(sid, nodes, move_head=move_head, derived=derived, alone=alone))


def _loop_running() -> bool:
    return asyncio._get_running_loop() is not None


async def _in_loop(start: Callable[[], Awaitable[T]]) -> T:
    """``start()`` awaited: a handler that hands work over before it returns, called by a
    caller that has no event loop yet and runs the result in one (``asyncio.run``)."""
    return await start()
