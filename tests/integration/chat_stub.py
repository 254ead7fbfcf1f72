"""A loopback stub of the OpenAI chat completions API, for agent-loop tests.

Requests that carry ``tools`` are an agent's turns: each gets the next scripted reply
(text and/or tool calls), then "Done." once the script is used up. Requests without
``tools`` are summaries (the daemon's ``samplingEndpoint``): they are answered with an
extractive summary that keeps every identifier of the transcript, so dagctx's fidelity
check (SPEC §8) passes deterministically. Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

IDENT = re.compile(r"[A-Za-z_][\w./-]*[\w]|[\u4e00-\u9fff]{2,}")


def summary_of(body: dict[str, Any]) -> str:
    text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
    seen: dict[str, None] = {}
    for w in IDENT.findall(text):
        if len(w) > 3:
            seen.setdefault(w, None)
    words = list(seen)[:400]
    return ("## 1. User intent\nThe work below.\n## 2. Decisions and constraints\nnone\n"
            "## 3. Work completed\n" + " ".join(words) + "\n## 4. Outstanding\nnone\n## 5. Active context\nnone")


class ChatStub:
    """``script``: a list of ``{"content": str, "tool_calls": [(name, args), …]}`` replies."""

    def __init__(self, script: list[dict[str, Any]], prompt_tokens: int | None = None) -> None:
        self.script = list(script)
        self.prompt_tokens = prompt_tokens  # what usage reports (default: a size estimate)
        self.agent_requests: list[dict[str, Any]] = []
        self.summary_requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self._calls = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_error(404, "only /v1/chat/completions is stubbed")
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.auth.append(self.headers.get("Authorization"))
                out = json.dumps(stub.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(body.get("messages", []))) // 4
        if not body.get("tools"):
            self.summary_requests.append(body)
            message: dict[str, Any] = {"role": "assistant", "content": summary_of(body)}
            finish = "stop"
        else:
            self.agent_requests.append(body)
            step = self.script.pop(0) if self.script else {"content": "Done."}
            message = {"role": "assistant", "content": step.get("content")}
            calls = []
            for name, args in step.get("tool_calls", []):
                self._calls += 1
                calls.append({"id": f"call_{self._calls}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}})
            if calls:
                message["tool_calls"] = calls
            finish = "tool_calls" if calls else "stop"
        prompt = self.prompt_tokens if self.prompt_tokens is not None and body.get("tools") else size
        return {"id": f"chatcmpl-{len(self.agent_requests) + len(self.summary_requests)}", "object": "chat.completion",
                "model": body.get("model", "stub"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
