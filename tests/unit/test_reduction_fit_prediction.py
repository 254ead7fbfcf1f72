"""Reduction within a turn (SPEC §8): a chunk of summarized results after which the
request is surely still over its limit is not built (``_surely_over``). The requests,
manifests and reports must be the same as when every chunk is built, and the estimate
the fast path predicts must be the one the build takes."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dagctx.engine import turn_reduction as er
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import NodeInput

MODELS = {"w8k": (8000, 1000), "w16k": (16000, 2000), "w32k": (32000, 4000)}


class Peer:
    """A client that samples: answers with the first words of what it was sent."""

    can_sample = True

    def notify(self, method: str, params: Any) -> None:
        pass

    def progress(self, token: Any, value: Any) -> None:
        pass

    async def request(self, method: str, params: Any, result_type: type, timeout: float | None = None) -> Any:
        text = "\n".join(x.content.text for x in params.messages)
        hit = re.search(r"<(result|steps)>\n(.*?)\n</\1>", text, re.S)
        words = (hit.group(2) if hit else text).split()[:12]
        return c.CreateMessageResult(content=c.SamplingContent(text="condensed: " + " ".join(words)), model="t")


def engine(path: Path, peer: Any = None) -> EngineCore:
    eng = EngineCore(DaemonConfig(database=str(path)), peer=peer)
    eng.initialize(m.InitializeParams(initialization_options=m.InitializationOptions(
        models={k: m.ModelSpec(context_window=w, max_output=o) for k, (w, o) in MODELS.items()})))
    return eng


def run(x: Any) -> Any:
    return asyncio.run(x) if asyncio.iscoroutine(x) else x


def append(eng: EngineCore, sid: str, **kw: Any) -> str:
    return run(eng.node_append(m.NodeAppendParams(session_id=sid, node=NodeInput(**kw)))).node.id


def session(path: Path, steps: int, lines: int, calls_per_step: int, *, new_turn: int = 0) -> str:
    """A turn of ``steps`` steps; with ``new_turn``, a second turn of that many steps after it
    (the first turn's results are then reduced, not checkpointed)."""
    eng = engine(path)
    s = run(eng.session_create(m.SessionCreateParams(title="t")))
    prev = append(eng, s.session_id, role="user", output="Fix every failing test under src/pkg", predecessor=s.head)
    for i in range(steps + new_turn):
        if new_turn and i == steps:
            prev = append(eng, s.session_id, role="user", output="Now the docs", predecessor=prev)
        prev = append(eng, s.session_id, role="llm", name="w32k", output=f"Step {i}: reading.", predecessor=prev)
        for j in range(calls_per_step):
            body = f"# src/mod_{i}_{j}.py\n" + "\n".join(
                f"    line {k}: total_{i} = accumulate(values_{j}, step={(k * (i + 3)) % 11})"
                for k in range(lines + (i * 7 + j * 3) % 25))
            append(eng, s.session_id, role="code", name="read_file", input={"path": f"src/mod_{i}_{j}.py"},
                   output=body, caller=prev, metadata={"toolCallId": f"call_{i}_{j}"})
    eng.close()
    return s.session_id


#: the in-process tier keeps one case per format (the refused one among them); the longer
#: sessions run in the slow tier (a quarter second each)
_SLOW = pytest.mark.slow
CASES = [  # (steps, lines per result, calls per step, steps of a second turn, model, format)
    (12, 60, 1, 0, "w8k", "openai"),
    pytest.param(30, 40, 2, 0, "w16k", "anthropic", marks=_SLOW),
    pytest.param(40, 50, 3, 0, "w32k", "neutral", marks=_SLOW),
    pytest.param(120, 25, 1, 0, "w32k", "anthropic", marks=_SLOW),
    pytest.param(40, 60, 1, 3, "w32k", "openai", marks=_SLOW),
    (20, 80, 2, 4, "w32k", "neutral"),
    pytest.param(40, 60, 1, 3, "w32k", "anthropic", marks=_SLOW),
    (30, 40, 2, 3, "w16k", "anthropic"),  # refused: over budget after every reduction
]


def timeless(x: Any) -> Any:
    """``x`` without its durations (the one thing that differs between two runs)."""
    if isinstance(x, dict):
        return {k: timeless(v) for k, v in x.items() if k not in ("durationMs", "duration_ms")}
    if isinstance(x, list):
        return [timeless(v) for v in x]
    return x


def prepare(db: Path, copy: Path, sid: str, model: str, fmt: str, predict: bool,
            builds: list[tuple[Any, Any]], bounds: list[tuple[Any, Any]] | None = None) -> dict[str, Any]:
    bounds = [] if bounds is None else bounds
    for ext in ("", "-wal", "-shm"):
        if Path(str(db) + ext).exists():
            shutil.copyfile(str(db) + ext, str(copy) + ext)
    orig = er.reduce
    orig_plan = er._plan
    plans: list[tuple[Any, Any]] = []

    def plan_spy(run_: Any, base: Any) -> Any:
        plans.append((run_, orig_plan(run_, base)))
        return plans[-1][1]

    async def spied(engine_: Any, build: Any, **kw: Any) -> Any:
        def b(red: Any) -> Any:
            out = build(red)
            builds.append((er._snapshot(red), out))
            if plans and red.checkpoint is not None:  # the bounds a checkpoint's skip reads
                bounds.append((er._checkpoint_bounds(*plans[-1], red), out))
            return out
        if kw.get("first") is not None:
            builds.append((er.Reductions(), kw["first"]))
        return await orig(engine_, b, **kw)

    er.PREDICT_FIT = predict
    import dagctx.engine.lifecycle as lifecycle
    lifecycle.turn_reduction.reduce = spied  # type: ignore[assignment]
    er._plan = plan_spy  # type: ignore[assignment]
    eng = engine(copy, Peer())
    try:
        try:
            p = run(eng.context_prepare(c.PrepareParams(session_id=sid, model=model, format=fmt,
                                                         prompt_mode="none")))
        except DagctxError as err:
            return {"error": err.kind, "message": err.message, "details": timeless(msgspec.to_builtins(err.details))}
        out = msgspec.to_builtins(p)
        out.pop("renderId", None)
        out["manifest"].pop("renderId", None)
        (out.get("reduction") or {}).pop("durationMs", None)
        out.pop("decisionPath", None)
        return out
    finally:
        lifecycle.turn_reduction.reduce = orig  # type: ignore[assignment]
        er._plan = orig_plan  # type: ignore[assignment]
        er.PREDICT_FIT = True
        eng.close()


@pytest.mark.parametrize("steps,lines,calls,more,model,fmt", CASES)
def test_fast_path_gives_the_same_request_and_predicts_the_build(tmp_path: Path, steps: int, lines: int,
                                                                 calls: int, more: int, model: str,
                                                                 fmt: str) -> None:
    db = tmp_path / "s.db"
    sid = session(db, steps, lines, calls, new_turn=more)
    slow_builds: list[tuple[Any, Any]] = []
    fast_builds: list[tuple[Any, Any]] = []
    bounds: list[tuple[Any, Any]] = []
    slow = prepare(db, tmp_path / "slow.db", sid, model, fmt, False, slow_builds, bounds)
    fast = prepare(db, tmp_path / "fast.db", sid, model, fmt, True, fast_builds)
    assert slow.get("reduction") is not None or slow.get("error") == "BudgetExceeded", "the case must reduce"
    assert msgspec.json.encode(fast) == msgspec.json.encode(slow)
    # a checkpoint's request not built yet is bounded from the unreduced one: at most
    # its estimate, at least its protected part (``_checkpoint_bounds``)
    for got, built in bounds:
        if got is not None:
            assert got[0] <= built.estimate and got[1] >= built.parts.total
    # every build the slow path made after another with a subset of its results: the
    # estimate the fast path predicts from the earlier one is the one the build took
    run_ = type("R", (), {"engine": None, "session_id": sid, "graph": None})()
    eng = engine(tmp_path / "slow.db")
    try:
        run_.engine = eng
        checked = 0
        for (ref_red, ref), (red, built) in zip(slow_builds, slow_builds[1:]):
            got = er._estimate_with(run_, ref, ref_red, red)  # type: ignore[arg-type]
            if got is not None:
                assert got == built.estimate
                checked += 1
    finally:
        eng.close()
    assert len(fast_builds) <= len(slow_builds)
    if len(slow_builds) > len(fast_builds):
        assert checked > 0


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_some_case_skips_builds(tmp_path: Path, fmt: str) -> None:
    """The fast path is exercised: the results of an earlier turn reduced in several chunks."""
    db = tmp_path / "s.db"
    sid = session(db, 40, 60, 1, new_turn=3)
    slow_builds: list[tuple[Any, Any]] = []
    fast_builds: list[tuple[Any, Any]] = []
    slow = prepare(db, tmp_path / "slow.db", sid, "w32k", fmt, False, slow_builds)
    fast = prepare(db, tmp_path / "fast.db", sid, "w32k", fmt, True, fast_builds)
    assert msgspec.json.encode(fast) == msgspec.json.encode(slow)
    assert len(fast_builds) < len(slow_builds)
