"""``dagctx serve``: a thin forwarder from the client's stdio to the per-user daemon.

The editor (or agent, or CLI) still spawns ``dagctx serve`` and speaks JSON-RPC on its
stdio; this process connects to the user's daemon (starting it when there is none,
``dagctx.protocol.transport``) and sends one ``$/dagctx/attach`` frame naming the client's
working directory and database — the daemon's environment is not the client's (SPEC §1.3).

When the client's stdin and stdout are pipes or sockets (an editor, an agent, a test
harness), the attach frame carries them (``SCM_RIGHTS``): the daemon reads and writes
the client's own pipes, and every request skips this process — two hops and two copies
fewer per round trip. This process then only waits on the socket for the closing frame.
Otherwise (a terminal, a file) it relays bytes both ways.

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
import stat
import sys
import threading
import time

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


#: Bytes read per system call, each way.
CHUNK = 1 << 18
#: A body at most this long is held until complete (it may be the closing frame); longer
#: ones are passed on piece by piece as they arrive.
SMALL_BODY = 256


#: Bytes of the client's input kept while the daemon has not answered, to send again to a
#: new daemon when the one reached dies before its first answer; past it nothing is kept.
REPLAY_LIMIT = 1 << 20


class _Inbound:
    """Client stdin → daemon (relayed), through one reused buffer (no copy of ours); at EOF
    half-close so the daemon sees the client go.

    Until the daemon's first byte (``answered``) what was sent is kept as well (``replay``,
    at most ``REPLAY_LIMIT`` bytes): a daemon that dies before answering — it ran nothing —
    is replaced, and ``move_to`` sends the new one the attach frame and all of it again.
    A send that fails meanwhile waits for that move (or for the end of the process)."""

    def __init__(self, fd: int, sock: socket.socket) -> None:
        self.fd = fd
        self.sock = sock
        self.moved = threading.Condition()
        self.replay: bytearray | None = bytearray()
        self.eof = False

    def answered(self) -> None:
        self.replay = None  # no lock: a reference dropped; the reader keeps no copy after it

    def run(self) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            try:
                n = os.readv(self.fd, [buf])
            except OSError:
                n = 0
            with self.moved:
                if not n:
                    self.eof = True
                    self._half_close()
                    return
                kept = self.replay
                if kept is not None:
                    if len(kept) + n <= REPLAY_LIMIT:
                        kept += view[:n]
                    else:
                        self.replay = kept = None
                try:
                    self.sock.sendall(view[:n])
                except OSError:
                    if kept is None:
                        self._half_close()
                        return
                    # the daemon went before answering: these bytes are kept, and go to its successor
                    sock = self.sock
                    self.moved.wait_for(lambda: self.sock is not sock)

    def move_to(self, sock: socket.socket, attach: bytes) -> None:
        """Go on with a new daemon: the attach frame, then everything sent to the one before."""
        with self.moved:
            self.sock = sock
            try:
                sock.sendall(attach + bytes(self.replay or b""))
                if self.eof:
                    self._half_close()
            except OSError:
                pass  # this one went too: the caller sees its end
            self.moved.notify_all()

    def _half_close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _content_length(header: bytes) -> int | None:
    length = None
    for line in header.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                length = None
    return length


class _Outbound:
    """Daemon → client stdout: frames pass through as they arrive, the closing frame is
    caught. Headers and small bodies are held until complete; a large body is written
    piece by piece straight from the receive buffer, so every byte is copied once into
    this process and once out of it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.head = bytearray()  # a header split across reads
        self.header = b""  # the header of the small body being held
        self.small: bytearray | None = None
        self.remaining = 0
        self.closing: dict | None = None

    def feed(self, data: bytes | bytearray, n: int | None = None) -> None:
        """The first ``n`` bytes of ``data`` (all of it by default) came from the daemon."""
        mv = memoryview(data)
        n = len(data) if n is None else n
        out: list[bytes | memoryview] = []
        i = 0
        while i < n:
            if self.remaining:
                take = min(self.remaining, n - i)
                if self.small is not None:
                    self.small += mv[i : i + take]
                else:
                    out.append(mv[i : i + take])
                self.remaining -= take
                i += take
                if not self.remaining and self.small is not None:
                    self._small_done(out)
                continue
            if self.head:
                held = len(self.head)
                self.head += mv[i:n]
                end = self.head.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.head) > 65536:  # not ours to judge: pass it on as it is
                        out.append(bytes(self.head))
                        self.head.clear()
                    break
                header = bytes(self.head[: end + 4])
                i += end + 4 - held
                self.head.clear()
            else:
                end = data.find(b"\r\n\r\n", i, n)
                if end < 0:
                    self.head += mv[i:n]
                    break
                header = bytes(mv[i : end + 4])
                i = end + 4
            length = _content_length(header[:-4])
            if length is None:
                out.append(header)
            elif length <= SMALL_BODY:
                self.header, self.small, self.remaining = header, bytearray(), length
                if not length:
                    self._small_done(out)
            else:
                out.append(header)
                self.remaining = length
        if out:
            self._write(out)

    def _small_done(self, out: list[bytes | memoryview]) -> None:
        body = bytes(self.small or b"")
        self.small = None
        if CLOSING_MARK in body[:64]:
            try:
                self.closing = json.loads(body).get("params") or {}
            except ValueError:
                self.closing = {}
        else:
            out.append(self.header + body)

    def _write(self, chunks: list[bytes | memoryview]) -> None:
        if self.fd < 0:  # handed off: the client's stdout is the daemon's to write
            return
        while chunks:
            n = os.writev(self.fd, chunks[:512])
            while chunks and n >= len(chunks[0]):
                n -= len(chunks[0])
                chunks.pop(0)
            if n:
                chunks[0] = memoryview(chunks[0])[n:]


def _handoff_fds() -> tuple[int, int] | None:
    """The client's stdin and stdout, when the daemon can take them over (SPEC §1.3):
    both pipes or sockets, and two different ones. A terminal, a file or one socket on
    both (and ``DAGCTX_HANDOFF=0``) are relayed by this process instead."""
    if os.environ.get("DAGCTX_HANDOFF", "1") == "0" or not hasattr(socket, "send_fds"):
        return None
    try:
        fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
        st_in, st_out = os.fstat(fd_in), os.fstat(fd_out)
    except (OSError, ValueError, AttributeError):
        return None
    for st in (st_in, st_out):
        if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
            return None
    if os.path.samestat(st_in, st_out):
        return None
    return fd_in, fd_out


def _let_go(fds: tuple[int, int]) -> None:
    """After the hand-off this process holds the client's pipes no longer: the client sees
    its stdout end when the daemon closes it, and its stdin is read by the daemon only."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in fds:
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def run_forwarder(database: str | None, max_frame_bytes: int | None = None) -> int:
    """Relay this process's stdio to the per-user daemon; the exit code for the client.

    A daemon that dies before its first byte to this connection (killed while this process
    connected: the kernel still queues connections to a dying daemon's socket) ran none of
    the client's requests — its answer to ``initialize`` comes first, and with the client's
    pipes handed off, ``$/dagctx/attached`` comes before it reads them. When its process is
    gone this process connects again (a new daemon starts) and hands over the pipes again,
    or sends what it relayed again, at most ``transport.HANDSHAKE_ATTEMPTS`` times (SPEC
    §1.3). A daemon that still runs, or whose pid cannot be read, is never tried again."""
    try:
        sock_path = transport.socket_path()
    except OSError as exc:  # DaemonUnavailable too: its runtime folder is not the user's
        _say(str(exc) if isinstance(exc, transport.DaemonUnavailable) else f"cannot reach the dagctx daemon: {exc}")
        return 1
    attach = _frame({
        "jsonrpc": "2.0",
        "method": "$/dagctx/attach",
        "params": {
            "cwd": os.getcwd(),
            "database": transport.client_database(database),
            "pid": os.getppid(),
            "env": dict(os.environ),
            **({"maxFrameBytes": max_frame_bytes} if max_frame_bytes else {}),
        },
    })
    fds = _handoff_fds()
    inbound: _Inbound | None = None
    out = _Outbound(-1 if fds is not None else sys.stdout.fileno())  # nothing fed before an answer
    buf = bytearray(CHUNK)
    attempt = 0
    while True:
        attempt += 1
        try:
            sock = transport.connect_or_start(sock_path)
        except transport.DaemonUnavailable as exc:
            _say(str(exc))
            return 1
        except OSError as exc:
            _say(f"cannot reach the dagctx daemon: {exc}")
            return 1
        pid = transport.peer_pid(sock, sock_path)
        try:
            if fds is not None:
                # The daemon reads the client's stdin and writes its stdout itself: this
                # process only waits for the closing frame (or the daemon's death) on the
                # socket, and lets the pipes go once the daemon says it has them.
                socket.send_fds(sock, [attach], list(fds))
            elif inbound is None:
                sock.sendall(attach)
                inbound = _Inbound(sys.stdin.fileno(), sock)
                threading.Thread(target=inbound.run, daemon=True).start()
            else:
                inbound.move_to(sock, attach)
        except OSError:
            pass  # a daemon gone already: its end shows below
        heard = False
        try:
            while True:
                n = sock.recv_into(buf)
                if not n:
                    break
                if not heard:
                    heard = True
                    if fds is not None:
                        _let_go(fds)
                    elif inbound is not None:
                        inbound.answered()
                out.feed(buf, n)  # written out before the buffer is reused
        except ConnectionResetError:
            pass
        except BrokenPipeError:
            return 0  # the client went away first
        finally:
            sock.close()
        if heard or (inbound is not None and inbound.replay is None):
            break  # the daemon answered (or more was sent than is kept): never sent again
        gone = transport.daemon_gone(pid)
        if not gone or attempt >= transport.HANDSHAKE_ATTEMPTS:
            _say(transport.died_before_answering(sock_path, attempt, pid, gone))
            return 1
    if out.closing is None:
        time.sleep(0.3)  # a killed daemon's listening socket closes a moment after its streams
        try:
            alive = transport.try_connect(sock_path)
        except Exception:  # noqa: BLE001 - unsure: say what we know
            alive = None
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
