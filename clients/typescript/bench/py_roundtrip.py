"""N sequential ``session/get`` round trips through the Python client (dagctx.client).

Run by ``bench/roundtrip.mjs``; prints one JSON line: ``{"client", "n", "seconds", "rps"}``.

    python3 bench/py_roundtrip.py --db /tmp/bench.db --n 2000 --warmup 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from dagctx.client.client import DagctxClient


async def run(db: str, n: int, warmup: int) -> dict[str, object]:
    client = await DagctxClient.spawn(db)
    try:
        created = await client.session_create("bench-py")
        sid = created.session_id
        for _ in range(warmup):
            await client.session_get(sid)
        start = time.perf_counter()
        for _ in range(n):
            await client.session_get(sid)
        seconds = time.perf_counter() - start
    finally:
        await client.close()
    return {"client": "python", "n": n, "seconds": seconds, "rps": n / seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args.db, args.n, args.warmup))))


if __name__ == "__main__":
    main()
