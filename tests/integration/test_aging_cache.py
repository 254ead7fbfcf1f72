"""Aging and the prompt cache through a real daemon (SPEC §8, aging and the prompt cache).

``context/prepare`` changes which old tool results it shows aged only at a user turn's
requests, and only when the change pays for the cache break it causes: the requests
since the branch's last break must have read, at the cache-read price, at least what
the rewrite after the first changed result costs. A change that does not pay waits —
the previous request's aged texts stay, the prefix stays byte-stable — unless the cache
is cold (``promptCache``) or the budget needs the tokens (the limit, or 70 % of it).

The session is a client loop on a real SQLite file: a user turn, ``context/prepare``,
the model's answer appended with the request's ``renderId`` (so the ledger holds what
each request showed), the next turn. One large tool result early on; later turns carry
long user texts, so the rewrite an aging break causes is large against what it frees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagctx.client import DagctxClient
from dagctx.protocol import context_messages as pc

WIDE = "wide-200k"
MODELS = {WIDE: {"contextWindow": 200_000, "maxOutput": 4_000, "tokenizer": "cl100k_base"},
          "narrow-24k": {"contextWindow": 24_000, "maxOutput": 2_000, "tokenizer": "cl100k_base"}}
AGING = {"minAgeSeconds": 0, "keepRecentTurns": 2, "minTokens": 200, "softTrimHeadChars": 300,
         "softTrimTailChars": 200, "hardClearAfterTurns": 6}
MARK = "row 333: value = compute(item, factor=3)"


def result_body() -> str:
    return "# file src/pkg/big.py\n" + "\n".join(f"    row {k}: value = compute(item, factor={k % 5})"
                                                 for k in range(600))


def filler(i: int, words: int) -> str:
    return f"Turn {i}: some thoughts. " + " ".join(f"t{i}w{k}" for k in range(words))


async def spawn(db: Path) -> DagctxClient:
    return await DagctxClient.spawn(db, initialization_options={"models": MODELS, "aging": AGING})


class Loop:
    """Prepare → answer (with the renderId) → next turn, recording every request."""

    def __init__(self, c: DagctxClient, model: str = WIDE, **prepare: Any) -> None:
        self.c, self.model, self.prepare_kw = c, model, prepare
        self.sid = ""
        self.head = ""
        self.got: list[tuple[int, pc.PrepareResult]] = []  # (turn, request)
        self.tool_id = ""

    async def start(self) -> None:
        s = await self.c.session_create("aging cache")
        self.sid, self.head = s.session_id, s.head
        u = await self.c.append(self.sid, "user", output="Turn 1: read src/pkg/big.py", predecessor=self.head)
        p = await self.request(1, u.node.id)
        call = await self.c.append(self.sid, "llm", name=self.model, output="Reading it.", predecessor=u.node.id,
                                   render_id=p.render_id)
        t = await self.c.append(self.sid, "code", name="read_file", input={"path": "src/pkg/big.py"},
                                output=result_body(), caller=call.node.id, metadata={"toolCallId": "call_1"})
        self.tool_id = t.node.id
        p = await self.request(1, call.node.id)
        done = await self.c.append(self.sid, "llm", name=self.model, output="Read.", predecessor=call.node.id,
                                   render_id=p.render_id)
        self.head = done.node.id

    async def request(self, turn: int, head: str, **kw: Any) -> pc.PrepareResult:
        p = await self.c.prepare(self.sid, head=head, model=self.model, format="anthropic", prompt_mode="none",
                                 **{**self.prepare_kw, **kw})
        self.got.append((turn, p))
        return p

    async def turn(self, i: int, words: int, steps: int = 1, **kw: Any) -> list[pc.PrepareResult]:
        """A user turn of ``steps`` requests: a tool loop (each step a small ``ls``) and the
        final answer, every request answered with its renderId."""
        u = await self.c.append(self.sid, "user", output=filler(i, words), predecessor=self.head)
        head = u.node.id
        out = []
        for k in range(steps):
            p = await self.request(i, head, **kw)
            out.append(p)
            last = k == steps - 1
            llm = await self.c.append(self.sid, "llm", name=self.model,
                                      output="Done." if last else f"Listing, step {k}.", predecessor=head,
                                      render_id=p.render_id)
            head = llm.node.id
            if not last:
                await self.c.append(self.sid, "code", name="ls", input={"path": f"dir{i}_{k}"},
                                    output=f"a{k}.txt b{k}.txt", caller=llm.node.id,
                                    metadata={"toolCallId": f"call_{i}_{k}"})
        self.head = head
        return out


def aged_in(p: pc.PrepareResult, node_id: str) -> bool:
    return node_id in (p.manifest.get("agingKinds") or {})


def held(p: pc.PrepareResult) -> bool:
    return any(x.startswith("aging held back") for x in p.decision_path)


def shown_whole(p: pc.PrepareResult) -> bool:
    return any(MARK in str(m) for m in p.messages)


async def test_an_aging_break_waits_until_it_pays_and_then_comes_at_a_user_turn(tmp_path: Path) -> None:
    c = await spawn(tmp_path / "a.db")
    try:
        lp = Loop(c)
        await lp.start()
        for i in range(2, 5):  # long turns after the result: an aging break rewrites them
            await lp.turn(i, 2500)
        turn = 5
        while turn < 60 and not any(aged_in(p, lp.tool_id) for _, p in lp.got):
            await lp.turn(turn, 10, steps=3)
            turn += 1
        reqs = lp.got
        first_held = next(k for k, (_, p) in enumerate(reqs) if held(p))
        applied = next(k for k, (_, p) in enumerate(reqs) if aged_in(p, lp.tool_id))
        assert first_held < applied
        # while held back, the result goes out whole, the manifest records no aging of it,
        # and no request breaks the prompt cache
        for _, p in reqs[first_held:applied]:
            assert shown_whole(p) and not aged_in(p, lp.tool_id) and p.tool_results_aged == 0
            assert p.cache_break is None, p.cache_break
        # applied at the first request of a user turn, not within one: the turn of the
        # request before it is an earlier one
        assert reqs[applied - 1][0] < reqs[applied][0]
        got = reqs[applied][1]
        assert not shown_whole(got) and got.tool_results_aged == 1
        assert got.cache_break is not None and "aging" in got.cache_break.causes
        # it paid: what the requests since the last break read of it covers the rewrite
        line = next(x for _, p in reqs[applied - 3:applied] for x in p.decision_path if x.startswith("aging held"))
        assert "would free" in line
        # every request held back said why, with the numbers
        held_lines = [x for _, p in reqs[first_held:applied] for x in p.decision_path if x.startswith("aging held")]
        assert len(held_lines) == applied - first_held
        # and the request after it extends it again
        await lp.turn(turn, 10)
        assert lp.got[-1][1].cache_break is None and aged_in(lp.got[-1][1], lp.tool_id)
    finally:
        await c.close()


async def test_a_cold_cache_applies_the_aging_at_once(tmp_path: Path) -> None:
    c = await spawn(tmp_path / "b.db")
    try:
        lp = Loop(c)
        await lp.start()
        for i in range(2, 5):
            await lp.turn(i, 2500)
        first = None
        for i in range(5, 12):
            (p,) = await lp.turn(i, 10)
            if held(p):
                first = i
                break
        assert first is not None, "the aging was never held back"
        # the next turn's cache has expired (the client says so): nothing cached to rewrite
        (p,) = await lp.turn(first + 1, 10, prompt_cache="cold")
        assert aged_in(p, lp.tool_id) and not held(p) and not shown_whole(p)
    finally:
        await c.close()


async def test_the_budget_forces_the_aging_it_would_hold_back(tmp_path: Path) -> None:
    """At 24k the held-back result would bring the request past 70 % of the budget: the
    aging applies at once, without a hold-back, and no compaction is asked for."""
    c = await spawn(tmp_path / "c.db")
    try:
        lp = Loop(c, model="narrow-24k")
        await lp.start()
        for i in range(2, 5):
            await lp.turn(i, 1300)
        for i in range(5, 8):
            await lp.turn(i, 10)
        reqs = [p for _, p in lp.got]
        applied = next(k for k, p in enumerate(reqs) if aged_in(p, lp.tool_id))
        assert not any(held(p) for p in reqs)
        # without the aging the request would have been at 70 % or more
        assert reqs[applied].tokens_freed_by_aging > 0
        unaged = reqs[applied].budget.input_used + reqs[applied].tokens_freed_by_aging
        assert unaged >= 0.7 * reqs[applied].budget.input_budget
        assert not reqs[applied].recommend_compaction or reqs[applied].budget.percent_used >= 70
    finally:
        await c.close()
