"""OpenHands event lists and evaluation output → Transcripts.

Three shapes are read: a JSON array of events, one object ``{"events": [...]}`` or
``{"history": [...]}``, and evaluation output (``output.jsonl``): one
``{"instance_id", "history": [...], ...}`` object a line, one run each, each its own
session titled by its ``instance_id`` (``source_key`` = ``<instance_id>:<SHA-256 of the
line>``). Older evaluation output stores ``history`` as ``[action, observation]`` pairs;
they are flattened in order.

Events carry ``id``, ``timestamp``, ``source`` (``user``/``agent``/``environment``) and
either ``action`` + ``args`` or ``observation`` + ``content``/``extras``; agent actions
that came from a tool call carry ``tool_call_metadata`` (``function_name``,
``tool_call_id``, ``model_response``).

* ``user`` ``message`` actions → user nodes (``image_urls`` become image references).
* One llm node per ``model_response.id``: its text is the response's message content,
  its name the response's model, its usage the response's usage. Every action from that
  response is a code node called by it; the arguments are taken from the response's
  ``tool_calls`` (by id), else from the action's ``args``.
* An observation whose ``cause`` is such an action (or, failing that, whose
  ``tool_call_id`` matches) is that call's result; ``success: false`` or an ``error``
  observation marks it ``status="error"``. An ``error`` observation without a ``cause``
  (OpenHands shows it to the model as a message: a bad action, a stuck loop) is a user
  node with ``metadata["observation"]="error"`` — the model saw it, so it is kept.
* An agent ``message`` action without tool-call metadata is an llm reply on its own.
* ``system`` actions → ``context/system_prompt``; a ``condensation`` action with a
  ``summary`` → ``context/summary`` covering the chain nodes built from the forgotten
  events. Environment and state-change events are not turns.

Ids: ``oh-<event id>`` (llm nodes from a model response: ``oh-<first event id>-llm``).
``source_key`` is the file's SHA-256 (whole-file shapes). ``counts["messages"]`` = events
read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from dagctx.protocol.context_messages import Skipped

from .base import quote, Rank, Reader, ROOT, Transcript
from .builder import Builder
from . import jsonstream
from .reading import _TOO_DEEP, decode_json, file_digest, iter_lines, max_line_bytes, text_digest, too_large
from .values import content_output, parse_arguments, scrub_block, text_of_blocks, to_epoch

_BOM = b"\xef\xbb\xbf"


def parse(path: Path) -> list[Transcript]:
    return list(iter_parse(path))


def _is_whole_json(path: Path) -> bool:
    with path.open("rb") as fh:
        first = fh.read(4096).removeprefix(_BOM).lstrip()
    if first[:1] == b"[":
        return True
    if first[:1] != b"{":
        return False
    # One object per line (output.jsonl) or one object in the whole file?
    return path.suffix != ".jsonl"


def _events_of(data: Any) -> Iterator[Any] | None:
    """The events of a whole-file document or of one output line, pairs flattened, one at a
    time (a streamed document's events are decoded one by one: ``jsonstream``)."""
    if jsonstream.is_array(data):
        events = data
    else:
        obj = jsonstream.fields(data)
        if obj is None:
            return None
        events = obj.get("events") if jsonstream.is_array(obj.get("events")) else obj.get("history")
    if not jsonstream.is_array(events):
        return None
    return _flat(jsonstream.elements(events))


def _flat(events: Iterator[Any]) -> Iterator[Any]:
    for ev in events:
        if isinstance(ev, list) and all(isinstance(x, dict) or x is None for x in ev):
            yield from (x for x in ev if x)  # an [action, observation] pair
        else:
            yield ev


def iter_parse(path: Path) -> Iterator[Transcript]:
    """Each session in ``path``, one at a time (an output.jsonl is streamed line by line, a
    large event list an event at a time)."""
    if _is_whole_json(path):
        with path.open("rb") as fh:
            try:
                data = jsonstream.open_document(fh, path.stat().st_size)
            except msgspec.DecodeError as exc:
                if "trailing characters" not in str(exc):
                    b = Builder("openhands")
                    b.skipped.append(Skipped(1, f"not JSON: {exc}"))
                    yield b.finish(file_digest(path), None)
                    return
                data = None  # several objects: evaluation output without the .jsonl suffix
            if data is not None:
                events = _events_of(data)
                b = Builder("openhands")
                if events is None:
                    b.skipped.append(Skipped(1, "no event list (expected a JSON array of events, or an object with "
                                                "\"events\" or \"history\")"))
                    yield b.finish(file_digest(path), None)
                    return
                obj = jsonstream.fields(data) if jsonstream.is_object(data) else None
                title = obj.get("instance_id") if obj is not None else None
                yield _Parser(b).run(events, file_digest(path), title if isinstance(title, str) else None)
                return
    yield from _iter_output_lines(path)


def _with_skipped(t: Transcript, skipped: list[Skipped]) -> Transcript:
    if skipped:
        t.skipped = sorted(skipped + t.skipped, key=lambda s: s.line)
        t.counts["skipped"] = len(t.skipped)
    return t


def _iter_output_lines(path: Path) -> Iterator[Transcript]:
    """One transcript per line; one is held back so bad lines ride on a neighbour."""
    pending: list[Skipped] = []
    last: Transcript | None = None
    for no, raw in iter_lines(path):
        if isinstance(raw, int):
            pending.append(Skipped(no, too_large(raw)))
            continue
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except msgspec.DecodeError as exc:
            pending.append(Skipped(no, _TOO_DEEP if str(exc) == _TOO_DEEP else f"not JSON: {quote(text, 20)}"))
            continue
        except RecursionError:
            pending.append(Skipped(no, "JSON nested too deeply"))
            continue
        events = _events_of(obj) if isinstance(obj, dict) else None
        if events is None:
            pending.append(Skipped(no, "not an OpenHands run (no \"history\" or \"events\" list)"))
            continue
        iid = obj.get("instance_id")
        title = str(iid) if isinstance(iid, (str, int)) and not isinstance(iid, bool) else None
        key = f"{title}:{text_digest(text)}" if title else text_digest(text)
        t = _Parser(Builder("openhands"), line=no).run(events, key, title)
        if last is not None:
            yield _with_skipped(last, pending)
            pending = []
        last = t
    if last is not None:
        yield _with_skipped(last, pending)
    elif pending:
        b = Builder("openhands")
        b.skipped.extend(pending)
        yield b.finish(file_digest(path), None)


class _Parser:
    def __init__(self, b: Builder, line: int | None = None) -> None:
        self.b = b
        #: the output.jsonl line the events came from (their skipped reports name it)
        self.line = line
        self.tip: str = ROOT
        self.model: str | None = None
        self.llm_by_response: dict[str, str] = {}
        self.action_call: dict[Any, str] = {}
        self.calls: dict[str, list[str]] = {}
        self.node_by_event: dict[Any, str] = {}

    def run(self, events: Iterator[Any], source_key: str, title: str | None = None) -> Transcript:
        i = -1
        for i, ev in enumerate(events):
            if isinstance(ev, jsonstream.Unreadable):
                why = (f"of {ev.size:,} bytes is over the {max_line_bytes():,}-byte limit "
                       "(DAGCTX_IMPORT_MAX_LINE_BYTES); not read" if ev.size is not None else f"is not JSON: {ev.reason}")
                self.b.skipped.append(Skipped(self.line or i + 1, f"event #{i} {why}"))
                continue
            if not isinstance(ev, dict):
                self.b.skipped.append(Skipped(self.line or i + 1, f"event #{i} is not an object"))
                continue
            self._event(i, ev)
        self.b.counts["messages"] = i + 1
        return self.b.finish(source_key, title)

    def _event(self, i: int, ev: dict) -> None:
        b = self.b
        eid = ev.get("id", i)
        ts = to_epoch(ev.get("timestamp"))
        key = (i,)
        src = ev.get("source")
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        tcm = ev.get("tool_call_metadata") if isinstance(ev.get("tool_call_metadata"), dict) else None
        action = ev.get("action")
        if action is not None:
            if action == "message" and src == "user":
                text = args.get("content") if isinstance(args.get("content"), str) else ev.get("message") or ""
                images = [u for u in (args.get("image_urls") or []) if isinstance(u, str)]
                output: Any = text
                if images:
                    output = [{"type": "text", "text": text}] + [scrub_block({"type": "image_url", "image_url": u}) for u in images]
                node = b.user(b.unique(f"oh-{eid}"), output, self.tip, key=key, timestamp=ts)
                self.tip = node.id
                self.node_by_event[eid] = node.id
            elif action == "system":
                text = args.get("content") if isinstance(args.get("content"), str) else ev.get("message") or ""
                b.system_prompt(b.unique(f"oh-{eid}"), text, key=key, timestamp=ts)
            elif action == "condensation":
                self._condensation(eid, args, key, ts)
            elif src == "agent" and tcm is not None:
                self._tool_action(eid, ev, args, tcm, key, ts)
            elif src == "agent" and action == "message":
                text = args.get("content") if isinstance(args.get("content"), str) else ev.get("message") or ""
                node = b.llm(b.unique(f"oh-{eid}"), self.model, self.tip, output=text, key=key, timestamp=ts)
                self.tip = node.id
                self.node_by_event[eid] = node.id
            else:
                b.counts["ignoredEvents"] = b.counts.get("ignoredEvents", 0) + 1
            return
        if ev.get("observation") is not None:
            target = self.action_call.get(ev.get("cause"))
            if target is None and tcm is not None:
                tid = tcm.get("tool_call_id")
                cands = self.calls.get(tid, []) if isinstance(tid, str) else []
                target = next((c for c in cands if not b.has_result(c)), None)
            if target is None and ev.get("observation") == "error" and ev.get("cause") is None:
                self._error_message(eid, ev, key, ts)
                return
            if target is None or b.has_result(target):
                b.counts["ignoredEvents"] = b.counts.get("ignoredEvents", 0) + 1
                return
            content = ev.get("content")
            output = content if isinstance(content, str) and content else ev.get("message") or (content or "")
            extras = ev.get("extras") if isinstance(ev.get("extras"), dict) else {}
            meta = extras.get("metadata") if isinstance(extras.get("metadata"), dict) else {}
            error = ev.get("success") is False or ev.get("observation") == "error"
            b.attach_result(
                target, content_output(output), error=error, ts=ts,
                observation=ev.get("observation"), exitCode=meta.get("exit_code"),
            )
            self.node_by_event[eid] = b.by_id[target].caller  # type: ignore[assignment]
            return
        b.counts["ignoredEvents"] = b.counts.get("ignoredEvents", 0) + 1

    def _error_message(self, eid: Any, ev: dict, key: tuple, ts: float | None) -> None:
        """An error the environment reported with no action behind it: the model read it
        as a message, so it is a user turn (marked, so it never becomes the title)."""
        content = ev.get("content")
        text = content if isinstance(content, str) and content else ev.get("message") or ""
        node = self.b.user(self.b.unique(f"oh-{eid}"), str(text), self.tip, key=key, timestamp=ts,
                           observation="error", injected=True)
        self.tip = node.id
        self.node_by_event[eid] = node.id

    def _tool_action(self, eid: Any, ev: dict, args: dict, tcm: dict, key: tuple, ts: float | None) -> None:
        b = self.b
        resp = tcm.get("model_response") if isinstance(tcm.get("model_response"), dict) else {}
        rid = resp.get("id") if isinstance(resp.get("id"), str) else f"event-{eid}"
        llm_id = self.llm_by_response.get(rid)
        choice = (resp.get("choices") or [{}])[0] if isinstance(resp.get("choices"), list) and resp.get("choices") else {}
        message = choice.get("message") if isinstance(choice, dict) and isinstance(choice.get("message"), dict) else {}
        if llm_id is None:
            model = resp.get("model") if isinstance(resp.get("model"), str) else self.model
            if model:
                self.model = model
            content = message.get("content")
            text = content if isinstance(content, str) else text_of_blocks(content or []) if isinstance(content, list) else ""
            if not text and isinstance(args.get("thought"), str):
                text = args["thought"]
            reasoning = message.get("reasoning_content")
            node = b.llm(
                b.unique(f"oh-{eid}-llm"), model, self.tip, output=text, key=key, timestamp=ts,
                responseId=resp.get("id"), thinking=reasoning if isinstance(reasoning, str) and reasoning else None,
                reasoning=[{"type": "reasoning", "text": reasoning}] if isinstance(reasoning, str) and reasoning else None,
            )
            llm_id = node.id
            self.llm_by_response[rid] = llm_id
            self.tip = llm_id
            usage = resp.get("usage")
            if isinstance(usage, dict):
                details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
                cached = usage.get("cache_read_input_tokens") or details.get("cached_tokens") or 0
                written = usage.get("cache_creation_input_tokens") or 0
                prompt = usage.get("prompt_tokens") or 0
                b.set_usage(
                    llm_id, input=max(int(prompt) - int(cached) - int(written), 0),
                    output=usage.get("completion_tokens") or 0, cache_read=cached, cache_write=written,
                )
        tid = tcm.get("tool_call_id") if isinstance(tcm.get("tool_call_id"), str) else None
        call_args: dict | None = None
        for tc in message.get("tool_calls") or []:
            if isinstance(tc, dict) and tc.get("id") == tid and isinstance(tc.get("function"), dict):
                call_args, _ = parse_arguments(tc["function"].get("arguments"))
                break
        if call_args is None:
            call_args = {k: v for k, v in args.items() if k != "thought"}
        name = tcm.get("function_name") if isinstance(tcm.get("function_name"), str) else str(ev.get("action"))
        cid = b.unique(f"oh-{eid}")
        b.tool_call(cid, name, call_args, llm_id, tid, key=key, timestamp=ts, action=ev.get("action"))
        self.action_call[eid] = cid
        if tid:
            self.calls.setdefault(tid, []).append(cid)
        self.node_by_event[eid] = llm_id

    def _condensation(self, eid: Any, args: dict, key: tuple, ts: float | None) -> None:
        summary = args.get("summary")
        if not isinstance(summary, str) or not summary:
            self.b.counts["ignoredEvents"] = self.b.counts.get("ignoredEvents", 0) + 1
            return
        forgotten = args.get("forgotten_event_ids")
        if isinstance(forgotten, list):
            gone = set(forgotten)
        else:
            lo, hi = args.get("forgotten_events_start_id"), args.get("forgotten_events_end_id")
            gone = set(range(lo, hi + 1)) if isinstance(lo, int) and isinstance(hi, int) else set()
        gone_nodes = {self.node_by_event[e] for e in gone if e in self.node_by_event}
        covers = [n for n in self.b.chain_ids(self.tip) if n in gone_nodes]
        self.b.summary(self.b.unique(f"oh-{eid}"), summary, covers, key[0] + 1, key=key, timestamp=ts)


# --------------------------------------------------------------------------- the reader


def _is_event(item: Any) -> bool:
    if isinstance(item, list):  # an [action, observation] pair of older OpenHands output
        return any(_is_event(x) for x in item)
    return isinstance(item, dict) and "source" in item and ("action" in item or "observation" in item)


def _detect_line(obj: dict) -> Rank | None:
    if "instance_id" in obj and isinstance(obj.get("history"), list):
        return (0, 10)  # evaluation output: one run a line
    return None


def _detect_json(value: Any) -> Rank | None:
    if isinstance(value, dict):
        # ``{"history": [...events]}`` is OpenHands; SWE-agent's history holds chat messages
        history = value.get("history")
        if isinstance(history, list) and any(_is_event(h) for h in history[:20] if h):
            return (0, 10)
        if isinstance(value.get("events"), list):
            return (0, 30)
    elif isinstance(value, list):
        for i, item in enumerate(value[:20]):
            if isinstance(item, dict) and _is_event(item):
                return (i, 10)
    return None


READER = Reader("openhands", "OpenHands", iter_parse, detect_line=_detect_line, detect_json=_detect_json)
