"""The web view's pure helpers: the request diff, token categories, identifiers (in-process)."""

from __future__ import annotations

from typing import Any

from dagctx.cli.webui.api import decision_path, identifier_split, request_diff, token_categories, usage_view
from dagctx.protocol import context_messages as c


def _replay(messages: list[Any], per: list[int], *, system: str | None = "sys", nodes: list[list[str]] | None = None,
            manifest: dict[str, Any] | None = None, usage: c.Usage | None = None) -> c.ReplayResult:
    return c.ReplayResult(
        node_id="n", system=system, messages=messages, reads=[], manifest=manifest or {}, exact=True,
        tokens=c.TokenCounts(total=sum(per) + 10, per_message=per, system=10, tokenizer="cl100k_base"),
        message_nodes=nodes or [[] for _ in messages], context_window=1000, output_reserve=250, usage=usage,
    )


def test_the_diff_finds_where_the_byte_stable_prefix_ends() -> None:
    a = {"role": "user", "content": "a"}
    b = {"role": "assistant", "content": "b"}
    c1 = {"role": "user", "content": "c"}
    prev = _replay([a, b, c1], [5, 6, 7])
    cur = _replay([a, b, {"role": "user", "content": "c2"}, c1], [5, 6, 8, 7])
    d = request_diff(prev, cur)
    assert d["stablePrefixMessages"] == 2 and d["stablePrefixTokens"] == 5 + 6 + 10
    assert d["added"] == [2] and d["kept"] == [3] and d["replaced"] == []
    # a changed system prompt: nothing is a stable prefix
    d2 = request_diff(_replay([a], [5], system="other"), cur)
    assert d2["stablePrefixMessages"] == 0 and d2["stablePrefixTokens"] == 0 and not d2["sameSystem"]
    # a message of the previous request that is gone was replaced
    d3 = request_diff(prev, _replay([a, {"role": "assistant", "content": "B"}], [5, 6]))
    assert d3["replaced"] == [1, 2] and d3["added"] == [1]


def test_token_categories_follow_the_manifest() -> None:
    msgs = [{"role": "user", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "r"}]
    man = {"summaryId": "S", "aged": ["t1"], "toolsTokens": 40,
           "turnReduction": {"results": [{"nodeId": "t2"}], "tokensBefore": 9, "tokensAfter": 3, "limit": 100}}
    rep = _replay(msgs, [20, 30, 5, 7], nodes=[["S"], ["u1"], ["l1", "t1"], ["t2"]], manifest=man)

    class SystemNode:
        metadata = {"sections": [{"name": "identity", "chars": 30}, {"name": "AGENTS.md", "chars": 70}]}

    cat = token_categories(rep, SystemNode())
    assert (cat["summary"], cat["verbatim"], cat["aged"], cat["reduced"]) == (20, 30, 5, 7)
    assert [l["tokens"] for l in cat["systemLayers"]] == [3, 7] and cat["tools"] == 40
    assert cat["window"] == 1000 and cat["outputReserve"] == 250 and cat["total"] == sum([20, 30, 5, 7]) + 10 + 40
    path = decision_path(rep)
    assert any("summary S replaces" in p for p in path) and any("1 tool result shown aged" in p for p in path)
    assert any("1 tool result summarized" in p for p in path)


def test_usage_is_priced_in_base_input_tokens() -> None:
    rep = _replay([], [], usage=c.Usage(input=100, output=5, cache_read=1000, cache_write=40))
    u = usage_view(rep)
    assert u is not None and u["prompt"] == 1140 and u["inputEquivalent"] == 100 + 50 + 100
    assert usage_view(_replay([], [])) is None


def test_identifiers_kept_and_dropped() -> None:
    kept, dropped = identifier_split(
        ["edit src/app.py and tests/test_app.py at 3f9c2ab1, see https://example.org/x parse_config"],
        "We changed src/app.py (parse_config).")
    assert kept == ["src/app.py", "parse_config"]
    assert set(dropped) == {"tests/test_app.py", "3f9c2ab1", "https://example.org/x"}
