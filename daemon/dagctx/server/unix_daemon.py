"""The per-user daemon: one engine on a Unix socket, one ``DagctxProtocol`` per connection.

``dagctx serve`` (the forwarder) starts it on demand (``dagctx daemon run``) and relays
its client's stdio here (SPEC §1). Every accepted connection has its own LSP lifecycle;
one client's ``exit`` ends that connection only. Output to a connection is queued by
its transport; a client that stops reading and lets more than ``max_queue_bytes`` pile
up is disconnected (with a log line saying so), never blocking the others.

The daemon stops on ``daemon/stop``, SIGTERM/SIGINT, or after ``idle_timeout``
seconds without a connection: it stops accepting, removes its socket, lets requests
in flight finish (bounded), tells every forwarder, and closes the stores. Writes are
committed transactions; nothing acknowledged is held in memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket as socketlib
import time
from typing import Any

from dagctx.engine.config import DaemonConfig
from dagctx.engine.shared import EngineShared

from .hub import Hub
from .jsonrpc_server import DagctxProtocol, DagctxServer

log = logging.getLogger("dagctx.server")

#: Default bytes queued for one client before it counts as not reading.
MAX_QUEUE_BYTES = 64 * 1024 * 1024
#: Default hard cap on a connection's frame limit (``DAGCTX_MAX_FRAME_CAP``): a forwarder's
#: ``--max-frame-bytes`` may lift its connection's limit up to this, never beyond.
MAX_FRAME_CAP = 256 * 1024 * 1024
#: Default seconds without any connection before the daemon exits.
IDLE_TIMEOUT = 300.0
#: Seconds in-flight requests get to finish when the daemon stops.
DRAIN_SECONDS = 10.0


class SocketWriter:
    """pygls-style writer onto one connection's transport, bounded."""

    def __init__(self, transport: asyncio.WriteTransport, limit: int, on_overflow: Any) -> None:
        self.transport = transport
        self.limit = limit
        self.on_overflow = on_overflow

    def write(self, data: bytes) -> None:
        if self.transport.is_closing():
            raise BrokenPipeError("the connection is closed")
        self.transport.write(data)
        # one whole answer (up to the frame limit) always fits beside what is queued
        if self.transport.get_write_buffer_size() > self.limit + len(data):
            self.on_overflow(self.transport.get_write_buffer_size())

    def close(self) -> None:
        self.transport.close()


class Connection(asyncio.Protocol):
    """One accepted socket ↔ one ``DagctxProtocol``."""

    def __init__(self, hub: Hub, config: DaemonConfig, max_queue: int) -> None:
        self.hub = hub
        self.config = config
        self.max_queue = max_queue
        self.proto: DagctxProtocol | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        proto: DagctxProtocol = DagctxServer(self.config, self.hub).protocol  # type: ignore[assignment]
        self.proto = proto
        proto.set_writer(SocketWriter(transport, self.max_queue, self._overflow))
        proto.on_finish = lambda code: transport.close()
        log.info("connection %s opened", proto.connection_id)

    def _overflow(self, queued: int) -> None:
        assert self.proto is not None and self.transport is not None
        info = self.proto.client_info
        log.warning(
            "connection %s (%s) stopped reading: %d bytes queued for it, more than the limit of %d; "
            "disconnecting it so the other clients are not held up",
            self.proto.connection_id, info.name if info else "unnamed client", queued, self.max_queue,
        )
        # dropped at once (a client that reads nothing would never let a closing frame
        # through); its forwarder finds the daemon alive and says it was dropped, not dead
        self.proto.exit_code = 1
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.proto is not None:
            self.proto.feed(data)

    def eof_received(self) -> bool | None:
        # The client closed its end (EOF, like a closed editor): end the connection
        # cleanly, telling the forwarder so (it exits 0).
        if self.proto is not None:
            self.proto._finish(0)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.proto is not None:
            log.info("connection %s closed", self.proto.connection_id)
            self.proto.connection_lost()
            self.proto = None


def _listening(path: str) -> bool:
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def run_daemon(
    socket_path: str,
    *,
    idle_timeout: float | None = IDLE_TIMEOUT,
    max_queue_bytes: int = MAX_QUEUE_BYTES,
    max_frame_bytes: int = 64 * 1024 * 1024,
    log_path: str | None = None,
    max_frame_cap: int = MAX_FRAME_CAP,
) -> int:
    """Serve every client of this user on ``socket_path`` until stopped; the exit code."""
    config = DaemonConfig(max_frame_bytes=min(max_frame_bytes, max_frame_cap), shared=True,
                          max_frame_cap=max_frame_cap)
    try:
        return asyncio.run(_serve(socket_path, config, idle_timeout, max_queue_bytes, log_path))
    except KeyboardInterrupt:
        return 130


async def _serve(path: str, config: DaemonConfig, idle_timeout: float | None, max_queue: int,
                 log_path: str | None) -> int:
    loop = asyncio.get_running_loop()
    if os.path.exists(path):
        if _listening(path):
            log.warning("another dagctx daemon already listens on %s; exiting", path)
            return 0
        os.unlink(path)  # stale (its daemon was killed)
    hub = Hub(EngineShared(), mode="shared", socket=path, log_path=log_path, idle_timeout=idle_timeout)
    old_umask = os.umask(0o177)
    try:
        server = await loop.create_unix_server(lambda: Connection(hub, config, max_queue), path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    pid_file = path[: -len(".sock")] + ".pid" if path.endswith(".sock") else path + ".pid"
    with open(pid_file, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "socket": path, "startedAt": time.time(), "log": log_path}, f)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, hub.request_stop, f"signal {signal.Signals(sig).name}")
    hub.start()
    log.warning("dagctx daemon %d listening on %s", os.getpid(), path)
    assert hub.stopped is not None
    why = await hub.stopped
    # Stop accepting and free the name first: the next client starts a fresh daemon.
    server.close()
    for p in (path, pid_file):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    await _drain(hub)
    for conn in list(hub.connections.values()):
        conn._finish(1, reason=f"the dagctx daemon stopped ({why})")
    await asyncio.sleep(0)  # let the transports flush and close
    await hub.close()
    log.warning("dagctx daemon %d stopped", os.getpid())
    return 0


async def _drain(hub: Hub) -> None:
    """Let requests in flight finish (a compaction waiting on a client is bounded)."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        pending = [f for c in hub.connections.values() for f in c._request_futures.values() if not f.done()]
        if not pending:
            return
        await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
