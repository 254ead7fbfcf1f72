"""Headless summaries from an OpenAI-compatible endpoint (a loopback stub server)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from dagctx.client import DagctxClient


class _Stub:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses  # status to answer per call; 200 once exhausted
        self.calls: list[dict] = []
        self.auth: list[str | None] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.calls.append(body)
                stub.auth.append(self.headers.get("Authorization"))
                status = stub.statuses.pop(0) if stub.statuses else 200
                if status != 200:
                    self.send_response(status)
                    self.end_headers()
                    return
                text = "\n".join(m["content"] for m in body["messages"])
                idents = sorted(set(re.findall(r"src/[\w/]+\.py", text)))
                out = json.dumps({"model": body["model"], "choices": [{"message": {
                    "role": "assistant", "content": "Summary of the work. Files: " + ", ".join(idents)}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


async def _session(c: DagctxClient) -> str:
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
    stub = _Stub(list(statuses))
    env = {**__import__("os").environ, "STUB_KEY": "sekret"}
    c = await DagctxClient.spawn(tmp_path / "e.db", env=env, initialization_options={
        "samplingEndpoint": {"baseUrl": stub.url, "model": "stub-model", "apiKeyEnv": "STUB_KEY"}})
    try:
        sid = await _session(c)
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
