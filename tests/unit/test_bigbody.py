"""A big request body read in pieces (daemon/dagctx/server/bigbody.py, SPEC §1.4) gives
exactly what decoding it whole gives, or steps aside; and a big frame is handed out as the
buffer it arrived in (daemon/dagctx/server/framing.py), never copied whole."""

from __future__ import annotations

import random

import msgspec
import pytest

from dagctx.protocol import codec
from dagctx.protocol.methods import METHODS
from dagctx.server import bigbody, framing

#: characters that exercise every escape: quotes, backslashes, controls, non-ASCII of
#: two, three and four bytes (a surrogate pair escaped), U+2028
ALPHABET = ['a', 'b', ' ', '\n', '"', '\\', '/', '\t', '\x01', '\x1f', 'é', '中', '😀', '\u2028', '{', ']', '0']


def whole(body: bytes) -> tuple[object, object]:
    env = codec.envelope_decoder.decode(body)
    return env, codec.decode_params(METHODS[env.method].params, env.params)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift strings of 40 bytes or more and decode them in pieces of about 7 bytes, so
    small bodies exercise every cut."""
    monkeypatch.setattr(bigbody, "LONG_STRING", 40)
    monkeypatch.setattr(bigbody, "PIECE_BYTES", 7)


def text(rnd: random.Random, n: int) -> str:
    return "".join(rnd.choice(ALPHABET) for _ in range(n))


@pytest.mark.parametrize("seed", range(40))
def test_a_body_read_in_pieces_is_the_body_decoded_whole(small_pieces: None, seed: int) -> None:
    rnd = random.Random(seed)
    long_key = text(rnd, 60)
    node = {"role": "code", "name": text(rnd, rnd.choice([3, 50])), "output": text(rnd, rnd.randrange(40, 400)),
            "input": {"cmd": text(rnd, 80), long_key: [text(rnd, 45), 7, {"deep": text(rnd, 50)}], "n": 12},
            "metadata": {"note": text(rnd, 41)}, "caller": "n1"}
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": seed, "method": "node/append",
                                "params": {"sessionId": "s", "node": node}})
    got = bigbody.predecode(bytearray(body))
    assert got is not None and got[0] == "message"
    env, params = whole(body)
    assert got[1].id == env.id and got[1].method == env.method and got[2] == params
    assert got[2].node.input[long_key][0] == node["input"][long_key][0]  # a long key stays, its value is lifted


@pytest.mark.parametrize("seed", range(10))
def test_strings_decode_in_pieces_exactly_whatever_the_cut(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(seed)
    s = text(rnd, rnd.randrange(1, 5000))
    raw = msgspec.json.encode(s)
    for piece in (1, 2, 6, 7, 64, 10_000):
        monkeypatch.setattr(bigbody, "PIECE_BYTES", piece)
        assert bigbody.decode_string(raw, 1, len(raw) - 1) == s


def test_invalid_string_content_steps_aside(small_pieces: None) -> None:
    """A raw control character or a bad escape in a long string: the whole decode
    answers (ParseError with its position), not the pieces."""
    good = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": "node/append",
                                "params": {"sessionId": "s", "node": {"role": "code", "output": "x" * 100}}})
    for bad in (b"x" * 50 + b"\x01" + b"x" * 49, b"x" * 50 + b"\\q" + b"x" * 48):
        body = good.replace(b"x" * 100, bad)
        assert bigbody.predecode(body) is None
        with pytest.raises(msgspec.DecodeError):
            whole(body)


def test_a_long_string_in_a_constrained_field_steps_aside(small_pieces: None) -> None:
    """session/import's path may hold no NUL: a placeholder would pass where the string
    does not, so the body is decoded whole, which refuses it."""
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": "session/import",
                                "params": {"path": "/tmp/" + "a" * 60 + "\x00"}})
    assert bigbody.predecode(body) is None
    with pytest.raises(msgspec.ValidationError):
        whole(body)


def test_answers_notifications_and_unknown_fields_step_aside(small_pieces: None) -> None:
    long = "y" * 100
    for msg in ({"jsonrpc": "2.0", "method": "$/dagctx/attach", "params": {"cwd": long}},  # a notification
                {"jsonrpc": "2.0", "id": 3, "result": {"text": long}},  # the client's answer
                {"jsonrpc": "2.0", "id": 4, "method": "node/append",  # a field the params drop
                 "params": {"sessionId": "s", "node": {"role": "user", "output": "hi"}, "extra": long}},
                {"jsonrpc": "2.0", "id": 5, "method": "no/such", "params": {"x": long}}):
        assert bigbody.predecode(msgspec.json.encode(msg)) is None


def test_too_many_strings_step_aside(small_pieces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bigbody, "MAX_QUOTES", 10)
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": "node/append", "params": {
        "sessionId": "s", "node": {"role": "code", "output": "z" * 100, "input": ["a"] * 20}}})
    assert bigbody.long_strings(body) is None and bigbody.predecode(body) is None


def test_a_big_frame_is_the_buffer_it_arrived_in() -> None:
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": "node/append",
                                "params": {"output": "q" * (framing.KEEP_BUFFER_BYTES + 10)}})
    stream = b"Content-Length: %d\r\n\r\n%s" % (len(body), body) + b'Content-Length: 2\r\n\r\n{}Content-Len'
    parser = framing.FrameParser(1 << 30)
    events: list[object] = []
    for i in range(0, len(stream), 65_536):
        events += parser.feed(stream[i:i + 65_536])
    assert [type(e.data) for e in events] == [bytearray, bytes]  # type: ignore[attr-defined]
    assert events[0].data == body and events[1].data == b"{}"  # type: ignore[attr-defined]
    assert parser.feed(b"gth: 2\r\n\r\n[]")[0].data == b"[]"  # type: ignore[index,union-attr]
