"""A connection's repeated quick reads recognised by their bytes (SPEC §1.4,
``server/replay.py``): a match is exactly what decoding the frame would give, and
anything that decoding could read differently is not a match."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dagctx.protocol import codec
from dagctx.server.replay import KEPT, Replays, id_of

PARAMS = object()  # what the first read's params decoded to: handed back by a match


def _body(msg_id: Any, method: str = "session/list", params: Any = None, *, order: str = "id-first") -> bytes:
    params = {} if params is None else params
    if order == "id-first":
        return msgspec.json.encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return msgspec.json.encode({"jsonrpc": "2.0", "method": method, "params": params, "id": msg_id})


def _learned(body: bytes) -> Replays:
    env = codec.envelope_decoder.decode(body)
    r = Replays()
    r.learn(body, env.id, env.method, PARAMS)
    return r


@pytest.mark.parametrize("order", ["id-first", "id-last"])
@pytest.mark.parametrize("new_id", [8, 0, -3, 123456789012345, "abc", "", "a b-c_9|~"])
def test_the_same_body_with_another_plain_id_matches_with_that_id(order: str, new_id: Any) -> None:
    r = _learned(_body(1, order=order))
    got = r.match(codec.frame(_body(new_id, order=order)))
    assert got is not None
    token, replay = got
    msg_id = id_of(token)
    assert msg_id == new_id and type(msg_id) is type(new_id)
    assert token == codec.encoder.encode(new_id)  # the encoder's own spelling: an answer may carry it
    assert replay.method == "session/list" and replay.params is PARAMS


@pytest.mark.parametrize("new_id", [
    "q\"uote", "back\\slash", "br[acket", "brace}", "é", "x" * 65,  # strings the pattern leaves alone
    1234567890123456,  # 16 digits: the door's integer checks decide those
    1.5, None, True, [1],  # not a request id, or not a plain one
])
def test_an_id_that_decoding_could_read_otherwise_is_no_match(new_id: Any) -> None:
    r = _learned(_body(1))
    assert r.match(codec.frame(_body(new_id))) is None


def test_an_id_spelled_otherwise_than_the_encoder_spells_it_is_no_match() -> None:
    r = _learned(_body(1))
    for token in (b"-0", b"01", b"1.0", b"1e3", b" 1"):
        assert r.match(codec.frame(_body(1).replace(b'"id":1', b'"id":' + token))) is None, token


def test_anything_but_one_canonical_frame_of_a_kept_body_is_no_match() -> None:
    r = _learned(_body(1, params={"limit": 5}))
    assert r.match(codec.frame(_body(2, params={"limit": 5}))) is not None
    assert r.match(codec.frame(_body(2, params={"limit": 6}))) is None  # other params
    assert r.match(codec.frame(_body(2, "session/get", {"limit": 5}))) is None  # another method
    one = codec.frame(_body(2, params={"limit": 5}))
    assert r.match(one + one) is None  # two frames
    assert r.match(one[:-1]) is None  # a partial frame
    assert r.match(one.replace(b"Content-Length: ", b"content-length: ")) is None  # another header spelling
    body = _body(2, params={"limit": 5})
    assert r.match(b"Content-Length: %d\r\nContent-Type: x\r\n\r\n%s" % (len(body), body)) is None
    assert r.match(b"Content-Length: %d\r\n\r\n%s" % (len(body) + 1, body + b" ")) is None  # bytes after


def test_an_id_like_text_inside_a_value_is_never_taken_for_the_id() -> None:
    """The id's place is proved by decoding: a string param that reads ``"id":1`` is text."""
    params = {"sessionId": '"id":1,'}
    body = _body(1, "session/get", params, order="id-last")
    assert body.index(b'\\"id\\":1') < body.rindex(b'"id":1')
    r = _learned(body)
    got = r.match(codec.frame(_body(7, "session/get", params, order="id-last")))
    assert got is not None and id_of(got[0]) == 7
    # the same text with the param changed instead of the id is another body
    assert r.match(codec.frame(_body(1, "session/get", {"sessionId": '"id":7,'}, order="id-last"))) is None


def test_a_body_whose_id_cannot_be_placed_is_not_kept() -> None:
    for body in (_body('we"ird'), _body(10**17), b'{"jsonrpc":"2.0","id":1.0,"method":"session/list"}'):
        env = codec.envelope_decoder.decode(body)
        r = Replays()
        r.learn(body, env.id, env.method, PARAMS)
        assert r.prefix == b"" and r.match(codec.frame(body)) is None


def test_several_bodies_are_kept_and_a_new_prefix_starts_over() -> None:
    r = Replays()
    bodies = [_body(1, "session/get", {"sessionId": f"s{i}"}) for i in range(KEPT)]
    for b in bodies:
        env = codec.envelope_decoder.decode(b)
        r.learn(b, env.id, env.method, env.params)
    for i in range(KEPT):
        got = r.match(codec.frame(_body(100 + i, "session/get", {"sessionId": f"s{i}"})))
        assert got is not None and id_of(got[0]) == 100 + i and bytes(got[1].params) == b'{"sessionId":"s%d"}' % i
    other = b'{"id":1,"jsonrpc":"2.0","method":"session/list","params":{}}'  # another client's spelling
    r.learn(other, 1, "session/list", PARAMS)
    assert r.match(codec.frame(_body(5, "session/get", {"sessionId": "s0"}))) is None
    assert r.match(codec.frame(other.replace(b'"id":1', b'"id":9'))) is not None


def test_a_connection_answers_a_repeated_read_from_its_bytes_and_anything_else_by_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a reader thread: the first read is decoded and answered, the same read with another
    id is answered without a decode, with that id; a read with other params is decoded."""
    import threading
    from types import SimpleNamespace

    from dagctx.engine.config import DaemonConfig
    from dagctx.server.jsonrpc_server import DagctxServer

    proto = DagctxServer(DaemonConfig()).protocol
    proto.engine.db = SimpleNamespace(key="x.db")  # type: ignore[assignment]
    proto.initialized = True
    proto.hub._loop_thread = threading.get_ident() + 1  # this thread is a reader, not the loop
    seen: list[Any] = []
    proto.quick = {"session/list": lambda p, same_batch: seen.append(p) or {"limit": p.limit}}
    written: list[bytes] = []
    monkeypatch.setattr(proto, "_write_from_thread", written.append)
    decoded: list[bytes] = []
    predecode = proto._predecode
    monkeypatch.setattr(proto, "_predecode", lambda body: decoded.append(body) or predecode(body))

    proto.feed_in_thread(codec.frame(_body(1, params={"limit": 3})))
    proto.feed_in_thread(codec.frame(_body("again", params={"limit": 3})))
    proto.feed_in_thread(codec.frame(_body(2, params={"limit": 4})))
    assert [msgspec.json.decode(w.split(b"\r\n\r\n", 1)[1]) for w in written] == [
        {"id": 1, "result": {"limit": 3}, "jsonrpc": "2.0"},
        {"id": "again", "result": {"limit": 3}, "jsonrpc": "2.0"},
        {"id": 2, "result": {"limit": 4}, "jsonrpc": "2.0"},
    ]
    assert len(decoded) == 2 and b'"again"' not in b"".join(decoded)  # the repeat was not decoded
    assert seen[0] is seen[1]  # the first read's params, handed back


def test_a_kept_answer_goes_out_until_a_commit_and_the_read_runs_again_after_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a real store: the first read runs the quick handler, the repeats are answered from
    the answer kept with the file's mark (no handler call), a commit moves the mark and the
    next repeat runs the handler again and answers what was committed."""
    import threading
    from types import SimpleNamespace

    from dagctx.engine.config import DaemonConfig
    from dagctx.ledger import Store
    from dagctx.server.jsonrpc_server import DagctxServer

    st = Store(tmp_path / "k.db")
    st.create_session("one")
    proto = DagctxServer(DaemonConfig()).protocol
    proto.engine._store = st
    proto.engine.db = SimpleNamespace(key="k.db")  # type: ignore[assignment]
    proto.initialized = True
    proto.hub._loop_thread = threading.get_ident() + 1  # this thread is a reader, not the loop
    runs: list[int] = []
    handler = proto.quick["session/list"]
    proto.quick = {"session/list": lambda p, same_batch: runs.append(1) or handler(p, same_batch)}
    written: list[bytes] = []
    monkeypatch.setattr(proto, "_write_from_thread", written.append)

    def poll(msg_id: Any) -> dict[str, Any]:
        proto.feed_in_thread(codec.frame(_body(msg_id, params={"limit": 5})))
        got = msgspec.json.decode(written[-1].split(b"\r\n\r\n", 1)[1])
        assert got["id"] == msg_id
        return got["result"]

    answered = proto.hub.quick.answered
    for i in range(4):  # the first learns the body, a later one keeps the answer (a cold first
        assert [s["title"] for s in poll(i)["sessions"]] == ["one"]  # read over the budget delays it)
    assert 2 <= len(runs) <= 3 and proto.hub.quick.answered == answered + 4
    ran = len(runs)
    for msg_id in ("s", 10, "t"):
        assert poll(msg_id)["total"] == 1
    assert len(runs) == ran and proto.hub.quick.answered == answered + 7
    st.create_session("two")  # a commit: the mark moves
    assert poll(20)["total"] == 2 and len(runs) == ran + 1
    assert poll(21)["total"] == 2 and len(runs) == ran + 1
    st.close()


def test_a_frame_longer_than_any_kept_body_can_make_is_no_match_and_is_not_cut() -> None:
    """An append of 50 MB behind a kept poll is passed over by its length alone."""
    r = _learned(_body(1))
    long_id = "x" * 64
    assert r.match(codec.frame(_body(long_id))) is not None  # the longest plain id still matches
    big = codec.frame(_body(2, params={"text": "y" * 100_000}))

    class Untouchable:
        def match(self, data: bytes) -> None:
            raise AssertionError("the frame was looked into")

    r._head = Untouchable()  # type: ignore[assignment]
    assert r.match(big) is None
    with pytest.raises(AssertionError):
        r.match(codec.frame(_body(3)))  # (a frame of a kept body's length is looked into)
