"""The MCP face's pure parts: tool table, argument checks, cursors (no processes)."""

from __future__ import annotations

import pytest

from dagctx.cli.mcp_tools import TOOLS, ToolError, check_arguments, decode_cursor, encode_cursor, node_text


def test_tool_table_is_ordered_camel_case_and_path_free() -> None:
    assert list(TOOLS) == ["search_history", "read_node", "expand_summary", "list_sessions", "session_history",
                           "context_stats", "memory_search", "memory_get"]
    for name, (desc, schema) in TOOLS.items():
        assert desc and schema["type"] == "object" and schema["additionalProperties"] is False, name
        assert set(schema["required"]) <= set(schema["properties"]), name
        for arg in schema["properties"]:
            assert arg[0].islower() and "_" not in arg, (name, arg)
            # memory_get's path names a memory file relative to the workspace chosen at start
            assert ("path" not in arg.lower() or name == "memory_get") and arg not in (
                "db", "database", "file", "workspace"), (name, arg)


@pytest.mark.parametrize(("name", "args", "needle"), [
    ("search_history", {}, "'query' is a required property"),
    ("search_history", {"query": ""}, "query"),
    ("search_history", {"query": "x", "limit": 101}, "limit"),
    ("search_history", {"query": "x", "roles": ["tool"]}, "roles.0"),
    ("read_node", {"sessionId": "s", "nodeId": "n", "offset": -1}, "offset"),
    ("list_sessions", {"cursor": 3}, "cursor"),
    ("context_stats", {"sessionId": "s", "extra": True}, "the arguments are: sessionId, model"),
    ("memory_search", {"query": "x", "maxResults": 51}, "maxResults"),
    ("memory_search", {"query": "x", "sources": []}, "sources"),
    ("memory_get", {"path": "MEMORY.md", "fromLine": 0}, "fromLine"),
    ("memory_get", {"workspace": "/"}, "the arguments are: chunkId, path, fromLine, lines"),
    ("nope", {}, "the tools are: search_history"),
])
def test_bad_arguments_say_what_is_wrong(name: str, args: dict, needle: str) -> None:
    with pytest.raises(ToolError) as err:
        check_arguments(name, args)
    assert needle in err.value.message


def test_good_arguments_pass_and_none_means_empty() -> None:
    assert check_arguments("list_sessions", None) == {}
    args = {"query": "迁移", "sessionId": "s", "limit": 5, "roles": ["user", "code"]}
    assert check_arguments("search_history", args) == args


def test_cursors_round_trip_and_garbage_is_refused() -> None:
    for offset in (0, 1, 20, 123456):
        assert decode_cursor(encode_cursor(offset)) == offset
    assert decode_cursor(None) == 0
    for bad in ("garbage!", encode_cursor(0)[:-2] + "??", "eyJvIjogLTF9"):  # the last is {"o": -1}
        with pytest.raises(ToolError, match="nextCursor"):
            decode_cursor(bad)


def test_node_text_is_the_recorded_value() -> None:
    assert node_text(None) == "" and node_text("数据") == "数据"
    assert node_text({"cmd": "ls", "n": 1}) == '{"cmd": "ls", "n": 1}'


def test_a_page_stops_at_the_bound_but_always_holds_one_block() -> None:
    from dagctx.cli.mcp_tools import ANSWER_CHARS, Pager, clip

    p = Pager(100)
    assert p.add("x" * (ANSWER_CHARS * 2)), "the first block always goes in (it is cut by its own limits)"
    assert not p.add("y")
    p = Pager(100)
    n = 0
    while p.add("z" * 999):
        n += 1
    assert sum(len(b) + 1 for b in p.blocks) + 100 <= ANSWER_CHARS and n == len(p.blocks) > 1
    assert clip("abcdef", 3) == ("abc", True) and clip("ab", 3) == ("ab", False)


def test_without_the_sdk_dagctx_mcp_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import sys

    from dagctx.cli import mcp_server

    for mod in ("mcp_types", "mcp", "mcp.types"):
        monkeypatch.setitem(sys.modules, mod, None)  # an import of these now fails
    assert mcp_server.cmd_mcp(argparse.Namespace(db=None)) == 2
    assert "pip install 'dagctx[mcp]'" in capsys.readouterr().err
