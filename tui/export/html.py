"""``perfmon report --html``: the run as one self-contained HTML file, charts drawn by Bokeh.

Bokeh (BSD, maintained by the Bokeh project under NumFOCUS) renders into a canvas from a JSON
document and ships its JavaScript with the Python package, so the whole of ``bokeh.min.js`` is
written into the page (about 1.3 MB) and the file opens offline: no script, font or style is
fetched. Only the core bundle is embedded (no widget models are used), which keeps a 1,024-rank
report to a few MB. The charts read the analysis's downsampled history
(``perfmon_analysis.history``); the verdict and the text sections read the report dict, as the
text report does.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
from bokeh.embed import components
from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    CustomJSHover,
    FixedTicker,
    HoverTool,
    LinearColorMapper,
    NumeralTickFormatter,
    Range1d,
)
from bokeh.models.annotations import ColorBar, Span  # the package's stubs do not re-export these two
from bokeh.palettes import Category10_10, Viridis256
from bokeh.plotting import figure as _bokeh_figure
from bokeh.resources import Resources

from perfmon_analysis import units
from perfmon_analysis.analysis import Analysis
from perfmon_analysis.capture import capture_reading
from perfmon_analysis.history import MEMORY_FIELDS, STEP_FIELDS, History, memory_used
from perfmon_analysis.layout_report import layout_lines
from perfmon_analysis.metrics import ETTR
from perfmon_analysis.profile import profile_lines
from perfmon_analysis.report import gains_lines
from perfmon_analysis.verdict import label as outcome_label

TREND_COLUMNS = 240       # time slices of the step-time chart
HEATMAP_COLUMNS = 100     # time slices of each per-rank heatmap
FRAME_WIDTH = 860         # every chart's plot area, so that the time axes line up
LEFT_BORDER = 90          # room for the widest y labels (memory, node names)
# The step's parts, stacked: (history field, legend, colour)
PARTS = (("compute", "compute", "#4c78a8"), ("data", "data wait", "#f58518"),
         ("comm", "exposed comm", "#e45756"), ("gap", "between steps", "#9d9d9d"))
MEMORY_KINDS = (("params", "#4c78a8"), ("grads", "#72b7b2"), ("optimizer", "#54a24b"),
                ("activations", "#f58518"), ("cache", "#b279a2"), ("other", "#9d9d9d"))
HEATMAPS = (("step", "step time (s)", False), ("compute", "compute (s)", False),
            ("data", "data wait (share of the step)", True), ("comm", "exposed comm (share of the step)", True))


def render(analysis: Analysis, report: dict[str, Any]) -> str:
    """The whole page for ``report`` (``Analysis.report``) and ``analysis``'s history."""
    hist = analysis.history
    plots = []
    span = hist.span()
    unmeasured: list[str] = []
    if span is not None:
        x_range = Range1d(start=_ms(span[0]), end=_ms(span[1]))
        plots.append(_step_chart(hist, x_range))
        plots.append(_verdict_chart(hist, x_range, span[1]))
        maps, unmeasured = _heatmaps(hist, x_range)
        plots.extend(maps)
        memory = _memory_chart(hist, x_range)
        if memory is not None:
            plots.append(memory)
    body = ""
    if plots:
        script, div = components(column(*plots))
        body = f"{div}\n{script}"
    js = Resources(mode="inline", components=["bokeh"]).render_js()
    title = html.escape(f"perfmon report: {report.get('job') or units.NA}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n"
            f"<style>{_CSS}</style>\n{js}\n</head><body>\n<h1>{title}</h1>\n{_verdict_html(report)}\n"
            f"<h2>Over the whole run</h2>\n{_ettr_html(report, hist)}\n{body}\n{_unmeasured_html(unmeasured)}\n"
            f"{_tail_html(report)}\n</body></html>\n")


def _unmeasured_html(titles: list[str]) -> str:
    """The per-rank maps left out because no rank measured their quantity (unknown is not 0)."""
    if not titles:
        return ""
    return f"<p>Not measured on any rank, so not drawn: {_esc(', '.join(titles))}.</p>"


_CSS = ("body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1150px}"
        "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.4em}pre{font-size:12px;background:#f6f6f6;"
        "padding:.6em;overflow-x:auto}.sev-crit{color:#b00}.sev-warn{color:#a60}.sev-ok{color:#070}"
        ".path{color:#555}")


def _ms(t: float) -> float:
    """Probe time (s since the epoch) on Bokeh's datetime axis (ms)."""
    return t * 1000.0


def _esc(text: Any) -> str:
    return html.escape(str(text))


def _verdict_html(report: dict[str, Any]) -> str:
    verdict = report["verdict"]
    parts = [f"<p>{_esc(report.get('world_size', 1))} rank(s), {_esc(report['device']['type'])}"
             f"{', ' + _esc(report['device']['name']) if report['device'].get('name') else ''}. "
             f"Window: the last {_esc(report['window']['steps'])} steps.</p>",
             f"<h2>Verdict: <span class=\"sev-{_esc(verdict['severity'])}\">"
             f"{_esc(outcome_label(verdict['bottleneck']))}"
             f"</span> [{_esc(verdict['severity'])}]</h2>", f"<p>{_esc(verdict['headline'])}</p>"]
    if verdict.get("path"):
        parts.append(f"<p class=\"path\">Path: {_esc(' > '.join(verdict['path']) + ' > ' + verdict['bottleneck'])}</p>")
    if verdict.get("suggestions"):
        parts.append("<ul>" + "".join(f"<li>{_esc(s)}</li>" for s in verdict["suggestions"]) + "</ul>")
    gains = gains_lines(verdict, width=110)
    if gains:     # the text report's section, word for word: one place computes and words the gains
        parts.append(f"<h2>{_esc(gains[0].split(' (')[0])}</h2><pre>{_esc(chr(10).join(gains))}</pre>")
    layout = layout_lines(report.get("layout") or {}, report.get("straggling"), verdict.get("bottleneck"), width=110)
    if layout:    # the text report's section too: the layout, the straggler what-if, each stage
        parts.append(f"<h2>{_esc(layout[1].split(':')[0])}</h2><pre>{_esc(chr(10).join(layout[1:]))}</pre>")
    return "\n".join(parts)


LONGEST_GAPS = 5     # the pauses between steps listed under ETTR


def _ettr_html(report: dict[str, Any], hist: History) -> str:
    """ETTR, the share of the ranks' wall time between steps, and the longest pauses (each the
    longest in its bucket of steps: when, which rank, which steps)."""
    dur = gap = 0.0
    g = STEP_FIELDS.index("gap")
    pauses: list[tuple[float, Any, Any]] = []
    for h in hist.ranks.values():
        for b in h.steps.buckets():
            dur += (b.mean[0] or 0.0) * b.n
            gap += (b.mean[g] or 0.0) * b.n
            if longest_gap := b.hi[g]:
                pauses.append((longest_gap, b, h))
    steps = sum(h.steps.points for h in hist.ranks.values())
    lost = units.pct(gap / dur) if dur > 0 else units.NA
    out = (f"<p>ETTR {_esc(units.pct(report['metrics'].get(ETTR.name)))}: {_esc(units.count(steps))} rank-steps, "
           f"{_esc(lost)} of their wall time between steps (checkpoints, evaluation, stalls); "
           f"grey in the step-time chart.</p>")
    # one line per range of steps (every rank pauses for the same checkpoint): its longest, and on how many ranks
    by_steps: dict[tuple[int, int], list[tuple[float, Any, Any]]] = {}
    for p in pauses:
        by_steps.setdefault((p[1].first, p[1].last), []).append(p)
    longest = sorted((max(group, key=lambda p: p[0]) + (len(group),) for group in by_steps.values()),
                     key=lambda p: -p[0])
    if longest:
        start = (hist.span() or (0.0, 0.0))[0]
        rows = "".join(f"<li>{_esc(units.seconds(secs))} before {_esc(_steps_of(b))} on rank "
                       f"{h.rank}{' (' + _esc(h.host) + ')' if h.host else ''}"
                       f"{f' and {n - 1} more' if n > 1 else ''}, {_esc(units.age(b.t0 - start))} into the run</li>"
                       for secs, b, h, n in longest[:LONGEST_GAPS])
        out += f"<p>Longest pauses between steps:</p><ul>{rows}</ul>"
    return out


def _steps_of(b: Any) -> str:
    return f"step {b.first}" if b.first == b.last else f"a step of {b.first}-{b.last}"


def _tail_html(report: dict[str, Any]) -> str:
    """The module profile and the profiler captures, as in the text report."""
    out = []
    if report.get("profile"):
        out.append("<h2>Module profile</h2><pre>" + _esc("\n".join(profile_lines(report["profile"], width=110)))
                   + "</pre>")
    if report.get("captures"):
        lines = [line for c in report["captures"] for line in capture_reading(c, c["rank"]).lines(110)]
        out.append("<h2>torch.profiler captures</h2><pre>" + _esc("\n".join(lines)) + "</pre>")
    return "\n".join(out)


def figure(**kwargs: Any) -> Any:
    """A Bokeh figure whose plot frame has the same width and left edge as every other chart's, so
    their time axes line up whatever their legends, colour bars and y labels take."""
    return _bokeh_figure(frame_width=FRAME_WIDTH, min_border_left=LEFT_BORDER, **kwargs)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _step_chart(hist: History, x_range: Range1d) -> Any:
    """Step time over the whole run: the mean step's parts stacked, the range of step times kept
    (each slice's fastest and slowest step of any rank, so a spike shows)."""
    trend = hist.trend(TREND_COLUMNS)
    data: dict[str, list[float]] = {"x": [_ms(p.t) for p in trend], "lo": [p.lo for p in trend],
                                    "hi": [p.hi for p in trend],
                                    "step": [_nan(p.mean[0]) for p in trend]}
    for field, _, _ in PARTS:
        i = STEP_FIELDS.index(field)
        data[field] = [p.mean[i] or 0.0 for p in trend]     # an unmeasured part adds nothing to the stack
    src = ColumnDataSource(data)
    top = max((p.mean[0] or 0.0 for p in trend), default=0.0) * 1.8
    slowest = max(trend, key=lambda p: p.hi) if trend else None
    title = "Step time over the run (mean of all ranks, stacked by part; band: fastest to slowest step)"
    y_range = None
    if slowest is not None and top > 0 and slowest.hi > top:     # one spike would flatten the rest: clip it
        y_range = Range1d(start=0, end=top)
        title += f"; slowest step {units.seconds(slowest.hi)}, off the scale"
    fig = figure(title=title, x_axis_type="datetime", x_range=x_range, height=300,
                 y_axis_label="seconds", tools="xpan,xwheel_zoom,ywheel_zoom,reset,save",
                 **({"y_range": y_range} if y_range is not None else {}))
    fig.varea(x="x", y1="lo", y2="hi", source=src, fill_color="#bbbbbb", fill_alpha=0.35,
              legend_label="fastest to slowest step")
    fig.varea_stack(stackers=[f for f, _, _ in PARTS], x="x", source=src, color=[c for _, _, c in PARTS],
                    legend_label=[name for _, name, _ in PARTS], fill_alpha=0.8)
    line = fig.line(x="x", y="step", source=src, color="black", line_width=1.2, legend_label="mean step")
    fig.add_tools(HoverTool(renderers=[line], mode="vline", tooltips=[
        ("time", "@x{%F %T}"), ("mean step", "@step{0.000 a}s"), ("slowest", "@hi{0.000 a}s"),
        ("data wait", "@data{0.000 a}s"), ("exposed comm", "@comm{0.000 a}s"), ("between", "@gap{0.000 a}s")],
        formatters={"@x": "datetime"}))
    fig.legend.location = "top_left"
    fig.legend.orientation = "horizontal"
    return fig


def _verdict_chart(hist: History, x_range: Range1d, end: float) -> Any:
    """The verdict's changes on the same time axis: a bar per verdict, from its change to the next."""
    changes = list(hist.verdicts)
    names = sorted({c.bottleneck for c in changes})
    color = {n: Category10_10[i % 10] for i, n in enumerate(names)}
    src = ColumnDataSource({
        "left": [_ms(c.t) for c in changes],
        "right": [_ms(max(n.t, c.t)) for c, n in zip(changes, changes[1:])] + ([_ms(max(end, changes[-1].t))]
                                                                                 if changes else []),
        "label": [outcome_label(c.bottleneck) for c in changes], "color": [color[c.bottleneck] for c in changes],
        "severity": [c.severity for c in changes], "headline": [c.headline for c in changes]})
    fig = figure(title="Verdict over the run", x_axis_type="datetime", x_range=x_range, y_range=Range1d(start=0, end=1),
                 height=110, tools="xpan,xwheel_zoom,reset")
    bars = fig.quad(left="left", right="right", bottom=0, top=1, color="color", source=src, legend_field="label")
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("verdict", "@label [@severity]"), ("", "@headline")]))
    fig.yaxis.visible = False
    fig.add_layout(fig.legend[0], "right")
    return fig


def _heatmaps(hist: History, x_range: Range1d) -> tuple[list[Any], list[str]]:
    """Per rank (rows, grouped by node) and time slice (columns): step time, compute, data wait and
    exposed communication; and the titles of those no rank measured."""
    out, unmeasured = [], []
    # no more slices than the busiest rank has buckets: a short run's slices would fall between its steps
    columns = min(HEATMAP_COLUMNS, max((len(h.steps) for h in hist.ranks.values()), default=0))
    for field, title, share in HEATMAPS:
        edges, ranks, rows = hist.grid(field, columns, share=share)
        if not ranks or not edges:
            continue
        matrix = np.array([[_nan(v) for v in row] for row in rows], dtype=np.float32)
        if np.all(np.isnan(matrix)):
            unmeasured.append(title)
            continue
        high = float(np.nanmax(matrix)) if not share else max(0.05, float(np.nanmax(matrix)))
        mapper = LinearColorMapper(palette=Viridis256, low=float(np.nanmin(matrix)) if not share else 0.0,
                                   high=high, nan_color="#ffffff")
        height = min(420, max(120, 60 + 3 * len(ranks)))
        fig = figure(title=f"Per rank: {title}", x_axis_type="datetime", x_range=x_range,
                     y_range=Range1d(start=0, end=len(ranks)), height=height, tools="xpan,xwheel_zoom,reset",
                     y_axis_label="rank, by node")
        img = fig.image(image=[matrix], x=_ms(edges[0]), y=0, dw=_ms(edges[-1]) - _ms(edges[0]), dh=len(ranks),
                        color_mapper=mapper)
        fig.add_tools(HoverTool(renderers=[img], tooltips=[("rank", "$y{rank}"), ("value", "@image{0.000 a}")],
                                formatters={"$y": _row_rank([(h.rank, h.host) for h in ranks])}))
        fig.add_layout(ColorBar(color_mapper=mapper, width=10,
                                formatter=NumeralTickFormatter(format="0%" if share else "0.000 a")), "right")
        _node_ticks(fig, [(h.rank, h.host) for h in ranks])
        out.append(fig)
    return out, unmeasured


def _row_rank(ranks: list[tuple[int, str | None]]) -> CustomJSHover:
    """The hover's rank (and node) of the row under the pointer: rows are ranks grouped by node."""
    labels = [f"{rank} ({host})" if host else str(rank) for rank, host in ranks]
    return CustomJSHover(args={"labels": labels},
                         code="const row = Math.floor(value); "
                              "return row >= 0 && row < labels.length ? labels[row] : '';")


def _node_ticks(fig: Any, ranks: list[tuple[int, str | None]]) -> None:
    """Label the rows: every rank when few, else each node's first row, with a line between nodes."""
    ticks: dict[int, str] = {}
    prev: str | None = None
    nodes = len({h for _, h in ranks})
    for row, (rank, host) in enumerate(ranks):
        if host != prev and row:
            fig.add_layout(Span(location=row, dimension="width", line_color="white", line_width=1))
        if len(ranks) <= 32:
            ticks[row] = f"{host} r{rank}" if host and nodes > 1 else f"rank {rank}"
        elif host != prev and nodes <= 48:
            ticks[row] = f"{host or 'node'} r{rank}"
        prev = host
    if not ticks:
        step = max(1, len(ranks) // 16)
        ticks = {row: f"r{rank}" for row, (rank, _) in enumerate(ranks) if row % step == 0}
    fig.yaxis.ticker = FixedTicker(ticks=[r + 0.5 for r in ticks])
    fig.yaxis.major_label_overrides = {r + 0.5: text for r, text in ticks.items()}


def _memory_chart(hist: History, x_range: Range1d) -> Any | None:
    """Memory over time by kind, against the limit, of the rank that came closest to it."""
    h = hist.closest_to_memory_limit()
    if h is None:
        return None
    buckets = h.memory.buckets()
    data: dict[str, list[float]] = {"x": [_ms((b.t0 + b.t1) / 2) for b in buckets]}
    kinds = [(k, c) for k, c in MEMORY_KINDS if any(b.mean[MEMORY_FIELDS.index(k)] is not None for b in buckets)]
    for k, _ in kinds:
        data[k] = [b.mean[MEMORY_FIELDS.index(k)] or 0.0 for b in buckets]
    data["used"] = [_nan(memory_used(b.mean)) for b in buckets]
    data["rss_hi"] = [_nan(b.hi[MEMORY_FIELDS.index("rss")]) for b in buckets]
    data["limit"] = [_nan(b.mean[MEMORY_FIELDS.index("limit")]) for b in buckets]
    src = ColumnDataSource(data)
    fig = figure(title=f"Memory of rank {h.rank}{' on ' + h.host if h.host else ''} (the closest to its limit)",
                 x_axis_type="datetime", x_range=x_range, height=260, y_axis_label="bytes",
                 tools="xpan,xwheel_zoom,reset")
    if kinds:
        fig.varea_stack(stackers=[k for k, _ in kinds], x="x", source=src, color=[c for _, c in kinds],
                        legend_label=[k for k, _ in kinds], fill_alpha=0.8)
    if kinds:     # each reading's total as a dot too: a run with one memory reading still shows it
        fig.scatter(x="x", y="used", source=src, size=5, color="#333333", legend_label="in use")
    if any(not math.isnan(v) for v in data["rss_hi"]):
        fig.line(x="x", y="rss_hi", source=src, color="#4c78a8", line_width=1.5, legend_label="resident (peak)")
    if any(not math.isnan(v) for v in data["limit"]):
        fig.line(x="x", y="limit", source=src, color="#b00", line_dash="dashed", line_width=1.5, legend_label="limit")
    fig.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    fig.legend.location = "top_left"
    fig.legend.orientation = "horizontal"
    return fig
