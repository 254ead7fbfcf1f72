"""The door checks of a message body (SPEC §1): nesting, 64-bit integers, safe text."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagctx.protocol.limits import MAX_JSON_DEPTH, too_deep
from dagctx.server import guards


def depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((depth(x) for x in v), default=0)
    return 0


KEYS = st.text(alphabet='ab[]{}"\\:,', max_size=4)
VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet='x[]{}"\\', max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=3),
    max_leaves=40,
)


@settings(derandomize=True, database=None, max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(v=VALUES, limit=st.integers(1, 8))
def test_too_deep_is_exact_for_valid_json(v: Any, limit: int) -> None:
    """Brackets inside strings (and escaped quotes) never count."""
    text = json.dumps(v).encode()
    assert too_deep(text, limit) == (depth(v) > limit), (text, depth(v), limit)


def test_too_deep_at_the_limit_and_for_unbalanced_input() -> None:
    at = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert not too_deep(at)
    assert too_deep(b"[" + at + b"]")
    assert too_deep(b"[" * 5000)  # a decoder would recurse before noticing the truncation
    assert not too_deep(b"[" * 50 + b"]" * 60)


def test_top_level_id_of_a_too_deep_body() -> None:
    deep = "[" * 3000 + "]" * 3000
    assert guards.top_level_id(('{"id": 7, "params": %s}' % deep).encode()) == (True, 7)
    assert guards.top_level_id(('{"params": %s, "id": "x"}' % deep).encode()) == (True, "x")
    assert guards.top_level_id(('{"params": {"id": 5, "a": %s}, "id": null}' % deep).encode()) == (True, None)
    assert guards.top_level_id(('{"id": %s}' % deep).encode()) == (False, None)
    assert guards.top_level_id(b'{"method": "id", "x": [[[]]]}') == (False, None)


def test_check_body_names_the_id_and_the_field() -> None:
    r = guards.check_body(b'{"jsonrpc": "2.0", "id": 3, "method": "m", "params": {"a": [1, 18446744073709551616]}}')
    assert r is not None and r.id == 3 and r.refusal.path == "params.a[1]"
    assert guards.check_body(b'{"jsonrpc": "2.0", "id": 3, "method": "m", "params": {"a": 9223372036854775807}}') is None
    assert guards.check_body(b'{"id": 3, "params": {"s": "12345678901234567890123"}}') is None  # digits in a string
    deep = guards.check_body(('{"id": 9, "params": %s}' % ("[" * 200 + "]" * 200)).encode())
    assert deep is not None and deep.id == 9 and deep.refusal.kind == "InvalidParams"


def test_safe_text_and_sanitized_encoding() -> None:
    assert guards.safe_text("plain 中文") == "plain 中文"
    assert guards.safe_text("bad\udcffname") == "bad\\xffname"
    assert guards.safe_text("lone\ud800") == "lone\\ud800"
    msg = {"id": 1, "result": {"file": "x\udcfe.jsonl", "list": ["\udcff"]}}
    out = msgspec.json.decode(guards.encode_sanitized(msg))
    assert out["result"] == {"file": "x\\xfe.jsonl", "list": ["\\xff"]}
