"""Render latency of a 10k-node session: in-daemon, end to end, incremental, upstream.

Run from the repository root: python bench/bench_render.py [--nodes N] [--profile]

1. builds a realistic session in a temp SQLite file through the ledger's own write
   path (``Store.append_many`` with the per-node derived data ``EngineCore.derive_node``
   computes): user/llm turns, llm nodes with 1–3 tool calls (code nodes, caller =
   the llm node, ``metadata.toolCallId``), a few large (spilled) tool outputs,
   English and Chinese text, failed-call retries and abandoned user edits (forks
   with the same predecessor), so the head's chain is not the whole graph;
2. in-daemon render: ``ContextService.render(sid, fmt="openai", model="gpt-4o")``,
   cold (fresh EngineCore on the file, first render) and warm (same EngineCore again);
3. floor: a plain dict predecessor walk that builds the same OpenAI messages and
   encodes them with msgspec (checked byte-equal to ours): ratio in-daemon / floor;
4. end to end: ``context/render`` through a real daemon subprocess and the Python
   client, p50/p95;
5. incremental: append one turn (user + llm + tool call) and render the new head,
   against a cold render;
6. upstream: OpenProgram (PyPI ``openprogram``) installed in a throw-away venv
   (``bench/.venv``, git-ignored) renders the same graph, exported as JSON, with
   ``bench/_upstream_render.py``: ratio ours / upstream.

Numbers only; no goal is asserted. Ratios compare figures from this same run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import hashlib
import json
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from dagctx.client import DagctxClient
from dagctx.context.formats import to_messages
from dagctx.context.render import render_view
from dagctx.engine.config import DaemonConfig
from dagctx.engine.core import EngineCore
from dagctx.ledger import SessionGraph
from dagctx.protocol.messages import InitializeParams, NodeAppendParams
from dagctx.protocol.nodes import NodeInput

HERE = Path(__file__).resolve().parent
UPSTREAM_SCRIPT = HERE / "_upstream_render.py"
DEFAULT_VENV = HERE / ".venv"  # ignored by the repository's ``.venv/`` rule
MODEL = "gpt-4o"
FMT = "openai"

# ---------------------------------------------------------------- synthetic text

_EN = (
    "the parser config module function returns value error when cache is empty so we "
    "retry request with backoff and log warning before raising exception in handler "
    "database migration script adds column index on table users orders items test "
    "suite fails because fixture timeout exceeded check path import refactor class "
    "method signature update docs build pipeline deploy staging branch merge commit"
).split()
_ZH = (
    "我们需要先检查配置文件", "数据库迁移脚本已经完成", "请帮我重构这个函数", "测试失败的原因是超时",
    "把日志级别改成调试", "这个接口返回了错误码", "然后写一个数据库迁移脚本", "缓存没有命中",
    "性能下降了百分之三十", "用户反馈页面加载很慢", "先运行单元测试再提交", "这里的并发处理有问题",
)
_TOOLS = ("read_file", "grep", "run_tests", "list_dir", "edit_file", "web_search", "shell")


class Text:
    """Deterministic English / Chinese / code-ish text from a seeded RNG."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.lines = [self._line(i) for i in range(3000)]

    def _line(self, i: int) -> str:
        r = self.rng
        kind = r.random()
        if kind < 0.15:
            return "，".join(r.choice(_ZH) for _ in range(r.randint(1, 3))) + "。"
        if kind < 0.55:
            return f"src/{r.choice(_EN)}/{r.choice(_EN)}_{i % 97}.py:{r.randint(1, 900)}: " + " ".join(
                r.choices(_EN, k=r.randint(3, 12)))
        return "    " + " ".join(r.choices(_EN, k=r.randint(4, 14)))

    def prose(self, lo: int, hi: int, zh: float = 0.3) -> str:
        r = self.rng
        target = r.randint(lo, hi)
        parts: list[str] = []
        size = 0
        chinese = r.random() < zh
        while size < target:
            if chinese:
                s = "，".join(r.choice(_ZH) for _ in range(r.randint(1, 4))) + "。"
            else:
                s = " ".join(r.choices(_EN, k=r.randint(5, 16))).capitalize() + "."
            parts.append(s)
            size += len(s) + 1
        return (" " if not chinese else "").join(parts)

    def block(self, chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < chars:
            line = self.rng.choice(self.lines)
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)


# ---------------------------------------------------------------- the session


def build_nodes(target: int, seed: int = 7) -> tuple[list[NodeInput], str, dict[str, int]]:
    """NodeInputs of one session (ROOT excluded), the head id and a composition count."""
    rng = random.Random(seed)
    text = Text(rng)
    nodes: list[NodeInput] = []
    stats = {"turns": 0, "llm": 0, "tool": 0, "large": 0, "retries": 0, "edits": 0}
    tip = "ROOT"

    def tool_calls(llm_id: str, n: int, tag: str) -> None:
        for k in range(n):
            roll = rng.random()
            if roll < 0.02:
                out = text.block(rng.randint(40_000, 90_000))  # spilled at write time
                stats["large"] += 1
            elif roll < 0.06:
                out = text.block(rng.randint(4_000, 12_000))
            else:
                out = text.block(rng.randint(80, 1_800))
            name = rng.choice(_TOOLS)
            args: dict[str, Any] = {"path": f"src/{rng.choice(_EN)}/{rng.choice(_EN)}.py"}
            if name in ("grep", "web_search"):
                args["pattern"] = rng.choice(_ZH) if rng.random() < 0.3 else rng.choice(_EN)
            if name == "shell":
                args = {"command": f"pytest -x tests/test_{rng.choice(_EN)}.py", "timeout": 120}
            nodes.append(NodeInput(
                role="code", id=f"t{tag}.{k}", name=name, input=args, output=out, caller=llm_id,
                metadata={"toolCallId": f"call_{tag}_{k}"},
            ))
            stats["tool"] += 1

    t = 0
    while len(nodes) < target:
        t += 1
        stats["turns"] += 1
        if t % 37 == 0:  # an abandoned user edit: a sibling user turn with its own replies
            stats["edits"] += 1
            alt = f"u{t:05d}x"
            nodes.append(NodeInput(role="user", id=alt, output=text.prose(40, 400), predecessor=tip))
            a = f"a{t:05d}x.0"
            nodes.append(NodeInput(role="llm", id=a, name=MODEL, output=text.prose(20, 200), predecessor=alt))
            tool_calls(a, 1, f"{t:05d}x.0")
            nodes.append(NodeInput(role="llm", id=f"a{t:05d}x.1", name=MODEL, output=text.prose(50, 600),
                                   predecessor=a))
        uid = f"u{t:05d}"
        nodes.append(NodeInput(role="user", id=uid, output=text.prose(30, 700), predecessor=tip))
        prev = uid
        steps = rng.choice((1, 2, 2, 3))
        for j in range(steps + 1):
            lid = f"a{t:05d}.{j}"
            if rng.random() < 0.03:  # a failed model call, retried from the same predecessor
                stats["retries"] += 1
                nodes.append(NodeInput(role="llm", id=lid + "e", name=MODEL, output=None, status="error",
                                       predecessor=prev, metadata={"error": "429 rate limited"}))
            final = j == steps
            out = text.prose(60, 1_500) if final else (text.prose(10, 240) if rng.random() < 0.7 else "")
            nodes.append(NodeInput(role="llm", id=lid, name=MODEL, output=out, predecessor=prev,
                                   metadata={"model": MODEL}))
            stats["llm"] += 1
            if not final:
                tool_calls(lid, rng.randint(1, 3), f"{t:05d}.{j}")
            prev = lid
        tip = prev
    return nodes, tip, stats


def build_session(path: str, target: int) -> tuple[str, str, dict[str, Any]]:
    """Write the session through the store; returns (session id, head, info)."""
    eng = open_engine(path)
    t0 = time.perf_counter()
    nodes, head, stats = build_nodes(target)
    t1 = time.perf_counter()
    counts = {n.id: eng.derive_node(n.role, n.input, n.output, n.name) for n in nodes}
    t2 = time.perf_counter()
    store = eng.store
    sid = store.create_session("bench-render").session_id
    store.append_many(sid, nodes, head=head, derived=counts)
    t3 = time.perf_counter()
    info = dict(stats, nodes=len(nodes) + 1, gen_s=t1 - t0, count_s=t2 - t1, write_s=t3 - t2,
                db_mb=os.path.getsize(path) / 1e6)
    eng.close()
    del eng, nodes, counts
    gc.collect()
    return sid, head, info


def open_engine(path: str) -> EngineCore:
    eng = EngineCore(DaemonConfig(database=path))
    eng.initialize(InitializeParams())
    return eng


# ---------------------------------------------------------------- the floor


FloorRow = tuple[str, str, Any, list[tuple[str, str, Any, Any]]]


def floor_table(graph: SessionGraph) -> dict[str, FloorRow]:
    """id → (predecessor, role, text, [(call id, name, input, result)]), built beforehand."""
    table: dict[str, FloorRow] = {}
    for n in graph.by_seq:
        if n.predecessor is None or n.role == "code":
            continue
        text = n.output if n.output is not None else n.input
        table[n.id] = (n.predecessor, n.role, text, [])
    for n in graph.by_seq:
        if n.role == "code" and n.caller in table and "toolCallId" in n.metadata:
            table[n.caller][3].append((n.metadata["toolCallId"], n.name, n.input, n.output))
    return table


def floor_render(table: dict[str, FloorRow], head: str, root: str, enc: msgspec.json.Encoder) -> bytes:
    chain: list[FloorRow] = []
    nid = head
    while nid != root:
        row = table[nid]
        chain.append(row)
        nid = row[0]
    chain.reverse()
    out: list[dict[str, Any]] = []
    for _, role, text, tools in chain:
        if role == "user":
            out.append({"role": "user", "content": text})
        elif tools:
            out.append({
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {"id": tid, "type": "function", "function": {"name": name, "arguments": enc.encode(args).decode()}}
                    for tid, name, args, _ in tools
                ],
            })
            for tid, _, _, result in tools:
                out.append({"role": "tool", "tool_call_id": tid, "content": result})
        elif text:
            out.append({"role": "assistant", "content": text})
    return enc.encode(out)


# ---------------------------------------------------------------- helpers


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))
    return s[int(k)]


def timed(fn: Any, runs: int) -> tuple[float, list[float]]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out), out


def render(eng: EngineCore, sid: str, head: str | None = None, use_cache: bool = False) -> Any:
    # use_cache=False: a full render every time (the incremental cache would answer a
    # repeated render of the same head in a few ms; the incremental section measures it)
    return eng.views.render(sid, head=head, fmt=FMT, model=MODEL, use_cache=use_cache)


def top_functions(prof: cProfile.Profile, n: int, key: str = "cumulative") -> list[str]:
    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        rows.append((ct if key == "cumulative" else tt, nc, tt, ct, f"{func} ({where})"))
    rows.sort(key=lambda r: r[0], reverse=True)
    return [f"{nc:>9,} calls  tottime {tt * 1e3:8.1f} ms  cumtime {ct * 1e3:8.1f} ms  {name}"
            for _, nc, tt, ct, name in rows[:n]]


class GcMeter:
    """Time spent in the cyclic garbage collector (``gc.callbacks``) and collections per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0

    def reset(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def cold_render(path: str, sid: str) -> float:
    eng = open_engine(path)
    gc.collect()
    t = time.perf_counter()
    render(eng, sid)
    elapsed = time.perf_counter() - t
    eng.close()
    # EngineCore and ContextService point at each other: only the cyclic GC frees this
    # engine's graph. Free it now, untimed, so it does not weigh on later collections.
    del eng
    gc.collect()
    return elapsed


def phase_split(eng: EngineCore, sid: str, head: str, tokenizer: str, runs: int) -> dict[str, float]:
    """Median time of each step of ``ContextService.render`` (GC off), and the rest."""
    enc = msgspec.json.Encoder()
    out: dict[str, list[float]] = {}

    def step(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        value = fn()
        out.setdefault(name, []).append(time.perf_counter() - t)
        return value

    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            render(eng, sid)
            whole = time.perf_counter() - t0
            graph = step("graph refresh", lambda: eng.store.graph(sid))
            view = step("render_view", lambda: render_view(graph, head))
            rendered = step("to_messages", lambda: to_messages(view, FMT))
            step("token counts", lambda: eng.views.count_messages(graph, rendered[1], rendered[2], tokenizer, {}))
            step("message hashes", lambda: [hashlib.blake2b(enc.encode(m), digest_size=16).digest()
                                             for m in rendered[1]])
            step("chain ids", lambda: frozenset(n.id for n in graph.chain(head)))
            out.setdefault("rest", []).append(whole - sum(v[-1] for k, v in out.items() if k != "rest"))
        finally:
            gc.enable()
    return {k: statistics.median(v) for k, v in out.items()}


# ---------------------------------------------------------------- end to end


async def end_to_end(path: str, sid: str, calls: int) -> dict[str, Any]:
    t = time.perf_counter()
    client = await DagctxClient.spawn(path, standalone=True)
    spawn = time.perf_counter() - t
    try:
        t = time.perf_counter()
        first = await client.render(sid, format=FMT, model=MODEL)
        cold = time.perf_counter() - t
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            r = await client.render(sid, format=FMT, model=MODEL)
            lat.append(time.perf_counter() - t)
        size = len(msgspec.json.encode(r.messages))
        return {"spawn": spawn, "cold": cold, "p50": pct(lat, 50), "p95": pct(lat, 95), "calls": calls,
                "messages": len(first.messages), "bytes": size}
    finally:
        await client.close()


# ---------------------------------------------------------------- upstream


def upstream(export: Path, venv: Path, runs: int, tmp: str) -> dict[str, Any]:
    """Install OpenProgram in a throw-away venv (reused when present) and run it."""
    py = venv / "bin" / "python"
    env = dict(os.environ, HOME=os.path.join(tmp, "upstream-home"), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    os.makedirs(env["HOME"], exist_ok=True)
    note = "venv reused"

    def importable() -> bool:
        if not py.exists():
            return False
        got = subprocess.run([str(py), "-c", "import openprogram.context.render"], env=env,
                             capture_output=True, timeout=120)
        return got.returncode == 0

    t = time.perf_counter()
    if not importable():
        shutil.rmtree(venv, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=60)
            got = subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "openprogram"],
                env=env, capture_output=True, text=True, timeout=120,
            )
        except subprocess.TimeoutExpired:
            return {"error": "pip install openprogram took more than 2 minutes"}
        except (OSError, subprocess.CalledProcessError) as exc:
            return {"error": f"cannot create a venv: {exc}"}
        if got.returncode != 0:
            tail = [ln for ln in got.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
            return {"error": "pip install openprogram failed: " + (tail[-1] if tail else f"exit {got.returncode}")}
        note = f"installed in {time.perf_counter() - t:.0f} s"
    try:
        got = subprocess.run([str(py), str(UPSTREAM_SCRIPT), str(export), "--runs", str(runs)], env=env,
                             capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return {"error": "the upstream render script took more than 4 minutes"}
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        return {"error": "upstream script failed: " + (tail[-1] if tail else f"exit {got.returncode}")}
    out = json.loads(got.stdout)
    out["note"] = note
    return out


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000, help="session size (default 10000)")
    ap.add_argument("--runs", type=int, default=15, help="warm renders (median)")
    ap.add_argument("--cold", type=int, default=5, help="cold renders, each on a fresh EngineCore (median)")
    ap.add_argument("--calls", type=int, default=20, help="end-to-end context/render calls")
    ap.add_argument("--incremental", type=int, default=5, help="append-one-turn-and-render rounds")
    ap.add_argument("--no-upstream", action="store_true", help="skip the OpenProgram comparison")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="venv for OpenProgram (reused)")
    ap.add_argument("--profile", action="store_true", help="cProfile one warm and one cold render")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory (database, export)")
    args = ap.parse_args()

    started = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-render-")
    path = os.path.join(tmp, "render.db")
    try:
        run(args, tmp, path)
    finally:
        if args.keep:
            print(f"\nkept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s")


def run(args: argparse.Namespace, tmp: str, path: str) -> None:
    print(f"building a {args.nodes:,}-node session in {path} …", flush=True)
    sid, head, info = build_session(path, args.nodes)
    print(
        f"  {info['nodes']:,} nodes: {info['turns']:,} turns, {info['llm']:,} llm, {info['tool']:,} tool calls "
        f"({info['large']} large/spilled), {info['retries']} failed-call retries, {info['edits']} abandoned edits; "
        f"db {info['db_mb']:.0f} MB\n  generate {info['gen_s']:.1f} s, count tokens {info['count_s']:.1f} s, "
        f"append_many {info['write_s']:.1f} s",
        flush=True,
    )

    # ---- cold: a fresh EngineCore on the file, first render (graph + token counts load)
    cold = []
    for _ in range(args.cold):
        cold.append(cold_render(path, sid))
    cold_med = statistics.median(cold)

    # cold split: graph load and token-count load, as the first render does them
    eng = open_engine(path)
    t = time.perf_counter()
    graph = eng.store.graph(sid)
    t_graph = time.perf_counter() - t
    tokenizer = eng.counter.tokenizer_for(MODEL)
    t = time.perf_counter()
    eng.views.node_tokens(graph, tokenizer)
    t_tokens = time.perf_counter() - t

    # ---- warm and floor, interleaved so load from other processes hits both alike
    r = render(eng, sid)
    chain_len = len(graph.chain(head))
    n_messages, total_tokens, tok_name = len(r.messages), r.total, r.tokenizer
    role_seq = hashlib.sha1("".join(m["role"][0] for m in r.messages).encode()).hexdigest()
    enc = msgspec.json.Encoder()
    ours_bytes = enc.encode(r.messages)
    del r  # the daemon keeps no rendering alive between calls; neither do we (GC cost)
    gc.collect()
    table = floor_table(graph)
    root = graph.root_id
    floor_bytes = floor_render(table, head, root, enc)
    same = floor_bytes == ours_bytes
    warm, floor, gc_time, gc_runs = [], [], [], []
    with GcMeter() as meter:
        for _ in range(args.runs):
            meter.reset()
            t = time.perf_counter()
            render(eng, sid)
            warm.append(time.perf_counter() - t)
            gc_time.append(meter.seconds)
            gc_runs.append(tuple(meter.collections))
            t = time.perf_counter()
            floor_render(table, head, root, enc)
            floor.append(time.perf_counter() - t)
    warm_med, floor_med, gc_med = statistics.median(warm), statistics.median(floor), statistics.median(gc_time)
    gens = [statistics.median(g[i] for g in gc_runs) for i in range(3)]

    # the same render with the cyclic GC off (collected between runs, not timed)
    nogc = []
    for _ in range(args.runs):
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            render(eng, sid)
            nogc.append(time.perf_counter() - t)
        finally:
            gc.enable()
    nogc_med = statistics.median(nogc)

    # phase split (GC off): the steps ContextService.render composes, one by one
    phases = phase_split(eng, sid, head, tokenizer, args.runs)

    print(
        f"\nhead {head}: chain {chain_len:,} of {len(graph.nodes):,} nodes → {n_messages:,} openai messages, "
        f"{len(ours_bytes) / 1e6:.1f} MB JSON, {total_tokens:,} tokens ({tok_name}); floor output byte-identical: "
        f"{'yes' if same else 'NO'}",
        flush=True,
    )
    print(f"  cold render      {ms(cold_med)} (median of {args.cold}; fresh EngineCore)"
          f" — of which graph load ≈ {ms(t_graph)}, token-count load ≈ {ms(t_tokens)}")
    print(f"  warm render      {ms(warm_med)} (median of {args.runs}); cyclic GC inside it {ms(gc_med)} "
          f"(collections per render: gen0 {gens[0]:.0f}, gen1 {gens[1]:.0f}, gen2 {gens[2]:.0f})")
    print(f"  warm, GC off     {ms(nogc_med)}")
    print("  phases (GC off): " + ", ".join(f"{k} {ms(v)}" for k, v in phases.items()))
    print(f"  floor            {ms(floor_med)} (dict walk + msgspec encode)")

    prof_lines: dict[str, list[str]] = {}
    if args.profile:
        # GC off while profiling: a collection would be billed to whichever function
        # happened to allocate when it ran (its share is measured above).
        def profiled(e: EngineCore) -> cProfile.Profile:
            prof = cProfile.Profile()
            gc.collect()
            gc.disable()
            try:
                prof.enable()
                render(e, sid)
                prof.disable()
            finally:
                gc.enable()
            return prof

        prof = profiled(eng)
        prof_lines["warm render (GC off), top 12 by cumulative time"] = top_functions(prof, 12)
        prof_lines["warm render (GC off), top 12 by own time"] = top_functions(prof, 12, key="tottime")
        fresh = open_engine(path)
        prof = profiled(fresh)
        fresh.close()
        del fresh
        gc.collect()
        prof_lines["cold render (GC off), top 12 by cumulative time"] = top_functions(prof, 12)

    # ---- export for upstream (same head, the graph as stored)
    export = Path(tmp) / "graph.json"
    export.write_bytes(enc.encode({
        "sessionId": sid, "root": root, "head": head,
        "ours": {"messages": n_messages, "chain": chain_len},
        "nodes": graph.by_seq,
    }))

    # ---- end to end through a real daemon subprocess
    print(f"\nend to end: {args.calls} context/render calls through `dagctx serve` …", flush=True)
    e2e = asyncio.run(end_to_end(path, sid, args.calls))
    print(f"  spawn+initialize {ms(e2e['spawn'])}; first call {ms(e2e['cold'])}; "
          f"p50 {ms(e2e['p50'])}, p95 {ms(e2e['p95'])} ({e2e['bytes'] / 1e6:.1f} MB of messages per answer)")

    # ---- incremental: one more turn, then render the new head on the warm engine;
    # each round also renders the same head cold (fresh EngineCore) for the ratio
    print(f"\nincremental: {args.incremental} × (append user + llm + tool call, render; cold render) …", flush=True)
    inc, inc_cold, inc_gc = [], [], []
    h = head
    meter = GcMeter()
    render(eng, sid, use_cache=True)  # the daemon's steady state: the last render of the branch is cached
    for i in range(args.incremental):
        u = asyncio.run(eng.node_append(NodeAppendParams(session_id=sid, node=NodeInput(
            role="user", id=f"inc{i}.u", output=f"再检查一下 src/app_{i}.py please", predecessor=h))))
        a = asyncio.run(eng.node_append(NodeAppendParams(session_id=sid, node=NodeInput(
            role="llm", id=f"inc{i}.a", name=MODEL, output="Let me read it.", predecessor=u.head))))
        asyncio.run(eng.node_append(NodeAppendParams(session_id=sid, node=NodeInput(
            role="code", id=f"inc{i}.t", name="read_file", input={"path": f"src/app_{i}.py"},
            output="def main():\n    return 0\n" * 20, caller=a.node.id, metadata={"toolCallId": f"call_inc_{i}"}))))
        h = a.head
        with meter:
            meter.reset()
            t = time.perf_counter()
            rr = render(eng, sid, use_cache=True)
            inc.append(time.perf_counter() - t)
        inc_gc.append(meter.seconds)
        assert rr.view.head == h
        stable, n_msgs = rr.stable.messages, len(rr.messages)
        del rr  # hold no rendering across rounds: its objects would weigh on the next render's GC
        inc_cold.append(cold_render(path, sid))
    inc_med, inc_cold_med = statistics.median(inc), statistics.median(inc_cold)
    print(f"  render after append {ms(inc_med)} (median of {args.incremental}; GC inside it "
          f"{ms(statistics.median(inc_gc))}); cold render of the same head "
          f"{ms(inc_cold_med)}; stable prefix {stable:,} of {n_msgs:,} messages")
    eng.close()

    # ---- upstream
    up: dict[str, Any] = {"error": "skipped (--no-upstream)"}
    if not args.no_upstream:
        print("\nupstream: OpenProgram in a throw-away venv …", flush=True)
        up = upstream(export, args.venv, args.runs, tmp)
        if "error" in up:
            print(f"upstream: unavailable ({up['error']})")
        else:
            print(f"  openprogram {up.get('version')} ({up['note']}); python {up.get('python')}")
            for name, p in up["paths"].items():
                same_roles = "same" if p.get("roleSeq") == role_seq else "different"
                print(f"  {name:5} {p['what']}\n        first {ms(p['first'])}, median {ms(p['median'])} "
                      f"→ {p['messages']:,} messages, {same_roles} role sequence as ours ({p['note']})")

    # ---- table
    rows: list[tuple[str, str, str, str]] = [
        ("in-daemon render, warm", ms(warm_med), f"GC {gc_med / warm_med:.0%} of it", ""),
        ("in-daemon render, warm, GC off", ms(nogc_med), "", ""),
        ("in-daemon render, cold", ms(cold_med), "", ""),
        ("floor (dict walk + encode)", ms(floor_med), "", ""),
        ("warm / floor", "", f"{warm_med / floor_med:.2f}×", "≤ 3×"),
        ("warm GC off / floor", "", f"{nogc_med / floor_med:.2f}×", ""),
        ("cold / floor", "", f"{cold_med / floor_med:.2f}×", ""),
        ("end to end p50", ms(e2e["p50"]), f"{e2e['p50'] / warm_med:.2f}× warm", ""),
        ("end to end p50 / floor", "", f"{e2e['p50'] / floor_med:.2f}×", "≤ 3×"),
        ("end to end p95", ms(e2e["p95"]), "", ""),
        ("render after one appended turn", ms(inc_med), f"{inc_med / inc_cold_med:.0%} of cold", "≤ 10 %"),
        ("", "", f"{inc_med / warm_med:.0%} of warm", ""),
    ]
    if "error" not in up:
        for name, p in up["paths"].items():
            rows.append((f"upstream {name}", ms(p["median"]), f"ours warm / it = {warm_med / p['median']:.2f}×", ""))
            rows.append(("", "", f"ours cold / it = {cold_med / p['median']:.2f}×", ""))
    else:
        rows.append(("upstream", "unavailable", "", ""))
    print("\n" + "-" * 86)
    print(f"{'measure':34} {'time':>14}  {'ratio':26} {'goal':>8}")
    print("-" * 86)
    for a, b, c, d in rows:
        print(f"{a:34} {b:>14}  {c:26} {d:>8}")
    print("-" * 86)
    print(f"{info['nodes']:,} nodes; head chain {chain_len:,}; {n_messages:,} messages; format {FMT}, model {MODEL}")
    for title, lines in prof_lines.items():
        print(f"\n{title}:")
        for ln in lines:
            print("  " + ln)


if __name__ == "__main__":
    main()
