"""A connection's appends in flight: handed to the writer in order, answered in order.

An append behind another append of the same connection (SPEC §1.4) starts once that one
is in its database's writer queue, not once it is answered: the writer runs its queue in
arrival order, so the append meets the rules after the one before exactly as it would
after its answer, and a pipelining client's appends share a group commit instead of
taking one group each (SPEC §4.2). Its answer still goes out after the answer before it:
``AppendAnswers`` settles each append's request future once it and every append before it
have finished, so the answers of one group go out together, in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class AppendTurn:
    """One append of a connection: ``done`` is its request future (answered by its done
    callbacks), ``queued`` is set once it is in the writer's queue (or it finished without
    getting there), ``task`` is its handler's coroutine once started."""

    __slots__ = ("done", "queued", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any]) -> None:
        self.done = done
        self.queued: asyncio.Future[None] = loop.create_future()
        self.task: asyncio.Future[Any] | None = None

    def mark_queued(self, _: Any = None) -> None:
        if not self.queued.done():
            self.queued.set_result(None)

    @property
    def finished(self) -> bool:
        return self.done.done() or (self.task is not None and self.task.done())


class AppendAnswers:
    """A connection's unanswered appends in arrival order."""

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns: deque[AppendTurn] = deque()

    def __len__(self) -> int:
        """Appends not yet settled."""
        return len(self._turns)

    def add(self, turn: AppendTurn) -> AppendTurn:
        self._turns.append(turn)
        return turn

    def settle(self, _: Any = None) -> None:
        """Settle the request future of every finished append at the head, in order: its
        result, its error, or its cancellation. One cancelled while it waited to start was
        answered at once (SPEC §1.4) and is only taken off."""
        turns = self._turns
        while turns and turns[0].finished:
            t = turns.popleft()
            task = t.task
            if t.done.done() or task is None:
                continue
            if task.cancelled():
                t.done.cancel()
            elif task.exception() is not None:
                t.done.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                t.done.set_result(task.result())


async def settled(result: Any) -> Any:
    """A handler's answer given without a coroutine (a value, or the exception it raised)."""
    if isinstance(result, BaseException):
        raise result
    return result
