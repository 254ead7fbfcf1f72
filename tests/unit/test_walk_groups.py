"""``View.parts``: where the walk began each chain node's items (and the summary's), so a
compaction reads each item's group by position (``compaction_plan._walk_groups``) instead
of following the caller edges of every item (``aging.owner_chain_id``). The two agree on
every view a walk gives — nested calls shown or hidden, functions on the chain, an
ask-user inside a function, an empty user message with inner calls, a spawned branch, an
active summary, ``before_seq`` — and on the views made from walks: aged
(``render.age_view``), and a cached prefix extended by a suffix (``render_cache.join_views``).
A view whose items were rearranged (a request checkpoint) or a frame view has none, and
its groups are looked up as before."""

from __future__ import annotations

from typing import Any

from test_render import Builder, conversation

from dagctx.context.aging import owner_chain_id
from dagctx.context.compaction_plan import _walk_groups, cut_decision
from dagctx.context.render import age_view, render_view
from dagctx.context.request_checkpoint import Checkpoint, apply_checkpoint
from dagctx.context.view import View
from dagctx.engine.render_cache import join_views


def _looked_up(view: View, graph: Any, n: int | None = None) -> list[str]:
    """Each item's group as ``cut_decision`` found it before (one lookup per item)."""
    items = view.items if n is None else view.items[:n]
    return [it.node_id if it.kind == "summary" else owner_chain_id(graph, it.node_id) for it in items]


def _rich() -> Builder:
    """Every way the walk renders a chain node's turn part."""
    b = Builder()
    last = conversation(b, 3)
    b.tool("t1", "l1", "read", {"p": "a.py"}, "old data")
    # a tool whose insides may be shown: an inner model call with its own tool, a helper
    b.user("u4", "analyse", last)
    b.llm("l4", "calling analyse", "u4")
    b.tool("fx", "l4", "analyse", {"f": "x.py"}, "analysis result")
    b.inner_llm("il1", "fx", "inner prompt", "inner reply")
    b.tool("it1", "il1", "read_file", {"p": "x.py"}, "file content")
    b.fn("sub", "fx", "helper", {"n": 1}, "helper out")
    b.inner_llm("il2", "sub", "deep prompt", "deep reply")
    # top-level functions on the chain, one shown whole with an ask-user inside
    b.fn("run", None, "lint", {"path": "src"}, "3 warnings", pred="l4")
    b.fn("dep", None, "deploy", {}, "deployed", pred="run", expose="full")
    b.node("ask", "user", input="Which region?", output="eu-west", caller="dep")
    # an empty user message whose inner calls still render
    b.node("u5", "user", output="", caller="root", predecessor="dep")
    b.inner_llm("iu5", "u5", "a prompt under an empty message", "its reply")
    b.llm("l5", "after the empty message", "u5")
    # a spawned branch under a tool of the chain: its own chain, never the parent's items
    b.tool("task", "l5", "task", {"goal": "g"}, "subagent done", expose="full")
    b.node("s0", "user", output="child goal", caller="task", predecessor=None, spawn_branch_root=True)
    b.llm("s1", "child answer", "s0")
    b.tool("st", "s1", "grep", {"q": "x"}, "child data")
    b.user("u6", "more", "l5")
    b.llm("l6", "done", "u6")
    return b


def test_walk_groups_equal_the_owner_of_each_item() -> None:
    b = _rich()
    g = b.g
    views = []
    for head in ("l6", "l5", "u5", "dep", "run", "l4", "s1"):
        for expose in ("io", "full"):
            views.append(render_view(g, head, expose_default=expose))  # type: ignore[arg-type]
    views.append(render_view(g, "l6", before_seq=g.nodes["u5"].seq))
    # an active summary: its own group, then the turns after it
    b.summary("S", ["u1", "l1", "u2", "l2"], "we read old data")
    views.append(render_view(g, "l6"))
    views.append(render_view(g, "l6", expose_default="full"))
    views.append(render_view(g, "l6", summary_policy="none"))
    assert any(v.summary_id == "S" for v in views)
    for v in views:
        assert v.parts is not None
        assert _walk_groups(v, len(v.items)) == _looked_up(v, g), (v.head, v.expose_default)
        for n in (0, 1, len(v.items) // 2, len(v.items) - 1):  # a cut anywhere
            assert _walk_groups(v, n) == _looked_up(v, g, n)


def test_views_made_from_walks_keep_or_drop_their_parts() -> None:
    b = _rich()
    g = b.g
    full = render_view(g, "l6", expose_default="full")
    # aged: the same items in the same places
    aged = age_view(full, g, {"t1": "[removed]", "fx": "[cleared]", "run": "[r]"})
    assert aged is not None and aged.parts == full.parts
    assert aged == render_view(g, "l6", expose_default="full", aged={"t1": "[removed]", "fx": "[cleared]",
                                                                   "run": "[r]"})
    # a cached prefix extended by the suffix after it: the parts of the whole walk
    for cut in ("l1", "l4", "dep", "u5"):
        prefix = render_view(g, cut, expose_default="full")
        suffix = render_view(g, "l6", expose_default="full", start_after=cut)
        joined = join_views(prefix, suffix, list(full.chain))
        # (the same items: a suffix's turn numbers stay its own, ``join_views`` shifts ``turns``)
        assert [(it.kind, it.node_id, it.text) for it in joined.items] == \
            [(it.kind, it.node_id, it.text) for it in full.items]
        assert joined.parts == full.parts, cut
    # a frame view, and items replaced by a request checkpoint: no parts, groups looked up
    b.tool("open", "l6", "build", {}, None, status="running")
    frame = render_view(g, "l6", frame="open")
    assert frame.parts is None and _walk_groups(frame, len(frame.items)) is None
    checked = apply_checkpoint(full, g, Checkpoint(id="cp", covers=("l4",), summary="steps so far", key="k"))
    assert checked.parts is None and any(it.node_id == "cp" for it in checked.items)


def test_cut_decision_groups_with_and_without_parts() -> None:
    b = _rich()
    b.summary("S", ["u1", "l1", "u2", "l2"], "we read old data")
    view = render_view(b.g, "l6", expose_default="full")

    def tok(it: Any) -> int:
        return 5 + len(it.text)

    without = View(**{**{f: getattr(view, f) for f in view.__dataclass_fields__}, "parts": None})
    found = 0
    for keep in range(0, 200, 7):
        with_parts, why = cut_decision(view, b.g, tok, window=128_000, keep_recent_tokens=keep)
        looked_up, why2 = cut_decision(without, b.g, tok, window=128_000, keep_recent_tokens=keep)
        assert why == why2
        assert with_parts == looked_up
        if with_parts is not None:
            found += 1
            assert with_parts.input_groups == _looked_up(view, b.g, with_parts.cut_index)
    assert found


def test_transcript_bodies_and_headers_in_one_loop() -> None:
    """``summary_transcript._bodies_and_heads`` (a compaction's transcript columns, built in
    one loop, a tool's header made once per name) gives each item's ``item_body`` and
    header as the per-item functions do, for every kind of item."""
    from dagctx.context.summary_transcript import _bodies_and_heads, _item_header, item_body

    b = _rich()
    b.tool("t9", "l6", "read", None, "no input")  # a call without arguments
    b.tool("t10", "l6", "read", "a plain string input", "x")
    b.summary("S", ["u1", "l1"], "earlier")
    g = b.g
    items = []
    for expose in ("io", "full"):
        items += render_view(g, "l6", expose_default=expose).items  # type: ignore[arg-type]
    items += render_view(g, "l6", summary_policy="none").items
    assert {"user", "assistant", "tool_call", "tool_result", "text_pair", "summary"} <= {it.kind for it in items}
    assert any(it.depth > 0 for it in items)
    bodies, heads = _bodies_and_heads(items)
    assert bodies == [item_body(it) for it in items]
    assert heads == [_item_header(it) for it in items]
