"""A minimal coding agent on dagctx: the whole loop, nothing hidden.

Each step: ``context/prepare`` (system prompt + history under the model's budget, in
OpenAI format; when it recommends compaction, ``context/compact`` first — the summary
comes from the same endpoint, which the daemon calls itself: ``samplingEndpoint`` — and
prepare again) → an OpenAI-compatible chat completion with tools → the reply appended as
an llm node (with the prepare's ``renderId``, so ``context/replay`` can rebuild exactly
what the model saw) and each tool call as a code node, ``running`` while it runs and
``completed``/``error`` after → ``usage/report`` with the provider's numbers (which
calibrate the next prepare's count). A compaction that found nothing to fold is not
tried again in the same turn: what it could fold is the turns before this one, and within
a turn dagctx reduces what the model sees by itself (SPEC §8).

    python examples/python/agent.py --base-url https://api.openai.com/v1 --model gpt-4o \\
        --workspace ./scratch "Add a README to this project"

The tools (read_file, write_file, list_files) only touch files inside ``--workspace``.
The key is read from the environment variable named by ``--api-key-env`` (default
OPENAI_API_KEY) by this process and by the daemon; it is never written anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dagctx.client import DagctxClient

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Create or overwrite a text file of the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "list_files", "description": "List the files of the workspace (or of one folder in it).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
]
IDENTITY = "You are a careful coding agent. Use the tools to read and change files in the workspace."


class ToolFailed(Exception):
    pass


def inside(workspace: Path, rel: str) -> Path:
    path = (workspace / rel).resolve()
    if not path.is_relative_to(workspace):
        raise ToolFailed(f"{rel!r} is outside the workspace")
    return path


def run_tool(workspace: Path, name: str, args: dict[str, Any]) -> str:
    if name == "read_file":
        path = inside(workspace, str(args.get("path", "")))
        if not path.is_file():
            raise ToolFailed(f"no file {args.get('path')!r} in the workspace")
        return path.read_text(encoding="utf-8", errors="replace")
    if name == "write_file":
        path = inside(workspace, str(args.get("path", "")))
        path.parent.mkdir(parents=True, exist_ok=True)
        content = str(args.get("content", ""))
        path.write_text(content, encoding="utf-8")
        return f"wrote {len(content.encode())} bytes to {args.get('path')}"
    if name == "list_files":
        root = inside(workspace, str(args.get("path") or "."))
        return "\n".join(sorted(str(p.relative_to(workspace)) for p in root.rglob("*") if p.is_file())) or "(empty)"
    raise ToolFailed(f"unknown tool {name!r}")


def chat(base_url: str, api_key: str | None, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's endpoint
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"the chat endpoint answered HTTP {exc.code}: {exc.read()[:500]!r}") from None


async def run(args: argparse.Namespace) -> int:
    workspace = Path(args.workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    api_key = os.environ.get(args.api_key_env)
    options: dict[str, Any] = {
        "samplingEndpoint": {"baseUrl": args.base_url, "model": args.model, "apiKeyEnv": args.api_key_env}}
    if args.context_window:
        options["models"] = {args.model: {"contextWindow": args.context_window}}
    client = await DagctxClient.spawn(args.db, initialization_options=options)
    try:
        if args.session:
            sid, head = args.session, (await client.session_get(args.session)).head
        else:
            s = await client.session_create(f"agent: {args.task[:60]}")
            sid, head = s.session_id, s.head
        print(f"session {sid}")
        head = (await client.append(sid, "user", output=args.task, predecessor=head)).head

        async def prepare() -> Any:
            return await client.prepare(sid, model=args.model, format="openai", tools=TOOLS,
                                        prompt_mode="minimal", identity=IDENTITY)

        nothing_to_fold = False  # a compaction of this turn found nothing: not again this turn
        for _step in range(args.max_steps):
            prep = await prepare()
            if prep.recommend_compaction and not nothing_to_fold:
                res = await client.compact(sid, model=args.model, keep_recent_tokens=args.keep_recent_tokens)
                print(f"  compaction: {'summary ' + res.summary_id if res.ok and res.summary_id else res.reason}"
                      f" ({res.tokens_before} → {res.tokens_after} tokens)")
                if res.ok and res.summary_id:
                    prep = await prepare()
                else:
                    nothing_to_fold = True
            reply = chat(args.base_url, api_key, {"model": args.model, "messages": prep.messages, "tools": TOOLS})
            msg = reply["choices"][0]["message"]
            calls = msg.get("tool_calls") or []
            llm = await client.append(sid, "llm", name=args.model, output=msg.get("content") or "",
                                      predecessor=head, render_id=prep.render_id)
            head = llm.head
            usage = reply.get("usage") or {}
            if usage.get("prompt_tokens"):
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                await client.usage_report(sid, llm.node.id, model=args.model,
                                          input=int(usage["prompt_tokens"]) - cached,
                                          output=int(usage.get("completion_tokens") or 0), cache_read=cached)
            for call in calls:
                fn = call["function"]
                try:
                    fargs = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    fargs = {"raw": fn.get("arguments")}
                code = await client.append(sid, "code", name=fn["name"], input=fargs, status="running",
                                           caller=llm.node.id, metadata={"toolCallId": call["id"]})
                try:
                    out, status = run_tool(workspace, fn["name"], fargs), "completed"
                except ToolFailed as exc:
                    out, status = f"error: {exc}", "error"
                await client.update(sid, code.node.id, status, output=out)
                print(f"  tool {fn['name']} {json.dumps(fargs)[:80]} → {status}")
            if not calls:
                print(msg.get("content") or "")
                return 0
        print(f"stopped after {args.max_steps} steps", file=sys.stderr)
        return 1
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("task", help="what the agent should do")
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"))
    p.add_argument("--model", default="gpt-4o")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--workspace", default=".", help="the folder the tools may read and write")
    p.add_argument("--db", help="dagctx database (default: the daemon's)")
    p.add_argument("--session", help="continue this dagctx session instead of starting one")
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--keep-recent-tokens", type=int, help="size of the verbatim tail compaction keeps (default: dagctx's)")
    p.add_argument("--context-window", type=int,
                   help="the model's context window in tokens, for a model dagctx's table does not know")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
