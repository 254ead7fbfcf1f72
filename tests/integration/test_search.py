"""search/query through the daemon: English, code identifiers, CJK, scope, roles, ranking."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import messages as m


@pytest.fixture(autouse=True)
def _one_daemon(module_shared_daemon: Path) -> None:
    """This module's clients share one daemon, as a user's do (each test its own database)."""


LONG_FILLER = " ".join(
    f"{w}" for w in ("the quick brown fox jumps over the lazy dog while the build runs slowly " * 25).split()
)


@dataclass
class Corpus:
    s1: str
    s2: str
    ids: dict[str, str]


async def build_corpus(c: DagctxClient) -> Corpus:
    ids: dict[str, str] = {}

    async def turn(sid: str, pred: str, key: str, user: str, reply: str) -> str:
        u = await c.append(sid, "user", input=user, predecessor=pred)
        a = await c.append(sid, "llm", output=reply, predecessor=u.node.id)
        ids[key + ".user"], ids[key + ".llm"] = u.node.id, a.node.id
        return a.node.id

    s1 = await c.session_create("project one")
    h = await turn(s1.session_id, s1.head, "config",
                   "How do I load the configuration file?",
                   "Call parse_config on src/app.py; it reads settings.toml at startup.")
    tool = await c.append(s1.session_id, "code", name="grep", input={"pattern": "parse_config"},
                          output="src/app.py:12: def parse_config(path):", caller=h,
                          metadata={"toolCallId": "call_grep"})
    ids["config.tool"] = tool.node.id
    h = await turn(s1.session_id, h, "cjk", "我们需要写一个数据库迁移脚本", "好的，下面是迁移脚本的第一版。")
    h = await turn(s1.session_id, h, "zebra",
                   "zebra zebra zebra: the zebra tests are flaky",
                   "Which zebra test fails?")
    h = await turn(s1.session_id, h, "long", "Here is the full build log. " + LONG_FILLER + " one zebra appears. "
                   + LONG_FILLER, "I read the log.")
    s2 = await c.session_create("project two")
    await turn(s2.session_id, s2.head, "other",
               "The migration failed with a configuration error",
               "Check the configuration of the database user; 数据库 permissions matter.")
    return Corpus(s1.session_id, s2.session_id, ids)


# One daemon and one corpus for the read-only tests of this module (daemon startup is
# most of their cost); the test that writes gets a daemon of its own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def search_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Every search test runs on both backends: same queries, same answers."""
    if request.param == "sqlite":
        yield str(tmp_path_factory.mktemp("search") / "search.db")
        return
    server = request.getfixturevalue("pg_server")
    url = server.new_database()
    yield url
    server.drop_database(url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(search_db: str):
    client = await DagctxClient.spawn(search_db)
    try:
        yield client, await build_corpus(client)
    finally:
        assert await client.close() == 0


def hit_ids(res: m.SearchResult) -> list[str]:
    return [h.node_id for h in res.hits]


async def test_english_words_and_scope(shared: tuple[DagctxClient, Corpus]) -> None:
    c, idx = shared
    ids = idx.ids
    everywhere = await c.search("configuration")
    assert set(hit_ids(everywhere)) == {ids["config.user"], ids["other.user"], ids["other.llm"]}
    assert {h.session_id for h in everywhere.hits} == {idx.s1, idx.s2}
    scoped = await c.search("configuration", session_id=idx.s1)
    assert hit_ids(scoped) == [ids["config.user"]]
    assert all(h.session_id == idx.s1 for h in scoped.hits)
    other = await c.search("configuration", session_id=idx.s2)
    assert set(hit_ids(other)) == {ids["other.user"], ids["other.llm"]}
    # Case-insensitive, and every hit says where it is.
    upper = await c.search("CONFIGURATION")
    assert set(hit_ids(upper)) == set(hit_ids(everywhere))
    for h in everywhere.hits:
        assert h.score > 0 and h.seq > 0 and h.role in ("user", "llm")
        assert "[configuration]" in h.snippet.lower()
    # Boolean operators keep their meaning.
    both = await c.search("configuration AND migration")
    assert hit_ids(both) == [ids["other.user"]]
    either = await c.search("settings OR permissions")
    assert set(hit_ids(either)) == {ids["config.llm"], ids["other.llm"]}
    assert await c.search("nonexistentword") == m.SearchResult(hits=[])


async def test_code_identifiers(shared: tuple[DagctxClient, Corpus]) -> None:
    c, idx = shared
    ids = idx.ids
    res = await c.search("parse_config")
    assert set(hit_ids(res)) == {ids["config.llm"], ids["config.tool"]}
    for h in res.hits:
        assert "[parse_config]" in h.snippet
    tool_hit = next(h for h in res.hits if h.node_id == ids["config.tool"])
    assert tool_hit.role == "code" and tool_hit.name == "grep"
    path = await c.search("src/app.py")
    assert set(hit_ids(path)) == {ids["config.llm"], ids["config.tool"]}
    assert all("[src/app.py]" in h.snippet for h in path.hits)
    dotted = await c.search("settings.toml")
    assert hit_ids(dotted) == [ids["config.llm"]]
    prefix = await c.search("parse_conf*")
    assert set(hit_ids(prefix)) == set(hit_ids(res))


async def test_cjk(shared: tuple[DagctxClient, Corpus]) -> None:
    c, idx = shared
    ids = idx.ids
    # A two-character word inside a longer unspaced sentence.
    res = await c.search("迁移")
    assert set(hit_ids(res)) == {ids["cjk.user"], ids["cjk.llm"]}
    assert all("[迁移]" in h.snippet for h in res.hits)
    # One character.
    one = await c.search("库")
    assert set(hit_ids(one)) == {ids["cjk.user"], ids["other.llm"]}
    # A four-character phrase: a phrase, not a bag of characters.
    four = await c.search("迁移脚本")
    assert set(hit_ids(four)) == {ids["cjk.user"], ids["cjk.llm"]}
    assert await c.search("脚本迁移") == m.SearchResult(hits=[])
    assert hit_ids(await c.search("数据库迁移")) == [ids["cjk.user"]]
    # CJK inside mixed text and across sessions / scoped.
    assert set(hit_ids(await c.search("数据库"))) == {ids["cjk.user"], ids["other.llm"]}
    assert hit_ids(await c.search("数据库", session_id=idx.s2)) == [ids["other.llm"]]
    # CJK words mixed with other terms (space-separated or glued) are one AND query.
    assert hit_ids(await c.search("数据库 permissions")) == [ids["other.llm"]]
    assert hit_ids(await c.search("permissions 数据库")) == [ids["other.llm"]]
    assert hit_ids(await c.search("数据库 迁移")) == [ids["cjk.user"]]
    assert set(hit_ids(await c.search("数据库 OR 脚本"))) == {ids["cjk.user"], ids["cjk.llm"], ids["other.llm"]}
    assert hit_ids(await c.search("迁移 NOT 数据库")) == [ids["cjk.llm"]]


async def test_role_filter(shared: tuple[DagctxClient, Corpus]) -> None:
    c, idx = shared
    ids = idx.ids
    users = await c.search("configuration", roles=["user"])
    assert set(hit_ids(users)) == {ids["config.user"], ids["other.user"]}
    llms = await c.search("configuration", roles=["llm"])
    assert hit_ids(llms) == [ids["other.llm"]]
    code = await c.search("parse_config", roles=["code"])
    assert hit_ids(code) == [ids["config.tool"]]
    mixed = await c.search("parse_config", roles=["code", "user"])
    assert hit_ids(mixed) == [ids["config.tool"]]
    assert hit_ids(await c.search("configuration", roles=["llm"], session_id=idx.s1)) == []


async def test_bm25_order_and_limit(shared: tuple[DagctxClient, Corpus]) -> None:
    c, idx = shared
    ids = idx.ids
    res = await c.search("zebra", session_id=idx.s1)
    order = hit_ids(res)
    assert set(order) == {ids["zebra.user"], ids["zebra.llm"], ids["long.user"]}
    assert order[0] == ids["zebra.user"], "four mentions in a short text rank first"
    assert order[-1] == ids["long.user"], "one mention in a long text ranks last"
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True)
    long_hit = res.hits[-1]
    assert "[zebra]" in long_hit.snippet and long_hit.snippet.startswith("…")
    assert len(long_hit.snippet) < 300
    top = await c.search("zebra", limit=1)
    assert hit_ids(top) == [ids["zebra.user"]]


async def test_invalid_queries(shared: tuple[DagctxClient, Corpus]) -> None:
    c, _ = shared
    for q in ("foo AND (", "AND", "zebra NOT"):
        with pytest.raises(RpcError) as info:
            await c.search(q)
        assert info.value.code == -32602 and info.value.kind == "InvalidQuery"
        assert info.value.data["path"] == "query"
        assert "Traceback" not in info.value.message
    with pytest.raises(RpcError) as info:
        await c.search("")
    assert info.value.kind == "InvalidQuery"
    with pytest.raises(RpcError) as info:
        await c.search("zebra", limit=0)
    assert info.value.code == -32602
    with pytest.raises(RpcError) as info:
        await c.search("zebra", session_id="no-such-session")
    assert info.value.kind == "SessionNotFound"
    # Still serving.
    assert (await c.search("zebra", limit=1)).hits


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_index_follows_updates_spills_and_deletes(tmp_path: Path, backend: str,
                                                        request: pytest.FixtureRequest) -> None:
    db = str(tmp_path / "writes.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    c = await DagctxClient.spawn(db)  # this test writes: its own daemon
    try:
        await _updates_spills_and_deletes(c)
    finally:
        assert await c.close() == 0


async def _updates_spills_and_deletes(c: DagctxClient) -> None:
    idx = await build_corpus(c)
    ids = idx.ids
    sid = idx.s1
    run = await c.append(sid, "code", name="pytest", status="running", caller=ids["zebra.llm"])
    assert hit_ids(await c.search("xylophone")) == []
    await c.update(sid, run.node.id, "completed", output="1 failed: test_xylophone_tuning")
    assert hit_ids(await c.search("test_xylophone_tuning")) == [run.node.id]
    # A word only in the omitted middle of a spilled output is still found.
    lines = [f"line {i} " + "ok " * 30 for i in range(600)]
    lines[300] = "line 300 marimba_overflow_detected"
    big = await c.append(sid, "code", name="cat", output="\n".join(lines), caller=ids["zebra.llm"])
    assert "spill" in big.node.metadata and "marimba" not in big.node.output
    found = await c.search("marimba_overflow_detected")
    assert hit_ids(found) == [big.node.id] and "[marimba_overflow_detected]" in found.hits[0].snippet
    # A word at the start of a line inside a tool call's JSON input (``\n`` escaped when the
    # input is encoded) is a word of its own: the call is found by it, as by any other word.
    js = await c.append(sid, "code", name="js", caller=ids["zebra.llm"], output="{}",
                        input={"title": "Open the page", "code": "await tab.goto(url);\nnodeRepl.write(JSON.stringify(t));"
                               "\n\tpanelWidget.render()"})
    assert hit_ids(await c.search('"nodeRepl.write"')) == [js.node.id]
    assert hit_ids(await c.search("panelWidget.render")) == [js.node.id]
    # an escaped backslash before an n is a backslash, not a newline: newt_folder stays whole
    win = await c.append(sid, "code", name="dir", caller=ids["zebra.llm"], output="ok",
                         input={"path": "C:\\newt_folder\\quokka_cfg"})
    assert hit_ids(await c.search("newt_folder")) == [win.node.id]
    # Deleting a session removes its nodes from every search.
    await c.session_delete(idx.s2)
    assert {h.session_id for h in (await c.search("configuration")).hits} == {idx.s1}
    assert hit_ids(await c.search("permissions")) == []


async def test_latin_words_glued_to_cjk_text_are_found(tmp_path: Path) -> None:
    daemon = await DagctxClient.spawn(tmp_path / "glued.db")
    try:
        await _glued(daemon)
    finally:
        await daemon.close()


async def _glued(daemon: DagctxClient) -> None:
    s = await daemon.session_create("glued")
    texts = ["我用Python编程", "在React中定义组件", "用Docker部署服务器", "JavaScript和TypeScript的区别",
             "plain python here", "数据库迁移脚本"]
    ids = []
    head = s.head
    for t in texts:
        r = await daemon.append(s.session_id, "user", output=t, predecessor=head)
        ids.append(r.node.id)
        head = r.node.id

    async def found(q: str) -> set[str]:
        return {h.node_id for h in (await daemon.search(q, session_id=s.session_id)).hits}

    assert await found("python") == {ids[0], ids[4]}
    assert await found("React") == await found("react") == {ids[1]}
    assert await found("docker") == {ids[2]}
    assert await found("javascript") == {ids[3]} and await found("TypeScript") == {ids[3]}
    assert await found("Python编程") == {ids[0]}  # a query splits its Latin run from its CJK run
    assert await found("React组件") == {ids[1]}
    assert await found("java") == set()  # a glued run is a whole word, not a prefix
    assert await found("迁移") == {ids[5]} and await found("服务器") == {ids[2]}
    hit = (await daemon.search("react", session_id=s.session_id)).hits[0]
    assert "[React]" in hit.snippet


async def test_recall_on_real_chinese_conversations(tmp_path: Path) -> None:
    """On the shared corpus's Chinese conversations: every node that contains the word is
    found (recall 1.0) and nothing else (precision 1.0), for Latin words glued to CJK
    text and for 2- and 3-character Chinese words."""
    import re

    from conftest import require_corpus

    root = require_corpus()
    c = await DagctxClient.spawn(tmp_path / "zh.db")
    try:
        await c.import_path(str(root / "sharegpt-zh"))
        texts: dict[tuple[str, str], str] = {}
        for info in (await c.session_list(limit=1000)).sessions:
            for n in (await c.history(info.session_id)).nodes:
                texts[(info.session_id, n.id)] = n.output if isinstance(n.output, str) else ""
        for word in ("python", "javascript", "java", "sql", "函数", "数据库", "机票", "天气"):
            pat = re.compile(rf"(?<![A-Za-z0-9]){word}(?![A-Za-z0-9])", re.I) if word.isascii() else re.compile(word)
            truth = {k for k, t in texts.items() if pat.search(t)}
            hits = {(h.session_id, h.node_id) for h in (await c.search(word, limit=1000, roles=["user", "llm"])).hits}
            assert truth, word
            assert hits == truth, (word, len(hits & truth) / len(truth))
    finally:
        await c.close()
