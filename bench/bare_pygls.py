"""A bare pygls 2.1.1 server with one custom method, for the startup comparison.

``LanguageServer`` answers ``initialize``/``shutdown``/``exit`` itself; ``bench/ping``
answers a small result. Started with ``start_io`` exactly as a pygls server would be.

Run: python bench/bare_pygls.py   (speaks on stdin/stdout)
"""

from __future__ import annotations

from typing import Any

from pygls.lsp.server import LanguageServer

server = LanguageServer("bare-pygls", "0.0")


@server.feature("bench/ping")
def ping(ls: LanguageServer, params: Any) -> dict[str, Any]:
    return {"sessions": [], "total": 0}


if __name__ == "__main__":
    server.start_io()
