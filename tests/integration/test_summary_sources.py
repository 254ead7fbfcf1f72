"""Summary sources (SPEC §2): the host's own completion function, the client's sampling, a
configured endpoint — chosen in the configured order, each with its own cache identity
and limits, on the real daemon with reduction within a turn as the consumer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient, RpcError

from chat_stub import ChatEndpoint
from test_turn_reduction_daemon import MODELS, SMALL, Sampler, endpoint_condensed, long_turn

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


def host(identity: str, **limits: Any) -> dict[str, Any]:
    return {"sampling": {"completion": {"identity": identity, **limits}}}


async def spawn(db: Path, capabilities: dict[str, Any], sampler: Sampler | None, **options: Any) -> DagctxClient:
    c = await DagctxClient.spawn(db, capabilities=capabilities, initialization_options={"models": MODELS, **options})
    if sampler is not None:
        c.on_request("sampling/createMessage", sampler)
    return c


async def reduce(c: DagctxClient, sid: str) -> Any:
    p = await c.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
    assert p.reduction is not None
    return p.reduction


async def test_a_host_function_keys_its_summaries_by_its_identity_and_keeps_its_limit(tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    first = Sampler()
    c = await spawn(db, host("openclaw/model-a", maxOutputTokens=300), first)
    try:
        sid, _ = await long_turn(c, 90, tag="host")
        red = await reduce(c, sid)
        assert red.summary_calls > 0 and len(first.requests) == red.summary_calls
        assert all(p.max_tokens <= 300 for p in first.requests), [p.max_tokens for p in first.requests]
    finally:
        await c.close()
    # another host model on the same database: its own summaries, never the first one's
    other = Sampler()
    c = await spawn(db, host("hermes/model-b"), other)
    try:
        red = await reduce(c, sid)
        assert red.summary_calls > 0 and red.cache_hits == 0
    finally:
        await c.close()
    # the first identity again: everything comes from the cache, no call
    again = Sampler()
    c = await spawn(db, host("openclaw/model-a", maxOutputTokens=300), again)
    try:
        red = await reduce(c, sid)
        assert red.summary_calls == 0 and red.cache_hits > 0 and again.requests == []
    finally:
        await c.close()


@pytest.mark.parametrize("order", [None, ["endpoint", "host"]])
async def test_the_order_of_preference_decides(tmp_path: Path, order: list[str] | None) -> None:
    stub = ChatEndpoint(endpoint_condensed)
    sampler = Sampler()
    options: dict[str, Any] = {"samplingEndpoint": {"baseUrl": stub.url, "model": "stub-model"}}
    if order is not None:
        options["summarySources"] = order
    c = await spawn(tmp_path / "order.db", host("openclaw/model-a"), sampler, **options)
    try:
        sid, _ = await long_turn(c, 90, tag="order")
        red = await reduce(c, sid)
        assert red.summary_calls > 0
        if order is None:  # the default prefers the host's function
            assert len(sampler.requests) == red.summary_calls and stub.calls == []
        else:
            assert len(stub.calls) == red.summary_calls and sampler.requests == []
    finally:
        await c.close()
        stub.close()


async def test_an_empty_order_means_no_summarizer(tmp_path: Path) -> None:
    sampler = Sampler()
    c = await spawn(tmp_path / "none.db", {"sampling": {}}, sampler, summarySources=[])
    try:
        sid, _ = await long_turn(c, 90, tag="none")
        with pytest.raises(RpcError) as err:
            await c.prepare(sid, model=SMALL, format="neutral", prompt_mode="none")
        assert err.value.kind == "BudgetExceeded"
        assert any("summarySources is empty" in f for f in err.value.data["details"]["failures"])
        assert sampler.requests == []
    finally:
        await c.close()


@pytest.mark.parametrize("capabilities, options, path", [
    (host(""), {}, "capabilities.sampling"),
    ({"sampling": {"completion": {"identity": "x", "window": 5}}}, {}, "capabilities.sampling"),
    ({"sampling": {"completion": {"identity": "x", "maxOutputTokens": 0}}}, {}, "capabilities.sampling"),
    ({}, {"summarySources": ["client", "client"]}, "initializationOptions.summarySources"),
])
async def test_a_malformed_declaration_is_refused_at_initialize(tmp_path: Path, capabilities: dict[str, Any],
                                                                 options: dict[str, Any], path: str) -> None:
    c = await DagctxClient.spawn(initialize=False)
    try:
        with pytest.raises(RpcError) as err:
            await c.initialize(capabilities=capabilities,
                               initialization_options={"database": str(tmp_path / "x.db"), **options})
        assert err.value.kind == "InvalidParams" and err.value.data.get("path") == path, err.value
        assert not (tmp_path / "x.db").exists()
        ok = await c.initialize(initialization_options={"database": str(tmp_path / "x.db")})
        assert ok.database == str(tmp_path / "x.db")
    finally:
        await c.close()
