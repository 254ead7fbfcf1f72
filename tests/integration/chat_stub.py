"""A loopback stub of the OpenAI chat completions API, for agent-loop tests.

Requests whose system message is dagctx's summarizer prompt are summaries (the daemon's
``samplingEndpoint``); every other request is an agent's turn and gets the next scripted
reply (text and/or tool calls), then "Done." once the script is used up. Summaries are
answered with an extractive summary that keeps every identifier of the transcript, so dagctx's fidelity
check (SPEC §8) passes deterministically. Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable, Sequence
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


def is_summary(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "system" and str(m.get("content") or "").startswith(SUMMARIZER)
               for m in body.get("messages", []))


#: How dagctx's summarizer system prompt begins (SPEC §8; context/summarizer_input.py).
SUMMARIZER = "You compact the context of an AI agent."


class ChatStub:
    """``script``: a list of ``{"content": str, "tool_calls": [(name, args), …]}`` replies."""

    def __init__(self, script: list[dict[str, Any]], prompt_tokens: int | list[int] | None = None) -> None:
        self.script = list(script)
        # what usage reports for agent turns: a number, one per request (the last repeats),
        # or None for a size estimate
        self.prompt_tokens = prompt_tokens
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
                reply = stub.answer(body)
                if body.get("stream"):
                    self.stream(reply, bool((body.get("stream_options") or {}).get("include_usage")))
                    return
                out = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def stream(self, reply: dict[str, Any], include_usage: bool) -> None:
                """The same reply as server-sent events, the way the API streams it."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                choice = reply["choices"][0]
                msg = choice["message"]
                delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
                if msg.get("tool_calls"):
                    delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
                base = {"id": reply["id"], "object": "chat.completion.chunk", "model": reply["model"]}
                chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                          {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
                if include_usage:
                    chunks.append({**base, "choices": [], "usage": reply["usage"]})
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(body.get("messages", []))) // 4
        if is_summary(body):
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
        prompt = size
        if self.prompt_tokens is not None and not is_summary(body):
            if isinstance(self.prompt_tokens, list):
                prompt = self.prompt_tokens.pop(0) if len(self.prompt_tokens) > 1 else self.prompt_tokens[0]
            else:
                prompt = self.prompt_tokens
        return {"id": f"chatcmpl-{len(self.agent_requests) + len(self.summary_requests)}", "object": "chat.completion",
                "model": body.get("model", "stub"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


class ChatEndpoint:
    """A loopback OpenAI-compatible endpoint for the daemon's ``samplingEndpoint``: answers
    the HTTP ``statuses`` first (one per request, e.g. ``[503]`` for one transient failure),
    then 200 with ``reply(body)`` as the assistant's text. Records bodies and auth headers."""

    def __init__(self, reply: Callable[[dict[str, Any]], str], statuses: Sequence[int] = ()) -> None:
        self.statuses = list(statuses)
        self.calls: list[dict[str, Any]] = []
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
                out = json.dumps({"model": body["model"], "choices": [{"message": {
                    "role": "assistant", "content": reply(body)}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
