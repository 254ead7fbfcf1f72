"""Search on PostgreSQL gives SQLite's results: same tokens, same syntax, same hits.

The tokenizer and the query parser are checked against the live SQLite (no server
needed); the hit sets are compared on both real backends over the Chinese corpus, and
CJK words are checked against a brute-force substring scan (recall 1.0).
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from dagctx.ledger import Store
from dagctx.ledger import pg_search
from dagctx.ledger import search as fts
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import NodeInput

SAMPLES = [
    "Hello, World! src/app.py parse_config()", "Ünïcödé façade naïve Straße ǅemal", "数据库迁移脚本 我用Python编程",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "emoji 🎉 party", "tab\tand\nnewline", "日本語のテキストとカタカナ", "한국어 텍스트",
    "x=1;y=2", "don't stop", "café-crème", "ΑΒΓ αβγ Ωμέγα", "Ⅷ ② ¼", "a\u0301e\u0300", "ﬁne ﬂow",
]


def sqlite_tokens(texts: list[str]) -> list[list[str]]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61 remove_diacritics 2')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    db.executemany("INSERT INTO t(rowid, x) VALUES(?, ?)", enumerate(texts, start=1))
    out: list[list[tuple[int, str]]] = [[] for _ in texts]
    for term, doc, off in db.execute("SELECT term, doc, offset FROM v"):
        out[doc - 1].append((off, term))
    return [[t for _, t in sorted(x)] for x in out]


def test_tokens_are_sqlites_tokens() -> None:
    rng = random.Random(7)
    texts = list(SAMPLES)
    for _ in range(300):  # random text over the whole BMP and beyond
        texts.append("".join(chr(rng.choice([rng.randrange(0x20, 0x2FFF), rng.randrange(0x3000, 0xFFFF),
                                              rng.randrange(0x10000, 0x2FFFF)]))
                             for _ in range(rng.randrange(1, 30))).replace("\ud800", ""))
    for _ in range(300):  # within the BMP only: the fast path of ``tokens``
        texts.append("".join(chr(rng.choice([rng.randrange(0x20, 0x2FFF), rng.randrange(0x3000, 0xD7FF),
                                              rng.randrange(0xE000, 0xFFFF), rng.randrange(0x20, 0x7F)]))
                             for _ in range(rng.randrange(1, 40))))
    texts = [t for t in texts if not any(0xD800 <= ord(c) < 0xE000 for c in t)]
    assert [pg_search.tokens(t) for t in texts] == sqlite_tokens(texts)


QUERIES = [
    "hello", "hello world", "hello AND world", "hello OR world", "hello NOT world", '"hello world"', "hel*",
    "(hello OR world) AND foo", "a OR b AND c", "a AND b OR c NOT d", "迁移", "数据库迁移", '"迁移 脚本"', "src/app.py",
    "NEAR(a b)", "NEAR(a b, 5)", "NEAR(a b,5)", "NEAR(a b , 5)", "NEAR(a b ,5)", "(NEAR(a b, 2) OR c) d",
    "grams : 迁移",
    # FTS5 refuses these; so must we
    "(", "foo AND (", "AND foo", "foo OR", "foo NOT", ")", "(a) b", "a (b)", "nosuch : foo",
]


@pytest.mark.parametrize("query", QUERIES)
def test_query_syntax_is_fts5s(query: str) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE search USING fts5(text, grams)")
    expr = fts.fts_query(query)
    try:
        db.execute("SELECT * FROM search WHERE search MATCH ?", (expr,)).fetchall()
        sqlite_ok = True
    except sqlite3.OperationalError:
        sqlite_ok = False
    try:
        pg_search.tsquery(expr)
        ours = True
    except DagctxError as err:
        assert err.kind == "InvalidQuery"
        ours = False
    assert ours == sqlite_ok, expr


def test_near_distances_are_kept_wherever_the_comma_is(tmp_path: Path) -> None:
    """``NEAR(a b, N)``: the comma is syntax, glued to a word or not, and N counts."""
    store = Store(tmp_path / "near.db")
    try:
        sid = store.create_session("near").session_id
        head = "ROOT"
        for t in ("alpha delta", "alpha beta delta", "alpha beta gamma delta", "alpha 1 2 3 4 5 6 7 8 9 10 11 delta"):
            head = store.append(sid, NodeInput(role="user", input=t, predecessor=head)).node.id
        for query, n in (("NEAR(alpha delta, 0)", 1), ("NEAR(alpha delta,1)", 2), ("NEAR(alpha delta , 2)", 3),
                         ("NEAR(alpha delta)", 3), ("NEAR(alpha delta, 20)", 4)):
            hits = store.search(query, session_id=sid)
            assert len(hits) == n, query
            assert all("[alpha]" in h.snippet and "[delta]" in h.snippet for h in hits), hits
        assert fts.query_terms("NEAR(alpha delta, 20)") == ["alpha", "delta"]
        with pytest.raises(DagctxError) as err:
            store.search("NEAR(数据 迁移, 2)", session_id=sid)
        assert err.value.kind == "InvalidQuery" and "AND" in err.value.message
    finally:
        store.close()


def corpus_texts(corpus: Path, limit: int = 1500) -> list[str]:
    out: list[str] = []
    for f in sorted((corpus / "sharegpt-zh").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            for turn in json.loads(line).get("conversations", []):
                if isinstance(turn.get("value"), str) and turn["value"].strip():
                    out.append(turn["value"])
    return out[:limit]


def fill(store: Store, texts: list[str]) -> dict[str, str]:
    """One session per 50 texts, alternating user/llm turns; node id → text."""
    ids: dict[str, str] = {}
    for start in range(0, len(texts), 50):
        sid = store.create_session(f"corpus {start}").session_id
        pred = "ROOT"
        batch = []
        for i, t in enumerate(texts[start:start + 50]):
            nid = f"n{start + i}"
            batch.append(NodeInput(id=nid, role="user", input=t, predecessor=pred) if i % 2 == 0
                         else NodeInput(id=nid, role="llm", output=t, predecessor=pred))
            ids[nid] = t
            pred = nid
        store.append_many(sid, batch)
    return ids


def cjk_words(texts: list[str], n: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    runs = [r for t in texts for r in fts.CJK_RUN.findall(t) if len(r) >= 2]
    while len(words) < n and runs:
        run = rng.choice(runs)
        size = rng.choice([1, 2, 2, 2, 3, 4])
        if len(run) >= size:
            i = rng.randrange(0, len(run) - size + 1)
            words.add(run[i:i + size])
    return sorted(words)


def test_same_hits_on_both_backends_and_full_cjk_recall(corpus: Path, pg_url: str, tmp_path: Path) -> None:
    texts = corpus_texts(corpus, 600)
    lite, pg = Store(tmp_path / "s.db"), Store(pg_url)
    try:
        ids = fill(lite, texts)
        assert fill(pg, texts) == ids
        rng = random.Random(3)
        words = cjk_words(texts, 60, rng)
        queries = words + ["name", "price OR total", '"customer_name"', "invoice*", "宝可梦 AND 游戏",
                           "游戏 NOT 宝可梦", "json", "generate_invoice"]
        for q in queries:
            a = {h.node_id for h in lite.search(q, limit=1000)}
            b = {h.node_id for h in pg.search(q, limit=1000)}
            assert a == b, q
        for w in words:  # a CJK word is found wherever it occurs as a substring
            truth = {nid for nid, t in ids.items() if w in t}
            assert {h.node_id for h in pg.search(w, limit=1000)} >= truth, w
    finally:
        lite.close()
        pg.close()


WORDS = ["alpha", "beta", "gamma", "delta"]
SEMANTIC = [
    "alpha beta", "alpha OR beta", "alpha NOT beta", "alpha OR beta NOT gamma", "alpha beta OR gamma",
    "alpha AND beta OR gamma NOT delta", "(alpha OR beta) AND (gamma OR delta)", "alpha OR beta gamma",
    "alpha NOT beta NOT gamma", "(alpha OR beta) NOT gamma", "alp*", '"alpha beta"', '"beta alpha"',
    "NEAR(alpha delta)", "NEAR(alpha delta, 0)", "NEAR(alpha delta, 1)", "NEAR(alpha gamma beta)",
]


def test_operators_mean_what_they_mean_in_fts5(pg_url: str, tmp_path: Path) -> None:
    """Every subset of four words, in two orders: each query finds the same documents."""
    import itertools

    texts = []
    for r in range(1, 5):
        for combo in itertools.combinations(WORDS, r):
            texts.append(" ".join(combo))
            texts.append(" filler ".join(reversed(combo)))
    lite, pg = Store(tmp_path / "s.db"), Store(pg_url)
    try:
        fill(lite, texts)
        fill(pg, texts)
        found = 0
        for q in SEMANTIC:
            a = {h.node_id for h in lite.search(q, limit=1000)}
            assert a == {h.node_id for h in pg.search(q, limit=1000)}, q
            found += bool(a) and len(a) < len(texts)
        assert found >= len(SEMANTIC) - 4  # the queries really select
    finally:
        lite.close()
        pg.close()


def test_the_exact_check_agrees_with_fts5_on_every_query(tmp_path: Path) -> None:
    """``verify`` (used for documents too big for PostgreSQL's positions) decides as FTS5 does."""
    import itertools

    texts = []
    for r in range(1, 5):
        for combo in itertools.combinations(WORDS, r):
            texts += [" ".join(combo), " filler ".join(reversed(combo))]
    texts += ["数据库迁移脚本", "迁 移", "alpha_beta gamma", "Ünïcödé alpha"]
    lite = Store(tmp_path / "s.db")
    try:
        ids = fill(lite, texts)
        for q in SEMANTIC + ["迁移", '"迁移脚本"', "grams : 迁", "alpha_beta", "unicode"]:
            parsed = pg_search.parse(fts.fts_query(q))
            want = {h.node_id for h in lite.search(q, limit=1000)}
            got = {nid for nid, t in ids.items() if pg_search.verify(parsed, t, fts.cjk_grams(t))}
            assert got == want, q
    finally:
        lite.close()


def test_huge_documents_are_searched_exactly(pg_url: str, tmp_path: Path) -> None:
    """Phrases deep inside outputs far beyond PostgreSQL's 16,383 positions are still found,
    and only where FTS5 finds them."""
    filler = " ".join(f"w{i % 97}" for i in range(12_000))
    texts = [
        filler + " marimba overflow detected " + filler,
        filler + " marimba filler overflow detected " + filler,   # not the phrase
        " ".join(["alpha"] * 300) + " " + filler + " alpha beta",  # > 128 occurrences of one word
        "数据库" * 3000 + "迁移脚本",
        "short marimba overflow detected",
    ]
    lite, pg = Store(tmp_path / "s.db"), Store(pg_url)
    try:
        fill(lite, texts)
        fill(pg, texts)
        for q in ['"marimba overflow detected"', "marimba_overflow_detected", "marimba NOT \"marimba overflow\"",
                  '"alpha beta"', "NEAR(marimba detected)", "迁移脚本", "库迁", "w5 NOT overflow", "overfl*"]:
            a = {h.node_id for h in lite.search(q, limit=100)}
            assert a == {h.node_id for h in pg.search(q, limit=100)}, q
            assert a or q.startswith("w5 NOT"), q
    finally:
        lite.close()
        pg.close()
