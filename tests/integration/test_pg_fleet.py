"""A fleet on PostgreSQL: 4 daemons on one database, one killed with ``kill -9`` every half
second (and restarted), appending to one shared session and to one session each, until
KILLS kills and APPENDS acknowledged appends to the shared session have happened —
outcomes, not a time: a loaded machine only takes longer.

After the storm a fresh daemon checks: every acknowledged append is there, no seq is
duplicated or skipped, HEAD names an existing node, and every branch walks without
``BrokenPredecessorChain``.
"""

from __future__ import annotations

import asyncio
import signal

from dagctx.client import DagctxClient, RpcError

from rawdb import RawDb

DAEMONS, KILL_EVERY, KILLS, APPENDS = 4, 0.5, 6, 20
#: only a hang ends the storm by time (never a throughput bound)
HANG_GUARD_SECONDS = 1800


async def test_four_daemons_with_kill_9_lose_nothing(pg_url: str) -> None:
    setup = await DagctxClient.spawn(pg_url)
    shared = (await setup.session_create("shared")).session_id
    own = [(await setup.session_create(f"own {w}")).session_id for w in range(DAEMONS)]
    await setup.close()

    acked: dict[str, list[str]] = {sid: [] for sid in [shared, *own]}
    clients: list[DagctxClient | None] = [None] * DAEMONS
    #: appends each worker's current daemon acknowledged: only a daemon that has served one
    #: is killed, so every kill follows progress however slowly daemons start
    served = [0] * DAEMONS
    unexpected: list[str] = []
    stop = asyncio.Event()
    kills = 0

    async def worker(w: int) -> None:
        i = 0
        while not stop.is_set():
            c = await DagctxClient.spawn(pg_url)
            served[w] = 0
            clients[w] = c
            try:
                while not stop.is_set():
                    for sid in (shared, own[w]):
                        head = (await c.session_get(sid)).head
                        nid = f"w{w}-{i}"
                        i += 1
                        await c.append(sid, "user" if i % 2 else "llm", id=nid, predecessor=head,
                                       **({"input": f"q {nid}"} if i % 2 else {"output": f"a {nid}"}))
                        acked[sid].append(nid)
                        served[w] += 1
                        if i % 5 == 0:
                            await c.history(sid)
            except RpcError as exc:
                if c.process is not None and c.process.returncode is None:
                    unexpected.append(f"{exc.kind}: {exc.message}")  # a live daemon's error
            except (ConnectionError, OSError, asyncio.IncompleteReadError, RuntimeError):
                pass  # killed mid-request: that append was never acknowledged
            finally:
                clients[w] = None
                if c.process is not None and c.process.returncode is None:
                    await c.close()
                else:
                    await c.wait(10)

    async def killer() -> None:
        nonlocal kills
        k = 0
        while not stop.is_set():
            await asyncio.sleep(KILL_EVERY)
            for j in range(DAEMONS):  # the next daemon (round robin) that is up and has served
                c = clients[(k + j) % DAEMONS]
                if (c is not None and c.process is not None and c.process.returncode is None
                        and served[(k + j) % DAEMONS] > 0):
                    c.process.send_signal(signal.SIGKILL)
                    kills += 1
                    k += j + 1
                    break

    async def enough() -> None:
        while kills < KILLS or len(acked[shared]) < APPENDS:
            await asyncio.sleep(0.1)
        stop.set()

    await asyncio.wait_for(asyncio.gather(enough(), killer(), *[worker(w) for w in range(DAEMONS)]),
                           HANG_GUARD_SECONDS)
    assert not unexpected, unexpected[:5]
    print(f"{kills} kills, {sum(map(len, acked.values()))} acknowledged appends")

    check = await DagctxClient.spawn(pg_url)
    try:
        with RawDb(pg_url) as db:
            for sid, ids in acked.items():
                seqs = [r[0] for r in db.execute("SELECT seq FROM nodes WHERE session_id=? ORDER BY seq", (sid,))]
                assert seqs == list(range(len(seqs))), "duplicate or skipped seq"
                stored = {r[0] for r in db.execute("SELECT id FROM nodes WHERE session_id=?", (sid,))}
                assert set(ids) <= stored, f"{len(set(ids) - stored)} acknowledged appends lost"
                info = await check.session_get(sid)
                assert info.head in stored and info.node_count == len(seqs)
                for b in (await check.branches(sid)).branches:
                    await check.history(sid, b.head)  # raises BrokenPredecessorChain if broken
                if ids:
                    got = await check.get_nodes(sid, ids)
                    assert [n.id for n in got.nodes] == ids
    finally:
        await check.close()
