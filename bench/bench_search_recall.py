"""Search recall and precision on real Chinese conversations (not a timing benchmark).

Run: python bench/bench_search_recall.py [--corpus DIR]

Imports the shared corpus's ``sharegpt-zh`` files into a temporary ledger (the Store
API, the same FTS5 index the daemon queries) and searches for Latin words that real
Chinese text glues to CJK characters (``我用Python编程``) and for 2- and 3-character
Chinese words. The ground truth of a word is every node whose searchable text contains
it case-insensitively, not inside a longer Latin/digit run; recall = found ∩ truth /
truth, precision = found ∩ truth / found. The baseline in the same run is the
``text``-column-only match (what a plain ``unicode61`` index finds).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from dagctx.ledger import Store
from dagctx.ledger.text import node_text
from dagctx.transcripts import parse_path

LATIN = ("python", "react", "javascript", "docker", "java", "sql", "API")
CHINESE = ("迁移", "函数", "数据库", "服务器", "电影", "机票", "天气")


def truth_of(word: str, texts: dict[str, str]) -> set[str]:
    if re.fullmatch(r"[A-Za-z0-9]+", word):
        pat = re.compile(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", re.IGNORECASE)
        return {k for k, t in texts.items() if pat.search(t)}
    return {k for k, t in texts.items() if word in t}


def main() -> int:
    ap = argparse.ArgumentParser()
    default = os.environ.get("DAGCTX_CORPUS") or str(Path(__file__).resolve().parents[2] / "shared" / "corpus")
    ap.add_argument("--corpus", default=default)
    args = ap.parse_args()
    folder = Path(args.corpus) / "sharegpt-zh"
    if not folder.is_dir():
        print(f"no corpus at {folder}; pass --corpus or set DAGCTX_CORPUS", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "recall.db")
        for t in parse_path(folder):
            store.import_session(source_key=t.source_key, title=t.title, nodes=t.nodes, head=t.head)
        texts: dict[str, str] = {}
        for info in store.list_sessions(limit=10_000)[0]:
            g = store.graph(info.session_id)
            for n in g.by_seq:
                if n.id != g.root_id:
                    texts[f"{info.session_id}/{n.id}"] = node_text(n)
        print(f"{len(texts):,} nodes from {folder}")
        print(f"{'word':12s} {'truth':>6s} {'recall':>7s} {'prec.':>6s}   baseline(text column) recall")
        for word in LATIN + CHINESE:
            truth = truth_of(word, texts)
            hits = {f"{h.session_id}/{h.node_id}" for h in store.search(word, limit=1000)}
            base = {f"{sid}/{nid}" for sid, nid in store.db.execute(
                "SELECT session_id, node_id FROM search WHERE text MATCH ?", (f'"{word}"',))}
            recall = len(hits & truth) / len(truth) if truth else 1.0
            precision = len(hits & truth) / len(hits) if hits else 1.0
            base_recall = len(base & truth) / len(truth) if truth else 1.0
            print(f"{word:12s} {len(truth):6d} {recall:7.3f} {precision:6.3f}   {base_recall:.3f}"
                  + ("" if len(hits) < 1000 else "  (limit reached)"))
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
