"""What ``dagctx eval`` shows: terminal tables and SVG plots (written by hand: no plotting
dependency). The JSON document is ``evaluate.evaluate``'s result as it is."""

from __future__ import annotations

import os
import re
from html import escape as xml
from typing import Any

from dagctx.cli.quality.identifiers import CLASSES

#: sessions in the terminal's per-session table and the token plots (the longest); --json has all
SESSIONS_SHOWN = 12


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else "–"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "–"


def print_tables(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    console.print(f"[bold]dagctx eval[/bold] · summarizer: {doc['summarizer']} · format {doc['format']} · "
                  f"compaction {doc['compaction']} · cache lifetime {doc['cacheTtlSeconds']:.0f} s · "
                  f"prices write {doc['prices']['write']}× read {doc['prices']['read']}× · {doc['seconds']} s")
    shown = sorted(doc["sessions"], key=lambda s: -s["modelCalls"])[:SESSIONS_SHOWN]
    more = len(doc["sessions"]) - len(shown)
    t = Table(title="per session (the longest)" + (f"; {more} more in --json" if more > 0 else ""))
    for col in ("session", "window", "requests (refused)", "compactions", "M1 recall", "M2 kept", "M3 files",
                "M4 max · over", "M5 cost", "÷ naive", "÷ unmanaged", "breaks", "M6 regret", "M7 same"):
        t.add_column(col, overflow="fold")
    for s in shown:
        for w in s["windows"]:
            m5 = w["M5"]
            d, n, u = m5["dagctx"]["totals"], m5["naive"]["totals"], m5["unmanaged"]["totals"]
            m1 = w["M1"]
            kept = sum(v[0] for v in w["M2"]["byClass"].values())
            ids = sum(v[1] for v in w["M2"]["byClass"].values())
            t.add_row(s["title"][:30], w["label"], f"{w['requests']} ({w['M4']['refused']})",
                      str(w["compactions"]["written"]),
                      _pct(m1["recovered"], m1["removed"]) if m1 else "skipped",
                      _pct(kept, ids), _pct(w["M3"]["filesNamed"], w["M3"]["filesEdited"]),
                      f"{w['M4']['maxShare'] or 0:.0%} · {w['M4']['maxOvershoot']}",
                      f"{d['cost']:,.0f}", _ratio(d["cost"], n["cost"]),
                      _ratio(d["cost"], u["cost"]) + ("" if u["served"] == u["requests"] else f" ({u['served']} served)"),
                      str(d["breaks"]), _pct(w["M6"]["regretted"], w["M6"]["aged"]),
                      _pct(w["M7"]["identical"], w["M7"]["requests"]))
    console.print(t)
    tot = doc["totals"]
    t = Table(title=f"total over {len(doc['sessions'])} sessions")
    for col in ("window", "requests (refused)", "compactions", "M1 recall", "M3 files", "M4 max · over",
                "M5 cost", "÷ naive", "÷ naive with summary calls", "breaks dagctx / naive", "unmanaged served",
                "M6 regret", "M7 same"):
        t.add_column(col, overflow="fold")
    for label, w in tot["byWindow"].items():
        m5 = w["M5"]
        t.add_row(label, f"{w['requests']} ({w['refused']})", str(w["compactions"]), _pct(*w["M1"]), _pct(*w["M3"]),
                  f"{w['M4maxShare']:.0%} · {w['M4maxOvershoot']}", f"{m5['dagctx']:,.0f}",
                  f"{m5['costVsNaive']:.2f}×" if m5["costVsNaive"] else "–",
                  f"{m5['withSummarizerVsNaive']:.2f}×" if m5.get("withSummarizerVsNaive") else "–",
                  f"{m5['dagctxBreaks']} / {m5['naiveBreaks']}", f"{m5['unmanagedServed']} of {w['requests']}",
                  _pct(*w["M6"]), _pct(*w["M7"]))
    console.print(t)
    t = Table(title="M2: identifiers of the covered turns each summary names, by class")
    t.add_column("summaries")
    for cls in CLASSES:
        t.add_column(cls)
    t.add_column("all")
    t.add_column("M3 edited files named")
    rec = tot["recorded"]
    rows = [(f"recorded in the transcripts ({rec['summaries']})", rec["byClass"], (rec["filesNamed"], rec["filesEdited"]))]
    for label, w in tot["byWindow"].items():
        rows.append((f"dagctx @ {label} ({w['compactions']})", w["M2"], tuple(w["M3"])))
    # side by side on the same session: the sessions that hold a recorded summary
    for sess in doc["sessions"]:
        if not sess["recordedSummaries"]:
            continue
        rs = sess["recordedSummaries"]
        by: dict[str, list[int]] = {}
        for r in rs:
            for cls, (k, n) in r["retention"].items():
                by.setdefault(cls, [0, 0])
                by[cls][0] += k
                by[cls][1] += n
        title = sess["title"][:28]
        rows.append((f"{title}: recorded ({len(rs)})", by,
                     (sum(r["filesNamed"] for r in rs), sum(r["filesEdited"] for r in rs))))
        for w in sess["windows"]:
            rows.append((f"{title}: dagctx @ {w['label']} ({len(w['M2']['summaries'])})", w["M2"]["byClass"],
                         (w["M3"]["filesNamed"], w["M3"]["filesEdited"])))
    for name, by, files in rows:
        cells = [_pct(*by.get(cls, [0, 0])) for cls in CLASSES]
        allk, alln = sum(v[0] for v in by.values()), sum(v[1] for v in by.values())
        t.add_row(name, *cells, _pct(allk, alln), _pct(*files))
    console.print(t)
    t = Table(title="M5: cache breaks of dagctx's requests by cause")
    for col in ("window", "cause", "breaks", "while warm", "tokens invalidated", "tokens rewritten"):
        t.add_column(col)
    for label, w in tot["byWindow"].items():
        for cause, c in sorted(w["M5"]["byCause"].items()):
            t.add_row(label, cause, str(c["breaks"]), str(c["warm"]), f"{c['invalidated']:,}", f"{c['rewritten']:,}")
    console.print(t)
    for label, w in tot["byWindow"].items():
        m5 = w["M5"]
        console.print(f"{label}: the daemon's stablePrefix predicted the measured prefix in "
                      f"{_pct(m5['stablePrefixAgree'], m5['stablePrefixChecked'])} of the requests it predicted")


# ---------------------------------------------------------------- plots

_W, _H, _PAD = 720, 300, 48
_COLORS = {"dagctx": "#1f6feb", "naive": "#d29922", "unmanaged": "#8b949e", "limit": "#cf222e"}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "session"


def tokens_svg(title: str, series: dict[str, Any]) -> str:
    """Tokens per request (dagctx, naive, unmanaged), the input limit, dagctx's cache breaks."""
    lines = {k: series.get(k) or [] for k in ("unmanaged", "naive", "dagctx")}
    n = max((len(v) for v in lines.values()), default=0)
    top = max([series["limit"]] + [x for v in lines.values() for x in v if x is not None]) * 1.05 or 1
    sx = (_W - 2 * _PAD) / max(1, n - 1)

    def x(i: int) -> float:
        return _PAD + i * sx

    def y(v: float) -> float:
        return _H - _PAD - v / top * (_H - 2 * _PAD)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_PAD}" y="18" font-size="13">{xml(title)}</text>',
           f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="black"/>',
           f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="black"/>',
           f'<text x="{_W / 2}" y="{_H - 12}" text-anchor="middle">request</text>',
           f'<text x="6" y="{_PAD - 8}">tokens (max {top / 1.05:,.0f})</text>']
    for i in series.get("breaks") or []:
        out.append(f'<line x1="{x(i):.1f}" y1="{_PAD}" x2="{x(i):.1f}" y2="{_H - _PAD}" stroke="#1f6feb" '
                   'stroke-opacity="0.25" stroke-dasharray="2,3"/>')
    ly = y(series["limit"])
    out.append(f'<line x1="{_PAD}" y1="{ly:.1f}" x2="{_W - _PAD}" y2="{ly:.1f}" stroke="{_COLORS["limit"]}" '
               'stroke-dasharray="6,4"/>')
    for name, vals in lines.items():
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vals) if v is not None)
        if pts:
            out.append(f'<polyline fill="none" stroke="{_COLORS[name]}" stroke-width="1.5" points="{pts}"/>')
    legend = [("dagctx", "dagctx"), ("naive", "naive 80 % compaction"), ("unmanaged", "no management"),
              ("limit", "input limit (window − output cap)")]
    for k, (key, label) in enumerate(legend):
        lx = _PAD + 10 + k * 165
        out.append(f'<rect x="{lx}" y="{_PAD - 26}" width="10" height="10" fill="{_COLORS[key]}"/>'
                   f'<text x="{lx + 14}" y="{_PAD - 17}">{xml(label)}</text>')
    out.append(f'<text x="{_W - _PAD}" y="{_PAD - 34}" text-anchor="end" fill="#1f6feb">dotted: cache breaks</text>')
    out.append("</svg>")
    return "\n".join(out)


def retention_svg(title: str, groups: list[tuple[str, dict[str, list[int]]]]) -> str:
    """Bars: share of identifiers kept, per class, for each group of summaries."""
    palette = ["#8b949e", "#1f6feb", "#2da44e", "#d29922", "#8250df", "#cf222e"]
    cw = (_W - 2 * _PAD) / len(CLASSES)
    bw = cw * 0.8 / max(1, len(groups))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_PAD}" y="18" font-size="13">{xml(title)}</text>',
           f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="black"/>']
    for c, cls in enumerate(CLASSES):
        cx = _PAD + c * cw
        out.append(f'<text x="{cx + cw / 2:.1f}" y="{_H - _PAD + 16}" text-anchor="middle">{cls}</text>')
        for g, (_name, by) in enumerate(groups):
            k, n = by.get(cls, [0, 0])
            share = k / n if n else 0
            h = share * (_H - 2 * _PAD - 20)
            bx = cx + cw * 0.1 + g * bw
            out.append(f'<rect x="{bx:.1f}" y="{_H - _PAD - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                       f'fill="{palette[g % len(palette)]}"><title>{xml(_name)}: {k}/{n}</title></rect>')
            if n:
                out.append(f'<text x="{bx + bw / 2:.1f}" y="{_H - _PAD - h - 3:.1f}" text-anchor="middle" '
                           f'font-size="9">{share:.0%}</text>')
    for g, (name, _by) in enumerate(groups):
        lx = _PAD + 10 + g * 200
        out.append(f'<rect x="{lx}" y="28" width="10" height="10" fill="{palette[g % len(palette)]}"/>'
                   f'<text x="{lx + 14}" y="37">{xml(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def write_plots(doc: dict[str, Any], folder: str) -> list[str]:
    """Tokens per request of the longest sessions (one file per session and window) and
    retention by class of every summary group."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for s in sorted(doc["sessions"], key=lambda s: -s["modelCalls"])[:SESSIONS_SHOWN]:
        for w in s["windows"]:
            path = os.path.join(folder, f"tokens-{_slug(s['title'])}-{s['session'][:8]}-{w['label']}.svg")
            with open(path, "w", encoding="utf-8") as f:
                f.write(tokens_svg(f"{s['title'][:70]} @ {w['label']}", w["series"]))
            written.append(path)
    tot = doc["totals"]
    groups = [("recorded summaries", tot["recorded"]["byClass"])]
    groups += [(f"dagctx @ {label}", w["M2"]) for label, w in tot["byWindow"].items()]
    path = os.path.join(folder, "retention-by-class.svg")
    with open(path, "w", encoding="utf-8") as f:
        f.write(retention_svg("identifiers of the covered turns kept by each summary, by class", groups))
    written.append(path)
    return written
