"""``dagctx daemon run|status|stop``: operate the per-user daemon (SPEC §1.6).

``run`` is what a forwarder starts (detached); ``status`` and ``stop`` talk to a running
daemon over its socket and never start one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = float(raw)
    return None if value <= 0 else value


def cmd_run(args: argparse.Namespace) -> int:
    import logging

    from dagctx.protocol import transport
    from dagctx.server import run_daemon

    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, (args.log_level or os.environ.get("DAGCTX_LOG_LEVEL") or "WARNING").upper(), 30),
        format="%(asctime)s dagctx %(levelname)s %(name)s: %(message)s",
    )
    sock = args.socket or transport.socket_path()
    idle = args.idle_timeout if args.idle_timeout is not None else _env_float("DAGCTX_IDLE_TIMEOUT", 300.0)
    queue = args.max_queue_bytes or int(os.environ.get("DAGCTX_MAX_QUEUE_BYTES") or 0) or None
    cap = int(os.environ.get("DAGCTX_MAX_FRAME_CAP") or 0) or None
    return run_daemon(socket_path=sock, idle_timeout=idle if idle and idle > 0 else None,
                      max_queue_bytes=queue, log_path=transport.log_path(sock), max_frame_cap=cap)


async def _ask(method: str, sock: str | None) -> Any:
    from dagctx.client import DagctxClient

    client = await DagctxClient.connect(socket_path=sock, start=False, initialize=False)
    try:
        return await client.request(method, timeout=15)
    finally:
        await client.wait(2.0) if method == "daemon/stop" else client._writer.close()


def _no_daemon(sock: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"running": False, "socket": sock}))
    else:
        print(f"no dagctx daemon is running for you (socket {sock}); `dagctx serve` starts one", file=sys.stderr)
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    import asyncio

    import msgspec

    from dagctx.protocol import transport

    sock = args.socket or transport.socket_path()
    try:
        st = asyncio.run(_ask("daemon/status", sock))
    except (transport.DaemonUnavailable, ConnectionError, FileNotFoundError):
        return _no_daemon(sock, args.json)
    if args.json:
        print(json.dumps({"running": True, **msgspec.to_builtins(st)}, indent=2))
        return 0
    up = st.uptime_seconds
    print(f"dagctx daemon {st.version} (protocol {st.protocol_version}), pid {st.pid}, up {up:.0f} s")
    print(f"  socket    {st.socket}")
    print(f"  log       {st.log}")
    idle = f"{st.idle_timeout_seconds:g} s" if st.idle_timeout_seconds else "never"
    print(f"  idle exit {idle}")
    mib = 1024 * 1024
    mem = st.memory
    print(f"  memory    {mem.rss_bytes / mib:.0f} MiB resident (peak {mem.peak_rss_bytes / mib:.0f} MiB, "
          f"at start {mem.baseline_rss_bytes / mib:.0f} MiB; session caches bounded at "
          f"{mem.cache_limit_bytes / mib:.0f} MiB)")
    print(f"  queue     {st.queue.queued} waiting, {st.queue.running} running ({st.queue.threads} threads)")
    print(f"  databases {len(st.databases)}")
    for d in st.databases:
        print(f"    {d}")
    for cache in st.caches:
        idle = f", unused for {cache.idle_seconds:.0f} s" if cache.idle_seconds is not None else ""
        print(f"    cached: {cache.sessions} sessions ({cache.nodes} nodes, {cache.bytes / mib:.1f} MiB), "
              f"{cache.renders} renders, "
              f"{cache.users} clients{idle} — {cache.database}")
    print(f"  clients   {len(st.clients)}")
    for c in st.clients:
        who = f"{c.name or 'unnamed'}" + (f" {c.version}" if c.version else "")
        extra = f" pid {c.pid}" if c.pid else ""
        sessions = f", watching {', '.join(s[:12] for s in c.sessions)}" if c.sessions else ""
        print(f"    {c.connection_id}: {who}{extra}, db {c.database or '(not initialized)'}, "
              f"{c.in_flight} in flight{sessions}")
    for w in st.warnings:
        print(f"  warning   {w}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    import asyncio

    from dagctx.protocol import transport

    sock = args.socket or transport.socket_path()
    try:
        res = asyncio.run(_ask("daemon/stop", sock))
    except (transport.DaemonUnavailable, ConnectionError, FileNotFoundError):
        return _no_daemon(sock, False)
    deadline = time.monotonic() + 15
    while os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"stopped the dagctx daemon ({res.connections} connection(s) were open)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("daemon", help="the shared per-user daemon: status, stop (run is what `serve` starts)")
    dsub = d.add_subparsers(dest="daemon_command", required=True)
    r = dsub.add_parser("run", help="run the per-user daemon in the foreground on its Unix socket")
    r.add_argument("--socket", help="socket path (default: the per-user path `daemon status` shows)")
    r.add_argument("--idle-timeout", type=float, help="seconds without clients before exiting "
                   "(default $DAGCTX_IDLE_TIMEOUT or 300; 0 = never)")
    r.add_argument("--max-queue-bytes", type=int, help="bytes queued for a client that stops reading before it is "
                   "disconnected (default $DAGCTX_MAX_QUEUE_BYTES or 64 MiB)")
    r.add_argument("--log-level", default=argparse.SUPPRESS, help="default $DAGCTX_LOG_LEVEL or WARNING")
    r.set_defaults(func=cmd_run)
    s = dsub.add_parser("status", help="pid, uptime, version, socket, databases and connected clients")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.add_argument("--socket", help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_status)
    t = dsub.add_parser("stop", help="stop the daemon after in-flight writes finish")
    t.add_argument("--socket", help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_stop)
