"""Neutral transcript model shared by every importer, and the check of its guarantees.

What else importers share has its own room: ``reading.py`` (size-capped streaming
reads), ``values.py`` (timestamps, content blocks), ``builder.py`` (``Builder``),
``detect.py`` (format detection) and ``files.py`` (dispatch, folder walks).

An importer is a pure parser: it reads a file written by another agent and returns a
``Transcript`` — an ordered list of ``NodeInput`` values with their ids already set —
that the ledger can append one by one. Nothing here touches the ledger or the network.

What every transcript guarantees (``check_transcript`` verifies it):

* ids are deterministic (same bytes in, same ids out) and unique within the transcript;
* every ``caller`` / ``predecessor`` names a node that comes earlier in ``nodes`` or the
  sentinel ``"ROOT"``; ``metadata["covers_ids"]`` of a summary names earlier chain nodes;
* top-level ``user``/``llm`` nodes always carry a predecessor, except spawn-branch roots
  (``metadata["spawn_branch_root"]``) whose ``caller`` is the spawning node;
* a tool call is a ``code`` node whose caller is an ``llm`` node; one that never got a
  result has ``status="cancelled"`` and ``metadata["noResult"]=True``;
* ``head`` is the tip of the branch whose last activity is newest (ties: the later one).

``counts`` keys, always present: ``messages`` (source chat records read; the unit depends
on the format, see each parser), ``toolPairs`` (tool calls that got a result),
``toolCalls``, ``compactions``, ``spawnBranches``, ``nodes``, ``userTurns``, ``llmCalls``
(summaries and system prompts excluded), ``systemPrompts``, ``orphanResults`` (results
whose call is unknown: not imported, listed in ``skipped``), ``skipped``. Present when
non-zero: ``duplicateResults``, ``emptyCompactions``, ``danglingParents``,
``unknownItems``, ``ignoredEvents``.

Timestamps are stored as ``metadata["timestamp"]`` in Unix seconds (float, UTC); a tool
call also gets ``metadata["endTimestamp"]`` when its result arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import msgspec


from dagctx.protocol.context_messages import ImportFormat, Skipped, Usage
from dagctx.protocol.nodes import ROOT_SENTINEL, SUMMARY_NAME, SYSTEM_PROMPT_NAME, NodeInput

ROOT = ROOT_SENTINEL

#: Formats this package reads, in the spelling ``Transcript.format`` uses.
#: The formats a file can be in: the wire's ``ImportFormat`` without ``auto``.
FORMATS: tuple[str, ...] = tuple(f for f in get_args(ImportFormat) if f != "auto")

#: ``name`` of an llm node when the source does not say which model answered.
UNKNOWN_MODEL = "unknown"

#: Node names that sit beside the chain (never a branch tip, never a fork).
BESIDE_CHAIN_NAMES = frozenset({SUMMARY_NAME, SYSTEM_PROMPT_NAME})

_COUNT_KEYS = (
    "messages",
    "toolPairs",
    "toolCalls",
    "compactions",
    "spawnBranches",
    "nodes",
    "userTurns",
    "llmCalls",
    "systemPrompts",
    "orphanResults",
    "skipped",
)


#: The longest reason a ``Skipped`` carries: a reason names what was wrong, it never
#: echoes a source line (the file may be anything the daemon can read; SPEC §9 import).
MAX_REASON_CHARS = 200


def quote(value: Any, limit: int = 40) -> str:
    """A short, escaped prefix of ``value`` for a reason: ``repr``-style (no raw control
    characters, no newlines), at most ``limit`` characters of the source, ``…`` when cut."""
    text = value if isinstance(value, str) else value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    cut = len(text) > limit
    out = repr(text[:limit])
    return out + "…" if cut else out


class SpilledOutput:
    """A node body (a tool result, a user or model text, a summary) or a line's message
    content kept aside in a private temporary file while the transcript is read
    (``SPILL_OVER``), read back by ``load`` one at a time when it is parsed or written, so
    an import holds the session's skeleton in memory, not its payloads (SPEC §9 import)."""

    __slots__ = ("_file", "_offset", "_length")

    def __init__(self, file: Any, offset: int, length: int) -> None:
        self._file, self._offset, self._length = file, offset, length

    def load(self) -> Any:
        self._file.seek(self._offset)
        return msgspec.json.decode(self._file.read(self._length))


def unspilled(value: Any) -> Any:
    """``value``, read back when it was kept aside (a parser reading a body it added)."""
    return value.load() if isinstance(value, SpilledOutput) else value


def loaded(node: NodeInput) -> NodeInput:
    """``node`` with its kept-aside output, input and ``metadata["thinking"]`` read back (a
    copy; ``node`` itself stays small)."""
    changes: dict[str, Any] = {}
    if isinstance(node.output, SpilledOutput):
        changes["output"] = node.output.load()
    if isinstance(node.input, SpilledOutput):
        changes["input"] = node.input.load()
    if isinstance(node.metadata.get("thinking"), SpilledOutput):
        changes["metadata"] = {**node.metadata, "thinking": node.metadata["thinking"].load()}
    return msgspec.structs.replace(node, **changes) if changes else node


@dataclass
class Transcript:
    """One imported session: nodes in append order plus what the ledger needs around them."""

    format: str
    source_key: str
    title: str
    nodes: list[NodeInput] = field(default_factory=list)
    #: the file it was read from (set by ``parse_file``), for skipped-line reports
    source_path: str | None = None
    head: str | None = None
    usage: dict[str, Usage] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    #: what the source lacked or what was folded away, in sentences (for the import report)
    notes: list[str] = field(default_factory=list)
    #: a dagctx export's source: ``{"sessionId", "head", "branches"}`` (see ``session/export``)
    origin: dict | None = None

    def node(self, node_id: str) -> NodeInput:
        """The node with this id (linear scan; for tests and tools, not hot paths)."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)


def is_beside_chain(node: NodeInput) -> bool:
    return node.name in BESIDE_CHAIN_NAMES and node.role in ("llm", "code")


def is_spawn_root(node: NodeInput) -> bool:
    return bool(node.metadata.get("spawn_branch_root"))


# --------------------------------------------------------------------------- checking


def check_transcript(t: Transcript) -> list[str]:
    """Every way ``t`` breaks the rules the ledger enforces (empty list: fine)."""
    problems: list[str] = []
    seen: dict[str, NodeInput] = {}
    for i, n in enumerate(t.nodes):
        where = f"node #{i} {n.id!r}"
        if not n.id:
            problems.append(f"{where}: no id")
            continue
        if n.id in seen:
            problems.append(f"{where}: duplicate id")
        for edge in ("caller", "predecessor"):
            ref = getattr(n, edge)
            if ref is not None and ref != ROOT and ref not in seen:
                problems.append(f"{where}: {edge} {ref!r} is not an earlier node")
        if n.role in ("user", "llm") and n.caller is None and n.predecessor is None:
            if not (is_spawn_root(n) or (n.name == SUMMARY_NAME and n.role == "llm")):
                problems.append(f"{where}: top-level {n.role} node without predecessor")
        if is_spawn_root(n) and (n.predecessor is not None or n.caller is None):
            problems.append(f"{where}: spawn root must have caller and no predecessor")
        if n.role == "code" and n.metadata.get("toolCallId") is not None:
            c = seen.get(n.caller or "")
            if c is None or c.role != "llm":
                problems.append(f"{where}: tool call whose caller is not an llm node")
        if n.role == "code" and n.caller is not None and n.predecessor is not None:
            problems.append(f"{where}: nested code node with a predecessor")
        if n.predecessor is not None and n.predecessor != ROOT:
            p = seen.get(n.predecessor)
            if p is not None and (is_beside_chain(p) or (p.role == "code" and p.caller is not None)):
                problems.append(f"{where}: predecessor {p.id!r} is not a conversation node")
        covers = n.metadata.get("covers_ids")
        if n.role == "llm" and n.name == SUMMARY_NAME and not covers:
            problems.append(f"{where}: summary without covers_ids")
        if covers is not None:
            for c in covers:
                node = seen.get(c)
                if node is None:
                    problems.append(f"{where}: covers unknown or later node {c!r}")
                elif node.role == "code" and node.caller is not None or is_beside_chain(node):
                    problems.append(f"{where}: covers non-conversation node {c!r}")
        seen[n.id] = n
    if t.head is not None:
        h = seen.get(t.head)
        if h is None:
            problems.append(f"head {t.head!r} is not a node")
        elif is_beside_chain(h) or (h.predecessor is None and not is_spawn_root(h)):
            problems.append(f"head {t.head!r} is not a conversation node")
    for k in t.usage:
        n = seen.get(k)
        if n is None or n.role != "llm":
            problems.append(f"usage for {k!r}, which is not an llm node")
    return problems


# --------------------------------------------------------------------------- readers

#: A detection rank: lower wins. A whole-JSON match ranks by (index of the first item
#: that matched, the rule's rank), so the first telling item of a list decides.
Rank = tuple[int, int]


def _no_match(value: Any) -> Rank | None:
    return None


def _no_companions(path: Path) -> Iterable[Path]:
    return ()


@dataclass(frozen=True)
class Reader:
    """One transcript format: each parser module defines ``READER`` and the registry
    (``readers.py``) finds it; its ``name`` is a value of the wire ``ImportFormat``."""

    #: the wire name (``ImportFormat``)
    name: str
    #: how people call it, for messages ("Claude Code")
    label: str
    #: every transcript of one file, one at a time
    read: Callable[[Path], Iterator[Transcript]]
    #: the rank of the rule a JSON Lines record matched, or None
    detect_line: Callable[[dict], Rank | None] = _no_match
    #: the rank of the rule a whole-JSON document matched, or None
    detect_json: Callable[[Any], Rank | None] = _no_match
    #: files below a folder that this file brings in itself (not read on their own)
    companions: Callable[[Path], Iterable[Path]] = _no_companions
    #: a file with this suffix is in this format, whatever it holds
    suffix: str | None = None
