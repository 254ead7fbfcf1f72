"""Where a summary's completion comes from: the client, or a configured endpoint.

dagctx holds no API keys unless configured to. When it needs an LLM it
asks its client (``sampling/createMessage``, MCP-shaped), or, for headless use, an
OpenAI-compatible ``/chat/completions`` endpoint named in
``initializationOptions.samplingEndpoint`` (the key comes from an environment
variable, never from the protocol).

Architecture Invariant: the only network I/O of the daemon lives here, and only
for a configured endpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError

if TYPE_CHECKING:
    from .core import EngineCore


async def create_message(engine: EngineCore, params: c.CreateMessageParams, *, timeout: float) -> tuple[str, str]:
    """Return ``(text, model)`` of one completion, or raise ``SamplingFailed``."""
    endpoint = engine.options.sampling_endpoint
    if engine.peer.can_sample:
        try:
            result: c.CreateMessageResult = await engine.peer.request(
                "sampling/createMessage", params, c.CreateMessageResult, timeout=timeout
            )
        except asyncio.TimeoutError as exc:
            raise DagctxError("SamplingFailed", f"the client did not answer sampling/createMessage within {timeout:g} s") from exc
        return result.content.text, result.model
    if endpoint is not None:
        return await asyncio.to_thread(_chat_completion, endpoint, params, timeout)
    raise DagctxError(
        "SamplingFailed",
        "no summarizer: the client did not declare capabilities.sampling and no "
        "initializationOptions.samplingEndpoint is configured (or pass fallback: \"structural\")",
    )


def _chat_completion(endpoint: Any, params: c.CreateMessageParams, timeout: float) -> tuple[str, str]:
    messages: list[dict[str, str]] = []
    if params.system_prompt:
        messages.append({"role": "system", "content": params.system_prompt})
    messages += [{"role": m.role, "content": m.content.text} for m in params.messages]
    body = json.dumps({"model": endpoint.model, "messages": messages, "max_tokens": params.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if endpoint.api_key_env:
        key = os.environ.get(endpoint.api_key_env)
        if not key:
            raise DagctxError("SamplingFailed", f"environment variable {endpoint.api_key_env} (the endpoint's API key) is not set")
        headers["Authorization"] = f"Bearer {key}"
    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=min(timeout, endpoint.timeout_seconds)) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        # 429 and 5xx are worth another try; other statuses will answer the same again.
        retry = exc.code == 429 or exc.code >= 500
        raise DagctxError("SamplingFailed", f"the endpoint {url} answered HTTP {exc.code}",
                          details={"retryable": retry, "status": exc.code}) from exc
    except (urllib.error.URLError, ConnectionError) as exc:
        raise DagctxError("SamplingFailed", f"the endpoint {url} failed: {exc}", details={"retryable": True}) from exc
    except (TimeoutError, OSError, ValueError) as exc:
        raise DagctxError("SamplingFailed", f"the endpoint {url} failed: {exc}") from exc
    try:
        choice = data["choices"][0]["message"]
        return str(choice.get("content") or ""), str(data.get("model") or endpoint.model)
    except (KeyError, IndexError, TypeError) as exc:
        raise DagctxError("SamplingFailed", f"the endpoint {url} returned no choices[0].message") from exc
