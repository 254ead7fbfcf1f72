"""Time to first graph of `dagctx ui` for 1k- and 10k-node sessions, against `session/history`.

Run: python bench/bench_graph.py [--sizes 1000,10000] [--repeat R] [--browser]

1. Fill a SQLite file in-process (Store API, 1,000 nodes a transaction): one session per
   size, a chain of user/llm turns with a tool call per llm node, a retry fork every 50
   turns, and one summary covering the first fifth of the chain.
2. Start a daemon on it (Python client) and, per session, time R times:
   * baseline: `session/history` of the session (the branch at HEAD, whole nodes);
   * `session/graph` first page of 5,000 conversation rows, the session unchanged since
     the last call (what the daemon keeps per graph state is warm);
   * first graph of a new state: one node appended (a tool call of HEAD's llm node, not
     timed), then the first page as the page asks for it (FIRST_PAGE rows): what the
     daemon keeps per state is brought up to date, as on a live session's every change;
   * the whole graph (every page, 5,000 rows each);
   * the web view's own route: GET /api/graph (first page) through `dagctx ui`'s server
     (in this process, over loopback HTTP with the token cookie);
   * with `--browser` (Debian's chromium via Playwright), after a new state too: from the
     click on the session to the first row drawn, timed inside the page
     (``performance.now()`` around ``click()``, a MutationObserver for the first row — a
     node or a summary's capsule — then the next animation frame), so the driver's own
     round trips are not counted.
3. Print medians and each one's ratio to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dagctx.cli.webui.server import UiServer
from dagctx.client import DagctxClient
from dagctx.ledger import Store
from dagctx.protocol.nodes import SUMMARY_NAME, NodeInput

#: the rows of the page's first request (static/app.js FIRST_PAGE)
FIRST_PAGE = 500

TEXT = ("Looking at src/app.py: parse_config reads the file, load_settings merges defaults, "
        "and the retry path in utils.retry_backoff is where the timeout comes from. ") * 3


def build(path: str, sizes: list[int]) -> dict[int, str]:
    store = Store(path)
    out: dict[int, str] = {}
    try:
        for size in sizes:
            info = store.create_session(f"bench graph {size}")
            sid = info.session_id
            prev = "ROOT"
            made = 0
            turn = 0
            chain: list[str] = []
            batch: list[NodeInput] = []

            def flush(head: str) -> None:
                nonlocal batch
                if batch:
                    store.append_many(sid, batch, head=head)
                    batch = []

            while made < size:
                u, a, t = f"u{turn}", f"a{turn}", f"t{turn}"
                batch.append(NodeInput(role="user", id=u, output=f"turn {turn}: {TEXT}", predecessor=prev))
                batch.append(NodeInput(role="llm", id=a, name="gpt-4o", output=TEXT, predecessor=u))
                batch.append(NodeInput(role="code", id=t, name="grep", input={"pattern": "parse_config"},
                                       output=TEXT, caller=a, metadata={"toolCallId": f"c{turn}"}))
                chain += [u, a]
                made += 3
                if turn % 50 == 49:  # a retry: a fork from the user node
                    batch.append(NodeInput(role="llm", id=f"r{turn}", name="gpt-4o", output="retry", predecessor=u))
                    made += 1
                prev = a
                turn += 1
                if len(batch) >= 1000:
                    flush(prev)
            flush(prev)
            covers = chain[: max(2, len(chain) // 5)]
            store.append_many(sid, [NodeInput(role="llm", id="summary-1", name=SUMMARY_NAME,
                                              output="[Previous conversation summary]\nearlier work",
                                              predecessor="ROOT", metadata={"covers_ids": covers})], head=prev)
            out[size] = sid
    finally:
        store.close()
    return out


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(repeat: int, fn: Any) -> float:
    await fn()  # warm: the daemon loads the session once
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return median_ms(samples)


async def whole_graph(client: DagctxClient, sid: str) -> int:
    after, rows = -1, 0
    while True:
        page = await client.graph(sid, after_seq=after, limit=5000, conversation_only=True)
        rows += len(page.nodes)
        if page.next_after_seq is None:
            return rows
        after = page.next_after_seq


def http_get(port: int, path: str, token: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Cookie": f"dagctx_ui_{port}={token}"})
        res = conn.getresponse()
        body = res.read()
        assert res.status == 200, body[:200]
        return len(body)
    finally:
        conn.close()


FIRST_ROW_JS = """async (sid) => {
  const t0 = performance.now();
  const drawn = new Promise((resolve) => {
    const seen = () => document.querySelector("[data-testid=node-row], [data-testid=capsule]");
    const obs = new MutationObserver(() => { if (seen()) { obs.disconnect(); resolve(); } });
    obs.observe(document.body, { childList: true, subtree: true });
  });
  document.querySelector(`[data-session='${sid}']`).click();
  await drawn;
  await new Promise((r) => requestAnimationFrame(() => r()));
  return performance.now() - t0;
}"""


class Browser:
    """Debian's chromium through Playwright's sync API, on one thread of its own."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pw: Any = None
        self.browser: Any = None

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _start(self, chromium: str) -> None:
        from playwright.sync_api import sync_playwright

        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])

    def _first_graph(self, url: str, sid: str) -> float:
        page = self.browser.new_page()
        try:
            page.goto(url)
            page.wait_for_selector("body[data-ready='1']")
            return float(page.evaluate(FIRST_ROW_JS, sid)) / 1000
        finally:
            page.close()

    def _stop(self) -> None:
        if self.browser is not None:
            self.browser.close()
        if self.pw is not None:
            self.pw.stop()

    async def start(self) -> bool:
        chromium = shutil.which("chromium")
        if chromium is None:
            print("(no chromium: browser timing skipped)")
            return False
        await self.call(self._start, chromium)
        return True

    async def first_graph(self, url: str, sid: str) -> float:
        return await self.call(self._first_graph, url, sid)

    async def close(self) -> None:
        await self.call(self._stop)
        self.pool.shutdown()


async def new_state(client: DagctxClient, sid: str, n: list[int]) -> None:
    """Append a tool call under HEAD's llm node: a new graph state, the same heads."""
    head = (await client.session_get(sid)).head
    n[0] += 1
    await client.append(sid, "code", name="grep", caller=head, input={"pattern": f"bench {n[0]}"},
                        output="one more line", metadata={"toolCallId": f"bench-{n[0]}"})


async def timed_new(repeat: int, client: DagctxClient, sid: str, n: list[int], fn: Any) -> float:
    samples = []
    for _ in range(repeat):
        await new_state(client, sid, n)
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return median_ms(samples)


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--browser", action="store_true", help="also time the page in Debian's chromium")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench-graph-")
    db = os.path.join(tmp, "graph.db")
    t0 = time.perf_counter()
    sids = build(db, sizes)
    print(f"built {', '.join(map(str, sizes))}-node sessions in {time.perf_counter() - t0:.1f} s")
    client = await DagctxClient.spawn(db, standalone=True)
    server = UiServer(client)
    port = await server.start()
    browser = Browser() if args.browser else None
    try:
        if browser is not None and not await browser.start():
            browser = None
        print(f"{'nodes':>6}  {'history (base)':>15}  {'graph p1':>14}  {'p1 new state':>14}  {'graph all':>14}"
              f"  {'ui /api/graph':>16}  {'browser new':>14}")
        n = [0]
        for size, sid in sids.items():
            base = await timed(args.repeat, lambda: client.history(sid))
            first = await timed(args.repeat, lambda: client.graph(sid, limit=5000, conversation_only=True))
            fresh = await timed_new(args.repeat, client, sid, n,
                                    lambda: client.graph(sid, limit=FIRST_PAGE, conversation_only=True))
            every = await timed(args.repeat, lambda: whole_graph(client, sid))
            api = await timed(args.repeat, lambda: asyncio.to_thread(
                http_get, port, f"/api/graph?session={sid}&limit=5000", server.token))
            shown = "—"
            if browser is not None:
                samples = []
                for _ in range(args.repeat):
                    await new_state(client, sid, n)
                    samples.append(await browser.first_graph(server.url, sid))
                ms = median_ms(samples)
                shown = f"{ms:7.1f} ({ms / base:4.2f}x)"
            print(f"{size:>6}  {base:12.1f} ms  {first:7.1f} ({first / base:4.2f}x)  {fresh:7.1f} ({fresh / base:4.2f}x)"
                  f"  {every:7.1f} ({every / base:4.2f}x)  {api:9.1f} ({api / base:4.2f}x)  {shown:>14}")
        print("ratios are to session/history of the same session in this run (median of", args.repeat, "runs)")
    finally:
        if browser is not None:
            await browser.close()
        await server.close()
        await client.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
