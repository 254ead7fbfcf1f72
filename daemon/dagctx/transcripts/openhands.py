"""OpenHands event list (a JSON array of events, or ``{"events": [...]}``) → Transcript.

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
  observation marks it ``status="error"``.
* An agent ``message`` action without tool-call metadata is an llm reply on its own.
* ``system`` actions → ``context/system_prompt``; a ``condensation`` action with a
  ``summary`` → ``context/summary`` covering the chain nodes built from the forgotten
  events. Environment and state-change events are not turns.

Ids: ``oh-<event id>`` (llm nodes from a model response: ``oh-<first event id>-llm``).
``source_key`` is the file's SHA-256. ``counts["messages"]`` = events read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from .base import (
    ROOT,
    Builder,
    Skipped,
    Transcript,
    content_output,
    file_digest,
    load_json,
    parse_arguments,
    scrub_block,
    text_of_blocks,
    to_epoch,
)


def parse(path: Path) -> Transcript:
    b = Builder("openhands")
    try:
        data = load_json(path)
    except msgspec.DecodeError as exc:
        b.skipped.append(Skipped(1, f"not JSON: {exc}"))
        return b.finish(file_digest(path), None)
    events = data.get("events") if isinstance(data, dict) else data
    if not isinstance(events, list):
        b.skipped.append(Skipped(1, "no event list"))
        return b.finish(file_digest(path), None)
    return _Parser(b).run(events, file_digest(path))


class _Parser:
    def __init__(self, b: Builder) -> None:
        self.b = b
        self.tip: str = ROOT
        self.model: str | None = None
        self.llm_by_response: dict[str, str] = {}
        self.action_call: dict[Any, str] = {}
        self.calls: dict[str, list[str]] = {}
        self.node_by_event: dict[Any, str] = {}

    def run(self, events: list[Any], source_key: str) -> Transcript:
        for i, ev in enumerate(events):
            if not isinstance(ev, dict):
                self.b.skipped.append(Skipped(i + 1, f"event #{i} is not an object"))
                continue
            self._event(i, ev)
        self.b.counts["messages"] = len(events)
        return self.b.finish(source_key, None)

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
