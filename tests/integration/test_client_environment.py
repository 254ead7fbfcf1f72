"""The client's environment travels with its connection (SPEC §1.3): the shared daemon reads
per-request settings — an endpoint's API key, the import record cap — from the
environment of the `dagctx serve` that asked, never from its own (whichever shell first
started it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dagctx.client import DagctxClient

from chat_stub import ChatEndpoint
from test_sampling_endpoint import files_summary, long_session
from test_shared_daemon import shared_env  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.asyncio

KEY = "DAGCTX_TEST_ENDPOINT_KEY"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (KEY, "DAGCTX_IMPORT_MAX_LINE_BYTES")}
    env.update(extra)
    return env


async def test_the_api_key_comes_from_the_client_that_asked(shared_env, tmp_path: Path) -> None:
    stub = ChatEndpoint(files_summary)
    opts = {"samplingEndpoint": {"baseUrl": stub.url, "model": "stub-model", "apiKeyEnv": KEY}}
    # A starts the daemon from a shell without the key; B has it in its own environment
    a = await DagctxClient.spawn(tmp_path / "k.db", env=_env(), initialization_options=opts)
    b = await DagctxClient.spawn(tmp_path / "k.db", env=_env(**{KEY: "sekret-b"}), initialization_options=opts)
    try:
        assert (await a.daemon_status()).pid == (await b.daemon_status()).pid  # one shared daemon
        sid = await long_session(b)
        res = await b.compact(sid, model="gpt-4o", keep_recent_tokens=800)
        assert res.ok, res
        assert stub.auth == ["Bearer sekret-b"]
        # A never gets B's key: the daemon kept it with B's connection only
        sid_a = await long_session(a)
        res = await a.compact(sid_a, model="gpt-4o", keep_recent_tokens=800)
        assert not res.ok and KEY in (res.error or "") and "not set" in (res.error or ""), res
        assert len(stub.calls) == 1
    finally:
        await a.close()
        await b.close()
        stub.close()


async def test_dagctx_settings_are_read_from_the_clients_environment(shared_env, tmp_path: Path) -> None:
    src = tmp_path / "long.jsonl"
    lines = []
    for i, text in enumerate(("a short first question", "x" * 5000)):
        lines.append(json.dumps({
            "type": "user", "uuid": f"00000000-0000-4000-8000-00000000000{i + 1}",
            "parentUuid": f"00000000-0000-4000-8000-00000000000{i}" if i else None,
            "sessionId": "0e9d2a54-7f3c-4b51-9a43-5b3d1c0f7a12", "timestamp": f"2026-01-01T00:00:0{i}.000Z",
            "message": {"role": "user", "content": text}}))
    src.write_text("\n".join(lines) + "\n")
    a = await DagctxClient.spawn(tmp_path / "i.db", env=_env())
    b = await DagctxClient.spawn(tmp_path / "j.db", env=_env(DAGCTX_IMPORT_MAX_LINE_BYTES="1000"))
    try:
        assert (await a.daemon_status()).pid == (await b.daemon_status()).pid
        res_b = await b.import_path(str(src))
        assert res_b.skipped and "1,000-byte limit" in res_b.skipped[0].reason, res_b
        res_a = await a.import_path(str(src))
        assert len(res_a.sessions) == 1 and not res_a.skipped, res_a
    finally:
        await a.close()
        await b.close()
