"""``dagctx eval`` (issue #23): the quality metrics, each checked on a small session written
here whose right answer is known, through the real daemon (a subprocess) and the real
client — the replay, the recovery searches (M1) and ``context/replay`` (M7) all go
through the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dagctx.cli.quality import evaluate as ev
from dagctx.cli.quality import replay as rp


def dagctx(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    env.pop("DAGCTX_DB", None)
    return subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", *args], capture_output=True, text=True,
                          encoding="utf-8", timeout=timeout, env=env)


def claude_code_session(path: Path, turns: int, *, result_chars: int = 6000, gap: float = 10.0) -> dict[str, Any]:
    """A Claude Code JSONL of ``turns`` user turns; each turn reads one file (a large result
    holding identifiers of its own), edits it, and answers. Returns what was written."""
    lines: list[dict[str, Any]] = []
    parent = None
    t = 1_767_225_600.0  # 2026-01-01

    def stamp() -> str:
        nonlocal t
        t += gap
        import datetime

        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")

    def add(obj: dict[str, Any]) -> None:
        nonlocal parent
        uid = f"{len(lines):08d}-0000-4000-8000-000000000000"
        obj.update({"uuid": uid, "parentUuid": parent, "sessionId": "eval-test", "timestamp": stamp(),
                    "isSidechain": False})
        lines.append(obj)
        parent = uid

    files = []
    for i in range(turns):
        f = f"src/module_{i}/handler_{i}.py"
        files.append(f)
        add({"type": "user", "message": {"role": "user", "content": f"Turn {i}: fix the bug in {f}"}})
        add({"type": "assistant", "message": {"id": f"msg_{i:04d}a", "role": "assistant", "content": [
            {"type": "text", "text": f"Reading {f}."},
            {"type": "tool_use", "id": f"toolu_read{i:04d}", "name": "Read", "input": {"file_path": f}}]}})
        body = "\n".join(f"line {k}: value_{i}_{k} = compute_{i}({1000 * i + k})"
                         for k in range(result_chars // 40))
        add({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_read{i:04d}", "content": f"marker_{i}_start\n{body}"}]}})
        add({"type": "assistant", "message": {"id": f"msg_{i:04d}b", "role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_edit{i:04d}", "name": "Edit",
             "input": {"file_path": f, "old_string": "a", "new_string": "b"}}]}})
        add({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_edit{i:04d}", "content": "ok"}]}})
        add({"type": "assistant", "message": {"id": f"msg_{i:04d}c", "role": "assistant", "content": [
            {"type": "text", "text": f"Fixed {f}."}]}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return {"files": files, "calls": 3 * turns}


def run_eval(*args: str) -> dict[str, Any]:
    p = dagctx("eval", *args, "--json")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads(p.stdout)


def test_eval_cli_replays_a_transcript_and_reports_every_metric(tmp_path: Path) -> None:
    src = tmp_path / "session.jsonl"
    known = claude_code_session(src, turns=10)
    doc = run_eval(str(src), "--window", "8k", "--plots", str(tmp_path / "plots"))
    assert doc["summarizer"].startswith("stand-in")
    (s,) = doc["sessions"]
    assert s["modelCalls"] == known["calls"]
    (w,) = s["windows"]
    assert w["requests"] == known["calls"]
    # M4: nothing handed out over the window; the history (10 × 6,000 characters) needs management
    assert w["M4"]["maxOvershoot"] == 0 and w["M4"]["overshootRequests"] == 0
    assert w["M5"]["unmanaged"]["totals"]["served"] < known["calls"]
    # something was taken out of requests, and every identifier of it was found again
    assert w["M1"]["removed"] > 0
    assert w["M1"]["recall"] == 1.0, w["M1"]["lost"]
    # M7: every request handed out replays byte for byte
    assert w["M7"]["identical"] == w["M7"]["requests"] == w["requests"] - w["M4"]["refused"]
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "retention-by-class.svg" in plots and any(p.startswith("tokens-") for p in plots)
    svg = (tmp_path / "plots" / plots[-1]).read_text()
    assert svg.startswith("<svg") and "polyline" in svg


def test_eval_cli_refuses_bad_arguments(tmp_path: Path) -> None:
    p = dagctx("eval")
    assert p.returncode == 2 and "give transcript files" in p.stdout + p.stderr
    p = dagctx("eval", str(tmp_path / "missing.jsonl"))
    assert p.returncode == 2 and "no such file" in p.stdout + p.stderr
    src = tmp_path / "s.jsonl"
    claude_code_session(src, turns=1)
    p = dagctx("eval", str(src), "--window", "huge")
    assert p.returncode == 2 and "give tokens, e.g. 16k" in p.stdout + p.stderr


# ---------------------------------------------------------------- known answers, through the daemon


class CC:
    """A Claude Code JSONL written line by line (each line's parent is the previous line)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.parent: str | None = None
        self.t = 1_767_225_600.0

    def add(self, obj: dict[str, Any], parent: Any = "prev") -> str:
        import datetime

        self.t += 10
        uid = f"{len(self.lines):08d}-0000-4000-8000-000000000000"
        obj.update({"uuid": uid, "parentUuid": self.parent if parent == "prev" else parent, "sessionId": "eval-test",
                    "isSidechain": False,
                    "timestamp": datetime.datetime.fromtimestamp(self.t, datetime.timezone.utc).isoformat()})
        self.lines.append(obj)
        self.parent = uid
        return uid

    def user(self, text: str) -> str:
        return self.add({"type": "user", "message": {"role": "user", "content": text}})

    def pause(self, seconds: float) -> None:
        """The next line comes ``seconds`` later (beyond 300 s the prompt cache has expired)."""
        self.t += seconds

    def call(self, n: int, name: str, args: dict[str, Any], result: str, text: str = "") -> None:
        blocks = ([{"type": "text", "text": text}] if text else []) + [
            {"type": "tool_use", "id": f"toolu_{n:04d}", "name": name, "input": args}]
        self.add({"type": "assistant", "message": {"id": f"msg_{n:04d}", "role": "assistant", "content": blocks}})
        self.add({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{n:04d}", "content": result}]}})

    def reply(self, n: int, text: str) -> None:
        self.add({"type": "assistant", "message": {"id": f"msg_{n:04d}r", "role": "assistant",
                                                   "content": [{"type": "text", "text": text}]}})

    def compact(self, summary: str) -> None:
        last = self.parent
        self.add({"type": "system", "subtype": "compact_boundary", "logicalParentUuid": last,
                  "compactMetadata": {"trigger": "manual", "preTokens": 1000}, "content": "Conversation compacted"},
                 parent=None)
        self.add({"type": "user", "isCompactSummary": True, "message": {"role": "user", "content": summary}})

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(x) + "\n" for x in self.lines), encoding="utf-8")
        return path


def filler(n: int, word: str = "lorem") -> str:
    """``n`` lines of plain words: no identifier of any class."""
    return "\n".join(f"{word} ipsum dolor sit amet line" for _ in range(n))


async def evaluate_file(tmp_path: Path, path: Path, window: str, **kw: Any) -> dict[str, Any]:
    cfg = ev.Config(paths=[str(path)], windows=[rp.parse_window(window)], **kw)
    return await ev.evaluate(cfg)


async def test_aging_removes_identifiers_that_are_found_again_and_regretted(tmp_path: Path) -> None:
    """Two large results age out of the requests (turn distance 4); the identifier in the middle
    of the first (soft trim keeps head and tail) is used again later: one regret (M6), every
    removed identifier found again through the protocol (M1), the aging boundary breaks the
    cache where the first aged result sits (M5), every request replays (M7). The user pauses
    ten minutes before turns 4 and 5: the replay tells the daemon its prompt cache is cold
    then (``promptCache``), so each aging is made at once rather than held back until it
    pays for a cache rewrite (SPEC §8)."""
    cc = CC()
    cc.user("start with the first file")
    cc.call(1, "Read", {"file_path": "src/alpha.py"}, filler(60) + "\nkiwi_mango_77 = 5\n" + filler(60), "reading")
    cc.reply(1, "read it")
    cc.user("now the second file")
    cc.call(2, "Read", {"file_path": "src/beta.py"}, filler(60, "nulla") + "\ngrape_melon_88 = 6\n" + filler(60, "nulla"))
    cc.reply(2, "read it too")
    for k in range(3, 7):
        if k >= 5:
            cc.pause(600)
        cc.user(f"step {k}")
        cc.call(k, "Bash", {"command": "true"}, "done")
        cc.reply(k, "ok")
    cc.user("search again")
    cc.call(7, "Grep", {"pattern": "kiwi_mango_77"}, "src/alpha.py: kiwi_mango_77 = 5")
    doc = await evaluate_file(tmp_path, cc.write(tmp_path / "aging.jsonl"), "32k")
    (w,) = doc["sessions"][0]["windows"]
    assert w["requests"] == 13 and w["compactions"]["written"] == 0 and w["M4"]["refused"] == 0
    # M6: both results aged; only the first one's removed identifier is used again
    assert w["M6"]["aged"] == 2 and w["M6"]["regretted"] == 1
    (ex,) = w["M6"]["examples"]
    assert ex["node"] == "toolu_0001" and ex["identifiers"] == ["kiwi_mango_77"]
    # M1: what aging removed is found again by search_history + read_node
    m1 = w["M1"]
    assert m1["byMechanism"]["aging"][1] >= 2 and m1["recall"] == 1.0
    assert m1["nodes"]["toolu_0001"] == [1, 1] and m1["nodes"]["toolu_0002"] == [1, 1]
    assert m1["routes"]["search"] == m1["removed"]
    # M5: the first request that ages toolu_0001 breaks the prefix at its result (unit 3: system,
    # user, assistant, the result), and the cause is the aging boundary
    aging = [b for b in w["M5"]["dagctx"]["breaks"] if b["cause"] == "aging"]
    assert aging and aging[0]["atUnit"] == 3
    assert aging[0]["index"] == 2 * 4  # turn 4's first request: turn 0 is 4 turns away
    assert w["M7"]["identical"] == w["M7"]["requests"] == 13


async def test_recorded_and_dagctx_summaries_are_measured_by_class(tmp_path: Path) -> None:
    """A Claude Code ``/compact`` (isCompactSummary) whose summary names a known part of what it
    covers: retention per class (M2) and edited files named (M3) are exact; dagctx's own
    summaries of the same session at a small window are measured the same way and the
    compaction shows as a cache break with its cause."""
    cc = CC()
    cc.user("fix the parser, see https://example.com/doc")
    cc.call(1, "Read", {"file_path": "src/a.py"}, "def parse_config(): return ParseConfig(4242)")
    cc.call(2, "Edit", {"file_path": "src/a.py", "old_string": "one", "new_string": "two"}, "done")
    cc.call(3, "Write", {"file_path": "src/b.py", "content": "commit deadbeef99"}, "done")
    cc.reply(3, "fixed")
    cc.compact("We fixed parse_config in src/a.py; the answer was 4242.")
    for k in range(4, 16):
        cc.user(f"part {k} of the work")
        # more distinct identifiers than a summary of a sixth of the size can hold
        cc.call(k, "Read", {"file_path": f"lib/part{k}.py"},
                filler(60, f"w{k}x") + "\n" + "\n".join(f"value_{k}_{j}_key = {5000 + 100 * k + j}" for j in range(40)))
        cc.reply(k, "noted")
    doc = await evaluate_file(tmp_path, cc.write(tmp_path / "compact.jsonl"), "6k")
    s = doc["sessions"][0]
    (rec,) = s["recordedSummaries"]
    r = rec["retention"]
    # covered: paths src/a.py src/b.py, url, symbols parse_config ParseConfig, number 4242, hash deadbeef99
    assert r["path"] == [1, 2] and r["number"] == [1, 1] and r["symbol"] == [1, 2]
    assert r["hash"] == [0, 1] and r["url"] == [0, 1] and r["id"] == [0, 0]
    assert rec["filesEdited"] == 2 and rec["filesNamed"] == 1 and rec["filesMissing"] == ["src/b.py"]
    assert doc["totals"]["recorded"]["byClass"]["path"] == [1, 2]
    (w,) = s["windows"]
    assert w["compactions"]["written"] >= 1
    for summ in w["M2"]["summaries"]:
        assert summ["coveredNodes"] > 0 and 0 < summ["kept"] <= summ["identifiers"]
    assert any(b["cause"] == "compaction" for b in w["M5"]["dagctx"]["breaks"])
    assert w["M5"]["dagctx"]["byCause"]["compaction"]["breaks"] >= 1
    # every summary dagctx wrote was a call to the stand-in, counted beside the cache cost
    sampled = w["M5"]["summarizer"]["dagctx"]
    assert sampled["calls"] >= w["compactions"]["written"] and sampled["input"] > sampled["output"] > 0
    both = w["M5"]["costWithSummarizer"]
    assert both["dagctx"] == round(w["M5"]["dagctx"]["totals"]["cost"] + sampled["cost"], 2)
    assert w["M4"]["maxOvershoot"] == 0 and w["M1"]["recall"] == 1.0
    assert w["M7"]["identical"] == w["M7"]["requests"] > 0


async def test_an_overshoot_and_a_changed_request_are_caught(tmp_path: Path) -> None:
    """Requests the daemon built for a 32k window, measured against 8k, overshoot by exactly
    what the recount says (M4); a request altered after it was handed out is not replayed
    identically (M7): the checks can fail."""
    cc = CC()
    for k in range(1, 9):
        cc.user(f"part {k}")
        cc.call(k, "Read", {"file_path": f"lib/p{k}.py"}, filler(200, f"z{k}q"))
    cfg = ev.Config(windows=[rp.parse_window("32k")])
    client = await ev.spawn_scratch(cfg, str(tmp_path))
    try:
        res = await client.import_path(str(cc.write(tmp_path / "big.jsonl")))
        src = await rp.load_source(client, res.sessions[0].session_id)
        rep = await rp.replay(client, src, cfg.windows[0], cfg.options)
        from dagctx.cli.quality import cache as cm

        sent = [cm.Sent(r.at, r.system, r.messages, r.manifest) for r in rep.requests]
        counter = cm.TokenCounter()
        econ = cm.economics(sent, counter, window=8000, max_output=1000)
        last = econ["rows"][-1]
        assert last["tokens"] > 8000
        assert last["overshoot"] == last["tokens"] + 1000 - 8000
        m4 = cm.budget(sent, econ, 8000, [1000] * len(sent))
        assert m4["overshootRequests"] >= 1 and m4["maxOvershoot"] == max(r["overshoot"] for r in econ["rows"])
        ok = await rp.replay_nodes(client, rep)
        assert ok["identical"] == ok["requests"] == len(rep.requests)
        rep.requests[3].messages[-1] = {"role": "user", "content": "not what was sent"}
        bad = await rp.replay_nodes(client, rep)
        assert bad["different"] == 1 and bad["firstDifferent"] == [3]
    finally:
        await client.close()


def test_a_codex_compaction_is_measured_and_the_structural_fallback_runs(tmp_path: Path) -> None:
    """A Codex rollout's ``compacted`` summary beside what it covers (an apply_patch that adds
    one file and updates another), through the CLI with the daemon's structural fallback as
    the summarizer (no sampling at all)."""
    patch = "*** Begin Patch\n*** Update File: src/c.py\n@@\n-a\n+b\n*** Add File: src/d.py\n+x\n*** End Patch\n"
    rows = [
        {"type": "session_meta", "payload": {"id": "codex-eval-test", "model": "gpt-5"}},
        {"type": "response_item", "payload": {"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": "patch it"}]}},
        {"type": "response_item", "payload": {"type": "function_call", "name": "apply_patch", "call_id": "call_1",
                                              "arguments": json.dumps({"input": patch})}},
        {"type": "response_item", "payload": {"type": "function_call_output", "call_id": "call_1",
                                              "output": "Success. wrote 7070 bytes"}},
        {"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                              "content": [{"type": "output_text", "text": "patched"}]}},
        {"type": "compacted", "payload": {"message": "Patched src/c.py as asked."}},
        {"type": "response_item", "payload": {"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": "thanks, now explain"}]}},
        {"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                              "content": [{"type": "output_text", "text": "it works"}]}},
    ]
    src = tmp_path / "rollout-2026-01-01T00-00-00-codex-eval-test.jsonl"
    src.write_text("".join(json.dumps({"timestamp": f"2026-01-01T00:00:{i:02d}Z", **r}) + "\n"
                           for i, r in enumerate(rows)), encoding="utf-8")
    doc = run_eval(str(src), "--window", "4k", "--summarizer", "structural")
    assert doc["summarizer"].startswith("structural")
    (s,) = doc["sessions"]
    (rec,) = s["recordedSummaries"]
    assert rec["filesEdited"] == 2 and rec["filesNamed"] == 1 and rec["filesMissing"] == ["src/d.py"]
    assert rec["retention"]["path"] == [1, 2] and rec["retention"]["number"] == [0, 1]
    (w,) = s["windows"]
    assert w["requests"] == s["modelCalls"] == w["M7"]["identical"] == 3 and w["M4"]["maxOvershoot"] == 0


async def test_an_identifier_a_request_checkpoint_removed_is_found_by_search(tmp_path: Path) -> None:
    """One user turn of 24 browser steps outgrows a 16k window: a request checkpoint takes
    the early steps out of the request. Each step's JSON input has an identifier of its own
    at the start of a line of its code (``\\nprobeWriterK.flush``), which the checkpoint's
    summary does not name; ``search_history`` finds each call again by it (top 10), as the
    Codex rollout's ``nodeRepl.write`` at 32k (issue 23: the escaped newline glued an ``n``
    to the word in the search index, and M1 lost them)."""
    cc = CC()
    cc.user("open every page and report its title")
    for k in range(1, 25):
        code = f"await tab.goto('http://localhost:5173/page_{k}');\nprobeWriter{k}.flush(JSON.stringify(await tab.title()));"
        cc.call(k, "js", {"title": f"Open page {k}", "code": code}, filler(90))
    cc.reply(25, "all pages opened")
    doc = await evaluate_file(tmp_path, cc.write(tmp_path / "checkpoint.jsonl"), "16k")
    (w,) = doc["sessions"][0]["windows"]
    assert w["requests"] == 25 and w["reductions"] > 0 and w["M4"]["refused"] == 0 and w["M4"]["maxOvershoot"] == 0
    m1 = w["M1"]
    # only the checkpoint removed anything, and what it removed is each step's line-start identifier
    assert set(m1["byMechanism"]) == {"checkpoint"} and m1["removed"] >= 5, m1
    assert all(v == [1, 1] for v in m1["nodes"].values()) and len(m1["nodes"]) == m1["removed"], m1["nodes"]
    assert m1["recall"] == 1.0 and m1["routes"]["search"] == m1["removed"], m1["lost"]
    assert w["M7"]["identical"] == w["M7"]["requests"] == 25


async def test_recovery_reads_an_identifier_cut_by_read_node_pages(tmp_path: Path) -> None:
    """``read_node`` pages an output by 20,000 characters; an identifier astride the cut is
    still recovered (the pages are read as one text), and only by reading both pages."""
    from dagctx.cli.mcp_tools import READ_DEFAULT_LENGTH

    ident = "boundary_marker_4242"
    head = ("a" * 79 + "\n") * (READ_DEFAULT_LENGTH // 80)
    head = head[: READ_DEFAULT_LENGTH - 8]
    body = head + ident + "\n" + ("b" * 79 + "\n") * 60
    assert body.index(ident) < READ_DEFAULT_LENGTH < body.index(ident) + len(ident)
    cc = CC()
    cc.user("read the big file")
    cc.call(1, "Read", {"file_path": "big.txt"}, body, "reading")
    cc.reply(1, "read")
    for k in range(2, 7):
        cc.user(f"step {k}")
        cc.reply(k, "ok")
    doc = await evaluate_file(tmp_path, cc.write(tmp_path / "pages.jsonl"), "32k")
    (w,) = doc["sessions"][0]["windows"]
    assert w["M6"]["aged"] == 1
    m1 = w["M1"]
    # the one identifier of the result (the rest is plain letters) was removed by aging and found
    assert m1["nodes"] == {"toolu_0001": [1, 1]} and m1["removed"] == 1, m1["lost"]


def test_eval_replays_a_stored_session(tmp_path: Path) -> None:
    """``--session`` takes a session of the user's database (named by a prefix); the replay
    runs in a scratch database and leaves the user's database as it was."""
    src = tmp_path / "stored.jsonl"
    known = claude_code_session(src, turns=3, result_chars=400)
    db = tmp_path / "user.db"
    p = dagctx("import", str(src), "--db", str(db), "--standalone", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    sid = json.loads(p.stdout)["sessions"][0]["sessionId"]
    before = db.stat().st_size, json.loads(dagctx("sessions", "--db", str(db), "--standalone", "--json").stdout)
    doc = run_eval("--session", sid[:8], "--db", str(db), "--standalone", "--window", "16k")
    (s,) = doc["sessions"]
    assert s["source"] == f"session {sid}" and s["modelCalls"] == known["calls"]
    assert s["windows"][0]["M7"]["identical"] == known["calls"]
    after = json.loads(dagctx("sessions", "--db", str(db), "--standalone", "--json").stdout)
    assert after == before[1]
    p = dagctx("eval", "--session", "ffffffff", "--db", str(db), "--standalone")
    assert p.returncode == 1 and "no session id starts with it" in p.stdout + p.stderr


def test_eval_says_when_nothing_can_be_replayed(tmp_path: Path) -> None:
    src = tmp_path / "chat.jsonl"
    src.write_text(json.dumps({"conversations": [{"from": "human", "value": "hello"}]}) + "\n", encoding="utf-8")
    p = dagctx("eval", str(src), "--window", "16k")
    assert p.returncode == 1 and "no session with a model call to replay" in p.stdout + p.stderr
