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
