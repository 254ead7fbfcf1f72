"""The Python client of the dagctx daemon (``from dagctx.client import DagctxClient``)."""

from .client import DagctxClient, RpcError

__all__ = ["DagctxClient", "RpcError"]
