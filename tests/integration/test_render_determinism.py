"""Renders are a pure function of the data (SPEC §8, reduction within a turn), through
real daemons.

``context/render`` with ``budget`` and ``context/prepare`` — aging, reduction within
the turn, checkpoints — give the same bytes from a daemon that served every earlier
request of the turn first, from a fresh daemon, and from a second daemon on the same
database; what a request reuses comes from the stored summaries, never from a
daemon's memory. Checked over every request of the real Codex rollout of the corpus
and on the issue's case (request 40 of a long turn, fresh vs after serving 30–39).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.client import DagctxClient, RpcError

from test_turn_reduction_daemon import CODEX, SMALL, TOOLS, Sampler, long_turn, spawn

pytestmark = pytest.mark.asyncio

#: a window small enough that most requests of the rollout need reducing
TIGHT = "tight-32k"
MODELS = {TIGHT: {"contextWindow": 32000, "maxOutput": 4000}}


def what_was_sent(res: Any) -> dict[str, Any]:
    """The bytes a request hands out, without what names the call (renderId)."""
    manifest = {k: v for k, v in res.manifest.items() if k != "renderId"}
    out = {"messages": res.messages, "manifest": manifest, "budget": res.budget}
    red = res.reduction
    if red is not None:
        out["reduced"] = ([(x.node_id, x.summary_key, x.tokens_after) for x in red.results],
                          None if red.checkpoint is None else (red.checkpoint.covers_ids, red.checkpoint.summary_key))
    return msgspec.json.decode(msgspec.json.encode(out))


async def request(c: DagctxClient, sid: str, head: str, kind: str, model: str) -> Any:
    try:
        if kind == "render":
            res = await c.render(sid, head=head, model=model, format="openai", budget=True, tools=TOOLS)
        else:
            res = await c.prepare(sid, head=head, model=model, format="openai", prompt_mode="none", tools=TOOLS)
    except RpcError as err:
        return {"refused": err.kind, "why": err.message[:400]}
    return what_was_sent(res)


async def test_every_request_of_a_real_codex_rollout_is_the_same_from_two_daemons(
        tmp_path: Path, corpus: Path) -> None:
    db = tmp_path / "codex.db"
    sampler = Sampler()
    a = await spawn(db, sampler, models=MODELS)
    try:
        imp = await a.import_path(str(corpus / CODEX), format="codex")
        sid = imp.sessions[0].session_id
        heads = [n.id for n in (await a.history(sid)).nodes if n.role in ("user", "llm")]
        assert len(heads) >= 20
        first = {}
        for h in heads:  # daemon A serves the turn in order
            for kind in ("render", "prepare"):
                first[(h, kind)] = await request(a, sid, h, kind, TIGHT)
        reduced = [k for k, v in first.items() if "reduced" in v]
        assert len(reduced) >= 10, "the window should make many requests need reducing"
        assert not [(k, v) for k, v in first.items() if "refused" in v]
        asked = len(sampler.requests)
        assert asked > 0
        # a second daemon on the same database, serving the requests newest first
        b = await spawn(db, Sampler(), models=MODELS)
        try:
            for h in reversed(heads):
                for kind in ("prepare", "render"):
                    assert await request(b, sid, h, kind, TIGHT) == first[(h, kind)], (h, kind)
        finally:
            await b.close()
        # and daemon A again, after everything it served: still the same bytes, no new call
        for h in heads[::3]:
            assert await request(a, sid, h, "render", TIGHT) == first[(h, "render")]
        assert len(sampler.requests) == asked
    finally:
        await a.close()
    # a fresh daemon on a fresh copy of the data answers the newest requests the same,
    # computing every summary itself
    fresh_db = tmp_path / "fresh.db"
    c = await spawn(fresh_db, Sampler(), models=MODELS)
    try:
        imp = await c.import_path(str(corpus / CODEX), format="codex")
        sid2 = imp.sessions[0].session_id
        for h in heads[-3:]:
            assert await request(c, sid2, h, "render", TIGHT) == first[(h, "render")], h
    finally:
        await c.close()


async def test_request_40_is_the_same_fresh_and_after_serving_30_to_39(tmp_path: Path) -> None:
    db = tmp_path / "long.db"
    a = await spawn(db, Sampler())
    try:
        sid, _ = await long_turn(a, 40, tag="det", lines=70)
        steps = [n.id for n in (await a.history(sid)).nodes if n.role == "llm"]
        assert len(steps) == 40
        for h in steps[29:39]:  # requests 30–39
            r = await a.render(sid, head=h, model=SMALL, format="neutral", budget=True, tools=TOOLS)
            assert r.budget.input_used <= r.budget.input_budget - r.budget.safety_margin
        warm = await request(a, sid, steps[39], "render", SMALL)
        warm_prep = await request(a, sid, steps[39], "prepare", SMALL)
        assert "reduced" in warm, "request 40 should need reducing at 32k"
    finally:
        await a.close()
    b = await spawn(db, Sampler())  # a fresh daemon on the same database
    try:
        got = await request(b, sid, steps[39], "render", SMALL)
        assert {k: (v, got["manifest"].get(k)) for k, v in warm["manifest"].items() if got["manifest"].get(k) != v} == {}
        assert got == warm
        assert await request(b, sid, steps[39], "prepare", SMALL) == warm_prep
    finally:
        await b.close()
