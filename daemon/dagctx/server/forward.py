"""``dagctx serve``: a thin forwarder from the client's stdio to the per-user daemon.

The editor (or agent, or CLI) still spawns ``dagctx serve`` and speaks JSON-RPC on its
stdio; this process connects to the user's daemon (starting it when there is none,
``dagctx.protocol.transport``), sends one ``$/dagctx/attach`` frame naming the client's
working directory and database — the daemon's environment is not the client's — and
then relays bytes both ways (SPEC §1.3).

Towards the client it reads frame boundaries only, to swallow the daemon's last frame,
``$/dagctx/closing {code}``: the forwarder exits with that code (0 after
``shutdown`` + ``exit``, 1 for ``exit`` alone, as a standalone daemon would). A stream
that ends without it means the daemon died: the forwarder says so on stderr and exits 1
— never a hang.

Imports nothing heavy (no pygls, lsprotocol, tiktoken, sqlite, msgspec, asyncio): its
start-up is close to a bare Python start.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

from dagctx.protocol import transport

CLOSING_MARK = b'"$/dagctx/closing"'


def _frame(obj: dict) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"dagctx serve: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _pump_in(sock: socket.socket, fd: int) -> None:
    """Client stdin → daemon; at EOF half-close so the daemon sees the client go."""
    try:
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class _Outbound:
    """Daemon → client stdout, passing frames through and catching the closing frame."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.closing: dict | None = None

    def feed(self, data: bytes) -> None:
        self.buf += data
        out = bytearray()
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                break
            length = None
            for line in bytes(self.buf[:end]).split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        length = None
            if length is None:  # not ours to judge: pass it on as it is
                out += self.buf[: end + 4]
                del self.buf[: end + 4]
                continue
            total = end + 4 + length
            if len(self.buf) < total:
                break
            body = bytes(self.buf[end + 4 : total])
            if CLOSING_MARK in body[:64]:
                try:
                    self.closing = json.loads(body).get("params") or {}
                except ValueError:
                    self.closing = {}
            else:
                out += self.buf[:total]
            del self.buf[:total]
        if out:
            self._write(bytes(out))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


def run_forwarder(database: str | None, max_frame_bytes: int | None = None) -> int:
    """Relay this process's stdio to the per-user daemon; the exit code for the client."""
    try:
        sock = transport.connect_or_start()
    except transport.DaemonUnavailable as exc:
        _say(str(exc))
        return 1
    except OSError as exc:
        _say(f"cannot reach the dagctx daemon: {exc}")
        return 1
    attach = {
        "jsonrpc": "2.0",
        "method": "$/dagctx/attach",
        "params": {
            "cwd": os.getcwd(),
            "database": transport.client_database(database),
            "pid": os.getppid(),
            "env": dict(os.environ),
            **({"maxFrameBytes": max_frame_bytes} if max_frame_bytes else {}),
        },
    }
    sock.sendall(_frame(attach))
    threading.Thread(target=_pump_in, args=(sock, sys.stdin.fileno()), daemon=True).start()
    out = _Outbound(sys.stdout.fileno())
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                break
            out.feed(data)
    except ConnectionResetError:
        pass
    except BrokenPipeError:
        return 0  # the client went away first
    finally:
        sock.close()
    if out.closing is None:
        sock_path = transport.socket_path()
        alive = transport.try_connect(sock_path)
        if alive is not None:  # it lives: it dropped this connection (the log says why)
            alive.close()
            _say("the dagctx daemon dropped this connection without saying why (it is still running; "
                 f"requests in flight got no answer) — its log: {transport.log_path(sock_path)}")
            return 1
        _say("the dagctx daemon closed the connection unexpectedly (it died or was killed); "
             f"requests in flight got no answer — its log: {transport.log_path(sock_path)}; "
             "the next `dagctx serve` starts a fresh daemon")
        return 1
    reason = out.closing.get("reason")
    if reason:
        _say(reason)
    return int(out.closing.get("code", 0))
