"""``dagctx ui`` in a real browser: Debian's chromium driven by Playwright.

One shared daemon, one ``dagctx ui`` process (the real command, ``--no-open``) and one
browser for the whole module; each test opens its own page. Sessions are written through
the Python client (real compaction with a scripted summarizer, requests recorded with
``renderId``, provider usage reported), and every test checks the page against the
daemon's own answers (``context/replay``, ``session/graph``). Screenshots go to the
module's temporary folder (``webui-shots/``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dagctx.client import DagctxClient
from dagctx.protocol import messages as m

from conftest import short_tempdir
from sampling_stub import ScriptedSampler, request_text

pw = pytest.importorskip("playwright.sync_api", reason="playwright (pip) drives the browser: pip install -e '.[test]'")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _need_chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI needs Debian's chromium (scripts/test.sh installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return CHROMIUM


# ---------------------------------------------------------------- the data


def _sampler() -> ScriptedSampler:
    # keeps every identifier of what it covers, so the compaction's fidelity gate passes
    return ScriptedSampler(lambda p: "## Summary\nWorked on: " + " ".join(
        sorted(set(re.findall(r"src/mod_\d+\.py|mod_\d+|call_\d+", request_text(p))))))


TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "git", "description": "Run git",
                                         "parameters": {"type": "object", "properties": {"args": {"type": "array"}}}}}]
#: each recorded call's decision path, as context/prepare answered it
PATHS: dict[str, list[str]] = {}


async def _record(c: DagctxClient, sid: str, pred: str, output: str) -> m.NodeResult:
    """One llm call as an agent records it: prepare (with its tools), then append with the render's id."""
    prep = await c.prepare(sid, model="gpt-4o", tools=TOOLS)
    node = await c.request("node/append", m.NodeAppendParams(session_id=sid, render_id=prep.render_id, node=m.NodeInput(
        role="llm", name="gpt-4o", output=output, predecessor=pred)))
    PATHS[node.node.id] = list(prep.decision_path)
    return node


async def _build(db: Path) -> dict[str, Any]:
    # aging on from the second turn back, so recorded requests show old tool results aged
    c = await DagctxClient.connect(db, capabilities={"sampling": {}}, initialization_options={
        "aging": {"keepRecentTurns": 1, "minAgeSeconds": 0, "minTokens": 20, "protectFirst": 0,
                  "softTrimHeadChars": 20, "softTrimTailChars": 20, "hardClearAfterTurns": 2}})
    c.on_request("sampling/createMessage", _sampler())
    try:
        other = await c.session_create("notes about zanzibar")
        u = await c.append(other.session_id, "user", output="The zanzibar port list is in docs/ports.md",
                           predecessor=other.head)
        await c.append(other.session_id, "llm", name="gpt-4o", output="Noted.", predecessor=u.head)

        s = await c.session_create("graph demo")
        sid, tip = s.session_id, s.head
        first_llm = ""
        for i in range(6):
            u = await c.append(sid, "user", output=f"Turn {i}: look at src/mod_{i}.py " + " ".join(WORDS) * 25,
                               predecessor=tip)
            a = await _record(c, sid, u.node.id, f"Reading src/mod_{i}.py")
            first_llm = first_llm or a.node.id
            await c.append(sid, "code", name="bash", input={"cmd": f"cat src/mod_{i}.py"},
                           output=f"def f_{i}():\n" + "    pass\n" * 40, caller=a.node.id,
                           metadata={"toolCallId": f"call_{i}"})
            b = await _record(c, sid, a.node.id, "Read it. " + " ".join(WORDS) * 20)
            tip = b.node.id
        comp = await c.compact(sid, model="gpt-4o", keep_recent_tokens=600)
        assert comp.ok, comp
        u6 = await c.append(sid, "user", output="Now summarise what changed in src/mod_5.py", predecessor=tip)
        l6a = await _record(c, sid, u6.node.id, "Checking the diff.")
        tool = await c.append(sid, "code", name="git", input={"args": ["diff", "src/mod_5.py"]},
                              output="+def g():\n+    return 5\n", caller=l6a.node.id,
                              metadata={"toolCallId": "call_diff"})
        big = await c.append(sid, "code", name="bash", input={"cmd": "cat build.log"},
                             output="".join(f"step {k}: ok\n" for k in range(4000)), caller=l6a.node.id,
                             metadata={"toolCallId": "call_log"})
        assert "spill" in big.node.metadata
        l6b = await _record(c, sid, l6a.node.id, "src/mod_5.py gained g().")
        await c.usage_report(sid, l6b.node.id, model="gpt-4o", input=300, output=12, cache_read=2500, cache_write=200)
        # a retry of the last reply: a fork (HEAD stays), and a spawned subagent branch
        retry = await c.append(sid, "llm", name="gpt-4o", output="A retried answer.", predecessor=l6a.node.id)
        spawn = await c.spawn_branch(sid, tool.node.id, source="subagent", output="Find callers of g()")
        head = (await c.session_get(sid)).head
        return {"sid": sid, "other": other.session_id, "summary": comp.summary_id, "covers": comp.covers_ids,
                "request": l6b.node.id, "previous": l6a.node.id, "retry": retry.node.id, "head": head,
                "spawn": spawn.node.id, "first_llm": first_llm}
    finally:
        await c.close()


def _run(coro: Any) -> Any:
    """Run a client coroutine to the end (in a thread: Playwright's sync API owns this
    thread's event loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(120)


async def _client_call(db: Path, fn: Any) -> Any:
    c = await DagctxClient.connect(db)
    try:
        return await fn(c)
    finally:
        await c.close()


# ---------------------------------------------------------------- the module's daemon, server, browser


class Ui:
    def __init__(self, url: str, db: Path, data: dict[str, Any], shots: Path, browser: Any) -> None:
        self.url = url
        self.db = db
        self.data = data
        self.shots = shots
        self.browser = browser
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token = dict(p.split("=", 1) for p in parts.query.split("&"))["token"]

    def call(self, fn: Any) -> Any:
        return _run(_client_call(self.db, fn))

    def page(self) -> tuple[Any, list[str]]:
        page = self.browser.new_page(viewport={"width": 1400, "height": 860})
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(20_000)
        page.goto(self.url)
        page.wait_for_selector("body[data-ready='1']")
        return page, errors

    def shot(self, page: Any, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path))
        assert path.stat().st_size > 1000
        return path

    def raw(self, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.putrequest(method, path, skip_host=True)
            hdrs = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()
            res = conn.getresponse()
            return res.status, res.read().decode("utf-8", "replace")
        finally:
            conn.close()


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    chromium = _need_chromium()
    base = tmp_path_factory.mktemp("webui")
    run = short_tempdir("ui-")  # short: socket paths are limited
    with pytest.MonkeyPatch.context() as mp:
        # the shared daemon (as users run it), in a runtime folder of this module's own
        mp.delenv("DAGCTX_STANDALONE", raising=False)
        mp.delenv("DAGCTX_DAEMON_TAG", raising=False)
        mp.setenv("XDG_RUNTIME_DIR", str(run))
        mp.setenv("DAGCTX_STATE_DIR", str(base / "state"))
        mp.setenv("DAGCTX_IDLE_TIMEOUT", "300")
        db = base / "ui.db"
        data = _run(_build(db))
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "dagctx.cli", "ui", "--db", str(db), "--no-open"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
        )
        url = None
        deadline = time.monotonic() + 90
        seen = []
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline() if proc.stdout else ""
            seen.append(line)
            mo = re.search(r"http://127\.0\.0\.1:\d+/\?token=[\w-]+", line)
            if mo:
                url = mo.group(0)
                break
        assert url, f"dagctx ui printed no URL: {''.join(seen)}"
        shots = base / "webui-shots"
        shots.mkdir()
        play = pw.sync_playwright().start()
        browser = play.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield Ui(url, db, data, shots, browser)
        finally:
            browser.close()
            play.stop()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout:
                proc.stdout.close()
            _run(_client_call(db, lambda c: c.request("daemon/stop", m.Empty())))
            shutil.rmtree(run, ignore_errors=True)


# ---------------------------------------------------------------- the tests


def test_session_list_and_full_text_search(ui: Ui) -> None:
    page, errors = ui.page()
    rows = page.locator("[data-testid=session-row]")
    assert rows.count() == 2
    demo = page.locator("[data-testid=session-row]", has_text="graph demo")
    assert "native" in demo.inner_text() and re.search(r"\d+ nodes", demo.inner_text())
    page.fill("[data-testid=session-search]", "zanzibar")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=session-row]').length === 1")
    only = page.locator("[data-testid=session-row]")
    assert "notes about zanzibar" in only.inner_text() and "[zanzibar]" in only.inner_text().lower()
    ui.shot(page, "sessions-search")
    page.fill("[data-testid=session-search]", "")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=session-row]').length === 2")
    assert errors == []
    page.close()


def _open_demo(ui: Ui) -> tuple[Any, list[str]]:
    page, errors = ui.page()
    page.click(f"[data-session='{ui.data['sid']}']")
    page.wait_for_selector("[data-testid=capsule]")
    page.wait_for_selector("#live-state:has-text('live')")
    return page, errors


def _row_ids(page: Any) -> list[str]:
    return page.eval_on_selector_all("[data-testid=node-row]", "els => els.map(e => e.dataset.node)")


def test_graph_with_fork_and_a_capsule_that_expands(ui: Ui) -> None:
    page, errors = _open_demo(ui)
    d = ui.data
    graph = ui.call(lambda c: c.graph(d["sid"], conversation_only=True))
    rows = {r.id: r for r in graph.nodes}
    covered_chain = [i for i in rows[d["summary"]].covers_ids if i in rows and rows[i].conversation]
    assert covered_chain == d["covers"]
    # folded: one capsule, none of the covered turns drawn
    shown = set(_row_ids(page))
    assert not shown & set(covered_chain)
    assert {d["retry"], d["request"], d["spawn"]} <= shown
    # HEAD and the fork: two lanes (a curve leaves the shared parent)
    assert page.locator(f"[data-node='{d['head']}'] [data-testid=head-badge]").count() == 1
    lanes = page.eval_on_selector_all("svg.lanes circle", "els => new Set(els.map(e => e.getAttribute('cx'))).size")
    assert lanes >= 2
    assert page.eval_on_selector_all("svg.lanes path", "els => els.some(e => e.getAttribute('d').includes('C'))")
    # the spawned branch hangs off the turn that spawned it (a dashed edge)
    assert page.locator(f"[data-node='{d['spawn']}'] .badge.spawn").count() == 1
    assert page.locator("svg.lanes path.spawn").count() == 1
    # a turn's calls fold into its row: the spilled log and the aged results are marked there
    assert page.locator(f"[data-node='{d['previous']}'] [data-testid=spilled-calls]").inner_text() == "1 spilled"
    aged_rows = [r for r in rows.values() if r.aged_calls]
    assert aged_rows, "recorded requests aged no tool result"
    for r in aged_rows:
        if r.id in shown:
            assert page.locator(f"[data-node='{r.id}'] [data-testid=aged-calls]").inner_text() == f"{r.aged_calls} aged"
    ui.shot(page, "graph-folded")
    # expanded: the capsule shows the turns it covers
    page.click(f"[data-testid=capsule][data-summary='{d['summary']}']")
    page.wait_for_function(f"() => document.querySelector(\"[data-node='{covered_chain[0]}']\") !== null")
    shown = _row_ids(page)
    assert set(covered_chain) <= set(shown)
    assert page.locator(".grow.covered").count() >= len(covered_chain)
    ui.shot(page, "graph-expanded")
    # the compaction view: tokens before/after, identifiers kept, a search of the originals
    page.click(f"[data-testid=capsule][data-summary='{d['summary']}'] [data-testid=capsule-open]")
    page.wait_for_selector("[data-testid=compaction-tokens]")
    before, after = (int(x.replace(",", "")) for x in page.inner_text("[data-testid=compaction-tokens]").split(" → "))
    assert before > after > 0
    chip = page.locator("[data-testid=kept] .chip", has_text="src/mod_1.py")
    chip.click()
    page.wait_for_selector("[data-testid=original-hits] .hit")
    assert page.locator("[data-testid=original-hits] .hit").count() >= 1
    ui.shot(page, "compaction")
    assert errors == []
    page.close()


def test_the_first_page_already_folds_the_covered_turns_into_the_capsule(ui: Ui) -> None:
    # A long session's first page holds the covered turns but not the summary (written
    # after them): the page must still draw the capsule, not the raw turns, at once. The
    # first page is made 4 rows here and the later pages are held until the check is done.
    page, errors = ui.page()
    d = ui.data
    held: list[Any] = []
    released = [False]

    def first_small(route: Any) -> None:
        url = route.request.url
        if released[0]:
            route.continue_()
        elif "after=-1" in url:
            route.continue_(url=re.sub(r"limit=\d+", "limit=4", url))
        else:
            held.append(route)

    page.route("**/api/graph?*", first_small)
    page.click(f"[data-session='{d['sid']}']")
    capsule = page.locator(f"[data-testid=capsule][data-summary='{d['summary']}']")
    capsule.wait_for()
    deadline = time.monotonic() + 20
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the page asked for no second page"
    # drawn from the first page alone: covered turns folded, the capsule says more is coming
    assert "(loading)" in capsule.inner_text()
    assert not set(_row_ids(page)) & set(d["covers"])
    ui.shot(page, "graph-first-page")
    released[0] = True
    for route in held:
        route.continue_()
    page.wait_for_function("() => !document.querySelector('[data-testid=capsule]').innerText.includes('(loading)')")
    shown = set(_row_ids(page))
    assert not shown & set(d["covers"]) and {d["retry"], d["request"], d["spawn"]} <= shown
    assert errors == []
    page.close()


def test_the_request_view_is_context_replay(ui: Ui) -> None:
    page, errors = _open_demo(ui)
    d = ui.data
    page.click(f"[data-node='{d['request']}']")
    page.click("[data-testid=open-request]")
    page.wait_for_selector("[data-testid=token-bar]")
    shown = json.loads(page.text_content("[data-testid=replay-json]") or "null")
    replay = ui.call(lambda c: c.replay(d["sid"], d["request"]))
    assert replay.exact and shown == replay.messages
    assert page.locator("[data-testid=request-message]").count() == len(replay.messages)
    # the decision path is the engine's own, recorded when the request was handed out
    path = page.locator("[data-testid=decision-path] li").all_inner_texts()
    node = ui.call(lambda c: c.get_nodes(d["sid"], [d["request"]])).nodes[0]
    assert path == PATHS[d["request"]] == node.metadata["decisionPath"]
    assert any(f"summary {d['summary']} replaces" in line for line in path)
    # the tools schema the request carried, recorded once for the branch, shown as sent
    assert replay.tools == TOOLS and "tools" not in replay.manifest  # the branch's first request recorded it
    assert page.locator("[data-testid=tools] details").count() == 2
    assert [page.locator("[data-testid=tools] details").nth(i).get_attribute("data-tool") for i in range(2)] == [
        "bash", "git"]
    legend = page.inner_text("[data-testid=detail] .legend")
    assert "summary" in legend and "output reserve" in legend
    ui.shot(page, "request")
    assert errors == []
    page.close()


def test_the_diff_marks_the_stable_prefix(ui: Ui) -> None:
    page, errors = _open_demo(ui)
    d = ui.data
    page.click(f"[data-node='{d['request']}']")
    page.click("[data-testid=open-request]")
    page.wait_for_selector("[data-testid=prefix-end]")
    cur = ui.call(lambda c: c.replay(d["sid"], d["request"]))
    prev = ui.call(lambda c: c.replay(d["sid"], d["previous"], format=cur.manifest.get("format")))
    k = 0
    while k < min(len(cur.messages), len(prev.messages)) and cur.messages[k] == prev.messages[k]:
        k += 1
    assert 0 < k < len(cur.messages)
    assert page.locator("[data-diff=stable]").count() == k
    assert page.locator("[data-diff=added]").count() == len(cur.messages) - k
    # the marker sits right after the last stable message
    assert page.eval_on_selector("[data-testid=prefix-end]",
                                 f"e => e.previousElementSibling.dataset.index === '{k - 1}'")
    summary = page.inner_text("[data-testid=diff-summary]")
    assert f"{k} of {len(cur.messages)} messages byte-stable" in summary
    usage = page.inner_text("[data-testid=usage]")
    assert "cache read 2,500" in usage and "cache write 200" in usage
    ui.shot(page, "diff")
    assert errors == []
    page.close()


def test_an_append_by_another_client_appears_live(ui: Ui) -> None:
    page, errors = _open_demo(ui)
    d = ui.data
    page.evaluate("window.__sameDocument = 42")
    new = ui.call(lambda c: c.append(d["sid"], "user", output="A message written while the page is open",
                                     predecessor=d["head"]))
    page.wait_for_selector(f"[data-node='{new.node.id}']", timeout=15_000)
    assert page.evaluate("window.__sameDocument") == 42  # updated in place, not reloaded
    page.wait_for_function(f"() => document.querySelector(\"[data-testid=head]\").textContent === '{new.node.id}'")
    ui.shot(page, "live")
    assert errors == []
    page.close()


def test_the_token_host_and_origin_are_required(ui: Ui) -> None:
    assert ui.raw("GET", "/api/sessions")[0] == 401
    assert ui.raw("GET", "/")[0] == 401
    assert ui.raw("GET", "/api/sessions?token=wrong")[0] == 401
    assert ui.raw("GET", f"/api/sessions?token={ui.token}")[0] == 200
    cookie = {"Cookie": f"dagctx_ui_{ui.port}={ui.token}"}
    assert ui.raw("GET", "/api/sessions", cookie)[0] == 200
    # DNS rebinding: a foreign Host is refused even with the token
    assert ui.raw("GET", "/api/sessions", {**cookie, "Host": f"attacker.example:{ui.port}"})[0] == 403
    # cross-site requests
    assert ui.raw("GET", "/api/sessions", {**cookie, "Origin": "http://attacker.example"})[0] == 403
    assert ui.raw("GET", "/api/sessions", {**cookie, "Sec-Fetch-Site": "cross-site"})[0] == 403
    # read-only by default: a write from the page's own origin is still refused
    status, body = ui.raw("POST", f"/api/checkout?session={ui.data['sid']}&node={ui.data['retry']}",
                          {**cookie, "Origin": f"http://127.0.0.1:{ui.port}", "Content-Length": "0"})
    assert status == 403 and "--allow-writes" in body
    head = ui.call(lambda c: c.session_get(ui.data["sid"])).head
    assert head != ui.data["retry"]
    # the first visit trades the URL's token for a cookie and drops it from the address bar
    page = ui.browser.new_page()
    page.goto(ui.url)
    assert "token=" not in page.url
    cookies = page.context.cookies()
    assert any(c["name"] == f"dagctx_ui_{ui.port}" and c["httpOnly"] for c in cookies)
    page.close()


def test_writes_only_with_allow_writes(tmp_path: Path) -> None:
    """Checkout and fork through the page's API: refused read-only, done with --allow-writes."""
    _run(_writes(tmp_path))  # in a thread of its own: this module's browser owns this thread's loop


async def _writes(tmp_path: Path) -> None:
    from dagctx.cli.webui.server import UiServer

    client = await DagctxClient.spawn(tmp_path / "w.db")
    s = await client.session_create("writes")
    u = await client.append(s.session_id, "user", output="hi", predecessor=s.head)
    a = await client.append(s.session_id, "llm", name="m", output="one", predecessor=u.head)
    b = await client.append(s.session_id, "llm", name="m", output="two", predecessor=u.node.id)  # a retry
    servers = [UiServer(client), UiServer(client, allow_writes=True)]
    try:
        for srv in servers:
            await srv.start()

        def post(srv: UiServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            try:
                data = json.dumps(body).encode()
                conn.request("POST", path, body=data, headers={
                    "Cookie": f"dagctx_ui_{srv.port}={srv.token}", "Origin": f"http://127.0.0.1:{srv.port}",
                    "Content-Type": "application/json"})
                res = conn.getresponse()
                return res.status, json.loads(res.read())
            finally:
                conn.close()

        ro, rw = servers
        assert (await client.session_get(s.session_id)).head == a.node.id  # the retry did not move HEAD
        status, body = await asyncio.to_thread(post, ro, "/api/checkout", {"session": s.session_id, "node": b.node.id})
        assert status == 403 and "--allow-writes" in body["error"]
        assert (await client.session_get(s.session_id)).head == a.node.id
        status, body = await asyncio.to_thread(post, rw, "/api/checkout", {"session": s.session_id, "node": b.node.id})
        assert status == 200 and body["head"] == b.node.id
        status, body = await asyncio.to_thread(post, rw, "/api/fork", {"session": s.session_id, "node": u.node.id,
                                                                       "text": "try another way"})
        assert status == 200 and body["node"]["predecessor"] == u.node.id and body["head"] == body["node"]["id"]
        # a write without the page's Origin is refused even when writes are allowed
        def no_origin() -> int:
            conn = http.client.HTTPConnection("127.0.0.1", rw.port, timeout=30)
            try:
                conn.request("POST", "/api/checkout", body=b"{}", headers={"Cookie": f"dagctx_ui_{rw.port}={rw.token}"})
                return conn.getresponse().status
            finally:
                conn.close()
        assert await asyncio.to_thread(no_origin) == 403
    finally:
        for srv in servers:
            await srv.close()
        await client.close()
