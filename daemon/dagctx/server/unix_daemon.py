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
import threading
import time
from typing import Any

from dagctx.engine.config import DaemonConfig
from dagctx.engine.shared import EngineShared

from .hub import Hub
from .jsonrpc_server import DagctxProtocol, DagctxServer
from .pipe_reader import CHUNK, PipeReader

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
    """pygls-style writer onto one connection's transport, bounded.

    ``write_now`` lets a worker thread write a finished answer itself (the caller holds
    the connection's output lock, which every write takes): straight to the descriptor
    when the transport has nothing queued, through a duplicate of it that only this
    writer closes (``release``), so a descriptor the loop closed meanwhile is never
    written to. What the descriptor does not take at once is queued on the transport by
    the loop before anything written after it."""

    def __init__(self, transport: asyncio.WriteTransport, limit: int, on_overflow: Any) -> None:
        self.transport = transport
        self.limit = limit
        self.on_overflow = on_overflow
        self.loop = asyncio.get_running_loop()
        #: the connection's output lock (``DagctxProtocol.set_writer`` hands it over)
        self.out_lock: Any = threading.RLock()
        #: bytes ``write_now`` could not write at once: the loop queues them first
        self._rest: list[bytes] = []
        self._fd = -1
        self._lock = threading.Lock()  # guards ``_fd`` against ``release``
        extra = transport.get_extra_info("pipe") or transport.get_extra_info("socket")
        try:
            self._fd = os.dup(extra.fileno())
        except (AttributeError, OSError, ValueError):
            self._fd = -1

    def write(self, data: bytes) -> None:
        if self.transport.is_closing():
            raise BrokenPipeError("the connection is closed")
        if self._rest:
            self._flush_rest()
        self.transport.write(data)
        # one whole answer (up to the frame limit) always fits beside what is queued
        if self.transport.get_write_buffer_size() > self.limit + len(data):
            self.on_overflow(self.transport.get_write_buffer_size())

    def buffered(self) -> int:
        """Bytes written to the client that it has not read yet (queued here or on the
        transport)."""
        return self.transport.get_write_buffer_size() + sum(map(len, self._rest))

    def write_now(self, data: bytes) -> bool:
        """From a worker, under the connection's output lock: True when ``data`` is written
        (or its unwritten end queued for the loop); False when the loop must write it."""
        with self._lock:
            if self._fd < 0 or self._rest or self.transport.is_closing() or self.transport.get_write_buffer_size():
                return False
            try:
                n = os.write(self._fd, data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return False
        if n < len(data):
            self._rest.append(data[n:])
            self.loop.call_soon_threadsafe(self._flush_posted)
        return True

    def _flush_rest(self) -> None:
        rest, self._rest = self._rest, []
        for chunk in rest:
            self.transport.write(chunk)

    def _flush_posted(self) -> None:
        with self.out_lock:
            if self._rest and not self.transport.is_closing():
                self._flush_rest()

    def release(self) -> None:
        """The transport is gone (or replaced): close the duplicate descriptor."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        self.transport.close()
        self.release()


#: Handed-off connections still writing their last answers and closing frame: a
#: stopping daemon waits for them (bounded) before it exits.
FLUSHING: set[asyncio.Future[None]] = set()
#: The forwarder's closing frame, as it recognises it (``forward.CLOSING_MARK``).
CLOSING_MARK = b'"$/dagctx/closing"'
#: Seconds the client's stdout gets to take the last answers before a handed-off
#: connection is closed anyway.
FLUSH_SECONDS = 10.0
#: Sent on a handed-off connection's socket once the daemon has the client's pipes, before
#: it reads them (``$/dagctx/attached``): until then the forwarder keeps them.
ATTACHED = b'Content-Length: 46\r\n\r\n{"jsonrpc":"2.0","method":"$/dagctx/attached"}'



class _ClientOut(asyncio.BaseProtocol):
    """The client's stdout, handed off by its forwarder: answers out."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn.handoff_writer is not None:
            self.conn.handoff_writer.release()
        if not self.lost.done():
            self.lost.set_result(None)
        if exc is not None:  # the client's end is closed: it is gone
            self.conn.client_gone()


class HandoffWriter(SocketWriter):
    """Answers onto the client's own stdout; the closing frame goes to the forwarder's
    socket instead, once every answer before it is out (SPEC §1.3)."""

    def __init__(self, transport: asyncio.WriteTransport, limit: int, on_overflow: Any, conn: Connection) -> None:
        super().__init__(transport, limit, on_overflow)
        self.conn = conn

    def write(self, data: bytes) -> None:
        if len(data) < 400 and CLOSING_MARK in data:
            end = data.find(b"\r\n\r\n")
            if end >= 0 and CLOSING_MARK in data[end + 4 : end + 68]:
                self.conn.closing = data
                return
        super().write(data)


class Connection(asyncio.Protocol):
    """One accepted socket ↔ one ``DagctxProtocol``.

    The socket's first read may carry the client's stdin and stdout (``SCM_RIGHTS``),
    handed off by a forwarder (SPEC §1.3): then the frames travel on those pipes and
    the socket only carries the closing frame, and its end tells the forwarder died."""

    def __init__(self, hub: Hub, config: DaemonConfig, max_queue: int) -> None:
        self.hub = hub
        self.config = config
        self.max_queue = max_queue
        self.proto: DagctxProtocol | None = None
        self.transport: asyncio.Transport | None = None
        self._peek: socketlib.socket | None = None
        #: the client's pipes once handed off
        self.pipe_in: PipeReader | None = None
        self.pipe_out: asyncio.WriteTransport | None = None
        self.out_proto: _ClientOut | None = None
        #: the closing frame of a handed-off connection, sent on the socket last
        self.closing: bytes | None = None
        #: the writers onto the socket and the client's stdout (their descriptors' duplicates
        #: are closed when their transports are gone)
        self.socket_writer: SocketWriter | None = None
        self.handoff_writer: HandoffWriter | None = None
        self._ending = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if isinstance(getattr(transport, "max_size", None), int):  # asyncio's selector transport
            transport.max_size = CHUNK  # type: ignore[attr-defined]  # not its 256 KiB recv (pipe_reader.CHUNK)
        proto: DagctxProtocol = DagctxServer(self.config, self.hub).protocol  # type: ignore[assignment]
        self.proto = proto
        self.socket_writer = SocketWriter(transport, self.max_queue, self._overflow)
        proto.set_writer(self.socket_writer)
        proto.on_finish = self._finished
        log.info("connection %s opened", proto.connection_id)
        # The first read is ours: it may carry file descriptors, which a transport's
        # recv() would drop. The transport reads everything after it.
        sock = transport.get_extra_info("socket")
        try:
            self._peek = socketlib.fromfd(sock.fileno(), socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        except (OSError, AttributeError):
            return
        transport.pause_reading()
        asyncio.get_running_loop().add_reader(self._peek.fileno(), self._first_read)

    def _first_read(self) -> None:
        peek = self._peek
        assert peek is not None and self.transport is not None
        try:
            data, fds, _, _ = socketlib.recv_fds(peek, 1 << 20, 2)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        loop = asyncio.get_running_loop()
        loop.remove_reader(peek.fileno())
        peek.close()
        self._peek = None
        if data:
            self.data_received(data)
        if len(fds) == 2 and self.proto is not None and self.proto.exit_code is None:
            asyncio.ensure_future(self._take_over(fds[0], fds[1]))
        else:
            for fd in fds:
                os.close(fd)
        if not self.transport.is_closing():
            self.transport.resume_reading()

    async def _take_over(self, fd_in: int, fd_out: int) -> None:
        """Serve the client on its own pipes: answers first (nothing may be read before
        there is somewhere to answer), then requests."""
        loop = asyncio.get_running_loop()
        proto = self.proto
        try:
            out_transport, out_proto = await loop.connect_write_pipe(
                lambda: _ClientOut(self), os.fdopen(fd_out, "wb", buffering=0))
            self.pipe_out, self.out_proto = out_transport, out_proto
            if proto is None or self.proto is None or self._ending:
                os.close(fd_in)
                out_transport.close()
                return
            self.handoff_writer = HandoffWriter(out_transport, self.max_queue, self._overflow, self)
            proto.set_writer(self.handoff_writer)
            # the attach frame came with the descriptors; a long one may still be arriving on
            # the socket, and the client's requests are read only after it (its database, cwd)
            deadline = loop.time() + FLUSH_SECONDS
            while proto.attach is None and not self._ending and loop.time() < deadline:
                await asyncio.sleep(0.005)
            # the forwarder holds the client's pipes until told they are taken, so that when
            # this daemon dies before reading them it can hand them to a new one (SPEC §1.3):
            # told before the first read, through the kernel (the socket's buffer is empty)
            if self._ending or self.transport is None or self.transport.is_closing():
                os.close(fd_in)
                return
            self.transport.write(ATTACHED)
            while self.transport.get_write_buffer_size() and not self._ending and loop.time() < deadline:
                await asyncio.sleep(0.005)
            # read by a thread of its own, which answers the quick reads itself (SPEC §1.4)
            reader = PipeReader(fd_in, proto.feed_in_thread, self.client_gone, self.hub.post,
                                name=f"dagctx-in-{proto.connection_id}")
            fd_in = -1  # the reader owns it now
            self.pipe_in = reader
            reader.start()
            if self._ending:
                reader.close()
        except (OSError, ValueError) as exc:
            log.warning("connection %s: cannot take over the client's stdio (%s); closing it",
                        proto.connection_id if proto else "?", exc)
            for fd in (fd_in, fd_out):
                if fd < 0:
                    continue
                try:
                    os.close(fd)
                except OSError:
                    pass
            if proto is not None:
                proto._finish(1, reason=f"the dagctx daemon could not take over this client's stdio: {exc}")

    def client_gone(self) -> None:
        """The client's stdin ended or its stdout closed: like EOF on a relayed socket."""
        if self.proto is not None:
            self.proto._finish(0)

    def _finished(self, code: int) -> None:
        """The connection ended (exit, EOF, a client gone, the daemon stopping)."""
        assert self.transport is not None
        self._ending = True
        if self.pipe_out is None:  # relayed: the closing frame went on the socket
            self.transport.close()
            return
        if self.pipe_in is not None:
            self.pipe_in.close()
        task = asyncio.ensure_future(self._flush_then_close())
        FLUSHING.add(task)
        task.add_done_callback(FLUSHING.discard)

    async def _flush_then_close(self) -> None:
        """Every answer out to the client, then the closing frame to the forwarder."""
        assert self.pipe_out is not None and self.out_proto is not None and self.transport is not None
        self.pipe_out.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.out_proto.lost), FLUSH_SECONDS)
        except asyncio.TimeoutError:
            if not self.out_proto.lost.done():
                self.pipe_out.abort()
        if self.closing is not None and not self.transport.is_closing():
            self.transport.write(self.closing)
        self.transport.close()

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
        self._abort_pipes()
        self.transport.abort()

    def _abort_pipes(self) -> None:
        self._ending = True
        if self.pipe_in is not None:
            self.pipe_in.close()  # a read pipe has nothing to drop
        if self.pipe_out is not None and self.out_proto is not None and not self.out_proto.lost.done():
            self.pipe_out.abort()

    def data_received(self, data: bytes) -> None:
        if self.proto is not None:
            self.proto.feed(data)

    def eof_received(self) -> bool | None:
        # The client closed its end (EOF, like a closed editor) — or, handed off, its
        # forwarder ended: end the connection cleanly, telling the forwarder so (it exits 0).
        if self.proto is not None:
            self.proto._finish(0)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peek is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._peek.fileno())
            except (OSError, ValueError):
                pass
            self._peek.close()
            self._peek = None
        self._abort_pipes()
        for writer in (self.socket_writer, self.handoff_writer):
            if writer is not None:
                writer.release()
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
    if FLUSHING:  # handed-off clients get their last answers before the closing frame
        await asyncio.wait(list(FLUSHING), timeout=FLUSH_SECONDS)
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
