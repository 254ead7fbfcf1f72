"""Where a summary's completion comes from: one registry of summary sources (SPEC §2).

A source says who it is (``identity``: the key its summaries are cached under, so two
summarizers' answers never mix), whether this connection can use it (``available``),
what it allows (``limits``), which model writes its summaries (``model``: the window
and output cap every summary request is sized by, SPEC §8) and how to get one
completion (``complete``). Compaction and
reduction within a turn ask ``create_message``, which takes the first available source
in the connection's order of preference (``initializationOptions.summarySources``,
default ``DEFAULT_ORDER``); ``identity`` names that same source for cache keys.

Adding a source is one class here, registered in ``SOURCES`` under a name that the wire
``SummarySourceName`` lists (a test keeps the two equal).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import msgspec

from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError

from .sampling import chat_completion

if TYPE_CHECKING:
    from dagctx.context.models import ModelInfo

    from .ports import Sampling

#: the order when the client names none: the host's own function, then the client's
#: MCP-shaped sampling, then a configured endpoint
DEFAULT_ORDER: tuple[str, ...] = ("host", "client", "endpoint")


@dataclass(frozen=True)
class Limits:
    """What a source allows; ``None``: no limit of its own (the rendering model's apply)."""

    context_window: int | None = None
    max_output_tokens: int | None = None


class SummarySource(Protocol):
    #: the wire name (``SummarySourceName``)
    name: ClassVar[str]
    #: why it is unavailable, in words for an error message
    missing: ClassVar[str]

    def available(self, engine: Sampling) -> bool: ...

    def identity(self, engine: Sampling) -> str: ...

    def limits(self, engine: Sampling) -> Limits: ...

    def model(self, engine: Sampling, session_model: ModelInfo) -> ModelInfo:
        """The model that writes this source's summaries, given the session's."""
        ...

    async def complete(self, engine: Sampling, params: c.CreateMessageParams, timeout: float) -> tuple[str, str]:
        """``(text, model)`` of one completion, or ``SamplingFailed``."""
        ...


def sampling_capability(engine: Sampling) -> m.SamplingCapability | None:
    """The client's ``capabilities.sampling``, typed (checked at ``initialize``)."""
    raw = engine.client_capabilities.get("sampling")
    if raw is None:
        return None
    return msgspec.convert(raw if isinstance(raw, dict) else {}, m.SamplingCapability, from_attributes=False)


async def _ask_client(engine: Sampling, params: c.CreateMessageParams, timeout: float) -> tuple[str, str]:
    try:
        result: c.CreateMessageResult = await engine.peer.request(
            "sampling/createMessage", params, c.CreateMessageResult, timeout=timeout
        )
    except asyncio.TimeoutError as exc:
        raise DagctxError("SamplingFailed", f"the client did not answer sampling/createMessage within {timeout:g} s") from exc
    return result.content.text, result.model


class HostCompletionSource:
    """The host's own completion function (OpenClaw ``llm.complete``, Hermes' auxiliary
    client), answered by the client through ``sampling/createMessage`` after it declared
    ``capabilities.sampling.completion`` with an identity."""

    name: ClassVar[str] = "host"
    missing: ClassVar[str] = "the client declared no capabilities.sampling.completion"

    def _declared(self, engine: Sampling) -> m.HostCompletion | None:
        cap = sampling_capability(engine) if engine.peer.can_sample else None
        return cap.completion if cap is not None else None

    def available(self, engine: Sampling) -> bool:
        return self._declared(engine) is not None

    def identity(self, engine: Sampling) -> str:
        declared = self._declared(engine)
        return f"host:{declared.identity}" if declared is not None else "host"

    def limits(self, engine: Sampling) -> Limits:
        declared = self._declared(engine)
        if declared is None:
            return Limits()
        return Limits(declared.context_window, declared.max_output_tokens)

    def model(self, engine: Sampling, session_model: ModelInfo) -> ModelInfo:
        # the host's function, sized by what it declared (the session's model where it did not)
        declared = self._declared(engine)
        if declared is None:
            return session_model
        return msgspec.structs.replace(
            session_model, name=f"host:{declared.identity}",
            context_window=declared.context_window or session_model.context_window,
            max_output=declared.max_output_tokens or session_model.max_output)

    async def complete(self, engine: Sampling, params: c.CreateMessageParams, timeout: float) -> tuple[str, str]:
        return await _ask_client(engine, params, timeout)


class ClientSamplingSource:
    """The client's MCP-shaped ``sampling/createMessage`` (its own model, unnamed)."""

    name: ClassVar[str] = "client"
    missing: ClassVar[str] = "the client did not declare capabilities.sampling"

    def available(self, engine: Sampling) -> bool:
        if not engine.peer.can_sample:
            return False
        cap = sampling_capability(engine)
        return cap is None or cap.completion is None  # a declared host function is the "host" source

    def identity(self, engine: Sampling) -> str:
        return "client"

    def limits(self, engine: Sampling) -> Limits:
        return Limits()

    def model(self, engine: Sampling, session_model: ModelInfo) -> ModelInfo:
        return session_model  # the client samples with its own (the session's) model

    async def complete(self, engine: Sampling, params: c.CreateMessageParams, timeout: float) -> tuple[str, str]:
        return await _ask_client(engine, params, timeout)


class EndpointSource:
    """An OpenAI-compatible endpoint named in ``initializationOptions.samplingEndpoint``."""

    name: ClassVar[str] = "endpoint"
    missing: ClassVar[str] = "no initializationOptions.samplingEndpoint is configured"

    def available(self, engine: Sampling) -> bool:
        return engine.options.sampling_endpoint is not None

    def identity(self, engine: Sampling) -> str:
        ep = engine.options.sampling_endpoint
        return f"endpoint:{ep.model}" if ep is not None else "endpoint"

    def limits(self, engine: Sampling) -> Limits:
        return Limits()

    def model(self, engine: Sampling, session_model: ModelInfo) -> ModelInfo:
        # the endpoint's model when the model table knows it, else the session's
        endpoint = engine.options.sampling_endpoint
        if endpoint is not None:
            info = engine.models.get(endpoint.model)
            if info.known:
                return info
        return session_model

    async def complete(self, engine: Sampling, params: c.CreateMessageParams, timeout: float) -> tuple[str, str]:
        endpoint = engine.options.sampling_endpoint
        if endpoint is None:
            raise DagctxError("SamplingFailed", self.missing)
        # the key is read from the environment of the client that asked (SPEC §1.3)
        return await asyncio.to_thread(chat_completion, endpoint, params, timeout, engine.environ)


#: every summary source by wire name
SOURCES: dict[str, SummarySource] = {s.name: s for s in (HostCompletionSource(), ClientSamplingSource(), EndpointSource())}


def order(engine: Sampling) -> tuple[str, ...]:
    names = engine.options.summary_sources
    return DEFAULT_ORDER if names is None else tuple(names)


def check_options(engine: Sampling) -> None:
    """At ``initialize``: the order names each source once, the sampling capability is well formed."""
    names = engine.options.summary_sources
    if names is not None and len(set(names)) != len(names):
        raise DagctxError("InvalidParams", "initializationOptions.summarySources names a source twice; list each "
                          f"of {', '.join(SOURCES)} at most once, most preferred first",
                          path="initializationOptions.summarySources")
    try:
        sampling_capability(engine)
    except msgspec.ValidationError as exc:
        raise DagctxError("InvalidParams", f"capabilities.sampling is invalid: {exc} (expected "
                          "{\"completion\": {\"identity\": \"host/model\", \"contextWindow\"?, \"maxOutputTokens\"?}} or {})",
                          path="capabilities.sampling") from exc


def choose(engine: Sampling) -> SummarySource | None:
    """The first available source in this connection's order, or None."""
    for name in order(engine):
        source = SOURCES[name]
        if source.available(engine):
            return source
    return None


def unavailable(engine: Sampling) -> str:
    """Why no source answers, in words."""
    names = order(engine)
    if not names:
        return "no summarizer: initializationOptions.summarySources is empty"
    why = "; ".join(f"{n}: {SOURCES[n].missing}" for n in names)
    return f"no summarizer ({why})"


def identity(engine: Sampling) -> str:
    """The one cache identity of this connection's summaries: the chosen source's."""
    source = choose(engine)
    return source.identity(engine) if source is not None else "none"


def limits(engine: Sampling) -> Limits:
    source = choose(engine)
    return source.limits(engine) if source is not None else Limits()


def summarizer_model(engine: Sampling, session_model: ModelInfo) -> ModelInfo:
    """The model that writes summaries (SPEC §8, summary requests fit the summarizer): the
    preferred available source's (``SummarySource.model``), else the session's."""
    source = choose(engine)
    return source.model(engine, session_model) if source is not None else session_model


async def create_message(engine: Sampling, params: c.CreateMessageParams, *, timeout: float) -> tuple[str, str]:
    """Return ``(text, model)`` of one completion from the preferred source, or raise ``SamplingFailed``."""
    source = choose(engine)
    if source is None:
        raise DagctxError("SamplingFailed", unavailable(engine) + " (or pass fallback: \"structural\")")
    cap = source.limits(engine).max_output_tokens
    if cap is not None and params.max_tokens > cap:
        params = msgspec.structs.replace(params, max_tokens=cap)
    return await source.complete(engine, params, timeout)
