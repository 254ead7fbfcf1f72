"""``session/import``: parse transcripts off the event loop, write each through the ledger.

Parsing and token counting run in a worker thread; each transcript is then written
in one ledger transaction, idempotently (keyed by the source session). Progress goes
to the client as ``$/progress`` when it gave a ``workDoneToken``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.transcripts import Transcript, parse_path
from dagctx.ledger import UsageRow
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.limits import safe_text

if TYPE_CHECKING:
    from .core import EngineCore


def _counts(engine: EngineCore, t: Transcript) -> dict[str, dict[str, tuple[int, int]]]:
    out = {}
    for node in t.nodes:
        if node.id is not None:
            out[node.id] = engine.count_node(node.input, node.output)
    return out


async def session_import(engine: EngineCore, p: c.ImportParams) -> c.ImportResult:
    path = engine.client_path(p.path)
    if not os.path.exists(path):
        raise DagctxError("InvalidParams", f"no file or folder at {p.path!r}", path="path")
    errors: list[tuple[str, str]] = []
    token = p.work_done_token
    engine.peer.progress(token, {"kind": "begin", "title": f"Importing {os.path.basename(path)}", "percentage": 0})
    try:
        fmt = p.format
        transcripts = await asyncio.to_thread(parse_path, path, fmt, errors)
    except ValueError as exc:
        raise DagctxError("ImportFailed", f"cannot import {p.path!r}: {exc}", path="path") from exc
    sessions: list[c.ImportedSession] = []
    skipped = [c.Skipped(None, why, file=f) for f, why in errors]
    total = max(1, len(transcripts))
    for i, t in enumerate(transcripts):
        counts = await asyncio.to_thread(_counts, engine, t)
        now = time.time()
        usage = [
            UsageRow(
                node_id=nid,
                model=None,
                usage=u,
                estimated=None,
                reported_at=now,
            )
            for nid, u in t.usage.items()
        ]

        def write(t: Transcript = t, counts: dict = counts, usage: list = usage) -> tuple[Any, bool]:
            info, created = engine.store.import_session(
                source_key=f"{t.format}:{t.source_key}",
                title=p.title or safe_text(t.title),  # a title made from an undecodable file name
                nodes=t.nodes,
                head=t.head,
                metadata={"importedFrom": t.format, "source": path},
                token_counts=counts,
                usage=usage,
            )
            if created:
                engine.lifecycle("session_start", info.session_id)
                # the same announcement and ingest hook as every other write (SPEC §1.5)
                written = [n for n in engine.store.graph(info.session_id).by_seq if n.id != info.root_id]
                engine.announce(info.session_id, written, info.head)
            return info, created

        # one transaction per transcript, off the event loop (SPEC §1.4)
        info, created = await engine.offload(write)
        sessions.append(
            c.ImportedSession(
                session_id=info.session_id,
                title=info.title,
                nodes=t.counts.get("nodes", len(t.nodes)),
                tool_pairs=t.counts.get("toolPairs", 0),
                compactions=t.counts.get("compactions", 0),
                spawn_branches=t.counts.get("spawnBranches", 0),
                created=created,
            )
        )
        skipped.extend(msgspec.structs.replace(s, file=t.source_path or path) for s in t.skipped)
        engine.peer.progress(
            token, {"kind": "report", "message": f"{i + 1}/{total} sessions", "percentage": int((i + 1) * 100 / total)}
        )
    engine.peer.progress(token, {"kind": "end", "message": f"imported {len(sessions)} sessions"})
    return c.ImportResult(sessions=sessions, skipped=skipped)
