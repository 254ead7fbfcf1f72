"""JSON-RPC envelopes and LSP base-protocol framing, shared by server and clients.

Encoders and decoders are built once per type and reused: building a msgspec
decoder per message would cost more than decoding the message.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from .errors import ResponseError


class Envelope(msgspec.Struct, omit_defaults=True):
    """Any JSON-RPC 2.0 message; ``params``/``result`` stay raw until the method is known.

    ``id`` is ``UNSET`` when absent (a notification) and ``None`` when it was ``null``.
    """

    jsonrpc: Any = msgspec.UNSET
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    params: msgspec.Raw = msgspec.UNSET  # type: ignore[assignment]
    result: msgspec.Raw = msgspec.UNSET  # type: ignore[assignment]
    error: Any = msgspec.UNSET


class Request(msgspec.Struct):
    """A request; ``params`` left UNSET is omitted from the wire."""

    method: str
    id: int | str
    params: Any = msgspec.UNSET
    jsonrpc: str = "2.0"


class Notification(msgspec.Struct):
    method: str
    params: Any = msgspec.UNSET
    jsonrpc: str = "2.0"


class Response(msgspec.Struct):
    id: int | str | None
    result: Any
    jsonrpc: str = "2.0"


class ErrorResponse(msgspec.Struct):
    id: int | str | None
    error: ResponseError
    jsonrpc: str = "2.0"


envelope_decoder = msgspec.json.Decoder(Envelope)
encoder = msgspec.json.Encoder()


@lru_cache(maxsize=None)
def decoder_for(tp: Any) -> msgspec.json.Decoder:
    """One cached decoder per type."""
    return msgspec.json.Decoder(tp)


def decode_params(tp: type, raw: Any) -> Any:
    """Decode raw params into ``tp``; absent or ``null`` params mean ``{}``."""
    if raw is msgspec.UNSET or raw is None or bytes(raw) == b"null":
        return decoder_for(tp).decode(b"{}")
    return decoder_for(tp).decode(raw)


def frame(body: bytes) -> bytes:
    """Prefix a JSON body with its LSP ``Content-Length`` header."""
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def encode_response(msg_id: int | str | None, result_json: bytes) -> bytes:
    """``encoder.encode(Response(id=msg_id, result=…))`` from the result's own encoding,
    byte for byte: an answer whose result was encoded before is not encoded again."""
    return b'{"id":' + encoder.encode(msg_id) + b',"result":' + result_json + b',"jsonrpc":"2.0"}'


def encode_message(message: Any) -> bytes:
    """Encode a message Struct and frame it."""
    return frame(encoder.encode(message))
