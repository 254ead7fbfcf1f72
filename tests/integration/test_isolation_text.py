"""One shared daemon, several real clients: an 8 MB ``node/append`` of non-ASCII text
(accented Latin, typographic dashes and quotes, CJK) is never felt by another connection
(SPEC §1.4), on SQLite and on PostgreSQL. Such a text is encoded to UTF-8 a piece at a
time before a database driver binds it (``utf8`` of ``ledger/text.py``); these tests assert the
outcomes — another client was answered while the append ran, and the node is stored and
read back exactly, found by search — never a duration (CI is loaded). 8 MB, not the 50 MB of
``bench/bench_isolation.py --append-texts``: eight 1 MiB pieces are as many cuts as the
pieced encoding (and PostgreSQL's pieced send, ``ledger/pg_pieces.py``) needs; 50 MB of CJK
cost the suite a minute of CPU per backend, 20 MB half a minute on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dagctx.protocol import messages as m

from test_isolation import answered_meanwhile
from test_shared_daemon import shared_env, spawn  # noqa: F401 - the fixture is used by name

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

#: a client's wait for a read of the huge node (the client's default is 60 s; CI is loaded)
LONG = 600.0
#: the read-back page (characters): well under the frame limit at 4 bytes a character
PAGE = 4_000_000


def non_ascii_text(size: int) -> str:
    """About ``size`` bytes of UTF-8: lines of Latin with accents, of dashes and curly
    quotes, of CJK with ASCII paths, an emoji (outside the BMP) and a NUL."""
    lines = []
    n = k = 0
    while n < size:
        line = (
            f"ligne {k} : déjà vérifié, çà et là — façade n°{k % 97} élève\n",
            f"step {k} \u2014 \u201cbuild\u201d of mod_{k % 97} \u2013 ok \u2026 \u2018done\u2019\n",
            f"第{k}行：编译 src/模块_{k % 97}.py 成功，日志已写入 \U0001F600\x00\n",
        )[k % 3]
        lines.append(line)
        n += len(line.encode())
        k += 1
    return "".join(lines)


async def read_back(client, session_id: str, node_id: str, chars: int) -> str:
    parts = []
    for offset in range(0, chars, PAGE):
        got = await client.request("node/get", m.NodeGetParams(
            session_id=session_id, ids=[node_id], range=m.OutputRange(offset=offset, length=PAGE)), timeout=LONG)
        parts.append(got.nodes[0].output)
    return "".join(parts)


async def test_session_list_is_answered_while_another_client_appends_8_mb_of_non_ascii_text(
        shared_env, database: str, tmp_path: Path) -> None:
    a = await spawn(database)
    b = await spawn(database)
    try:
        await b.session_create("other")
        s = await a.session_create("big")
        u = await a.append(s.session_id, "user", output="run it", predecessor=s.head)
        big = non_ascii_text(8_000_000)
        _, app = a.send_request("node/append", {"sessionId": s.session_id, "node": {
            "role": "code", "name": "bash", "input": {"cmd": "make"}, "output": big, "caller": u.node.id}})
        before, worst = await answered_meanwhile(app, lambda: b.session_list(limit=5))
        res = await app
        node_id = res["node"]["id"] if isinstance(res, dict) else res.node.id
        assert before >= 1, f"B got no answer while A appended 8 MB (worst {worst:.3f} s)"
        assert await read_back(b, s.session_id, node_id, len(big)) == big  # stored exactly, every character
        for word in ("vérifié", "编译"):  # a huge node is checked against its whole text on PostgreSQL
            hits = await b.request("search/query", m.SearchParams(query=word, session_id=s.session_id), timeout=LONG)
            assert [h.node_id for h in hits.hits] == [node_id], (word, hits)
    finally:
        await a.close()
        await b.close()
