"""The report: a window's view and verdict as JSON, and that JSON as 80-column text (both pure).

``build`` assembles the report dict (``tui/schemas/report.schema.json``) from a ``JobView`` and its
``Verdict``; every number in ``metrics`` and the per-rank rows comes from the metric table
(``perfmon_analysis.metrics``), once, at one precision. The verdict's losses and evidence point at
those metrics by name instead of repeating their values. ``render_text`` words the same view and
verdict (typed, never the JSON read back by key), rounding as the JSON does, so the text and the
JSON say the same numbers; its numbers go through ``perfmon_analysis.units``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.capture import capture_reading
from perfmon_analysis.health import text_lines as health_lines
from perfmon_analysis.layout_report import layout_lines, rank_note, rank_place
from perfmon_analysis.metrics import Metric, Unit, by_name, job_values, loss_metrics, rank_values, rounded
from perfmon_analysis.overhead import text_lines as overhead_lines
from perfmon_analysis.profile import profile_lines
from perfmon_analysis.stuck import WHERE_FRAMES
from perfmon_analysis.verdict import WHERE_TOP, Verdict, label as outcome_label
from perfmon_analysis.views import JobView

__all__ = ["build", "gains_lines", "render_text"]

SCHEMA = "perfmon.report/2"
# A verdict's evidence key that is a metric under another name.
EVIDENCE_METRIC = {"memory_peak_frac": "memory.peak_frac"}
_SAME = 5e-5          # evidence rounded to 4 places still names the metric's own value


def build(view: JobView, verdict: Verdict, *, retired: Iterable[tuple[int, dict[str, Any]]] = (),
          source: dict[str, Any] | None = None, price: float | None = None) -> dict[str, Any]:
    """The report JSON for one view and its verdict. ``retired``: earlier processes of a rank
    (``RunModel.retired``); ``source``: where the records came from; ``price``: per device-hour,
    for the money the gains put on each loss."""
    metrics = metric_values(view)
    ranks = [{"rank": r.rank, "host": r.host, "pid": r.pid, "restart": r.restart, "generation": r.generation,
              **rank_values(r), "straggler": r.rank == verdict.straggler_rank, "ended": r.ended, "drops": r.drops,
              **rank_place(view.layout, r.rank)}
             for r in view.ranks]
    return {
        "schema": SCHEMA,
        "job": view.job,
        "world_size": view.world_size,
        "device": {"type": view.device_type, "name": view.device_name},
        "ranks": ranks,
        "window": {"steps": int(view.window["steps"]), "seconds": view.window["seconds"]},
        "metrics": metrics,
        "verdict": _verdict_json(verdict, metrics, price),
        "findings": _jsonable(verdict.findings),
        "step_outliers": [o.as_json() for o in view.health.outliers],
        "memory_growth": view.health.growth.as_json() if view.health.growth is not None else None,
        "crash": view.health.crash.as_json() if view.health.crash is not None else None,
        "comm_ops": [{"op": c.op, "count": c.count, "bytes": c.bytes, "seconds": rounded(c.seconds),
                      "busbw": rounded(c.busbw), "algbw": rounded(c.algbw)} for c in view.comm_ops],
        "ended": view.ended,
        "drops": view.drops_total,
        "previous_generations": [{"rank": rank, "pid": hello.get("pid"), "restart": hello.get("restart")}
                                 for rank, hello in retired],
        "problems": list(view.problems),
        "profile": view.profile.as_json() if view.profile is not None else None,
        "captures": [c.as_json() for c in view.captures],
        "overhead": view.overhead.as_json() if view.overhead is not None else None,
        "layout": view.layout.as_json(),
        "straggling": view.straggling.as_json(view.layout) if view.straggling is not None else None,
        "source": source or {},
        "groups": [g.as_json() for g in view.groups],     # through a relay tree (docs/tree.md); else []
        "as_of": round(view.now, 3),     # the instant the window ends (newest record, or now when live)
    }


def _verdict_json(verdict: Verdict, metrics: dict[str, Any], price: float | None = None) -> dict[str, Any]:
    """The verdict's JSON with each loss and each evidence number that is a metric named, not repeated."""
    out: dict[str, Any] = _jsonable(verdict.as_json(price))
    named_by = loss_metrics()
    out["losses"] = [{"id": x.id, "label": x.label, "metric": named_by[x.id],
                      "source" if x.known else "why_unknown": x.source, "span": x.span} for x in verdict.losses]
    out["evidence"], out["evidence_metrics"] = evidence_split(verdict, metrics)
    return out


def metric_values(view: JobView) -> dict[str, Any]:
    """The report's ``metrics`` object: the table's job numbers and the memory breakdown."""
    metrics = job_values(view)
    metrics["memory"] = {k: rounded(v) for k, v in view.metrics.memory.as_json().items()}
    return metrics


def evidence_split(verdict: Verdict, metrics: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The verdict's evidence less the numbers that are metrics, and those metrics' names (paths)."""
    evidence, named = {}, []
    for key, value in _jsonable(dict(verdict.evidence)).items():
        path = EVIDENCE_METRIC.get(key, key)
        if _is_metric_value(metrics, path, value):
            named.append(path)
        else:
            evidence[key] = value
    return evidence, named


def metric_at(metrics: dict[str, Any], path: str) -> Any:
    """``metrics`` value at ``name`` or ``memory.key``."""
    head, _, rest = path.partition(".")
    value = metrics.get(head)
    return value.get(rest) if rest and isinstance(value, dict) else value


def _is_metric_value(metrics: dict[str, Any], path: str, value: Any) -> bool:
    """Is ``value`` the metric at ``path`` (both unknown, or equal up to the evidence's rounding)?"""
    if path.partition(".")[0] not in metrics:
        return False
    known = metric_at(metrics, path)
    if value is None or known is None:
        return value is None and known is None
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (known, value))
    return numbers and abs(known - value) <= _SAME


def _jsonable(obj: Any) -> Any:
    """Evidence may hold tuples or odd numbers; make it plain JSON at the report's precision."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return rounded(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


# -- text ---------------------------------------------------------------------------------------
_pct = units.pct
_FORMAT: dict[Unit, Callable[[float | None], str]] = {
    Unit.RATIO: units.pct, Unit.CORES: units.pct, Unit.SECONDS: units.seconds, Unit.PER_SECOND: units.rate,
    Unit.PER_STEP: units.number, Unit.BYTES_PER_SECOND: units.bandwidth,
    Unit.FLOPS: lambda x: units.rate(x, "FLOP"), Unit.COUNT: units.count,
    Unit.WATTS: lambda x: units.fixed(x, "W"), Unit.JOULES: units.energy}


def formatted(metric: Metric | None, value: Any) -> str:
    """A metric's value for a person, in its unit; a number of no known metric in 3 figures."""
    if value is None:
        return units.NA
    if isinstance(value, (str, bool)):
        return str(value)
    fmt = _FORMAT.get(metric.unit) if metric is not None else None
    return fmt(value) if fmt is not None else units.number(value)


def _evidence_text(key: str, value: Any) -> str:
    if key.endswith("_frac") and isinstance(value, float):
        return units.pct(value)
    return formatted(by_name(key), value)


def render_text(view: JobView, verdict: Verdict, *, retired: Iterable[tuple[int, dict[str, Any]]] = (),
                price: float | None = None, width: int = 80) -> str:
    """Readable form of what ``build`` reports, from the same view and verdict: verdict first, then
    evidence and the path, metrics, findings, per-rank rows. Metric values are the table's, rounded
    as the JSON rounds them, so the two say the same numbers."""
    width = max(40, width)
    lines: list[str] = []

    def wrap(text: str, indent: str = "", first: str | None = None) -> None:
        lines.extend(textwrap.wrap(text, width, initial_indent=first if first is not None else indent,
                                   subsequent_indent=indent, break_long_words=True, break_on_hyphens=False)
                     or [first or indent])

    m = view.metrics
    steps, seconds = int(view.window["steps"]), view.window["seconds"]
    wrap(f"perfmon report: {view.job or units.NA}, {view.world_size} rank(s), {view.device_type}")
    wrap(f"{outcome_label(verdict.bottleneck)} [{verdict.severity}]", first="VERDICT  ", indent="         ")
    wrap(verdict.headline, indent="  ")
    if verdict.suggestions:
        lines.append("Fixes:")
        for s in verdict.suggestions:
            wrap(s, first="  - ", indent="    ")
    stuck = verdict.stuck
    if stuck is not None:
        lines.append("Where each rank is (innermost frame last):")
        roles = {**{r: "waiting" for r in stuck.waiting_ranks}, **{r: "culprit" for r in stuck.culprit_ranks},
                 **{r.rank: "unresponsive" for r in stuck.ranks if r.role == "unresponsive"}}
        for rank, role in sorted(roles.items()):
            frames = list(stuck.where.get(rank, ())[-WHERE_FRAMES:]) or ["(no stack: it sent nothing)"]
            lines.append(f"  rank {rank} ({role})")
            for frame in frames:
                wrap(frame, first="    ", indent="      ")
    if verdict.losses:
        wrap(f"Where the step goes (shares of one step: from a step's start to the next's; over the last "
             f"{steps} steps, pauses over the whole run):")
        for loss in verdict.losses:
            shown = _pct(rounded(loss.share)) if loss.share is not None else "not measured"
            wrap(loss.source or "", first=f"  {loss.label:<30} {shown:>12}  ", indent=" " * 48)
    lines.extend(gains_lines(_jsonable(verdict.gains.as_json(price)) if verdict.gains is not None else {}, width))
    lines.extend(layout_lines(view.layout.as_json(), _straggling(view), verdict.bottleneck, width))
    if verdict.where is not None:
        wrap("Where the unexplained time goes (stack samples in steps and between them, share of the "
             "iteration ± 95%):")
        shown_lines = verdict.where_lines()[:WHERE_TOP]
        if not shown_lines:
            lines.append("  no stack samples in the window")
        for w in shown_lines:
            between = " between steps" if w.span == "between" else ""
            wrap(f"{w.state}{between} in {w.lib or w.call or w.function} at "
                 f"{_site(w.file, w.line)} in {w.function} ({w.samples} samples)",
                 first=f"  {_pct(round(w.share, 4)):>4} ± {_pct(round(w.err, 4)):<4} ", indent=" " * 15)
    values = metric_values(view)
    evidence, named = evidence_split(verdict, values)
    shown_ev = [f"{p}={_evidence_text(p.rpartition('.')[2], metric_at(values, p))}" for p in named]
    shown_ev += [f"{k}={_evidence_text(k, val)}" for k, val in evidence.items()
                 if k not in ("skipped", "notes", "undecided", "stuck") and not isinstance(val, (dict, list))]
    if shown_ev:
        lines.append("Evidence:")
        wrap(", ".join(shown_ev), indent="  ")
    if verdict.path:
        wrap(" > ".join(verdict.path) + f" > {verdict.bottleneck}", first="Path: ", indent="  ")
    skipped = evidence.get("skipped") or {}
    for node, reason in skipped.items():
        wrap(f"{node}: {reason}", first="  skipped ", indent="    ")
    lines.append("")
    wrap(f"Window: {steps} steps, {units.seconds(seconds)}. Steps {m.steps}, step "
         f"{units.seconds(rounded(m.step_time_median_s))} median, {units.rate(rounded(m.samples_per_s), ' samples')}")
    busy_source = f" ({m.device_busy_source})" if m.device_busy_source else ""
    fill = f"  fill {_pct(rounded(m.device_fill))} (SM activity {_pct(rounded(m.sm_active))})" \
        if m.device_fill is not None else ""
    wrap(f"Busy {_pct(rounded(m.device_busy))}{busy_source}{fill}  data wait {_pct(rounded(m.data_wait_frac))}  comm "
         f"{_pct(rounded(m.comm_frac))} (exposed {_pct(rounded(m.comm_exposed_frac))})  MFU {_pct(rounded(m.mfu))}  "
         f"ETTR {_pct(rounded(m.ettr))}  loader CPU {_loader_cpu(view)}")
    for unmeasured, why in sorted((m.device_busy_unknown or {}).items()):
        wrap(why, first=f"Busy not measured on rank {unmeasured}: ", indent="  ")
    if m.params_offloaded:
        wrap(f"{_pct(rounded(m.params_offloaded))} of the parameters' bytes live in host memory "
             "(CPU embedding or offload)")
    mem = m.memory
    if mem.peak_bytes is not None:
        wrap(f"Memory ({mem.source}): peak {units.nbytes(rounded(mem.peak_bytes))} of "
             f"{units.nbytes(rounded(mem.limit_bytes))} ({_pct(rounded(mem.peak_frac))})")
    for line in health_lines(view.health, rounded(m.step_time_median_s)):
        for part in line.split("\n"):
            wrap(part, first="", indent="  ")
    for f in _jsonable(verdict.findings):
        wrap(f.get("message") or f["id"], first=f"Finding {f['id']}: ", indent="  ")
    for p in view.problems:
        wrap(p, first="Problem: ", indent="  ")
    if view.profile is not None:
        lines.append("")
        lines.extend(profile_lines(view.profile.as_json(), width=width, top=12))
    if view.captures:
        lines.append("")
        lines.append("torch.profiler captures (open the traces in Perfetto or HTA):")
        for c in view.captures:
            lines.extend(capture_reading(c.as_json(), c.rank).lines(width))
    lines.append("")
    for line in overhead_lines(view.overhead.as_json() if view.overhead is not None else None):
        wrap(line.strip(), first=line[:len(line) - len(line.lstrip())], indent="    ")
    for rank, hello in retired:
        wrap(f"rank {rank} had an earlier process (pid {hello.get('pid')}, restart {hello.get('restart')}); "
             "rows show the newest generation", first="Note: ", indent="  ")
    if view.ranks:
        lines.append("")
        lines.append(f"{'RANK':>4} {'GEN':>3} {'PID':>8} {'STEPS':>6} {'STEP':>7} {'COMPUTE':>7} {'BUSY':>5} "
                     f"{'DATA':>5} {'COMM':>5} {'ETTR':>5}  NOTE")
        for r in view.ranks:
            note = " ".join(x for x in (rank_note(rank_place(view.layout, r.rank)),
                                        "straggler" if r.rank == verdict.straggler_rank else
                                        ("ended" if r.ended else "")) if x)
            row = (f"{r.rank:>4} {r.generation:>3} {str(r.pid or units.NA):>8} {r.steps:>6} "
                   f"{units.seconds(rounded(r.step_time_median_s)):>7} {units.seconds(rounded(r.compute_s)):>7} "
                   f"{_pct(rounded(r.device_busy)):>5} {_pct(rounded(r.data_wait_frac)):>5} "
                   f"{_pct(rounded(r.comm_exposed_frac)):>5} {_pct(rounded(r.ettr)):>5}  {note}")
            lines.append(row[:width])
        lines.append("COMPUTE = step - time between steps - data wait - exposed comm")
        lines.append("COMM = exposed (blocking) share")
    return "\n".join(line[:width] for line in lines) + "\n"


def _straggling(view: JobView) -> dict[str, Any] | None:
    return view.straggling.as_json(view.layout) if view.straggling is not None else None


def gains_lines(v: dict[str, Any], width: int = 80) -> list[str]:
    """The "What fixing it buys" section: each measured loss's speedup bound and device-hours, then
    the combination; losses that take nothing are left out (the step's accounting lists them)."""
    basis = v.get("gains_basis")
    rows = [g for g in v.get("gains") or [] if g.get("share")]
    if not basis or not rows:
        return []
    unit = basis["device_unit"]
    priced = any(g.get("price") for g in rows)
    lines = [f"What fixing it buys (upper bounds unless marked; {basis['ranks']} rank(s), "
             f"{units.hours(basis.get('hours'))} h so far):",
             f"  {'loss':<28} {'speedup':>7} {unit + '/day':>10} {'so far':>8} {'cost/day' if priced else '':>9}"
             .rstrip()]
    for g in rows + ([v["gains_combined"]] if v.get("gains_combined") else []):
        cost = units.money((g.get("price") or {}).get("per_day")) if priced else ""
        mark = "~" if g.get("basis") == "simulated" else ""
        lines.append(f"  {g['label'][:28]:<28} {mark + units.speedup(g['speedup_bound']):>7} "
                     f"{units.hours(g.get('per_day')):>10} {units.hours(g.get('device_hours')):>8} {cost:>9}".rstrip())
    if any(g.get("basis") == "simulated" for g in rows):
        lines.extend(textwrap.wrap("~ simulated: the step without the straggler, from the ranks' operations "
                                   "(not a bound)", width, initial_indent="  ", subsequent_indent="    "))
    if not priced:
        lines.extend(textwrap.wrap(rows[0].get("why_no_price", ""), width, initial_indent="  money: ",
                                   subsequent_indent="    ", break_on_hyphens=False))
    for g in rows:
        e = g.get("energy")
        if e:
            per = f", {units.energy(e['per_sample_j'])}/sample" if e.get("per_sample_j") is not None else ""
            lines.extend(textwrap.wrap(f"{g['label']}: at most {units.energy(e['per_step_j'])}/step{per}, "
                                       f"{units.number(e['per_day_kwh'])} kWh/day", width,
                                       initial_indent="  energy in ", subsequent_indent="    "))
    return lines


def _loader_cpu(view: JobView) -> str:
    """The loader workers' CPU, or with no workers (num_workers=0) the main process's CPU share of its
    data wait, the measure the verdict's loader question uses then."""
    m = view.metrics
    if m.loader_cpu is None and m.data_cpu_frac is not None and not m.loader_workers:
        return f"{_pct(rounded(m.data_cpu_frac))} (main process)"
    return _pct(rounded(m.loader_cpu))


def _site(file: str, line: int) -> str:
    """'train.py:21': the base name keeps the line short; the JSON has the full path."""
    return f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"
