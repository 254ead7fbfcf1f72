"""A stand-in daemon for the nvim test: it sends server -> client requests.

Until the real daemon has a method that asks the client to sample, this lets
test_dagctx.lua check ``sampling/createMessage`` over a real pipe. Standard
library only; LSP framing on stdio.

* ``initialize``: answers, echoing the client's capabilities and options;
* ``test/sample {text}``: sends ``node/didAppend`` (with nulls in it) and the
  request ``sampling/createMessage`` (string id), waits for the client's reply and
  answers ``{reply, capabilities}`` with the reply exactly as it came;
* ``session/history``: two fixed nodes; ``context/render`` is unknown (-32601),
  as in a daemon that predates it, so the render fallback can be tested;
* ``shutdown`` / ``exit`` / EOF: stops (exit 0 after shutdown).
"""

from __future__ import annotations

import json
import sys

inp = sys.stdin.buffer
out = sys.stdout.buffer


def read_message() -> dict | None:
    length = None
    while True:
        line = inp.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None:
        return None
    body = inp.read(length)
    if len(body) < length:
        return None
    return json.loads(body)


def send(message: dict) -> None:
    body = json.dumps(message, ensure_ascii=False).encode()
    out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    out.flush()


def main() -> int:
    caps: dict = {}
    shut = False
    counter = 0
    while True:
        msg = read_message()
        if msg is None:
            return 0
        method = msg.get("method")
        if method is None:
            continue  # a stray response
        if "id" not in msg:
            if method == "exit":
                return 0 if shut else 1
            continue
        mid = msg["id"]
        params = msg.get("params")
        if method == "initialize":
            caps = (params or {}).get("capabilities") or {}
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "serverInfo": {"name": "fake-sampler", "version": "0"},
                "protocolVersion": "1.0",
                "methods": ["initialize", "shutdown", "test/sample"],
                "notifications": ["node/didAppend"],
                "database": "",
                "initializationOptions": (params or {}).get("initializationOptions"),
            }})
        elif method == "shutdown":
            shut = True
            send({"jsonrpc": "2.0", "id": mid, "result": None})
        elif method == "test/sample":
            counter += 1
            sid = f"fake-{counter}"
            send({"jsonrpc": "2.0", "method": "node/didAppend", "params": {
                "sessionId": "s1", "head": "n1",
                "node": {"id": "n1", "seq": 1, "role": "llm", "caller": None, "output": "x", "reads": [None]},
            }})
            send({"jsonrpc": "2.0", "id": sid, "method": "sampling/createMessage", "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": (params or {}).get("text", "")}}],
                "systemPrompt": "Summarize.",
                "maxTokens": 64,
                "metadata": {"purpose": "test", "empty": {}},
            }})
            reply = None
            while reply is None:
                m = read_message()
                if m is None:
                    return 1
                if m.get("method") is None and m.get("id") == sid:
                    reply = m
            send({"jsonrpc": "2.0", "id": mid, "result": {"reply": reply, "capabilities": caps}})
        elif method == "session/history":
            # an old daemon: history, but no context/render (-32601 below)
            send({"jsonrpc": "2.0", "id": mid, "result": {"head": "n2", "nodes": [
                {"id": "n1", "seq": 1, "createdAt": 0, "role": "user", "output": "old daemon question",
                 "predecessor": "root", "caller": None, "status": "completed"},
                {"id": "n2", "seq": 2, "createdAt": 0, "role": "llm", "output": "old daemon answer",
                 "predecessor": "n1", "caller": "n1", "status": "completed"},
            ]}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {
                "code": -32601, "message": f"unknown method {method}", "data": {"kind": "MethodNotFound"}}})


if __name__ == "__main__":
    sys.exit(main())
