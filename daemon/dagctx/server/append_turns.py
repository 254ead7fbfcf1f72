"""A connection's appends in flight: handed to the writer in order, answered in order.

An append behind another append of the same connection (SPEC §1.4) starts once that one
is in its database's writer queue, not once it is answered: the writer runs its queue in
arrival order, so the append meets the rules after the one before exactly as it would
after its answer, and a pipelining client's appends share a group commit instead of
taking one group each (SPEC §4.2). Its answer still goes out after the answer before it.
"""

from __future__ import annotations

import asyncio
from typing import Any


class AppendTurn:
    """One append of a connection: ``queued`` is set once it is in the writer's queue (or
    it finished without getting there), ``turn`` once it and every append of the
    connection before it are answered."""

    __slots__ = ("done", "queued", "turn", "before")

    def __init__(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any],
                 before: AppendTurn | None) -> None:
        self.done = done
        self.queued: asyncio.Future[None] = loop.create_future()
        self.turn: asyncio.Future[None] = loop.create_future()
        #: the turn of the append this one follows, while that one is unanswered
        self.before = before.turn if before is not None and not before.turn.done() else None

    def mark_queued(self, _: Any = None) -> None:
        if not self.queued.done():
            self.queued.set_result(None)

    def end_turn(self, _: Any = None) -> None:
        """Called once its answer is written: its turn ends with the turn before it."""
        if self.before is not None and not self.before.done():
            self.before.add_done_callback(self.end_turn)
        elif not self.turn.done():
            self.turn.set_result(None)

    def in_turn(self, work: Any) -> Any:
        """The handler's result (a coroutine, a value or the exception it raised) as a
        coroutine whose end waits for the answer before it, when that is still owed."""
        if self.before is None or self.before.done():
            return work if asyncio.iscoroutine(work) else _settled(work)
        return _after(work if asyncio.iscoroutine(work) else _settled(work), self.before)


async def _settled(result: Any) -> Any:
    if isinstance(result, BaseException):
        raise result
    return result


async def _after(work: Any, before: asyncio.Future[None]) -> Any:
    """``work``, ended only after ``before``. Once its own part is over it waits even when
    cancelled meanwhile: what it wrote is answered as written, in its place."""
    try:
        return await work
    finally:
        while not before.done():
            try:
                await asyncio.wait((before,))
            except asyncio.CancelledError:
                continue
