"""The size limits of one summary request (``summary_limits``, ``check_fits``, SPEC §8) and
the configured endpoint's HTTP client: one OpenAI-compatible ``/chat/completions`` call.

dagctx holds no API keys unless configured to. Which source a summary comes from (the
host's completion function, the client's sampling, this endpoint) is
``summary_sources.py``; for headless use the endpoint is named in
``initializationOptions.samplingEndpoint`` (the key comes from an environment
variable, never from the protocol).

Architecture Invariant: the only network I/O of the daemon lives here, and only
for a configured endpoint.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError


#: A summary request never asks for more than this many output tokens.
SUMMARY_MAX_TOKENS = 8192


def summary_limits(window: int, max_output: int) -> tuple[int, int]:
    """``(maxTokens, input limit)`` of one summary request to a model of ``window``
    tokens: the answer may use a quarter of the window (at most its max output and
    8,192); the input gets the rest, minus a safety margin for the estimate."""
    max_tokens = max(64, min(SUMMARY_MAX_TOKENS, max_output, window // 4))
    margin = max(256, -(-window * 2 // 100))
    return max_tokens, window - max_tokens - margin


def check_fits(system: str, texts: list[str], max_tokens: int, window: int, model: str,
               estimates: list[int] | None = None) -> None:
    """Refuse (``SamplingFailed``, nothing sent) a summary request its summarizer cannot take.
    ``estimates``: ``estimate_tokens`` of each of ``texts``, when the caller has them."""
    from dagctx.context.tokens import estimate_tokens

    sizes = [estimate_tokens(t) for t in texts] if estimates is None else estimates
    used = estimate_tokens(system) + sum(e + 4 for e in sizes)
    if used + max_tokens > window:
        raise DagctxError(
            "SamplingFailed",
            f"the summary request needs about {used:,} input tokens plus {max_tokens:,} for the answer, but the "
            f"summarizer {model} has a window of {window:,} tokens; it was not sent. Configure a summarizer "
            "with a larger window (initializationOptions.samplingEndpoint, or a client model with more context)",
            details={"inputTokens": used, "maxTokens": max_tokens, "window": window, "model": model},
        )


#: the largest endpoint answer read; a summary is a few KiB
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


def chat_completion(endpoint: Any, params: c.CreateMessageParams, timeout: float,
                    environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """One ``POST {baseUrl}/chat/completions`` within a total deadline (SPEC §2).

    ``timeout`` bounds the whole exchange — connect, headers and body — not each socket
    read: a watchdog shuts the socket down when the deadline passes, so an endpoint
    that trickles bytes cannot hold a compaction past it. Only http and https URLs are
    accepted (``file://`` and friends would read local files); redirects are not
    followed; a body cut short or too large is ``SamplingFailed``.
    """
    messages: list[dict[str, str]] = []
    if params.system_prompt:
        messages.append({"role": "system", "content": params.system_prompt})
    messages += [{"role": m.role, "content": m.content.text} for m in params.messages]
    body = json.dumps({"model": endpoint.model, "messages": messages, "max_tokens": params.max_tokens}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if endpoint.api_key_env:
        # the key is read from the environment of the client that asked (SPEC §1.3), never
        # from the shared daemon's own
        key = (os.environ if environ is None else environ).get(endpoint.api_key_env)
        if not key:
            raise DagctxError("SamplingFailed", f"environment variable {endpoint.api_key_env} (the endpoint's API key) "
                              "is not set in the client's environment (the one `dagctx serve` was started in)")
        headers["Authorization"] = f"Bearer {key}"
    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise DagctxError("SamplingFailed", f"samplingEndpoint.baseUrl must be an http:// or https:// URL, not {endpoint.base_url!r}")
    limit = min(timeout, endpoint.timeout_seconds)
    deadline = time.monotonic() + limit
    cls = http.client.HTTPSConnection if parts.scheme.lower() == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=limit)
    expired = threading.Event()

    def _expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(limit, _expire)
    watchdog.daemon = True
    watchdog.start()
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        try:
            conn.request("POST", target, body=body, headers=headers)
            resp = conn.getresponse()
            status = resp.status
            raw = _read_capped(resp, deadline)
        except (http.client.IncompleteRead, http.client.HTTPException) as exc:
            if expired.is_set():
                raise _late(url, limit) from exc
            raise DagctxError("SamplingFailed", f"the endpoint {url} sent a broken answer ({type(exc).__name__}: {exc})",
                              details={"retryable": True}) from exc
        except (ConnectionError, TimeoutError, OSError) as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                raise _late(url, limit) from exc
            raise DagctxError("SamplingFailed", f"the endpoint {url} failed: {exc}", details={"retryable": True}) from exc
    finally:
        watchdog.cancel()
        conn.close()
    if expired.is_set():
        raise _late(url, limit)
    if status >= 300:
        # 429 and 5xx are worth another try; other statuses will answer the same again.
        retry = status == 429 or status >= 500
        raise DagctxError("SamplingFailed", f"the endpoint {url} answered HTTP {status}",
                          details={"retryable": retry, "status": status})
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DagctxError("SamplingFailed", f"the endpoint {url} did not answer JSON: {exc}") from exc
    try:
        choice = data["choices"][0]["message"]
        return str(choice.get("content") or ""), str(data.get("model") or endpoint.model)
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise DagctxError("SamplingFailed", f"the endpoint {url} returned no choices[0].message") from exc


def _read_capped(resp: http.client.HTTPResponse, deadline: float) -> bytes:
    """The body, at most ``MAX_RESPONSE_BYTES``; ``IncompleteRead`` when cut short."""
    chunks: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("deadline passed while reading the body")
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not chunk:
            break
        total += len(chunk)
        if total > MAX_RESPONSE_BYTES:
            raise http.client.HTTPException(f"the answer is larger than {MAX_RESPONSE_BYTES:,} bytes")
        chunks.append(chunk)
    data = b"".join(chunks)
    expected = resp.length  # remaining bytes per Content-Length; None when chunked or unknown
    if expected:
        raise http.client.IncompleteRead(data, expected)
    return data


def _late(url: str, limit: float) -> DagctxError:
    return DagctxError("SamplingFailed", f"the endpoint {url} did not answer within {limit:g} s (a total deadline)",
                       details={"retryable": False})
