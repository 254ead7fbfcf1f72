"""The keyword side's word counts on SQLite (SPEC §5.1, ``SqliteMemory._doc_counts``): they plan a
conversational query's draws and are kept between searches while the database is unchanged, so
every write — this store's own, or another connection's to the same file — must show in the
next search's counts, and a kept count must be what a fresh connection reads."""

from __future__ import annotations

from dagctx.ledger import Store
from dagctx.ledger import memory as lm


def put(index: lm.MemoryIndex, ws: str, path: str, texts: list[str], at: float) -> None:
    chunks = [lm.MemoryChunkRow(f"{path}-{i}", path, "memory", i + 1, i + 1, f"h{i}", at, t) for i, t in enumerate(texts)]
    row = lm.MemoryFileRow(path, "memory", f"x{at}", at, 100, len(texts), len(texts))
    index.apply(ws, drop=[], put=[lm.FileUpdate(row, chunks)], indexed_at=at, skipped=b"")


def counts(store: Store, words: list[str]) -> list[int]:
    with store.lock:
        return store.backend.memory_rows()._doc_counts(words)  # type: ignore[attr-defined]


def test_kept_word_counts_follow_every_write(tmp_path) -> None:
    path = tmp_path / "m.db"
    a = Store(path)
    index = lm.MemoryIndex(a)
    put(index, "/ws", "MEMORY.md", ["alpha beta", "alpha", "gamma"], 1.0)
    words = ["Alpha", "beta", "delta"]
    assert counts(a, words) == [2, 1, 0]
    assert counts(a, words) == [2, 1, 0]  # kept: the same answer

    put(index, "/ws", "memory/a.md", ["alpha delta", "delta"], 2.0)  # this store's own write
    assert counts(a, words) == [3, 1, 2]

    b = Store(path)  # another connection (another daemon, the CLI) writes the same file
    put(lm.MemoryIndex(b), "/other", "MEMORY.md", ["beta beta", "delta alpha"], 3.0)
    assert counts(a, words) == [4, 2, 3] == counts(b, words)

    lm.MemoryIndex(b).apply("/ws", drop=["memory/a.md"], put=[], indexed_at=4.0, skipped=b"")
    assert counts(a, words) == [3, 2, 1]
    c = Store(path)  # a fresh connection reads what the kept counts say
    assert counts(c, words) == counts(a, words)
    for s in (a, b, c):
        s.close()


def test_draws_over_the_workspaces_rowid_range_answer_what_the_join_does(tmp_path, monkeypatch) -> None:
    """A draw ranks only the workspace's rowid range (``SqliteMemory._rowids``), without the join
    to the chunks when the range is the workspace's alone: the same hits, order and scores as
    the join over the whole index — for a workspace whose chunks are one range, one whose
    chunks another workspace's split, and after a write moves a workspace's range."""
    import random

    from dagctx.ledger import sqlite_memory

    monkeypatch.setattr(sqlite_memory, "KEYWORD_BUDGET", 24)  # draws at a few hundred chunks
    rng = random.Random(3)
    vocab = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma"] + [f"w{i}" for i in range(40)]

    def texts(n: int) -> list[str]:  # a file's first and last chunk hold every query word: the range's ends count
        every = "alpha beta gamma omega kappa delta sigma w1 w2 w7"
        return [every] + [" ".join(rng.choices(vocab, k=rng.randint(3, 12))) for _ in range(n - 2)] + [every + " w3"]

    s = Store(tmp_path / "m.db")
    index = lm.MemoryIndex(s)
    put(index, "/a", "memory/one.md", texts(150), 1.0)
    put(index, "/b", "memory/b.md", texts(150), 2.0)
    put(index, "/a", "memory/two.md", texts(150), 3.0)  # /a's rowids now split by /b's
    queries = [["alpha", "beta", "gamma"], ["omega", "kappa"], ["delta", "sigma", "w1", "w2"], ["beta", "w7"]]

    def answers() -> list[list[tuple[str, float]]]:
        return [[(r.id, sc) for r, sc in index.search(ws, " OR ".join(q), 8, None, q)] for ws in ("/a", "/b")
                for q in queries]

    def plain() -> list[list[tuple[str, float]]]:
        with monkeypatch.context() as m:
            m.setattr(sqlite_memory.SqliteMemory, "_rowids", lambda self, ws: None)
            return answers()

    got = answers()
    assert got == plain() and all(len(a) == 8 for a in got)
    with s.lock:
        rows = s.backend.memory_rows()
        assert rows._rowids("/a")[2] is False and rows._rowids("/b")[2] is True  # type: ignore[attr-defined]
    put(index, "/b", "memory/late.md", ["alpha beta gamma " * 3] * 5, 4.0)  # after /a's: /b's range grows
    got = answers()
    assert got == plain()
    late = {f"memory/late.md-{i}" for i in range(5)}
    assert late <= {cid for cid, _ in got[len(queries)]}  # /b's first query finds its new chunks first
    s.close()
