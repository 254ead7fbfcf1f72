"""Provider usage and the calibration of estimates against it (SPEC §7).

The usage part of ``ContextService`` (``engine/views.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dagctx.context import budget as budget_mod
from dagctx.context.cancel import stop_if_cancelled
from dagctx.ledger import SessionGraph, UsageRow
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call

if TYPE_CHECKING:
    from .ports import ViewHost
    from .records import RenderRecord


class UsageCalibration:
    """``usage/report`` and the calibrated total of a render."""

    e: ViewHost

    def calibrated(self, session_id: str, model: str, estimate: int, rec: RenderRecord | None) -> tuple[str, int]:
        """Provider figure when this is exactly the reported call's render, else the
        estimate scaled by the newest measured/estimated ratio of the same model."""
        stop_if_cancelled()
        rows = [u for u in self.e.store.usage(session_id) if u.estimated and (u.model or model) == model]
        if not rows:
            return "estimate", estimate
        last = rows[-1]
        node = self.e.store.graph(session_id).nodes.get(last.node_id)
        same = (
            rec is not None
            and node is not None
            and node.reads == rec.reads
            and (node.metadata.get("renderManifest") or {}).get("tokens") == rec.total
        )
        value, source = budget_mod.calibrate(estimate, last.prompt, last.estimated, same_messages=same)
        return source, value

    def usage_report(self, p: c.UsageReportParams) -> tuple[c.UsageReportResult, c.CompactionRecommended | None]:
        store = self.e.store
        node = _llm_node(store.graph(p.session_id), p.node_id, "usage belongs on an llm node")
        manifest = node.metadata.get("renderManifest") or {}
        model = p.model or manifest.get("model") or node.name or None
        estimated = manifest.get("tokens") if isinstance(manifest.get("tokens"), int) else None
        row = UsageRow(
            node_id=p.node_id,
            model=self.e.models.get(model).name if model else None,
            usage=p.usage,
            estimated=estimated,
            reported_at=time.time(),
        )
        store.put_usage(p.session_id, row)
        info = self.e.models.get(row.model)
        reserve = budget_mod.output_reserve(info, None)
        input_budget = max(1, info.context_window - reserve)
        percent = round(row.prompt / input_budget * 100, 1)
        ratio = (row.prompt / estimated) if estimated else None
        recommend = percent >= budget_mod.RECOMMEND_AT
        note = None
        if recommend:
            note = c.CompactionRecommended(
                session_id=p.session_id,
                head=store.head(p.session_id),
                percent_used=percent,
                input_used=row.prompt,
                context_window=info.context_window,
                model=info.name,
            )
        return (
            c.UsageReportResult(
                node_id=p.node_id,
                measured_prompt=row.prompt,
                estimated_prompt=estimated,
                calibration=None if ratio is None else round(ratio, 4),
                percent_used=percent,
                recommend_compaction=recommend,
            ),
            note,
        )


def _llm_node(graph: SessionGraph, node_id: str, why: str) -> Call:
    node = graph.get(node_id)
    if node.role != "llm":
        raise DagctxError(
            "InvalidParams", f"{why}; {node_id!r} is a {node.role} node", node_id=node_id, path="nodeId"
        )
    return node

