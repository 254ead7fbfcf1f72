"""``session/import``: parse transcripts off the event loop, write each through the ledger.

Files are parsed one session at a time in a worker thread (formats with one session a
line are streamed, every record is size-capped); every node body over ``SPILL_OVER_BYTES``
(tool results, user and model texts, summaries, also texts joined from parts after their
node was added) and the message contents of the lines Claude Code's and Codex's parsers
hold for their tree walk are kept aside in a private temporary file as they are read and
read back one at a time when parsed, derived and written, so bodies cost memory one at a
time, not the session's (tool call inputs and ``metadata.thinking`` too). Not so
(issue 19): bodies under the threshold and the rest of each node's metadata stay in the
parsed transcript; the whole-JSON files (a ShareGPT array, an OpenHands ``.json``, a
SWE-agent ``.traj``) are read an element at a time (``transcripts/jsonstream.py``;
ARCHITECTURE.md says what each reader holds). The write holds no text of the session: the
ledger checks its rules against a skeleton graph it does not cache, and the nodes announced
after it are read back from the database a page at a time. Each transcript is written in one ledger transaction,
idempotently (keyed by the source session), so an interrupted import keeps what it
committed and a rerun resumes. Progress goes to the client as ``$/progress`` when it
gave a ``workDoneToken``.

What is never written (SPEC §9 ``session/import``): a transcript with no conversation
node — a wrong ``format``, a file that is no transcript at all — creates no session; it
is reported once per file in ``skipped`` (an entry whose ``line`` is null). A file exported by
``session/export`` names its source session; when that session is in this database the
import answers it as already present (``created: false``) instead of copying it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagctx.ledger import NodeDerived, UsageRow
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.transcripts import Transcript, iter_file, transcript_files
from dagctx.transcripts.reading import CLIENT_ENVIRON
from dagctx.transcripts.base import BESIDE_CHAIN_NAMES, MAX_REASON_CHARS, loaded
from dagctx.transcripts.builder import SPILL_OVER
from dagctx.protocol.limits import safe_text

if TYPE_CHECKING:
    from .ports import Record

#: Skipped-line entries listed per file, and in all; the rest are counted in
#: ``ImportResult.skippedMore`` (SPEC §9): a wrong format must not answer with
#: thousands of rows.
MAX_SKIPPED_PER_FILE = 10
MAX_SKIPPED = 100

_DONE = object()

#: Node bodies and held message contents longer than this (as JSON) wait for their write
#: in a temporary file, not in memory (SPEC §9 import: memory bounded by the largest node).
SPILL_OVER_BYTES = 64 * 1024


def _derived(engine: Record, t: Transcript) -> dict[str, NodeDerived]:
    out = {}
    for node in t.nodes:
        if node.id is not None:
            whole = loaded(node)  # one spilled output in memory at a time
            out[node.id] = engine.derive_node(whole.role, whole.input, whole.output, whole.name)
    return out


def has_conversation(t: Transcript) -> bool:
    """True when ``t`` holds a user or llm turn (system prompts and summaries alone are not one)."""
    return any(n.role in ("user", "llm") and n.name not in BESIDE_CHAIN_NAMES for n in t.nodes)


class _Report:
    """Skipped entries, capped per file and in all, with a count of the rest; each reason
    at most ``MAX_REASON_CHARS`` (a reason names what was wrong, it never echoes a line)."""

    def __init__(self) -> None:
        self.entries: list[c.Skipped] = []
        self.more = 0
        self._per_file: dict[str, int] = {}

    def add(self, line: int | None, reason: str, file: str) -> None:
        n = self._per_file.get(file, 0)
        # File-level entries (no line) are always listed: they say a file was not imported.
        if line is not None and (n >= MAX_SKIPPED_PER_FILE or len(self.entries) >= MAX_SKIPPED):
            self.more += 1
            return
        self._per_file[file] = n + 1
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[: MAX_REASON_CHARS - 1] + "…"
        self.entries.append(c.Skipped(line, reason, file=file))


def _next(it: Iterator[Transcript]) -> Any:
    try:
        return next(it)
    except StopIteration:
        return _DONE


def _files(path: str, shown: str) -> tuple[list[Path], list[tuple[str, str]]]:
    """The files to read, and the folders that could not be listed (reported, not fatal)."""
    p = Path(path)
    if p.is_file():
        return [p], []
    if not p.is_dir():
        raise DagctxError("InvalidParams", f"{shown!r} is neither a file nor a folder; give a transcript file or a "
                          "folder of them", path="path")
    errors: list[tuple[str, str]] = []
    files = transcript_files(p, errors)
    if not files:
        extra = f"; {len(errors)} folders could not be listed" if errors else ""
        raise DagctxError("ImportFailed", f"no transcripts found in {shown} (looked for .jsonl, .json and .traj "
                          f"files in it and its subfolders{extra})", path="path")
    return files, errors


def _not_imported(t: Transcript, fmt: str, records: int) -> str:
    lines = t.counts.get("skipped", len(t.skipped))
    why = f"{lines} of its lines could not be read as {t.format}" if lines else f"nothing in it reads as {t.format}"
    hint = " (check --format / format)" if fmt != "auto" else ""
    where = f" in its {records} records" if records > 1 else ""
    return f"no conversation found{where}: {why}{hint}; nothing was imported from it"


async def session_import(engine: Record, p: c.ImportParams) -> c.ImportResult:
    CLIENT_ENVIRON.set(engine.environ)  # this task's context: its reads use the client's limits
    SPILL_OVER.set(SPILL_OVER_BYTES)  # and its parsers keep large tool results on disk
    path = engine.client_path(p.path)
    if not os.path.exists(path):
        raise DagctxError("InvalidParams", f"no file or folder at {p.path!r}", path="path")
    files, walk_errors = await asyncio.to_thread(_files, path, p.path)
    token = p.work_done_token
    engine.peer.progress(token, {"kind": "begin", "title": f"Importing {os.path.basename(path)}", "percentage": 0})
    sessions: list[c.ImportedSession] = []
    report = _Report()
    for where, why in walk_errors:
        report.add(None, why, where)
    single = os.path.isfile(path)
    for fi, f in enumerate(files):
        it = iter_file(f, p.format)
        written = 0
        empty = 0
        empty_example: Transcript | None = None
        while True:
            try:
                t = await asyncio.to_thread(_next, it)
            except (ValueError, OSError, RecursionError) as exc:
                if single:
                    raise DagctxError("ImportFailed", f"cannot import {p.path!r}: {exc}", path="path") from exc
                report.add(None, str(exc), str(f))
                break
            if t is _DONE:
                break
            assert isinstance(t, Transcript)
            for s in t.skipped:
                report.add(s.line, s.reason, s.file or t.source_path or str(f))
            if not has_conversation(t):
                empty += 1
                empty_example = empty_example or t
                continue
            sessions.append(await _write(engine, p, t, path))
            written += 1
            engine.peer.progress(token, {
                "kind": "report", "message": f"{len(sessions)} sessions written",
                "percentage": int(fi * 100 / len(files)),
            })
        if empty and not written:
            report.add(None, _not_imported(empty_example, p.format, empty), str(f))  # type: ignore[arg-type]
        elif empty:
            report.add(None, f"{empty} of its records hold no conversation; they were not imported", str(f))
        engine.peer.progress(token, {
            "kind": "report", "message": f"{fi + 1}/{len(files)} files, {len(sessions)} sessions written",
            "percentage": int((fi + 1) * 100 / len(files)),
        })
    engine.peer.progress(token, {"kind": "end", "message": f"imported {len(sessions)} sessions"})
    return c.ImportResult(sessions=sessions, skipped=report.entries, skipped_more=report.more)


async def _write(engine: Record, p: c.ImportParams, t: Transcript, path: str) -> c.ImportedSession:
    origin = _origin_session(engine, t)
    if origin is not None:
        info, created = origin, False
    else:
        derived = await asyncio.to_thread(_derived, engine, t)
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

        def write(t: Transcript = t, derived: dict = derived, usage: list = usage) -> tuple[Any, bool]:
            sizes: list[int] = []
            info, created = engine.store.import_session(
                source_key=f"{t.format}:{t.source_key}",
                title=p.title or safe_text(t.title),  # a title made from an undecodable file name
                nodes=(loaded(n) for n in t.nodes),  # each spilled output read back as it is written
                head=t.head,
                metadata={"importedFrom": t.format, "source": path},
                derived=derived,
                usage=usage,
                written=sizes,
            )
            if created:
                engine.lifecycle("session_start", info.session_id)
                # the same announcement and ingest hook as every other write (SPEC §1.5), read
                # back a page at a time: never the whole session's texts at once
                drain = getattr(engine.peer, "drain", None)
                for page in engine.store.written_nodes(info.session_id, sizes):
                    engine.announce(info.session_id, page, info.head)
                    if drain is not None:
                        drain()  # the client was sent this page before the next is read
            return info, created

        # one transaction per transcript, off the event loop (SPEC §1.4)
        info, created = await engine.offload(write)
    notes = list(t.notes)
    if origin is not None:
        notes.append(f"exported from session {origin.session_id}, which is in this database; not copied again")
    return c.ImportedSession(
        session_id=info.session_id,
        title=info.title,
        nodes=t.counts.get("nodes", len(t.nodes)),
        tool_pairs=t.counts.get("toolPairs", 0),
        compactions=t.counts.get("compactions", 0),
        spawn_branches=t.counts.get("spawnBranches", 0),
        created=created,
        source_file=t.source_path,
        notes=notes,
    )


def _origin_session(engine: Record, t: Transcript) -> Any:
    """The session a dagctx export came from, when it is in this database (SPEC §9)."""
    sid = t.origin.get("sessionId") if isinstance(t.origin, dict) else None
    if not isinstance(sid, str) or not sid:
        return None
    try:
        return engine.store.get_session(sid)
    except DagctxError:
        return None
