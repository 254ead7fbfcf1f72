"""Neutral transcript model shared by every importer, plus format detection and dispatch.

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

import base64
import binascii
import hashlib
import heapq
import os
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, get_args

import msgspec

from dagctx.protocol.context_messages import ImportFormat, Skipped, Usage
from dagctx.protocol.limits import MAX_JSON_DEPTH, too_deep
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


# --------------------------------------------------------------------------- reading

_BOM = b"\xef\xbb\xbf"

#: Default cap on one JSONL line, and on a whole ``.json``/``.traj`` file (one record):
#: 16 MiB. Longer records are skipped with their size, so import memory stays bounded
#: whatever the input (SPEC §9 import). ``DAGCTX_IMPORT_MAX_LINE_BYTES`` overrides it.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1 << 20


#: The environment of the client whose import runs (SPEC §1.3: the shared daemon's own
#: environment is not the client's); None: this process's environment.
CLIENT_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("dagctx_client_environ", default=None)


def max_line_bytes() -> int:
    """The record cap in bytes (read on every call, from the requesting client's
    ``DAGCTX_IMPORT_MAX_LINE_BYTES``)."""
    env = CLIENT_ENVIRON.get()
    raw = (os.environ if env is None else env).get("DAGCTX_IMPORT_MAX_LINE_BYTES", "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_MAX_LINE_BYTES
    return value if value > 0 else DEFAULT_MAX_LINE_BYTES


class RecordTooLarge(ValueError):
    """A whole-file JSON record over the cap (``max_line_bytes``)."""


def iter_lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, bytes | int]]:
    """``(line_no, bytes)`` for each line of ``path``, read in 1 MiB chunks; a line longer
    than ``limit`` bytes is given as ``(line_no, size)`` instead, without ever holding
    more than ``limit`` + one chunk in memory. A leading BOM is dropped; lines split on
    ``\\n`` only."""
    cap = max_line_bytes() if limit is None else limit
    no = 0
    buf = bytearray()
    over = 0  # bytes of the current line when it is over the cap (0: not over)
    first = True
    with path.open("rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if first:
                chunk = chunk.removeprefix(_BOM)
                first = False
            if not chunk:
                break
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                piece = chunk[start:] if nl < 0 else chunk[start:nl]
                if over:
                    over += len(piece)
                elif len(buf) + len(piece) > cap:
                    over = len(buf) + len(piece)
                    buf = bytearray()
                else:
                    buf += piece
                if nl < 0:
                    break
                no += 1
                if over:
                    yield no, over
                else:
                    yield no, bytes(buf)
                buf = bytearray()
                over = 0
                start = nl + 1
    if over:
        yield no + 1, over
    elif buf:
        yield no + 1, bytes(buf)


def too_large(size: int) -> str:
    return f"line of {size:,} bytes is over the {max_line_bytes():,}-byte limit (DAGCTX_IMPORT_MAX_LINE_BYTES); not read"


def iter_jsonl(path: Path, *, label: str = "") -> Iterator[tuple[int, dict] | Skipped]:
    """Each JSON-object line of ``path`` as ``(line_no, object)``, each bad line as a
    ``Skipped`` (not JSON, not an object, over the size cap), streaming."""
    prefix = f"{label}: " if label else ""
    for no, raw in iter_lines(path):
        if isinstance(raw, int):
            yield Skipped(no, prefix + too_large(raw))
            continue
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except msgspec.DecodeError as exc:
            if str(exc) == _TOO_DEEP:
                yield Skipped(no, f"{prefix}{_TOO_DEEP}")
                continue
            yield Skipped(no, f"{prefix}not JSON: {quote(text, 20)}")
            continue
        except RecursionError:
            yield Skipped(no, f"{prefix}{_TOO_DEEP}")
            continue
        if not isinstance(obj, dict):
            yield Skipped(no, f"{prefix}not a JSON object ({type(obj).__name__})")
            continue
        yield no, obj


def read_jsonl(path: Path, *, label: str = "") -> tuple[list[tuple[int, dict]], list[Skipped]]:
    """Decode a JSONL file into ``(line_no, object)`` pairs; bad lines become ``Skipped``.

    Lines are split on ``\\n`` only (JSON text may contain a raw U+2028), blank lines are
    ignored silently, and a line that is not a JSON object (or is over the size cap) is
    reported, never raised. ``label`` prefixes the reasons (used for files folded into
    another transcript).
    """
    rows: list[tuple[int, dict]] = []
    skipped: list[Skipped] = []
    for item in iter_jsonl(path, label=label):
        if isinstance(item, Skipped):
            skipped.append(item)
        else:
            rows.append(item)
    return rows, skipped


_TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"


def decode_json(data: bytes) -> Any:
    """``msgspec.json.decode``, but a text nested deeper than ``MAX_JSON_DEPTH`` is a
    ``DecodeError`` (SPEC §3): deeper values would fail later walks by recursion."""
    if too_deep(data):
        raise msgspec.DecodeError(_TOO_DEEP)
    return msgspec.json.decode(data)


def load_json(path: Path) -> Any:
    """A whole-file JSON document; ``RecordTooLarge`` over the record cap."""
    size = path.stat().st_size
    if size > max_line_bytes():
        raise RecordTooLarge(f"{path.name} is {size:,} bytes, over the {max_line_bytes():,}-byte limit "
                             "(DAGCTX_IMPORT_MAX_LINE_BYTES); not read")
    with path.open("rb") as fh:
        data = fh.read(max_line_bytes() + 1)
    return decode_json(data.removeprefix(_BOM))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def text_digest(text: str | bytes) -> str:
    if isinstance(text, str):
        text = text.encode("utf-8")
    return "sha256:" + hashlib.sha256(text).hexdigest()


# --------------------------------------------------------------------------- values

_NAIVE_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")


def to_epoch(value: Any) -> float | None:
    """Unix seconds from an ISO-8601 string (naive = UTC) or a number (ms when huge)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        return v / 1000.0 if v > 1e11 else v
    if not isinstance(value, str) or not value:
        return None
    s = value.strip()
    if s.endswith("Z") or s.endswith("z"):
        s = s[:-1] + "+00:00"
    # Python 3.11 fromisoformat accepts up to 6 fractional digits; trim longer ones.
    s = re.sub(r"(\.\d{6})\d+", r"\1", s)
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return round(dt.timestamp(), 6)


def parse_arguments(raw: Any) -> tuple[dict, bool]:
    """Tool-call arguments as a dict. Returns ``(args, ok)``; ``ok`` is False when the
    source string was not a JSON object (the raw value is then kept under ``"raw"``)."""
    if isinstance(raw, dict):
        return raw, True
    if raw is None or raw == "":
        return {}, True
    if isinstance(raw, str):
        try:
            value = decode_json(raw.encode("utf-8", "surrogatepass"))
        except (msgspec.DecodeError, UnicodeError):
            return {"raw": raw}, False
        if isinstance(value, dict):
            return value, True
        return {"raw": value}, False
    return {"raw": raw}, False


def _image_ref(media_type: str | None, data: str | None, url: str | None = None) -> dict:
    ref: dict[str, Any] = {"type": "image"}
    if media_type:
        ref["mediaType"] = media_type
    if data:
        try:
            decoded = base64.b64decode(data, validate=False)
            size = len(decoded)
            digest = hashlib.sha256(decoded).hexdigest()
        except (binascii.Error, ValueError):
            size = len(data)
            digest = hashlib.sha256(data.encode("utf-8", errors="replace")).hexdigest()
        ref["data"] = "<omitted>"
        ref["bytes"] = size
        ref["sha256"] = digest
    elif url:
        ref["url"] = url
    return ref


_DATA_URI = re.compile(r"^data:([^;,]+)?(;base64)?,(.*)$", re.S)


def scrub_block(block: Any) -> Any:
    """One content block with any inline image replaced by a small reference."""
    if not isinstance(block, dict):
        return block
    btype = block.get("type")
    if btype == "image":
        src = block.get("source")
        if isinstance(src, dict):  # Anthropic
            if src.get("type") == "base64":
                return _image_ref(src.get("media_type"), src.get("data"))
            return _image_ref(src.get("media_type"), None, src.get("url"))
        # pi / OpenClaw: {type:image, data, mimeType}
        return _image_ref(block.get("mimeType") or block.get("mediaType"), block.get("data"), block.get("url"))
    if btype in ("image_url", "input_image"):
        url = block.get("image_url")
        if isinstance(url, dict):
            url = url.get("url")
        if isinstance(url, str):
            m = _DATA_URI.match(url)
            if m:
                return _image_ref(m.group(1), m.group(3) if m.group(2) else None)
            return _image_ref(None, None, url)
        return {"type": "image"}
    if btype == "tool_result" and isinstance(block.get("content"), list):
        return {**block, "content": [scrub_block(b) for b in block["content"]]}
    return block


def content_blocks(content: Any) -> list[Any]:
    """Message content as a list of blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def text_of_blocks(blocks: Iterable[Any], sep: str = "\n\n") -> str:
    parts: list[str] = []
    for b in blocks:
        if isinstance(b, str):
            parts.append(b)
        elif isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text"):
            t = b.get("text")
            if isinstance(t, str):
                parts.append(t)
    return sep.join(parts)


def content_output(content: Any, sep: str = "\n") -> Any:
    """A tool result or user message body: text when it is only text, else scrubbed blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(
            isinstance(b, str) or (isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text"))
            for b in content
        ):
            return text_of_blocks(content, sep)
        return [scrub_block(b) for b in content]
    if isinstance(content, dict):
        return scrub_block(content)
    return content


def has_images(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("image", "image_url", "input_image") for b in content
    )


def one_line(text: str, limit: int = 80) -> str:
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


# --------------------------------------------------------------------------- ordering


def stable_topo(items: list[Any], deps: Callable[[Any], Iterable[Hashable]], ident: Callable[[Any], Hashable]) -> list[Any]:
    """Order ``items`` so each comes after the items it depends on, otherwise keeping
    the given order. Unknown dependencies are ignored; a cycle is broken in input order."""
    index = {ident(it): i for i, it in enumerate(items)}
    waiting: dict[int, int] = {}
    dependents: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        n = 0
        for d in deps(it):
            j = index.get(d)
            if j is None or j == i:
                continue
            dependents.setdefault(j, []).append(i)
            n += 1
        waiting[i] = n
    heap = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(heap)
    out: list[int] = []
    done = [False] * len(items)
    while len(out) < len(items):
        if not heap:  # cycle: release the earliest item still waiting
            i = min(k for k in range(len(items)) if not done[k])
            waiting[i] = 0
            heapq.heappush(heap, i)
        i = heapq.heappop(heap)
        if done[i]:
            continue
        done[i] = True
        out.append(i)
        for k in dependents.get(i, ()):
            waiting[k] -= 1
            if waiting[k] == 0 and not done[k]:
                heapq.heappush(heap, k)
    return [items[i] for i in out]


# --------------------------------------------------------------------------- builder


def is_beside_chain(node: NodeInput) -> bool:
    return node.name in BESIDE_CHAIN_NAMES and node.role in ("llm", "code")


def is_spawn_root(node: NodeInput) -> bool:
    return bool(node.metadata.get("spawn_branch_root"))


class Builder:
    """Collects nodes for one transcript and finishes them into a ``Transcript``.

    Parsers add nodes with a sort key (their position in the source); ``finish`` sorts by
    key, then fixes the order so every node follows its caller, predecessor and covered
    nodes, picks the head and fills ``counts``.
    """

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.nodes: list[NodeInput] = []
        self.by_id: dict[str, NodeInput] = {}
        self._keys: dict[str, tuple] = {}
        self._last_ts: dict[str, float] = {}
        self._tool_calls: set[str] = set()
        self._paired: set[str] = set()
        self.usage: dict[str, Usage] = {}
        self.skipped: list[Skipped] = []
        self.counts: dict[str, int] = {}

    # -- ids and nodes

    def unique(self, base: str) -> str:
        if base not in self.by_id:
            return base
        n = 2
        while f"{base}#{n}" in self.by_id:
            n += 1
        return f"{base}#{n}"

    def add(self, node: NodeInput, key: tuple | None = None) -> NodeInput:
        assert node.id is not None and node.id not in self.by_id, node.id
        self.nodes.append(node)
        self.by_id[node.id] = node
        self._keys[node.id] = key if key is not None else (len(self.nodes),)
        ts = node.metadata.get("timestamp")
        if isinstance(ts, (int, float)):
            self.touch(node.id, ts)
        return node

    def touch(self, node_id: str, ts: float | None) -> None:
        """Record activity on a node (the newest activity decides which tip is HEAD)."""
        if ts is None:
            return
        old = self._last_ts.get(node_id)
        if old is None or ts > old:
            self._last_ts[node_id] = ts

    def user(self, node_id: str, output: Any, predecessor: str | None, key: tuple | None = None, **metadata: Any) -> NodeInput:
        md = {k: v for k, v in metadata.items() if v is not None}
        return self.add(NodeInput(role="user", id=node_id, output=output, predecessor=predecessor, metadata=md), key)

    def llm(self, node_id: str, model: str | None, predecessor: str | None, output: Any = "", key: tuple | None = None, **metadata: Any) -> NodeInput:
        md = {k: v for k, v in metadata.items() if v is not None}
        return self.add(
            NodeInput(role="llm", id=node_id, name=model or UNKNOWN_MODEL, output=output, predecessor=predecessor, metadata=md),
            key,
        )

    def system_prompt(self, node_id: str, text: Any, key: tuple | None = None, **metadata: Any) -> NodeInput:
        md = {"imported": True, **{k: v for k, v in metadata.items() if v is not None}}
        return self.add(
            NodeInput(role="llm", id=node_id, name=SYSTEM_PROMPT_NAME, output=text, predecessor=ROOT, metadata=md), key
        )

    def tool_call(
        self,
        node_id: str,
        name: str,
        args: dict,
        caller: str,
        call_id: str | None,
        key: tuple | None = None,
        **metadata: Any,
    ) -> NodeInput:
        """A tool call waiting for its result: cancelled + noResult until one is attached."""
        md: dict[str, Any] = {}
        if call_id is not None:
            md["toolCallId"] = call_id
        md["noResult"] = True
        md.update({k: v for k, v in metadata.items() if v is not None})
        node = NodeInput(role="code", id=node_id, name=name or "", input=args, output=None, status="cancelled", caller=caller, metadata=md)
        self._tool_calls.add(node_id)
        return self.add(node, key)

    def hosted_call(self, node_id: str, name: str, args: dict, caller: str, status: str, key: tuple | None = None, **metadata: Any) -> NodeInput:
        """A provider-side tool (web search) that has no separate result record."""
        md = {"hostedTool": True, **{k: v for k, v in metadata.items() if v is not None}}
        st = status if status in ("completed", "error", "cancelled") else "completed"
        node = NodeInput(role="code", id=node_id, name=name, input=args, output=None, status=st, caller=caller, metadata=md)  # type: ignore[arg-type]
        self._tool_calls.add(node_id)
        return self.add(node, key)

    def has_result(self, node_id: str) -> bool:
        return node_id in self._paired

    def attach_result(self, node_id: str, output: Any, *, error: bool = False, ts: float | None = None, **metadata: Any) -> None:
        node = self.by_id[node_id]
        node.output = output
        node.status = "error" if error else "completed"
        node.metadata.pop("noResult", None)
        if ts is not None:
            node.metadata["endTimestamp"] = ts
        node.metadata.update({k: v for k, v in metadata.items() if v is not None})
        self._paired.add(node_id)
        if node.caller is not None and ts is not None:
            self.touch(node.caller, ts)

    def set_usage(self, llm_id: str, input: int = 0, output: int = 0, cache_read: int = 0, cache_write: int = 0) -> None:
        self.usage[llm_id] = Usage(input=int(input or 0), output=int(output or 0),
                                   cache_read=int(cache_read or 0), cache_write=int(cache_write or 0))

    # -- chains and summaries

    def chain_ids(self, tip: str | None) -> list[str]:
        """Chain nodes from the chain's start to ``tip`` (oldest first, ROOT excluded)."""
        out: list[str] = []
        seen: set[str] = set()
        cur = tip
        while cur is not None and cur != ROOT and cur not in seen:
            seen.add(cur)
            node = self.by_id.get(cur)
            if node is None:
                break
            if not is_beside_chain(node):
                out.append(cur)
            if is_spawn_root(node):
                break
            cur = node.predecessor
        out.reverse()
        return out

    def summary(
        self,
        node_id: str,
        text: Any,
        covers: list[str],
        line: int,
        key: tuple | None = None,
        **metadata: Any,
    ) -> NodeInput | None:
        """A compaction summary: ``predecessor`` is that of the first covered node.

        A compaction that covers no conversation node replaces nothing (and the ledger
        refuses a summary without ``covers_ids``): it is reported as skipped instead.
        """
        if not covers:
            self.skipped.append(Skipped(line, "compaction that covers no conversation node"))
            self.counts["emptyCompactions"] = self.counts.get("emptyCompactions", 0) + 1
            return None
        pred = self.by_id[covers[0]].predecessor
        md: dict[str, Any] = {"compaction": True, "covers_ids": list(covers)}
        md.update({k: v for k, v in metadata.items() if v is not None})
        node = NodeInput(role="llm", id=node_id, name=SUMMARY_NAME, output=text, predecessor=pred, metadata=md)
        if pred is None:
            # The covered segment starts at a spawn root: the summary hangs off the same caller.
            node.caller = self.by_id[covers[0]].caller
        return self.add(node, key)

    # -- finishing

    def _ordered(self) -> list[NodeInput]:
        nodes = sorted(self.nodes, key=lambda n: self._keys[n.id])

        def deps(n: NodeInput) -> list[str]:
            d = [x for x in (n.caller, n.predecessor) if x and x != ROOT]
            d.extend(n.metadata.get("covers_ids") or ())
            return d

        return stable_topo(nodes, deps, lambda n: n.id)

    def pick_head(self, ordered: list[NodeInput]) -> str | None:
        position = {n.id: i for i, n in enumerate(ordered)}
        conv = [n for n in ordered if not is_beside_chain(n) and (n.predecessor is not None or is_spawn_root(n))]
        conv_ids = {n.id for n in conv}
        has_child: set[str] = set()
        for n in conv:
            if n.predecessor in conv_ids:
                has_child.add(n.predecessor)  # type: ignore[arg-type]
        # Tips that are on the main tree (their chain reaches ROOT, not a spawn root).
        start: dict[str, bool] = {}

        def reaches_root(nid: str) -> bool:
            path: list[str] = []
            cur: str | None = nid
            result = False
            while cur is not None:
                if cur in start:
                    result = start[cur]
                    break
                if cur == ROOT:
                    result = True
                    break
                node = self.by_id.get(cur)
                if node is None or is_spawn_root(node):
                    result = False
                    break
                path.append(cur)
                cur = node.predecessor
            for p in path:
                start[p] = result
            return result

        tips = [n for n in conv if n.id not in has_child and reaches_root(n.id)]
        if not tips:
            return None
        best = max(tips, key=lambda n: (self._last_ts.get(n.id, float("-inf")), position[n.id]))
        return best.id

    def finish(self, source_key: str, title: str | None, head: str | None = None, *, auto_head: bool = True) -> Transcript:
        ordered = self._ordered()
        position = {n.id: i for i, n in enumerate(ordered)}
        if head is None and auto_head:
            head = self.pick_head(ordered)
        counts = {k: 0 for k in _COUNT_KEYS}
        counts.update(self.counts)
        counts["nodes"] = len(ordered)
        counts["toolCalls"] = len(self._tool_calls)
        counts["toolPairs"] = len(self._paired)
        counts["compactions"] = sum(1 for n in ordered if n.role == "llm" and n.name == SUMMARY_NAME)
        counts["systemPrompts"] = sum(1 for n in ordered if n.role == "llm" and n.name == SYSTEM_PROMPT_NAME)
        counts["spawnBranches"] = sum(1 for n in ordered if is_spawn_root(n))
        counts["userTurns"] = sum(1 for n in ordered if n.role == "user")
        counts["llmCalls"] = sum(1 for n in ordered if n.role == "llm" and n.name not in BESIDE_CHAIN_NAMES)
        counts["skipped"] = len(self.skipped)
        if not title:
            title = default_title(ordered)
        return Transcript(
            format=self.format,
            source_key=source_key,
            title=title,
            nodes=ordered,
            head=head,
            usage={k: self.usage[k] for k in sorted(self.usage, key=lambda i: position.get(i, len(ordered)))},
            skipped=list(self.skipped),
            counts=counts,
        )


_LEADING_TAGS = re.compile(r"^(?:\s*<([A-Za-z][\w:-]*)[^>]*>.*?</\1>)+", re.S)


def default_title(nodes: Iterable[NodeInput]) -> str:
    """The first real (not injected, not meta) user text, minus leading ``<tag>…</tag>``
    blocks that agents wrap around it (IDE context, slash-command echoes)."""
    for n in nodes:
        if n.role != "user" or n.metadata.get("injected") or n.metadata.get("isMeta"):
            continue
        out = n.output
        text = out if isinstance(out, str) else text_of_blocks(out, " ") if isinstance(out, list) else ""
        text = _LEADING_TAGS.sub("", text).strip()
        if text:
            return one_line(text)
    return "Imported session"


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


# --------------------------------------------------------------------------- detection

_CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
_CLAUDE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "progress", "file-history-snapshot", "queue-operation", "attachment"}
)


def _is_event(item: Any) -> bool:
    if isinstance(item, list):  # an [action, observation] pair of older OpenHands output
        return any(_is_event(x) for x in item)
    return isinstance(item, dict) and "source" in item and ("action" in item or "observation" in item)


def _openhands_history(value: dict) -> bool:
    """``{"history": [...events]}`` is OpenHands; SWE-agent's history holds chat messages."""
    history = value.get("history")
    if not isinstance(history, list):
        return False
    items = [h for h in history[:20] if h]
    return bool(items) and any(_is_event(h) for h in items)


def _detect_line(obj: dict) -> str | None:
    t = obj.get("type")
    if "instance_id" in obj and isinstance(obj.get("history"), list):
        return "openhands"  # evaluation output: one run a line
    if t in _CODEX_TYPES and "payload" in obj:
        return "codex"
    if t == "session" and ("version" in obj or "cwd" in obj) and "id" in obj:
        return "openclaw"
    if t in ("message", "compaction", "branch_summary", "model_change", "thinking_level_change") and "parentId" in obj:
        return "openclaw"
    if isinstance(obj.get("conversations"), list):
        return "sharegpt"
    if "sessionId" in obj or "parentUuid" in obj or (t in _CLAUDE_TYPES and ("uuid" in obj or "leafUuid" in obj or "messageId" in obj)):
        return "claude-code"
    if isinstance(obj.get("messages"), list) and "type" not in obj:
        return "sharegpt"
    return None


def _detect_json(value: Any) -> str | None:
    if isinstance(value, dict):
        if _openhands_history(value):
            return "openhands"
        if "history" in value or "trajectory" in value:
            return "swe-agent"
        if isinstance(value.get("events"), list):
            return "openhands"
        if isinstance(value.get("conversations"), list) or isinstance(value.get("messages"), list):
            return "sharegpt"
        return None
    if isinstance(value, list):
        for item in value[:20]:
            if not isinstance(item, dict):
                continue
            if "source" in item and ("action" in item or "observation" in item):
                return "openhands"
            if isinstance(item.get("conversations"), list) or isinstance(item.get("messages"), list):
                return "sharegpt"
        return None
    return None


def detect_format(path: str | Path) -> str:
    """The format of a transcript file (one of ``FORMATS``); ``ValueError`` if unknown."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a directory; use parse_path")
    if p.suffix == ".traj":
        return "swe-agent"
    with p.open("rb") as fh:
        first_chunk = fh.read(4096).removeprefix(_BOM).lstrip()
    if first_chunk[:1] == b"[" or (p.suffix == ".json" and first_chunk[:1] == b"{"):
        try:
            fmt = _detect_json(load_json(p))
        except (msgspec.DecodeError, RecordTooLarge, RecursionError):
            fmt = None
        if fmt:
            return fmt
    seen = 0
    for _, raw in iter_lines(p):
        if isinstance(raw, int):
            continue  # over the cap: the parser reports it
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except (msgspec.DecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            fmt = _detect_line(obj)
            if fmt:
                return fmt
        seen += 1
        if seen >= 200:
            break
    raise ValueError(
        f"cannot tell which transcript format {p} is in (not Claude Code, Codex, OpenClaw, SWE-agent, OpenHands "
        "or ShareGPT); pass --format / format if it is one of them"
    )


# --------------------------------------------------------------------------- dispatch


def parse_file(path: str | Path, format: str = "auto") -> list[Transcript]:  # noqa: A002
    """Parse one transcript file into one or more ``Transcript`` values.

    A Claude Code session file brings its ``<session>/subagents/agent-*.jsonl`` files (and
    legacy ``agent-*.jsonl`` siblings with the same ``sessionId``) in as spawn branches; a
    ShareGPT file gives one transcript per conversation, an OpenHands ``output.jsonl`` one
    per run.
    """
    return list(iter_file(path, format))


def iter_file(path: str | Path, format: str = "auto") -> Iterator[Transcript]:  # noqa: A002
    """``parse_file`` one transcript at a time: formats with one session a line (ShareGPT,
    OpenHands output) are streamed, so memory is bounded by the largest session."""
    p = Path(path)
    for t in _iter_as(p, detect_format(p) if format == "auto" else format):
        t.source_path = str(p)
        yield t


def _iter_as(p: Path, fmt: str) -> Iterator[Transcript]:
    if fmt == "claude-code":
        from . import claude_code

        yield claude_code.parse(p)
    elif fmt == "codex":
        from . import codex

        yield codex.parse(p)
    elif fmt == "openclaw":
        from . import openclaw

        yield openclaw.parse(p)
    elif fmt == "swe-agent":
        from . import swe_agent

        yield swe_agent.parse(p)
    elif fmt == "openhands":
        from . import openhands

        yield from openhands.iter_parse(p)
    elif fmt == "sharegpt":
        from . import sharegpt

        yield from sharegpt.iter_parse(p)
    else:
        raise ValueError(f"unknown transcript format {fmt!r}; expected one of {', '.join(FORMATS)}")


_SUFFIXES = (".jsonl", ".json", ".traj")


def parse_path(path: str | Path, format: str = "auto", errors: list[tuple[str, str]] | None = None) -> list[Transcript]:  # noqa: A002
    """Parse a file, or every transcript file below a folder (``~/.claude/projects``-style).

    Subagent files are folded into their parent session and not returned on their own.
    Files whose format cannot be told are left out; pass ``errors`` to collect
    ``(path, message)`` for them.
    """
    return list(iter_path(path, format, errors))


def transcript_files(path: str | Path, errors: list[tuple[str, str]] | None = None) -> list[Path]:
    """The files ``iter_path`` reads below a folder, subagent files folded away.

    A Claude Code compaction summarizer's own transcript (``agent-acompact-*``) is folded
    too: it is not a turn of anyone's conversation (the parent's parser records it as the
    compaction's provenance).
    """
    p = Path(path)
    files = _transcript_files(p, errors)
    from . import claude_code

    folded: set[Path] = set()
    for f in files:
        if f.suffix == ".jsonl" and not claude_code.is_agent_file(f):
            folded.update(claude_code.subagent_files(f))
            folded.update(claude_code.compaction_files(f))
    return [f for f in files if f not in folded]


def iter_path(path: str | Path, format: str = "auto", errors: list[tuple[str, str]] | None = None) -> Iterator[Transcript]:  # noqa: A002
    """``parse_path`` one transcript at a time (see ``iter_file``)."""
    p = Path(path)
    if p.is_file():
        yield from iter_file(p, format)
        return
    for f in transcript_files(p, errors):
        try:
            yield from iter_file(f, format)
        except (ValueError, OSError, RecursionError) as exc:
            if errors is not None:
                errors.append((str(f), str(exc) if not isinstance(exc, RecursionError)
                               else f"nested deeper than {MAX_JSON_DEPTH} levels; not a transcript"))


#: how many unreadable folders one import reports by name
_MAX_WALK_ERRORS = 20


def _transcript_files(root: Path, errors: list[tuple[str, str]] | None) -> list[Path]:
    """Transcript files below ``root``, sorted; symlinked folders are not entered.

    A folder that cannot be listed (``/proc/1/cwd``, a permission-denied subtree) is
    reported in ``errors`` (the first ``_MAX_WALK_ERRORS`` by name, then a count) and
    the walk goes on, so one unreadable corner never fails the whole import.
    """
    failed: list[OSError] = []
    found: list[Path] = []
    for folder, _dirs, names in os.walk(root, onerror=failed.append, followlinks=False):
        for name in names:
            f = Path(folder, name)
            if f.suffix in _SUFFIXES and f.is_file():
                found.append(f)
    if errors is not None:
        for exc in failed[:_MAX_WALK_ERRORS]:
            errors.append((str(exc.filename or root), f"cannot list: {exc.strerror or exc}"))
        if len(failed) > _MAX_WALK_ERRORS:
            errors.append((str(root), f"{len(failed) - _MAX_WALK_ERRORS} more folders could not be listed"))
    return sorted(found)
