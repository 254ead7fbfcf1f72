"""``database/migrate``: copy every session of another database into the daemon's own.

The CLI's ``dagctx migrate --from A --to B`` spawns a daemon on B and asks it for this,
so the command line never touches a database itself. Progress goes out as
``$/progress`` (one report per session); between sessions the loop is yielded, so a copy
of many sessions never starves other requests' I/O.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from dagctx.ledger import Store, names_a_file
from dagctx.ledger.copy import CopyStats, copy_session, session_ids
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError

from .config import redact_database

if TYPE_CHECKING:
    from .ports import Record


def _open_source(source: str) -> Store:
    if (names_a_file(source) or source == ":memory:") and not os.path.isfile(os.path.expanduser(source)):
        raise DagctxError(
            "InvalidParams",
            f"no database file at {source!r}: give the path of an existing dagctx database or a "
            "postgresql:// URL",
            path="source",
        )
    try:
        return Store(os.path.expanduser(source) if names_a_file(source) else source, create_parent=False)
    except DagctxError:
        raise
    except Exception as exc:
        raise DagctxError("InvalidParams", f"cannot open {redact_database(source)!r}: {exc}", path="source") from exc


async def database_migrate(engine: Record, p: m.DatabaseMigrateParams) -> m.DatabaseMigrateResult:
    dst = engine.store
    src = _open_source(p.source)
    try:
        if src.path == dst.path or (
            names_a_file(p.source) and os.path.abspath(os.path.expanduser(p.source)) == os.path.abspath(dst.path)
        ):
            raise DagctxError("InvalidParams", "source and target are the same database", path="source")
        token = p.work_done_token
        ids = session_ids(src)
        engine.peer.progress(token, {"kind": "begin", "title": f"Copying {len(ids)} sessions", "percentage": 0})
        stats = CopyStats()
        for i, sid in enumerate(ids):
            copy_session(src, dst, sid, stats)
            engine.peer.progress(token, {
                "kind": "report", "message": f"{i + 1}/{len(ids)} sessions, {stats.nodes:,} nodes",
                "percentage": int((i + 1) * 100 / max(1, len(ids))),
            })
            await asyncio.sleep(0)
        engine.peer.progress(token, {"kind": "end", "message": f"copied {stats.copied}, unchanged {stats.unchanged}"})
        return m.DatabaseMigrateResult(
            source=src.path, target=dst.path, sessions=stats.sessions, copied=stats.copied,
            unchanged=stats.unchanged, nodes=stats.nodes, conflicts=stats.conflicts,
        )
    finally:
        src.close()
