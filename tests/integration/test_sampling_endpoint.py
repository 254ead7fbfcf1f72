"""Headless summaries from an OpenAI-compatible endpoint (a loopback stub server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dagctx.client import DagctxClient

from chat_stub import ChatEndpoint


def files_summary(body: dict) -> str:
    """A summary naming every ``src/…py`` path it was shown (passes the fidelity gate)."""
    text = "\n".join(m["content"] for m in body["messages"])
    return "Summary of the work. Files: " + ", ".join(sorted(set(re.findall(r"src/[\w/]+\.py", text))))


async def long_session(c: DagctxClient) -> str:
    """Twelve long user turns naming ``src/mod_i.py``: enough to compact."""
    s = await c.session_create()
    head = s.head
    for i in range(12):
        u = await c.append(s.session_id, "user", output=f"step {i}: edit src/mod_{i}.py " + "words " * 150,
                           predecessor=head)
        llm = await c.append(s.session_id, "llm", name="gpt-4o", output="done " * 150, predecessor=u.head)
        head = llm.head
    return s.session_id


@pytest.mark.parametrize(("statuses", "ok", "calls"), [([503], True, 2), ([400], False, 1), ([], True, 1)])
async def test_endpoint_summaries_retry_only_transient_failures(tmp_path: Path, monkeypatch, statuses, ok, calls):
    stub = ChatEndpoint(files_summary, statuses)
    env = {**__import__("os").environ, "STUB_KEY": "sekret"}
    c = await DagctxClient.spawn(tmp_path / "e.db", env=env, initialization_options={
        "samplingEndpoint": {"baseUrl": stub.url, "model": "stub-model", "apiKeyEnv": "STUB_KEY"}})
    try:
        sid = await long_session(c)
        before = (await c.session_get(sid)).node_count
        res = await c.compact(sid, model="gpt-4o", keep_recent_tokens=800)
        assert res.ok is ok, res
        assert len(stub.calls) == calls
        assert stub.calls[0]["model"] == "stub-model"
        assert stub.auth[0] == "Bearer sekret"
        after = (await c.session_get(sid)).node_count
        assert after == before + (1 if ok else 0)
        if not ok:
            assert "HTTP 400" in (res.error or "")
    finally:
        await c.close()
        stub.close()
