"""Reaching a PostgreSQL server (SPEC §2.1): the libpq settings that bound every wait
(``connection_settings``: connect timeout, keepalives, ``tcp_user_timeout``, a statement
timeout, the pool's wait and size), a connection class whose waits end after the timeout,
storage faults by kind (``fault_kind``), and a URL as messages show it (``redact``).
``PostgresBackend`` (``postgres_backend.py``) keeps its rows over these.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

try:  # an optional dependency: `pip install dagctx[postgres]`
    import psycopg
    import psycopg_pool
except ImportError:  # pragma: no cover - reported when a postgresql:// URL is opened
    psycopg = None  # type: ignore[assignment]
    psycopg_pool = None  # type: ignore[assignment]


def redact(url: str) -> str:
    """The URL without its password, for messages and ``initialize``'s ``database``."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:  # not even a URL: show no more than its scheme
        return url.split("://", 1)[0] + "://…"
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    user = urllib.parse.quote(parts.username or "", safe="")
    return urllib.parse.urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def fault_kind(exc: BaseException) -> str | None:
    """The stable kind of a PostgreSQL storage fault, or None for anything else."""
    if psycopg is None:
        return None
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return "StorageUnavailable"
    state = getattr(exc, "sqlstate", None) or ""
    if state == "53100":
        return "StorageFull"
    if state in ("25006", "42501"):  # a read-only transaction (a standby); the role may not (e.g. TEMPORARY)
        return "StorageReadOnly"
    if state in ("XX001", "XX002"):
        return "StorageCorrupt"
    if state in SCHEMA_GONE or state == "57014":  # schema dropped; statement timeout
        return "StorageUnavailable"
    if state == "55P03":  # lock_timeout
        return "StorageBusy"
    if state.startswith(("08", "53", "57P")) or state in ("40001", "40P01"):
        return "StorageUnavailable"
    if isinstance(exc, psycopg.OperationalError) and not state:
        return "StorageUnavailable"  # the connection is gone
    return None


#: how long a request waits for the server by default (SPEC §2.1), seconds
DEFAULT_TIMEOUT = 10.0

#: URL parameters that are dagctx's own (removed before the URL reaches libpq)
_OWN_PARAMS = ("dagctx_pool_timeout", "dagctx_pool_size")

#: schema or table missing: the ``dagctx`` schema was dropped under a running daemon
SCHEMA_GONE = ("3F000", "42P01")


def connection_settings(url: str, timeout: float) -> tuple[str, float, int]:
    """The libpq conninfo to use, the pool wait limit and the pool size (SPEC §2.1).

    What the URL sets itself wins; otherwise: ``connect_timeout`` (whole seconds, at least
    2, libpq's minimum), TCP keepalives that notice a dead peer within about the timeout,
    ``tcp_user_timeout`` for unacknowledged data, and a ``statement_timeout`` a little under
    the timeout so a slow server answers with its own error first. dagctx's own
    ``dagctx_pool_timeout`` and ``dagctx_pool_size`` are taken out."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in _OWN_PARAMS}
    if own:
        rest = urllib.parse.urlencode([(k, v) for k, v in query if k not in _OWN_PARAMS])
        url = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")
    params = psycopg.conninfo.conninfo_to_dict(url)
    pool_timeout = float(own.get("dagctx_pool_timeout", timeout))
    pool_size = int(own.get("dagctx_pool_size", 4))
    if pool_timeout <= 0 or not 1 <= pool_size <= 100:
        raise ValueError("dagctx_pool_timeout must be > 0 and dagctx_pool_size between 1 and 100")
    params.setdefault("connect_timeout", str(max(2, math.ceil(timeout))))
    params.setdefault("keepalives", "1")
    params.setdefault("keepalives_idle", str(max(1, int(timeout // 3))))
    params.setdefault("keepalives_interval", str(max(1, int(timeout // 6))))
    params.setdefault("keepalives_count", "3")
    params.setdefault("tcp_user_timeout", str(int(timeout * 1000)))
    options = str(params.get("options") or "")
    if "statement_timeout" not in options:
        params["options"] = (options + f" -c statement_timeout={int(timeout * 900)}").strip()
    return psycopg.conninfo.make_conninfo("", **params), pool_timeout, pool_size


def timed_connection(seconds: float) -> type:
    """A connection class whose every wait for the server ends after ``seconds``: a server
    that accepts but never answers (a frozen host, a half-open proxy) gives up the thread
    that waits on it, and the connection, instead of holding them forever."""

    class DagctxConnection(psycopg.Connection):  # type: ignore[misc, name-defined]
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            try:
                return super().wait(gen, interval=interval, timeout=seconds if timeout is None else timeout)
            except psycopg.errors._WaitTimeout:
                self.pgconn.finish()  # its state is unknown: never reused
                raise psycopg.OperationalError(
                    f"the server did not answer within {seconds:g} s (it may be frozen or unreachable)"
                ) from None

    return DagctxConnection
