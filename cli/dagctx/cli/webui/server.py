"""``dagctx ui``: a local web view of a database's sessions, served on 127.0.0.1.

A client of the shared daemon like every other command: the page's JSON API is a thin
layer over the Python client (``dagctx.client``), and the page itself is static files
bundled in this package (``static/``), so nothing is fetched from the internet.

Safety on a shared machine (SPEC §1.7; ARCHITECTURE.md says why):

* it listens on 127.0.0.1 only;
* every request must carry the random token of the URL the command prints: as
  ``?token=`` on the first request (answered with a cookie and a redirect that drops it
  from the address bar) or as that cookie; anything else is 401;
* ``Host`` must name this server (127.0.0.1 or localhost and its port: DNS rebinding),
  and a request with an ``Origin`` or ``Sec-Fetch-Site`` from elsewhere is 403;
* read-only unless started with ``--allow-writes`` (checkout and fork are the only writes);
* every answer carries a Content-Security-Policy that allows this origin only.

The HTTP server is the standard library's asyncio streams: the page asks for small JSON
answers and one event stream, so a framework would add a dependency and no safety.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec

from dagctx.client import DagctxClient, RpcError

from . import api

log = logging.getLogger("dagctx.ui")

MAX_HEADER = 32 * 1024
MAX_BODY = 1 << 20
COOKIE = "dagctx_ui"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
REASONS = {200: "OK", 204: "No Content", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large",
           500: "Internal Server Error", 502: "Bad Gateway"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""
    cookies: dict[str, str] = field(default_factory=dict)

    def arg(self, name: str, default: str | None = None) -> str | None:
        return self.query.get(name, default)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Handler = Callable[[Request], Awaitable[Any]]


class UiServer:
    """The HTTP side: security checks, static files, the JSON API, the live event stream."""

    def __init__(self, client: DagctxClient, *, token: str | None = None, allow_writes: bool = False) -> None:
        self.client = client
        self.token = token or secrets.token_urlsafe(24)
        self.allow_writes = allow_writes
        self.port = 0
        self.api = api.Api(client, allow_writes=allow_writes)
        self._server: asyncio.base_events.Server | None = None
        self._streams: dict[str, set[asyncio.Queue[bytes | None]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        for method in ("node/didAppend", "node/didUpdate", "session/didChange"):
            client.on_notification(method, self._make_forwarder(method))

    # ------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host="127.0.0.1", port=port, limit=MAX_HEADER * 2)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    async def close(self) -> None:
        for queues in self._streams.values():
            for q in queues:
                q.put_nowait(None)
        if self._server is not None:
            self._server.close()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except asyncio.TimeoutError:
                pass
        for t in list(self._tasks):
            t.cancel()

    # ------------------------------------------------------------ the live stream

    def _make_forwarder(self, method: str) -> Callable[[Any], None]:
        def forward(params: Any) -> None:
            sid = getattr(params, "session_id", None)
            queues = self._streams.get(sid or "")
            if not queues:
                return
            node = getattr(params, "node", None)
            event = {
                "method": method,
                "sessionId": sid,
                "head": getattr(params, "head", None),
                "change": getattr(params, "change", None),
                "nodeId": getattr(node, "id", None) or getattr(params, "node_id", None),
                "seq": getattr(node, "seq", None),
                "summary": bool(node is not None and node.role == "llm" and node.name == "context/summary"),
            }
            data = b"event: change\ndata: " + json.dumps(event).encode() + b"\n\n"
            for q in queues:
                if q.qsize() < 1000:
                    q.put_nowait(data)
        return forward

    async def _live(self, req: Request, writer: asyncio.StreamWriter) -> None:
        sid = req.arg("session")
        if not sid:
            raise HttpError(400, "live needs ?session=ID")
        try:
            await self.client.session_get(sid)
        except RpcError as err:
            raise HttpError(404, err.message) from None
        queues = self._streams.setdefault(sid, set())
        q: asyncio.Queue[bytes | None] = asyncio.Queue()
        first = not queues
        queues.add(q)
        try:
            if first:
                await self.client.subscribe(sid)
            writer.write(self._head(200, "text/event-stream; charset=utf-8", None,
                                    extra=[("Cache-Control", "no-store")]))
            writer.write(b"retry: 1000\nevent: ready\ndata: {}\n\n")
            await writer.drain()
            while True:
                try:
                    item = await asyncio.wait_for(q.get(), 15)
                except asyncio.TimeoutError:
                    item = b": keep-alive\n\n"
                if item is None:
                    break
                writer.write(item)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            queues.discard(q)
            if not queues:
                self._streams.pop(sid, None)
                try:
                    await self.client.unsubscribe(sid)
                except (RpcError, ConnectionError, asyncio.CancelledError):
                    pass  # the server or its client is closing: the subscription ends with it

    # ------------------------------------------------------------ HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            req = await self._read(reader)
            if req is None:
                return
            await self._respond(req, writer)
        except HttpError as err:
            self._send_json(writer, err.status, {"error": err.message})
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            pass
        except Exception:  # the page gets a 500; the server goes on
            log.exception("ui request failed")
            self._send_json(writer, 500, {"error": "internal error (see the dagctx ui log)"})
        finally:
            if task is not None:
                self._tasks.discard(task)
            try:
                await writer.drain()
                writer.close()
            except (ConnectionError, RuntimeError):
                pass

    async def _read(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError:
            raise HttpError(413, "request headers too large") from None
        if len(raw) > MAX_HEADER:
            raise HttpError(413, "request headers too large")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(400, "not an HTTP/1.x request")
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpError(400, "malformed header line")
            key = name.strip().lower()
            if key in headers and key in ("host", "origin", "cookie", "content-length"):
                raise HttpError(400, f"duplicate {key} header")
            headers[key] = value.strip()
        body = b""
        if "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise HttpError(400, "bad Content-Length") from None
            if n < 0 or n > MAX_BODY:
                raise HttpError(413, "request body too large")
            body = await asyncio.wait_for(reader.readexactly(n), 30)
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        cookies: dict[str, str] = {}
        for part in headers.get("cookie", "").split(";"):
            k, sep, v = part.strip().partition("=")
            if sep:
                cookies[k] = v
        return Request(method, url.path, query, headers, body, cookies)

    def _allowed_hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    def _check(self, req: Request) -> bool:
        """Host, Origin and the token (SPEC §1.7).
        Returns True when the token came in the query (answer with a cookie and redirect)."""
        host = req.headers.get("host", "")
        if host.lower() not in self._allowed_hosts():
            raise HttpError(403, "this server answers only to 127.0.0.1 and localhost (Host header refused)")
        origin = req.headers.get("origin")
        if origin is not None and origin.lower() not in {f"http://{h}" for h in self._allowed_hosts()}:
            raise HttpError(403, "cross-origin requests are refused (Origin header)")
        if req.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise HttpError(403, "cross-site requests are refused (Sec-Fetch-Site)")
        from_query = req.query.get("token")
        if from_query is not None and hmac.compare_digest(from_query.encode(), self.token.encode()):
            return True
        cookie = req.cookies.get(self._cookie_name())
        if cookie is not None and hmac.compare_digest(cookie.encode(), self.token.encode()):
            return False
        raise HttpError(401, "open the URL dagctx ui printed (it carries the access token)")

    def _cookie_name(self) -> str:
        return f"{COOKIE}_{self.port}"

    async def _respond(self, req: Request, writer: asyncio.StreamWriter) -> None:
        token_in_query = self._check(req)
        if token_in_query and req.method == "GET" and not req.path.startswith("/api/"):
            # set the cookie and drop the token from the address bar (and from history)
            writer.write(self._head(303, None, 0, extra=[
                ("Location", req.path),
                ("Set-Cookie", f"{self._cookie_name()}={self.token}; Path=/; HttpOnly; SameSite=Strict"),
            ]))
            return
        if req.path in STATIC:
            if req.method != "GET":
                raise HttpError(405, "GET only")
            name, ctype = STATIC[req.path]
            data = resources.files("dagctx.cli.webui").joinpath("static", name).read_bytes()
            writer.write(self._head(200, ctype, len(data)) + data)
            return
        if req.path == "/api/live":
            await self._live(req, writer)
            return
        if not req.path.startswith("/api/"):
            raise HttpError(404, f"no page {req.path}")
        route = self.api.route(req.method, req.path[len("/api/"):])
        if route is None:
            raise HttpError(404 if req.method in ("GET", "POST") else 405, f"no API {req.method} {req.path}")
        if req.method == "POST" and req.headers.get("origin") is None:
            raise HttpError(403, "a write needs the page's Origin header")
        try:
            params = dict(req.query)
            if req.method == "POST" and req.body:
                params.update(json.loads(req.body))
            result = await route(params)
        except api.ApiError as err:
            raise HttpError(err.status, err.message) from None
        except RpcError as err:
            self._send_json(writer, 404 if err.kind in ("SessionNotFound", "NodeNotFound") else 400,
                            {"error": err.message, "kind": err.kind})
            return
        except (ValueError, TypeError) as err:
            raise HttpError(400, str(err)) from None
        self._send_json(writer, 200, result)

    def _head(self, status: int, ctype: str | None, length: int | None,
              extra: list[tuple[str, str]] | None = None) -> bytes:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
        if ctype is not None:
            lines.append(f"Content-Type: {ctype}")
        if length is not None:
            lines.append(f"Content-Length: {length}")
        lines += [
            "Connection: close",
            f"Content-Security-Policy: {CSP}",
            "X-Content-Type-Options: nosniff",
            "Referrer-Policy: no-referrer",
            "Cross-Origin-Resource-Policy: same-origin",
            "Cache-Control: no-store",
        ]
        for k, v in extra or ():
            lines.append(f"{k}: {v}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send_json(self, writer: asyncio.StreamWriter, status: int, value: Any) -> None:
        data = msgspec.json.encode(value)
        writer.write(self._head(status, "application/json", len(data)) + data)


async def run_ui(client: DagctxClient, *, port: int = 0, open_browser: bool = True, allow_writes: bool = False,
                 announce: Callable[[str], None] = print) -> None:
    """Serve until Ctrl-C or SIGTERM (or until cancelled)."""
    server = UiServer(client, allow_writes=allow_writes)
    await server.start(port)
    announce(server.url)
    if open_browser:
        import webbrowser

        await asyncio.to_thread(webbrowser.open, server.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not on this platform: Ctrl-C still ends asyncio.run
            pass
    try:
        await stop.wait()
    finally:
        await server.close()
