"""The ledger in-process over both backends: invariants, spill, revision-based refresh
across Store objects, and transactions that fail at COMMIT."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dagctx.ledger import AppendRequest, Store
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call, NodeInput
from rawdb import RawDb


@pytest.fixture
def store(database: str):
    s = Store(database)
    yield s
    s.close()


def U(pred: str | None, text: str = "hi", **kw) -> NodeInput:
    return NodeInput(role="user", input=text, predecessor=pred, **kw)


def L(pred: str | None, text: str = "ok", **kw) -> NodeInput:
    return NodeInput(role="llm", output=text, predecessor=pred, **kw)


def raises(kind: str, fn, *args, **kw) -> DagctxError:
    with pytest.raises(DagctxError) as info:
        fn(*args, **kw)
    assert info.value.kind == kind, info.value.message
    return info.value


def rows(path: str | Path, sid: str) -> tuple[int, int, str, int]:
    with RawDb(path) as db:
        n = db.execute("SELECT count(*) FROM nodes WHERE session_id=?", (sid,))[0][0]
        node_count, head, rev = db.execute("SELECT node_count, head, rev FROM sessions WHERE id=?", (sid,))[0]
        return n, node_count, head, rev


def turn(store: Store, sid: str, pred: str, i: int) -> tuple[Call, Call]:
    u = store.append(sid, U(pred, f"question {i}")).node
    a = store.append(sid, L(u.id, f"answer {i}")).node
    return u, a


# ---------------------------------------------------------------- sessions and appends


def test_new_session_has_a_root_that_is_head(store: Store) -> None:
    info = store.create_session("first")
    assert info.head == info.root_id and info.node_count == 1 and info.title == "first"
    assert store.history(info.session_id) == ([], info.root_id)
    branches, head = store.branches(info.session_id)
    assert head == info.root_id
    assert [(b.head, b.length, b.main, b.current) for b in branches] == [(info.root_id, 0, True, True)]
    root = store.get_nodes(info.session_id, ["ROOT"])[0]
    assert root.id == info.root_id and root.seq == 0


def test_seq_is_per_session_and_contiguous(store: Store) -> None:
    a = store.create_session("a")
    b = store.create_session("b")
    ua, _ = turn(store, a.session_id, a.root_id, 1)
    ub, _ = turn(store, b.session_id, b.root_id, 1)
    turn(store, a.session_id, store.head(a.session_id), 2)
    assert ua.seq == 1 and ub.seq == 1
    with RawDb(store.path) as db:
        seqs = [r[0] for r in db.execute("SELECT seq FROM nodes WHERE session_id=? ORDER BY seq", (a.session_id,))]
    assert seqs == [0, 1, 2, 3, 4]


def test_head_moves_only_when_the_append_extends_it(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u1, a1 = turn(store, sid, s.root_id, 1)
    assert store.head(sid) == a1.id
    # A fork (same predecessor as a1) without moveHead leaves HEAD where it is.
    fork = store.append(sid, L(u1.id, "alternative"))
    assert not fork.moved and fork.head == a1.id == store.head(sid)
    # moveHead=False on an extending append also leaves HEAD.
    held = store.append(sid, U(a1.id, "held"), move_head=False)
    assert not held.moved and store.head(sid) == a1.id
    # moveHead=True on a fork is a retry: HEAD moves to it.
    retry = store.append(sid, L(u1.id, "retry"), move_head=True)
    assert retry.moved and store.head(sid) == retry.node.id
    hist, _ = store.history(sid)
    assert [n.id for n in hist] == [u1.id, retry.node.id]


def test_tool_call_is_a_nested_code_node(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u, a = turn(store, sid, s.root_id, 1)
    tool = store.append(
        sid,
        NodeInput(role="code", name="read_file", input={"path": "a.py"}, output="x = 1", caller=a.id,
                  metadata={"toolCallId": "call_1"}),
    )
    assert not tool.moved and store.head(sid) == a.id
    assert tool.node.metadata["toolCallId"] == "call_1" and tool.node.predecessor is None
    assert [n.id for n in store.history(sid)[0]] == [u.id, a.id]
    assert [n.id for n in store.graph(sid).subtree(a.id)] == [tool.node.id]
    # A nested call is never a predecessor, never a HEAD, and has no predecessor itself.
    raises("InvalidEdge", store.append, sid, U(tool.node.id))
    raises("InvalidEdge", store.checkout, sid, tool.node.id)
    raises("InvalidEdge", store.append, sid, NodeInput(role="code", name="x", caller=a.id, predecessor=a.id))
    raises("InvalidEdge", store.append, sid, NodeInput(role="code", name="x", caller=a.id), move_head=True)


def test_rejected_appends_write_nothing(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u, a = turn(store, sid, s.root_id, 1)
    before = rows(store.path, sid)
    raises("DuplicateNode", store.append, sid, U(a.id, id=u.id))
    raises("DuplicateNode", store.append, sid, U(a.id, id="ROOT"))
    raises("PredecessorMissing", store.append, sid, U(None))
    raises("PredecessorMissing", store.append, sid, L(None))
    raises("NodeNotFound", store.append, sid, U("nope"))
    raises("NodeNotFound", store.append, sid, NodeInput(role="code", caller="nope"))
    raises("NodeNotFound", store.append, sid, L(a.id, reads=["nope"]))
    raises("InvalidParams", store.append, sid, U(a.id, id="bad\nid"))
    raises("InvalidEdge", store.append, sid, U(a.id, metadata={"spawn_branch_root": True}))
    raises("InvalidEdge", store.append, sid, NodeInput(role="llm", name="context/summary", predecessor=a.id))
    # moveHead on a nested call fails after the row was inserted: the rollback must undo it.
    raises("InvalidEdge", store.append, sid, NodeInput(role="code", id="nested", caller=a.id), move_head=True)
    raises("SessionNotFound", store.append, "no-such-session", U("ROOT"))
    assert rows(store.path, sid) == before
    assert "nested" not in store.graph(sid).nodes
    # The cache is still right: the next append gets the next seq and extends HEAD.
    nxt = store.append(sid, U(a.id, "next"))
    assert nxt.node.seq == 3 and nxt.moved


def test_documented_exceptions_to_predecessor_missing(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    first = store.append(sid, U("ROOT"))  # the ROOT sentinel
    assert first.node.predecessor == s.root_id and first.moved
    a = store.append(sid, L(first.node.id)).node
    ask = store.append(sid, NodeInput(role="code", name="ask_user", caller=a.id)).node
    answer = store.append(sid, NodeInput(role="user", input="yes", caller=ask.id))  # an ask-user answer
    assert answer.node.predecessor is None and not answer.moved
    spawn = store.spawn(sid, a.id)
    assert spawn.node.predecessor is None and spawn.node.metadata["spawn_branch_root"]


def test_duplicate_ids_are_per_session(store: Store) -> None:
    a = store.create_session()
    b = store.create_session()
    store.append(a.session_id, U("ROOT", id="same"))
    store.append(b.session_id, U("ROOT", id="same"))
    raises("DuplicateNode", store.append, a.session_id, L("same", id="same"))


def test_update_is_the_one_mutation(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u = store.append(sid, U("ROOT")).node
    a = store.append(sid, L(u.id, "", status="running")).node
    done = store.update(sid, a.id, status="completed", output="final", metadata={"model": "m"})
    assert done.node.status == "completed" and done.node.output == "final"
    assert done.node.seq == a.seq and done.node.predecessor == u.id and done.node.metadata == {"model": "m"}
    assert not done.moved and store.head(sid) == a.id
    before = rows(store.path, sid)
    raises("NotRunning", store.update, sid, a.id, status="error", output="again")
    raises("NotRunning", store.update, sid, u.id, status="completed")
    raises("NodeNotFound", store.update, sid, "nope", status="completed")
    t = store.append(sid, NodeInput(role="code", name="t", caller=a.id, status="running")).node
    raises("InvalidParams", store.update, sid, t.id, status="running")
    assert rows(store.path, sid)[:3] == (before[0] + 1, before[1] + 1, before[2])
    assert store.get_nodes(sid, [a.id])[0].output == "final"


def test_checkout_and_rewind(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u1, a1 = turn(store, sid, s.root_id, 1)
    u2, a2 = turn(store, sid, a1.id, 2)
    alt = store.append(sid, L(u2.id, "alt"), move_head=True).node
    assert store.checkout(sid, a2.id) == (a2.id, alt.id)
    assert store.rewind(sid, steps=3) == (u1.id, a2.id)
    raises("InvalidEdge", store.rewind, sid, node_id=a2.id)  # ahead of HEAD: not on its branch
    assert store.checkout(sid, alt.id) == (alt.id, u1.id)
    raises("InvalidEdge", store.rewind, sid, node_id=a2.id)  # on the other branch
    raises("InvalidParams", store.rewind, sid, steps=0)
    raises("InvalidParams", store.rewind, sid, steps=5)
    raises("InvalidParams", store.rewind, sid)
    raises("InvalidParams", store.rewind, sid, node_id=u1.id, steps=1)
    raises("NodeNotFound", store.rewind, sid, node_id="nope")
    assert store.rewind(sid, steps=4) == (s.root_id, alt.id)
    assert store.rewind(sid, node_id="ROOT") == (s.root_id, s.root_id)
    assert store.checkout(sid, "ROOT")[0] == s.root_id


def test_branches_main_lane_and_lengths(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u1, a1 = turn(store, sid, s.root_id, 1)
    u2, a2 = turn(store, sid, a1.id, 2)
    alt = store.append(sid, L(u1.id, "alt"), move_head=True).node
    sp = store.spawn(sid, a2.id, name="research").node
    su = store.append(sid, U(sp.id, "sub task")).node
    assert store.head(sid) == alt.id
    branches, head = store.branches(sid)
    by_head = {b.head: b for b in branches}
    assert head == alt.id and set(by_head) == {a2.id, alt.id, su.id}
    assert by_head[a2.id].main and by_head[a2.id].length == 4 and not by_head[a2.id].current
    assert by_head[alt.id].current and by_head[alt.id].length == 2 and not by_head[alt.id].main
    spawn = by_head[su.id]
    assert spawn.spawn and spawn.root == sp.id and spawn.length == 2 and spawn.name == "research"
    assert [n.id for n in store.history(sid, su.id)[0]] == [sp.id, su.id]


# ---------------------------------------------------------------- bad data surfaces


def _corrupt(path: str, sid: str, node_id: str, predecessor: str | None) -> None:
    """Rewrite one node's predecessor underneath the store, as a broken writer would."""
    db = RawDb(path)
    db.begin()
    body = db.execute("SELECT body FROM nodes WHERE session_id=? AND id=?", (sid, node_id))[0][0]
    call = msgspec.msgpack.decode(body, type=Call)
    call = msgspec.structs.replace(call, predecessor=predecessor)
    rev = db.execute("SELECT rev FROM sessions WHERE id=?", (sid,))[0][0] + 1
    db.execute(
        "UPDATE nodes SET predecessor=?, body=?, rev=? WHERE session_id=? AND id=?",
        (predecessor, msgspec.msgpack.encode(call), rev, sid, node_id),
    )
    db.execute("UPDATE sessions SET rev=? WHERE id=?", (rev, sid))
    db.commit()
    db.close()


@pytest.mark.parametrize("bad", [None, "ghost"], ids=["null", "dangling"])
def test_broken_chain_raises_with_the_node_id(store: Store, bad: str | None) -> None:
    s = store.create_session()
    sid = s.session_id
    u1, a1 = turn(store, sid, s.root_id, 1)
    u2, a2 = turn(store, sid, a1.id, 2)
    assert len(store.history(sid)[0]) == 4  # cached before the corruption
    _corrupt(store.path, sid, u2.id, bad)
    err = raises("BrokenPredecessorChain", store.history, sid)
    # A dangling predecessor stops the walk at u2 itself; a null one makes u2 a
    # non-conversation node, so the walk stops at its child a2 naming u2 as the cause.
    assert err.node_id == (u2.id if bad else a2.id) and u2.id in err.message
    raises("BrokenPredecessorChain", store.branches, sid)
    raises("BrokenPredecessorChain", store.checkout, sid, a2.id)
    # The intact part of the branch still walks.
    assert [n.id for n in store.history(sid, a1.id)[0]] == [u1.id, a1.id]
    # A fresh Store over the same file sees the same thing (nothing papered over on load).
    other = Store(store.path)
    try:
        assert raises("BrokenPredecessorChain", other.history, sid).node_id == err.node_id
    finally:
        other.close()


def test_predecessor_loop_is_broken(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u1, a1 = turn(store, sid, s.root_id, 1)
    _corrupt(store.path, sid, u1.id, a1.id)
    assert raises("BrokenPredecessorChain", store.history, sid).kind == "BrokenPredecessorChain"


# ---------------------------------------------------------------- spill


def big_output(lines: int = 400, width: int = 120) -> str:
    return "\n".join(f"{i:05d} " + "x" * (width - 6) for i in range(lines))


def test_large_output_spills_once_and_reads_back_whole(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u = store.append(sid, U("ROOT")).node
    a = store.append(sid, L(u.id)).node
    text = big_output()
    text = text[:20_000] + " needle_in_the_middle " + text[20_000:]
    assert len(text) > 32_000 and text.count("\n") + 1 > 100
    node = store.append(sid, NodeInput(role="code", name="cat", caller=a.id, output=text)).node
    sp = node.metadata["spill"]
    pol = store.spill
    assert sp["chars"] == len(text) and sp["lines"] == text.count("\n") + 1
    assert node.output.startswith(text[: pol.head_chars]) and node.output.endswith(text[-pol.tail_chars :])
    assert "omitted" in node.output and len(node.output) < len(text)
    assert sp["headChars"] + sp["omitted"] + sp["tailChars"] == len(text)
    # Stored the same way it was answered: reading has no side effects.
    again = store.get_nodes(sid, [node.id])[0]
    assert again == node
    assert store.full_output(sid, node) == text
    whole = store.get_nodes(sid, [node.id], ranged=True)[0]
    assert whole.output == text
    part = store.get_nodes(sid, [node.id], offset=sp["headChars"], length=sp["omitted"], ranged=True)[0]
    assert part.output == text[sp["headChars"] : sp["headChars"] + sp["omitted"]]
    assert store.get_nodes(sid, [node.id], offset=len(text) - 5, length=100, ranged=True)[0].output == text[-5:]
    raises("InvalidParams", store.get_nodes, sid, [node.id], offset=-1, ranged=True)
    # The omitted middle is still searchable.
    hits = store.search("needle_in_the_middle", session_id=sid)
    assert [h.node_id for h in hits] == [node.id]
    # Deterministic: the same output spills to the same stored text.
    again2 = store.append(sid, NodeInput(role="code", name="cat", caller=a.id, output=text)).node
    assert again2.output == node.output and again2.metadata["spill"] == sp


@pytest.mark.parametrize(
    "text",
    ["y" * 31_999, "y" * 31_700 + "\n" * 299, big_output(lines=300, width=50)],
    ids=["one-char-short", "just-under-chars-many-lines", "many-short-lines"],
)
def test_outputs_below_the_size_limit_stay_inline(store: Store, text: str) -> None:
    s = store.create_session()
    u = store.append(s.session_id, U("ROOT"), move_head=None).node
    a = store.append(s.session_id, L(u.id)).node
    n = store.append(s.session_id, NodeInput(role="code", name="cat", caller=a.id, output=text)).node
    assert len(text) < store.spill.min_chars
    assert n.output == text and "spill" not in n.metadata


def test_messages_are_never_spilled(store: Store) -> None:
    """SPEC §4: only function and tool results spill; a user's message and a model's reply
    are the conversation itself, kept whole however long."""
    s = store.create_session()
    text = "requirement must hold " * 5_000
    u = store.append(s.session_id, NodeInput(role="user", output=text, predecessor="ROOT")).node
    a = store.append(s.session_id, L(u.id, text)).node
    for n in (u, a):
        assert n.output == text and "spill" not in n.metadata


@pytest.mark.parametrize("text", ["z" * 32_000, big_output(lines=100, width=400), ("w" * 99 + " ") * 5_000],
                         ids=["exactly-the-limit-one-line", "exactly-100-lines", "500k-one-line"])
def test_size_alone_decides_a_spill(store: Store, text: str) -> None:
    """SPEC §4: an output of at least 32,000 characters spills whatever its line count."""
    s = store.create_session()
    sid = s.session_id
    u = store.append(sid, U("ROOT")).node
    a = store.append(sid, L(u.id)).node
    n = store.append(sid, NodeInput(role="code", name="cat", caller=a.id, output=text)).node
    sp = n.metadata["spill"]
    assert sp["chars"] == len(text) and sp["lines"] == text.count("\n") + 1
    assert len(n.output) < 10_000 and n.output.startswith(text[:6_000]) and n.output.endswith(text[-3_000:])
    assert store.get_nodes(sid, [n.id], ranged=True)[0].output == text


def test_a_system_prompt_is_never_spilled(store: Store) -> None:
    """SPEC §4, §7: a ``context/system_prompt`` node keeps its whole text, however long."""
    s = store.create_session()
    prompt = "\n".join(f"- skill-{i}: does thing {i} " + "d" * 300 for i in range(400))
    assert len(prompt) > 100_000
    n = store.append(s.session_id, NodeInput(role="code", name="context/system_prompt", caller="ROOT",
                                             output=prompt)).node
    assert n.output == prompt and "spill" not in n.metadata
    assert store.get_nodes(s.session_id, [n.id])[0].output == prompt


def test_update_spills_too(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u = store.append(sid, U("ROOT")).node
    a = store.append(sid, L(u.id)).node
    t = store.append(sid, NodeInput(role="code", name="build", caller=a.id, status="running")).node
    text = big_output()
    done = store.update(sid, t.id, status="completed", output=text).node
    assert "spill" in done.metadata and done.output != text
    assert store.get_nodes(sid, [t.id], ranged=True)[0].output == text


# ---------------------------------------------------------------- two stores, one file


def test_second_store_sees_every_committed_write(database: str) -> None:
    path = database
    a, b = Store(path), Store(path)
    try:
        s = a.create_session("shared")
        sid = s.session_id
        assert b.history(sid) == ([], s.root_id)  # b caches the empty graph now
        u1, a1 = turn(a, sid, s.root_id, 1)
        assert [n.id for n in b.history(sid)[0]] == [u1.id, a1.id]
        assert b.graph(sid).rev == a.graph(sid).rev
        # b writes on top of what a wrote; a sees it without reopening.
        u2 = b.append(sid, U(a1.id, "from b")).node
        assert u2.seq == 3 and a.head(sid) == u2.id
        l2 = a.append(sid, L(u2.id, "", status="running")).node
        # The one mutation, made by a, replaces b's cached copy.
        assert b.get_nodes(sid, [l2.id])[0].status == "running"
        a.update(sid, l2.id, status="completed", output="done")
        got = b.get_nodes(sid, [l2.id])[0]
        assert got.status == "completed" and got.output == "done"
        raises("NotRunning", b.update, sid, l2.id, status="error")
        # HEAD moves by a are visible to b.
        a.checkout(sid, a1.id)
        assert b.head(sid) == a1.id and b.branches(sid)[1] == a1.id
        # A session created by b is listed by a.
        other = b.create_session("from b")
        assert other.session_id in {x.session_id for x in a.list_sessions()[0]}
        # Deletion by a: b answers SessionNotFound instead of serving its cache.
        a.delete_session(sid)
        raises("SessionNotFound", b.history, sid)
        raises("SessionNotFound", b.append, sid, U("ROOT"))
    finally:
        a.close()
        b.close()


def test_recreated_session_id_is_not_served_from_a_stale_cache(database: str) -> None:
    path = database
    a, b = Store(path), Store(path)
    try:
        s = a.create_session("one", session_id="fixed")
        turn(a, "fixed", s.root_id, 1)
        old = {n.id for n in b.history("fixed")[0]}
        a.delete_session("fixed")
        s2 = a.create_session("two", session_id="fixed")
        turn(a, "fixed", s2.root_id, 1)
        turn(a, "fixed", a.head("fixed"), 2)
        turn(a, "fixed", a.head("fixed"), 3)
        hist = b.history("fixed")[0]
        assert [n.id for n in hist] == [n.id for n in a.history("fixed")[0]]
        assert not old & set(b.graph("fixed").nodes)
    finally:
        a.close()
        b.close()


def test_append_many_is_all_or_nothing(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    before = rows(store.path, sid)
    batch = [U("ROOT", id="m1"), L("m1", id="m2"), U("m2", id="m3"), U(None, id="m4")]
    raises("PredecessorMissing", store.append_many, sid, batch)
    assert rows(store.path, sid) == before and "m1" not in store.graph(sid).nodes
    out = store.append_many(sid, batch[:3], head="m3")
    assert [n.seq for n in out] == [1, 2, 3] and store.head(sid) == "m3"


def test_search_in_process(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u = store.append(sid, U("ROOT", "我们需要写一个数据库迁移脚本")).node
    store.append(sid, L(u.id, "call parse_config in src/app.py"))
    assert [h.node_id for h in store.search("迁移")] == [u.id]
    assert store.search("parse_config", session_id=sid)[0].snippet.count("[parse_config]") == 1
    raises("InvalidQuery", store.search, "foo AND (")
    raises("InvalidQuery", store.search, "   ")
    raises("InvalidParams", store.search, "x", limit=0)
    raises("SessionNotFound", store.search, "x", session_id="nope")


# ---------------------------------------------------------------- a COMMIT that fails


def _trap_commit(database: str) -> None:
    """Install a deferred constraint that makes COMMIT itself fail for a node named 'boom'."""
    with RawDb(database) as db:
        if db.pg:
            db.execute(
                "CREATE FUNCTION dagctx.trap() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.id = 'boom' THEN RAISE EXCEPTION 'commit refused by the test trap'; END IF; "
                "RETURN NULL; END $$"
            )
            db.execute(
                "CREATE CONSTRAINT TRIGGER trap AFTER INSERT ON dagctx.nodes DEFERRABLE INITIALLY DEFERRED "
                "FOR EACH ROW EXECUTE FUNCTION dagctx.trap()"
            )
        else:
            db.execute("CREATE TABLE trap_parent(id TEXT PRIMARY KEY)")
            db.execute("CREATE TABLE trap(ref TEXT REFERENCES trap_parent(id) DEFERRABLE INITIALLY DEFERRED)")
            db.execute(
                "CREATE TRIGGER trap_on_node AFTER INSERT ON nodes WHEN NEW.id = 'boom' "
                "BEGIN INSERT INTO trap VALUES('nothing'); END"
            )


def test_a_failing_commit_rolls_back_and_leaves_the_cache_as_the_database(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    u1, a1 = turn(store, sid, s.root_id, 1)
    _trap_commit(store.path)
    before = rows(store.path, sid)
    with pytest.raises(Exception) as info:
        store.append(sid, U(a1.id, "doomed", id="boom"))
    assert "trap" in str(info.value).lower() or "foreign key" in str(info.value).lower()
    # Nothing was written, the cache agrees, and HEAD did not move.
    assert rows(store.path, sid) == before
    assert "boom" not in store.graph(sid).nodes and store.head(sid) == a1.id
    assert [n.id for n in store.history(sid)[0]] == [u1.id, a1.id]
    # The connection is not left inside a transaction: the next writes work.
    u2 = store.append(sid, U(a1.id, "next")).node
    assert u2.seq == 3 and store.head(sid) == u2.id
    assert rows(store.path, sid)[:2] == (before[0] + 1, before[1] + 1)
    other = Store(store.path)
    try:
        assert [n.id for n in other.history(sid)[0]] == [u1.id, a1.id, u2.id]
    finally:
        other.close()


def test_nul_and_unusual_text_round_trips_exactly(store: Store) -> None:
    """Text a client may send — NUL, emoji, CJK — comes back exactly on every backend."""
    from dagctx.ledger import UsageRow
    from dagctx.protocol.context_messages import Usage

    odd = "a\x00b 🎉 迁移 \\ ' \" %s ?"
    s = store.create_session(odd)
    sid = s.session_id
    u = store.append(sid, U("ROOT", odd, name=odd)).node
    big = (odd + "\n") * 4000  # spilled: the blob keeps it whole
    t = store.append(sid, NodeInput(role="code", name=odd, output=big, caller=u.id)).node
    store.put_usage(sid, UsageRow(u.id, odd, Usage(input=1, output=2, cache_read=3, cache_write=4), None, 1.0))
    other = Store(store.path)
    try:
        assert other.get_session(sid).title == odd
        assert other.get_nodes(sid, [u.id])[0].name == odd
        assert other.get_nodes(sid, [t.id], ranged=True)[0].output == big
        assert other.usage(sid)[0].model == odd
        hits = other.search("迁移", session_id=sid)
        assert {h.node_id for h in hits} == {u.id, t.id} and all(h.name == odd for h in hits)
    finally:
        other.close()


# ---------------------------------------------------------------- group commit (SPEC §4.2)


def test_a_group_keeps_the_rules_of_lone_appends_and_isolates_failures(store: Store) -> None:
    s1, s2 = store.create_session(), store.create_session()
    a, b = s1.session_id, s2.session_id
    units = [
        AppendRequest(a, [U(s1.root_id, id="a1")]),
        AppendRequest(a, [L("nope", id="bad")]),  # refused before writing
        AppendRequest(b, [U(s2.root_id, id="b1"), L("b1", id="b2"), L("missing", id="b3")], batch=True),
        AppendRequest(a, [L("a1", id="a2")]),  # follows a1 of the same group
        AppendRequest(b, [U(s2.root_id, id="b4")]),
        AppendRequest(a, [U(s1.root_id, id="a1")]),  # a duplicate of a group-mate
        AppendRequest("no-such-session", [U(None)]),
    ]
    got = store.append_group(units)
    assert [o.node.id for o in got[0]] == ["a1"] and got[0][0].node.seq == 1
    assert isinstance(got[1], DagctxError) and got[1].kind == "NodeNotFound"
    assert isinstance(got[2], DagctxError) and got[2].path == "nodes[2].predecessor"
    assert [o.node.seq for o in got[3]] == [2] and got[3][0].head == "a2"
    assert [o.node.seq for o in got[4]] == [1] and got[4][0].head == "b4"  # b1..b3 were rolled back
    assert isinstance(got[5], DagctxError) and got[5].kind == "DuplicateNode"
    assert isinstance(got[6], DagctxError) and got[6].kind == "SessionNotFound"
    assert rows(store.path, a) == (3, 3, "a2", 3)
    assert rows(store.path, b) == (2, 2, "b4", 2)
    assert "b1" not in store.graph(b).nodes
    other = Store(store.path)
    try:
        assert [n.id for n in other.history(a)[0]] == ["a1", "a2"]
        assert [n.id for n in other.history(b)[0]] == ["b4"]
    finally:
        other.close()


def test_a_group_whose_commit_fails_for_one_row_commits_the_others(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    _trap_commit(store.path)
    got = store.append_group([
        AppendRequest(sid, [U(s.root_id, id="x1")]),
        AppendRequest(sid, [U(s.root_id, id="boom")]),
        AppendRequest(sid, [L("x1", id="x2")]),
    ])
    assert not isinstance(got[0], BaseException) and not isinstance(got[2], BaseException)
    assert isinstance(got[1], BaseException)
    assert [n.id for n in store.history(sid)[0]] == ["x1", "x2"]
    assert rows(store.path, sid) == (3, 3, "x2", 3)


def _refuse_at_insert(database: str) -> None:
    """A BEFORE INSERT trigger that refuses a node with id 'poison' at once (on PostgreSQL
    in pipeline mode its error reaches the client only at a later sync point)."""
    with RawDb(database) as db:
        if db.pg:
            db.execute("CREATE FUNCTION dagctx.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                       "IF NEW.id = 'poison' THEN RAISE EXCEPTION 'refused by the test'; END IF; "
                       "RETURN NEW; END $$")
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON dagctx.nodes FOR EACH ROW "
                       "EXECUTE FUNCTION dagctx.refuse()")
        else:
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON nodes WHEN NEW.id = 'poison' "
                       "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")


def test_a_row_refused_at_insert_fails_only_its_own_unit(store: Store) -> None:
    """The refusal may surface while a LATER unit of the group runs (PostgreSQL's pipeline
    mode): it must fail the unit that wrote the row, not the one that was running."""
    s = store.create_session()
    sid = s.session_id
    _refuse_at_insert(store.path)
    got = store.append_group([
        AppendRequest(sid, [U(s.root_id, id="p1")]),
        AppendRequest(sid, [U(s.root_id, id="poison")]),
        AppendRequest(sid, [L("p1", id="p2")]),
        AppendRequest(sid, [U(s.root_id, id="p3")]),
    ])
    assert isinstance(got[1], BaseException) and "refused by the test" in str(got[1])
    for k in (0, 2, 3):
        assert not isinstance(got[k], BaseException), (k, got[k])
    assert [n.id for n in store.history(sid)[0]] == ["p1", "p2"]  # p3 forks from the root: HEAD stays
    assert {"p1", "p2", "p3"} <= set(store.graph(sid).nodes) and "poison" not in store.graph(sid).nodes


def _words(k: int) -> str:
    """A text only node ``k`` of a test has: one Latin word and one CJK word of its own."""
    return f"marker{k}word 第{'一二三四五六七八九十'[k % 10]}{'甲乙丙丁戊己庚辛壬癸'[k // 10 % 10]}段"


def test_a_group_writes_its_rows_as_lone_appends_would(store: Store) -> None:
    """The group's node rows go to the database in one statement a table: each node is stored
    as a lone append stores it, and each is found by search as itself (SQLite: every search
    row carries its own node's rowid, also after rows were deleted; PostgreSQL: each node its
    own vector, a large one sent in pieces)."""
    from dagctx.ledger import pg_pieces

    gone = store.create_session()
    store.append(gone.session_id, U(gone.root_id, "deleted soon"))
    store.delete_session(gone.session_id)  # the largest rowid is no longer the last written
    lone, grouped, other = store.create_session(), store.create_session(), store.create_session()
    nodes = [U("ROOT", _words(0), id="n0"), L("n0", _words(1), id="n1"),
             NodeInput(role="code", name="bash", input={"cmd": "ls"}, output=_words(2) + " " + "x" * 3000,
                       caller="n1", id="n2"),
             L("n1", _words(3), id="n3")]
    for n in nodes:
        store.append(lone.session_id, n)
    old_piece = pg_pieces.PIECE
    pg_pieces.PIECE = 1000  # the code node's search text (3 KB) goes in pieces on PostgreSQL
    try:
        got = store.append_group(
            [AppendRequest(grouped.session_id, [n]) for n in nodes]
            + [AppendRequest(other.session_id, [U(other.root_id, _words(k), id=f"o{k}")]) for k in range(4, 8)])
    finally:
        pg_pieces.PIECE = old_piece
    assert not any(isinstance(r, BaseException) for r in got), got

    def columns(sid: str) -> list[tuple]:
        root = store.get_session(sid).root_id
        return [(r.id, r.seq, r.rev, r.role, r.name, r.status, r.caller,
                 "ROOT" if r.predecessor == root else r.predecessor, r.tokens, r.refs, r.search_text)
                for r in store.backend.node_rows(sid) if r.id != root]

    assert columns(grouped.session_id) == columns(lone.session_id)
    assert rows(store.path, grouped.session_id) == rows(store.path, lone.session_id)[:2] + (
        "n3", rows(store.path, lone.session_id)[3])
    for k in range(8):
        sid = other.session_id if k >= 4 else grouped.session_id
        for word in (f"marker{k}word", _words(k).split()[1][1:3]):
            hits = store.search(word, session_id=sid)
            assert [h.node_id for h in hits] == [f"o{k}" if k >= 4 else f"n{k}"], (k, word, hits)
    reopened = Store(store.path)
    try:
        assert [n.id for n in reopened.history(grouped.session_id)[0]] == ["n0", "n1", "n3"]
        assert [h.node_id for h in reopened.search("marker6word")] == ["o6"]
    finally:
        reopened.close()


def test_a_group_writes_its_rows_without_a_raw_cursor_too(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg 3.1 has no raw cursor: the group's statement is then marked ``%s``, and
    stores the same rows."""
    from dagctx.ledger import postgres_backend

    monkeypatch.setattr(postgres_backend, "_RAW_CURSOR", None)
    test_a_group_writes_its_rows_as_lone_appends_would(store)


def test_a_group_whose_batched_rows_are_refused_commits_every_other_unit(store: Store) -> None:
    """One row of the group's batched statement is refused (a batch unit's second node):
    the statement fails whole, and the group falls back to one unit at a time, so only the
    unit that holds the row fails — its other node is not stored — and every other unit of
    every session is committed, searchable, with contiguous seq and HEAD as lone appends."""
    a, b = store.create_session(), store.create_session()
    _refuse_at_insert(store.path)
    got = store.append_group([
        AppendRequest(a.session_id, [U(a.root_id, _words(0), id="a0")]),
        AppendRequest(b.session_id, [U(b.root_id, _words(1), id="b0")]),
        AppendRequest(a.session_id, [L("a0", _words(2), id="a1"), U("a1", _words(3), id="poison")], batch=True),
        AppendRequest(a.session_id, [L("a0", _words(4), id="a2")]),
        AppendRequest(b.session_id, [L("b0", _words(5), id="b1")]),
    ])
    assert isinstance(got[2], BaseException) and "refused by the test" in str(got[2])
    assert [o.node.seq for k in (0, 3) for o in got[k]] == [1, 2]
    assert [o.node.seq for k in (1, 4) for o in got[k]] == [1, 2]
    assert got[3][0].head == "a2" and got[4][0].head == "b1"
    assert rows(store.path, a.session_id) == (3, 3, "a2", 3)
    assert rows(store.path, b.session_id) == (3, 3, "b1", 3)
    assert set(store.graph(a.session_id).nodes) == {a.root_id, "a0", "a2"}
    for k, nid in ((0, "a0"), (1, "b0"), (4, "a2"), (5, "b1")):
        assert [h.node_id for h in store.search(f"marker{k}word")] == [nid]
    for k in (2, 3):
        assert store.search(f"marker{k}word") == []
    other = Store(store.path)
    try:
        assert [n.id for n in other.history(a.session_id)[0]] == ["a0", "a2"]
        assert [n.id for n in other.history(b.session_id)[0]] == ["b0", "b1"]
    finally:
        other.close()


def test_cached_graphs_are_weighed_and_can_be_evicted(store: Store) -> None:
    s = store.create_session()
    sid = s.session_id
    turn(store, sid, s.root_id, 1)
    other = Store(store.path)
    try:
        g = other.graph(sid)
        ((got_sid, nbytes, used),) = other.cached_graphs()
        assert got_sid == sid and nbytes > 0 and used > 0 and other.cache_bytes() == nbytes
        assert other.evict(sid) and other.cached_graphs() == [] and not other.evict(sid)
        again = other.graph(sid)  # rebuilt from the database, the same nodes
        assert again is not g and list(again.nodes) == list(g.nodes)
        assert other.cache_bytes() == nbytes
    finally:
        other.close()


def test_an_import_is_written_through_a_skeleton_and_read_back_in_pages(store: Store) -> None:
    """SPEC §9 session/import: the ledger checks an import's rules against a graph of its
    edges without texts that it does not cache (memory bounded by the largest node), and
    ``written_nodes`` reads the written nodes back in pages of at most ``budget`` stored
    bytes (or one node), each once, in order, whole."""
    texts = [f"{i} " + "x" * (40 * (i % 3)) for i in range(7)]
    nodes = []
    pred = "ROOT"
    for i, text in enumerate(texts):
        nodes.append(NodeInput(role="user" if i % 2 == 0 else "llm", id=f"n{i}", output=text, predecessor=pred,
                               name="" if i % 2 == 0 else "m"))
        pred = f"n{i}"
    nodes.append(NodeInput(role="code", id="call", name="sh", input={"cmd": "ls"}, output="a" * 50, caller="n1"))
    written: list[int] = []
    info, created = store.import_session(source_key="test:1", title="t", nodes=(n for n in nodes), head="n6",
                                         written=written)
    sid = info.session_id
    assert created and info.head == "n6" and len(written) == len(nodes) and min(written) > 0
    assert sid not in {s for s, _, _ in store.cached_graphs()}  # nothing of it waits in memory
    pages = list(store.written_nodes(sid, written, budget=250))
    got = [n for page in pages for n in page]
    assert [n.id for n in got] == [n.id for n in nodes]
    assert [n.output for n in got] == [n.output for n in nodes] and got[-1].input == {"cmd": "ls"}
    assert len(pages) > 2
    k = 0
    for page in pages:  # each page within the budget, or a single node
        assert len(page) == 1 or sum(written[k:k + len(page)]) <= 250
        k += len(page)
    # the next read loads the session from the database, texts included
    assert store.graph(sid).nodes["n4"].output == texts[4]
    # the rules still apply to an import: a node after an unknown one writes nothing
    bad = [NodeInput(role="user", id="b0", output="x", predecessor="ROOT"),
           NodeInput(role="user", id="b1", output="y", predecessor="nope")]
    raises("NodeNotFound", store.import_session, source_key="test:2", title="t", nodes=iter(bad), head=None)
    assert store.find_by_source("test:2") is None


def test_a_graph_load_stops_at_its_checkpoint_and_leaves_no_half_graph(store: Store) -> None:
    """SPEC §1.4: a session's graph is read with the store's ``checkpoint`` called every
    512 rows (the daemon's cancellation check), so a cancelled view stops inside a long
    load; what was read so far is dropped, and the next read is the whole graph."""
    nodes = [NodeInput(role="user", id="n0", name="u", output="q 0", predecessor="ROOT")]
    nodes += [NodeInput(role="user" if k % 2 == 0 else "llm", id=f"n{k}", name="u" if k % 2 == 0 else "m",
                        output=f"t {k}", predecessor=f"n{k - 1}") for k in range(1, 1500)]
    info, _ = store.import_session(source_key="t:load", title="t", nodes=iter(nodes), head="n1499")
    sid = info.session_id
    store.evict(sid)
    ticks: list[int] = []

    def stop() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 2:
            raise DagctxError("RequestCancelled", "the request was cancelled; nothing was written")

    store.checkpoint = stop
    with pytest.raises(DagctxError) as exc:
        store.graph(sid)
    assert exc.value.kind == "RequestCancelled" and ticks == [0, 1]
    assert sid not in {s for s, _, _ in store.cached_graphs()}  # the half-read graph is gone
    store.checkpoint = lambda: None
    g = store.graph(sid)
    assert len(g.by_seq) == 1501 and g.chain("n1499")[-1].id == "n1499"
