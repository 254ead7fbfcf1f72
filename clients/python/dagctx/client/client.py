"""An asyncio client for the dagctx daemon.

It spawns ``dagctx serve`` (or talks over given streams), frames messages the LSP
way, returns typed protocol Structs, answers server→client requests such as
``sampling/createMessage`` through registered handlers, and delivers notifications.

API Boundary: this package knows only ``dagctx.protocol``; it never imports the daemon.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from dagctx.protocol import codec, errors, transport
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.methods import METHODS
from dagctx.protocol.nodes import NodeInput

from .stderr_tail import StderrTail, describe_exit

_UNSET = msgspec.UNSET


class RpcError(Exception):
    """A JSON-RPC error answer. ``kind`` is the daemon's stable ``data.kind``."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data or {}
        self.kind: str | None = self.data.get("kind")


NotificationHandler = Callable[[Any], None]
RequestHandler = Callable[[Any], Awaitable[Any]]


class DagctxClient:
    """One connection to one daemon."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: Any,
        process: asyncio.subprocess.Process | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.process = process
        self._ids = itertools.count(1)
        self._pending: dict[Any, tuple[asyncio.Future[Any], Any]] = {}
        self._note_handlers: dict[str, list[NotificationHandler]] = {}
        self._req_handlers: dict[str, RequestHandler] = {}
        self.notifications: list[tuple[str, Any]] = []
        self.keep_notifications = True
        self._read_task = asyncio.ensure_future(self._read_loop())
        self.closed = asyncio.get_running_loop().create_future()
        self.initialize_result: m.InitializeResult | None = None
        #: the spawned daemon's last stderr lines (when ``spawn`` captured them)
        self.stderr_tail: StderrTail | None = None
        #: why the connection ended (set when it has)
        self.closed_reason: str | None = None
        #: the shared daemon's log file (``connect``), named when the connection ends early
        self.daemon_log: str | None = None

    # ------------------------------------------------------------ spawning

    @classmethod
    async def spawn(
        cls,
        database: str | os.PathLike[str] | None = None,
        *,
        command: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        stderr: Any = None,
        initialize: bool = True,
        initialization_options: dict[str, Any] | None = None,
        capabilities: dict[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        standalone: bool = False,
    ) -> DagctxClient:
        """Start ``dagctx serve`` as a child process and (by default) initialize it.

        ``dagctx serve`` forwards to the per-user daemon (starting it when needed);
        ``standalone=True`` (or ``DAGCTX_STANDALONE=1``) runs a private daemon instead.

        ``stderr``: where the daemon's stderr goes; by default it is read into a ring
        buffer (``stderr_tail``) so that when the daemon dies or cannot start, the
        ``ConnectionError`` quotes its last lines.
        """
        argv = list(command or [sys.executable, "-P", "-m", "dagctx.cli", "serve"])
        if database is not None:
            argv += ["--db", os.fspath(database)]
        if standalone:
            argv.append("--standalone")
        argv += list(extra_args)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr if stderr is not None else asyncio.subprocess.PIPE,
            env=env,
            limit=1 << 26,
        )
        assert proc.stdout is not None and proc.stdin is not None
        client = cls(proc.stdout, proc.stdin, proc)
        if stderr is None and proc.stderr is not None:
            client.stderr_tail = StderrTail(proc.stderr)
        if initialize:
            await client.initialize(initialization_options=initialization_options, capabilities=capabilities)
        return client

    @classmethod
    async def connect(
        cls,
        database: str | os.PathLike[str] | None = None,
        *,
        socket_path: str | None = None,
        start: bool = True,
        initialize: bool = True,
        initialization_options: dict[str, Any] | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> DagctxClient:
        """Connect straight to the per-user daemon's socket (no forwarder process),
        starting the daemon when none listens (SPEC §1.2).

        A daemon that dies before answering ``initialize`` (killed while this client
        connected: the kernel still queues connections to a dying daemon's socket) is
        connected to again, a new daemon started in its place — only when its process is
        gone, at most ``transport.HANDSHAKE_ATTEMPTS`` times. Nothing but the attach frame and
        ``initialize`` was sent to it, and a daemon runs nothing before it answers
        ``initialize``, so nothing is done twice."""
        sock_path = socket_path or transport.socket_path()
        db = os.fspath(database) if database is not None else os.environ.get("DAGCTX_DB") or None
        attach = m.AttachParams(cwd=os.getcwd(), database=transport.client_database(db), pid=os.getpid(),
                                env=dict(os.environ))
        attempt = 0
        while True:
            attempt += 1
            sock = await asyncio.to_thread(transport.connect_or_start, sock_path, start=start)
            pid = transport.peer_pid(sock, sock_path)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 26)
            client = cls(reader, writer)
            client.daemon_log = transport.log_path(sock_path)
            client.notify("$/dagctx/attach", attach)
            if not initialize:
                return client
            try:
                await client.initialize(initialization_options=initialization_options, capabilities=capabilities)
                return client
            except ConnectionError as exc:
                # no answer came: the daemon closed the connection (died, or dropped it)
                await client.wait(1.0)
                gone = await asyncio.to_thread(transport.daemon_gone, pid)
                if not gone or attempt >= transport.HANDSHAKE_ATTEMPTS:
                    raise ConnectionError(
                        f"{exc}: {transport.died_before_answering(sock_path, attempt, pid, gone)}") from exc

    # ------------------------------------------------------------ wire

    def _send(self, message: Any) -> None:
        self._writer.write(codec.encode_message(message))

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (for protocol tests)."""
        self._writer.write(data)

    async def _read_loop(self) -> None:
        try:
            while True:
                header = await self._reader.readuntil(b"\r\n\r\n")
                length = None
                for line in header.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length is None:
                    continue
                body = await self._reader.readexactly(length)
                self._dispatch(body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            raise
        finally:
            self.closed_reason = await self._why_closed()
            for fut, _ in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(self.closed_reason))
            if not self.closed.done():
                self.closed.set_result(None)

    async def _why_closed(self) -> str:
        """Why the connection ended: the exit code and last stderr lines, when known."""
        code = None
        if self.process is not None:
            try:
                code = await asyncio.wait_for(self.process.wait(), 2.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                code = self.process.returncode
        if self.stderr_tail is not None:
            await self.stderr_tail.settle()
        why = describe_exit(code, self.stderr_tail)
        return f"{why}; its log: {self.daemon_log}" if self.daemon_log else why

    def _dispatch(self, body: bytes) -> None:
        env = codec.envelope_decoder.decode(body)
        if env.method is not _UNSET:
            if env.id is not _UNSET:
                asyncio.ensure_future(self._answer(env))
            else:
                self._notify_handlers(env)
            return
        entry = self._pending.pop(env.id, None)
        if entry is None:
            return
        fut, result_type = entry
        if fut.done():
            return
        if env.error is not _UNSET and env.error is not None:
            e = env.error
            fut.set_exception(RpcError(e.get("code", 0), e.get("message", ""), e.get("data")))
            return
        raw = env.result
        if result_type is None or raw is _UNSET:
            fut.set_result(None if raw is _UNSET else msgspec.json.decode(raw))
        else:
            try:
                fut.set_result(codec.decoder_for(result_type).decode(raw))
            except msgspec.ValidationError as exc:
                fut.set_exception(exc)

    def _notify_handlers(self, env: codec.Envelope) -> None:
        spec = METHODS.get(env.method)
        raw = env.params
        try:
            params = (
                codec.decode_params(spec.params, raw)
                if spec is not None
                else (None if raw is _UNSET else msgspec.json.decode(raw))
            )
        except msgspec.ValidationError:
            params = msgspec.json.decode(raw)
        if self.keep_notifications:
            self.notifications.append((env.method, params))
        for handler in self._note_handlers.get(env.method, ()):
            handler(params)

    async def _answer(self, env: codec.Envelope) -> None:
        handler = self._req_handlers.get(env.method)
        if handler is None:
            self._send(
                codec.ErrorResponse(
                    id=env.id,
                    error=codec.ResponseError(code=errors.METHOD_NOT_FOUND, message=f"client has no handler for {env.method}"),
                )
            )
            return
        spec = METHODS.get(env.method)
        try:
            params = codec.decode_params(spec.params, env.params) if spec else msgspec.json.decode(env.params)
            result = await handler(params)
            self._send(codec.Response(id=env.id, result=result))
        except RpcError as exc:
            self._send(codec.ErrorResponse(id=env.id, error=codec.ResponseError(code=exc.code, message=exc.message)))
        except Exception as exc:
            self._send(
                codec.ErrorResponse(id=env.id, error=codec.ResponseError(code=errors.INTERNAL_ERROR, message=f"{type(exc).__name__}: {exc}"))
            )

    # ------------------------------------------------------------ public API

    def on_notification(self, method: str, handler: NotificationHandler) -> None:
        self._note_handlers.setdefault(method, []).append(handler)

    def on_request(self, method: str, handler: RequestHandler) -> None:
        """Answer a server→client request, e.g. ``sampling/createMessage``."""
        self._req_handlers[method] = handler

    def send_request(self, method: str, params: Any = None) -> tuple[Any, asyncio.Future[Any]]:
        """Send a request; return its id and a future of the typed result."""
        msg_id = next(self._ids)
        spec = METHODS.get(method)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed.done():
            fut.set_exception(ConnectionError(self.closed_reason or "the daemon closed the connection"))
            return msg_id, fut
        self._pending[msg_id] = (fut, spec.result if spec else None)
        self._send(codec.Request(method=method, id=msg_id, params=_UNSET if params is None else params))
        return msg_id, fut

    async def request(self, method: str, params: Any = None, *, timeout: float | None = 60.0) -> Any:
        _, fut = self.send_request(method, params)
        return await asyncio.wait_for(fut, timeout)

    def notify(self, method: str, params: Any = None) -> None:
        self._send(codec.Notification(method=method, params=_UNSET if params is None else params))

    def cancel(self, request_id: Any) -> None:
        self.notify("$/cancelRequest", m.CancelParams(id=request_id))

    async def initialize(
        self,
        *,
        initialization_options: dict[str, Any] | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> m.InitializeResult:
        params = {
            "processId": os.getpid(),
            "clientInfo": {"name": "dagctx-python", "version": "0.1.0"},
            "capabilities": capabilities or {},
            "initializationOptions": initialization_options or {},
        }
        result = await self.request("initialize", params)
        self.notify("initialized", {})
        self.initialize_result = result
        return result

    async def shutdown(self) -> None:
        await self.request("shutdown")

    async def close(self, timeout: float = 10.0) -> int | None:
        """shutdown + exit, then wait for the process; returns its exit code."""
        if not self.closed.done():
            try:
                await self.shutdown()
            except (ConnectionError, RpcError, asyncio.TimeoutError):
                pass  # e.g. never initialized: exit still ends the daemon (with code 1)
            try:
                self.notify("exit")
            except (ConnectionError, RuntimeError, OSError):
                pass
        return await self.wait(timeout)

    async def wait(self, timeout: float = 10.0) -> int | None:
        if self.process is None:
            # a socket connection: the daemon closes it after exit
            try:
                await asyncio.wait_for(asyncio.shield(self.closed), timeout)
            except asyncio.TimeoutError:
                pass
            finally:
                try:
                    self._writer.close()
                except (OSError, RuntimeError):
                    pass
                await self._end_reader()
            return None
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except asyncio.TimeoutError:
            self.process.kill()
            return await self.process.wait()
        finally:
            await self._end_reader()
            if self.stderr_tail is not None:
                await self.stderr_tail.stop()

    async def _end_reader(self) -> None:
        """Cancel the reader task and let it finish (its ``finally`` says why the connection
        ended): a task left pending when the caller's loop closes is reported by asyncio as
        "Task was destroyed but it is pending", and a caller that checks for leftover tasks
        would find it."""
        task = self._read_task
        if not task.done():
            task.cancel()
            try:
                await asyncio.wait({task}, timeout=5.0)
            except asyncio.CancelledError:
                raise
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: never "exception was never retrieved"

    # ------------------------------------------------------------ typed methods

    async def session_create(self, title: str | None = None, **metadata: Any) -> m.SessionCreateResult:
        return await self.request("session/create", m.SessionCreateParams(title=title, metadata=metadata))

    async def session_list(self, limit: int = 100, offset: int = 0) -> m.SessionListResult:
        return await self.request("session/list", m.SessionListParams(limit=limit, offset=offset))

    async def session_get(self, session_id: str) -> m.SessionInfo:
        return await self.request("session/get", m.SessionRef(session_id=session_id))

    async def id_resolve(self, prefix: str, *, kinds: str = "any", session_id: str | None = None,
                         limit: int = 20) -> m.IdResolveResult:
        """The sessions and nodes whose id starts with ``prefix`` (SPEC §4.3)."""
        return await self.request("id/resolve", m.IdResolveParams(prefix=prefix, kinds=kinds,  # type: ignore[arg-type]
                                                                  session_id=session_id, limit=limit))

    async def session_rename(self, session_id: str, title: str) -> m.SessionInfo:
        return await self.request("session/rename", m.SessionRenameParams(session_id=session_id, title=title))

    async def session_delete(self, session_id: str) -> m.SessionDeleteResult:
        return await self.request("session/delete", m.SessionRef(session_id=session_id))

    async def history(self, session_id: str, head: str | None = None) -> m.SessionHistoryResult:
        return await self.request("session/history", m.SessionHistoryParams(session_id=session_id, head=head))

    async def branches(self, session_id: str) -> m.SessionBranchesResult:
        return await self.request("session/branches", m.SessionRef(session_id=session_id))

    async def graph(self, session_id: str, *, after_seq: int = -1, limit: int = 2_000,
                    conversation_only: bool = False, heads: list[str] | None = None) -> m.SessionGraphResult:
        """One page of ``session/graph``; pass ``nextAfterSeq`` as ``after_seq`` for the next."""
        return await self.request("session/graph", m.SessionGraphParams(
            session_id=session_id, after_seq=after_seq, limit=limit, conversation_only=conversation_only, heads=heads))

    async def checkout(self, session_id: str, node_id: str) -> m.HeadResult:
        return await self.request("session/checkout", m.SessionCheckoutParams(session_id=session_id, node_id=node_id))

    async def rewind(self, session_id: str, node_id: str | None = None, steps: int | None = None) -> m.HeadResult:
        return await self.request(
            "session/rewind", m.SessionRewindParams(session_id=session_id, node_id=node_id, steps=steps)
        )

    async def spawn_branch(self, session_id: str, caller_id: str, **kw: Any) -> m.SessionSpawnResult:
        return await self.request("session/spawn", m.SessionSpawnParams(session_id=session_id, caller_id=caller_id, **kw))

    async def append(
        self,
        session_id: str,
        role: str,
        *,
        move_head: bool | None = None,
        render_id: str | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> m.NodeResult:
        """Append one node (``node/append``). ``timeout`` (seconds): none by default, unlike
        other requests (60 s): a write waits for its answer, which says whether it was
        committed — a client that gave up could not tell — and a 50 MB output can take a
        minute on a loaded machine. The daemon bounds its own waits for the database
        (``StorageBusy``, ``StorageUnavailable``)."""
        node = NodeInput(role=role, **fields)  # type: ignore[arg-type]
        return await self.request(
            "node/append",
            m.NodeAppendParams(session_id=session_id, node=node, move_head=move_head, render_id=render_id),
            timeout=timeout,
        )

    async def append_batch(
        self,
        session_id: str,
        nodes: Sequence[NodeInput | dict[str, Any]],
        *,
        move_head: bool | None = None,
        render_id: str | None = None,
        timeout: float | None = None,
    ) -> m.NodeBatchResult:
        """Append several nodes of one session as one unit (``node/appendBatch``): all of them
        or none. A node may name an earlier node of the batch (give it an ``id``) as its
        predecessor or caller. Nodes are ``NodeInput`` or dicts of its fields (snake_case).
        ``timeout``: none by default, as for ``append``."""
        items = [n if isinstance(n, NodeInput) else NodeInput(**n) for n in nodes]
        return await self.request(
            "node/appendBatch",
            m.NodeAppendBatchParams(session_id=session_id, nodes=items, move_head=move_head, render_id=render_id),
            timeout=timeout,
        )

    async def update(self, session_id: str, node_id: str, status: str, output: Any = None, **metadata: Any) -> m.NodeResult:
        return await self.request(
            "node/update",
            m.NodeUpdateParams(session_id=session_id, node_id=node_id, status=status, output=output, metadata=metadata),  # type: ignore[arg-type]
        )

    async def get_nodes(self, session_id: str, ids: Sequence[str], range: m.OutputRange | None = None,
                        include_callees: bool = False) -> m.NodeGetResult:
        return await self.request("node/get", m.NodeGetParams(session_id=session_id, ids=list(ids), range=range,
                                                              include_callees=include_callees))

    async def search(self, query: str, session_id: str | None = None, limit: int = 20, roles: list[str] | None = None) -> m.SearchResult:
        return await self.request(
            "search/query", m.SearchParams(query=query, session_id=session_id, limit=limit, roles=roles)  # type: ignore[arg-type]
        )

    async def render(self, session_id: str, **kw: Any) -> c.RenderResult:
        return await self.request("context/render", c.RenderParams(session_id=session_id, **kw))

    async def prepare(self, session_id: str, **kw: Any) -> c.PrepareResult:
        return await self.request("context/prepare", c.PrepareParams(session_id=session_id, **kw))

    async def compact(self, session_id: str, *, timeout: float | None = 120.0, **kw: Any) -> c.CompactResult:
        return await self.request("context/compact", c.CompactParams(session_id=session_id, **kw), timeout=timeout)

    async def replay(self, session_id: str, node_id: str, **kw: Any) -> c.ReplayResult:
        return await self.request("context/replay", c.ReplayParams(session_id=session_id, node_id=node_id, **kw))

    async def usage_report(self, session_id: str, node_id: str, model: str | None = None, **usage: int) -> c.UsageReportResult:
        return await self.request(
            "usage/report",
            c.UsageReportParams(session_id=session_id, node_id=node_id, usage=c.Usage(**usage), model=model),
        )

    async def import_path(self, path: str, **kw: Any) -> c.ImportResult:
        return await self.request("session/import", c.ImportParams(path=path, **kw), timeout=600)

    async def export(self, session_id: str, **kw: Any) -> c.ExportResult:
        return await self.request("session/export", c.ExportParams(session_id=session_id, **kw))

    async def subscribe(self, session_id: str) -> m.SubscribeResult:
        """Hear ``node/didAppend``, ``node/didUpdate`` and ``session/didChange`` of a session,
        whoever writes it (see ``on_notification``)."""
        return await self.request("session/subscribe", m.SessionRef(session_id=session_id))

    async def unsubscribe(self, session_id: str) -> m.SubscribeResult:
        return await self.request("session/unsubscribe", m.SessionRef(session_id=session_id))

    async def daemon_status(self) -> m.DaemonStatus:
        return await self.request("daemon/status")

    @property
    def connection_id(self) -> str | None:
        """This connection's id in the daemon: the ``origin`` of its own notifications."""
        return self.initialize_result.connection_id if self.initialize_result else None
