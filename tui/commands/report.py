"""``perfmon report``: the verdict and its evidence as JSON (DESIGN §7) or as 80-column text.

``build_report`` is pure over a ``RunModel``; ``render_text`` is pure over the
report dict; ``main`` only gathers records (recording files, or a live job for
``--seconds``) and prints. Recording problems (torn tail, corruption) do not
stop the report: what was intact is analysed and each problem is one line on
stderr.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from typing import Any

from probe.paths import RECORD_SUFFIX, SOCKET_SUFFIX
from tui.errors import UserError
from perfmon_analysis import units
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.views import JobView
from perfmon_analysis.verdict import Verdict, evaluate, label as outcome_label

SCHEMA = "perfmon.report/1"


def build_report(model: RunModel, now: float | None = None, *, source: dict[str, Any] | None = None,
                 clock: float | None = None) -> dict:
    """The report JSON for the model's current window (pure). ``source`` describes where the records came from;
    ``clock`` (live: the monotonic clock) lets a rank's silence count (``RunModel.view``)."""
    view = model.view(now, clock=clock)
    verdict = evaluate(view)
    return report_from(view, verdict, model, source=source)


def report_from(view: JobView, verdict: Verdict, model: RunModel | None = None, *,
                source: dict[str, Any] | None = None) -> dict:
    """Assemble the JSON from an already computed view and verdict (the TUI's "save report" uses this)."""
    ranks = []
    for r in view.ranks:
        ranks.append({
            "rank": r.rank, "host": r.host, "pid": r.pid, "restart": r.restart, "generation": r.generation,
            "steps": r.steps, "step_time_median_s": _r(r.step_time_median_s), "compute_s": _r(r.compute_s),
            "device_busy": _r(r.device_busy), "data_wait_frac": _r(r.data_wait_frac),
            "comm_frac": _r(r.comm_frac), "comm_exposed_frac": _r(r.comm_exposed_frac),
            "samples_per_s": _r(r.samples_per_s), "ettr": _r(r.ettr), "loader_cpu": _r(r.loader_cpu),
            "loader_workers": r.loader_workers, "straggler": r.rank == verdict.straggler_rank,
            "ended": r.ended, "drops": r.drops,
        })
    metrics = {k: _r(v) for k, v in view.metrics.as_json().items()}
    metrics["memory"] = {k: _r(v) for k, v in view.metrics.memory.as_json().items()}
    generations = [{"rank": rank, "pid": hello.get("pid"), "restart": hello.get("restart")}
                   for rank, hello in (model.retired if model is not None else [])]
    return {
        "schema": SCHEMA,
        "job": view.job,
        "world_size": view.world_size,
        "device": {"type": view.device_type, "name": view.device_name},
        "ranks": ranks,
        "window": {"steps": int(view.window["steps"]), "seconds": view.window["seconds"]},
        "metrics": metrics,
        "verdict": _jsonable(verdict.as_json()),
        "findings": _jsonable(verdict.findings),
        "comm_ops": [{"op": c.op, "count": c.count, "bytes": c.bytes, "seconds": _r(c.seconds),
                      "busbw": _r(c.busbw), "algbw": _r(c.algbw)} for c in view.comm_ops],
        "ended": view.ended,
        "drops": view.drops_total,
        "previous_generations": generations,
        "problems": list(view.problems),
        "profile": view.profile.as_json() if view.profile is not None else None,
        "captures": [c.as_json() for c in view.captures],
        "source": source or {},
        "as_of": round(view.now, 3),     # the instant the window ends (newest record, or now when live)
    }


def _r(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    return x


def _jsonable(obj: Any) -> Any:
    """Evidence may hold tuples or odd numbers; make it plain JSON."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return round(obj, 6)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


# -- text ---------------------------------------------------------------------------------------
_pct = units.pct


def _ms(x: Any) -> str:
    """'123ms', '12.3s'; under a millisecond in µs, never '0ms'."""
    if x is None:
        return units.NA
    return units.seconds(x) if x < 1e-3 else f"{1000 * x:.0f}ms" if x < 10 else f"{x:.1f}s"


def _num(x: Any, fmt: str = "{:.1f}") -> str:
    return units.NA if x is None else fmt.format(x)


def render_text(report: dict, width: int = 80) -> str:
    """Readable form: verdict first, then evidence and the path, metrics, findings, per-rank rows."""
    width = max(40, width)
    lines: list[str] = []

    def wrap(text: str, indent: str = "", first: str | None = None) -> None:
        lines.extend(textwrap.wrap(text, width, initial_indent=first if first is not None else indent,
                                   subsequent_indent=indent, break_long_words=True, break_on_hyphens=False)
                     or [first or indent])

    v = report["verdict"]
    m = report["metrics"]
    job = report.get("job") or units.NA
    head = f"perfmon report: {job}, {report.get('world_size', 1)} rank(s), {report['device']['type']}"
    wrap(head)
    wrap(f"{outcome_label(v['bottleneck'])} [{v['severity']}]", first="VERDICT  ",
         indent="         ")
    wrap(v["headline"], indent="  ")
    if v.get("suggestions"):
        lines.append("Fixes:")
        for s in v["suggestions"]:
            wrap(s, first="  - ", indent="    ")
    stuck = v.get("stuck")
    if stuck:
        lines.append("Where each rank is (innermost frame last):")
        roles = {**{r: "waiting" for r in stuck["waiting_ranks"]}, **{r: "culprit" for r in stuck["culprit_ranks"]},
                 **{r: "unresponsive" for r in stuck.get("unresponsive_ranks", [])}}
        for rank, role in sorted(roles.items()):
            frames = stuck["where"].get(str(rank)) or ["(no stack: it sent nothing)"]
            lines.append(f"  rank {rank} ({role})")
            for frame in frames:
                wrap(frame, first="    ", indent="      ")
    if v.get("losses"):
        lines.append("Where the step goes:")
        for loss in v["losses"]:
            share = _pct(loss["share"]) if loss["share"] is not None else "not measured"
            wrap(loss.get("source") or loss.get("why_unknown") or "", first=f"  {loss['label']:<30} {share:>12}  ",
                 indent=" " * 48)
    if v.get("where") is not None:
        lines.append("Where the unexplained time goes (in-step stack samples, share of the step ± 95%):")
        if not v["where"]:
            lines.append("  no stack samples inside steps in the window")
        for w in v["where"]:
            wrap(f"{w['state']} in {w.get('lib') or w.get('call') or w['function']} at {_site(w['file'], w['line'])} "
                 f"in {w['function']} ({w['samples']} samples)",
                 first=f"  {_pct(w['share']):>4} ± {_pct(w['err']):<4} ", indent=" " * 15)
    ev = {k: val for k, val in (v.get("evidence") or {}).items() if k not in ("skipped", "notes", "undecided", "stuck")}
    if ev:
        lines.append("Evidence:")
        wrap(", ".join(f"{k}={_fmt_ev(k, val)}" for k, val in ev.items()), indent="  ")
    if v.get("path"):
        wrap(" > ".join(v["path"]) + f" > {v['bottleneck']}", first="Path: ", indent="  ")
    skipped = (v.get("evidence") or {}).get("skipped") or {}
    for node, reason in skipped.items():
        wrap(f"{node}: {reason}", first="  skipped ", indent="    ")
    w = report["window"]
    lines.append("")
    wrap(f"Window: {w['steps']} steps, {units.seconds(w['seconds'])}. Steps {m['steps']}, step {_ms(m['step_time_median_s'])}"
         f" median, {_num(m['samples_per_s'])} samples/s")
    busy_source = f" ({m['device_busy_source']})" if m.get("device_busy_source") else ""
    wrap(f"Busy {_pct(m['device_busy'])}{busy_source}  data wait {_pct(m['data_wait_frac'])}  comm {_pct(m['comm_frac'])}"
         f" (exposed {_pct(m['comm_exposed_frac'])})  MFU {_pct(m['mfu'])}  ETTR {_pct(m['ettr'])}"
         f"  loader CPU {_pct(m['loader_cpu'])}")
    mem = m.get("memory") or {}
    if mem.get("peak_bytes") is not None:
        wrap(f"Memory ({mem.get('source')}): peak {_gb(mem['peak_bytes'])} of {_gb(mem.get('limit_bytes'))}"
             f" ({_pct(mem.get('peak_frac'))})")
    for f in report.get("findings") or []:
        wrap(f.get("message") or f["id"], first=f"Finding {f['id']}: ", indent="  ")
    for p in report.get("problems") or []:
        wrap(p, first="Problem: ", indent="  ")
    if report.get("profile"):
        from tui.commands.profile import profile_lines
        lines.append("")
        lines.extend(profile_lines(report["profile"], width=width, top=12))
    if report.get("captures"):
        from perfmon_analysis.capture import capture_reading
        lines.append("")
        lines.append("torch.profiler captures (open the traces in Perfetto or HTA):")
        for c in report["captures"]:
            lines.extend(capture_reading(c, c["rank"]).lines(width))
    for g in report.get("previous_generations") or []:
        wrap(f"rank {g['rank']} had an earlier process (pid {g['pid']}, restart {g['restart']}); "
             "rows show the newest generation", first="Note: ", indent="  ")
    if report["ranks"]:
        lines.append("")
        lines.append(f"{'RANK':>4} {'GEN':>3} {'PID':>8} {'STEPS':>6} {'STEP':>7} {'COMPUTE':>7} {'BUSY':>5} "
                     f"{'DATA':>5} {'COMM':>5} {'ETTR':>5}  NOTE")
        for r in report["ranks"]:
            note = "straggler" if r.get("straggler") else ("ended" if r.get("ended") else "")
            row = (f"{r['rank']:>4} {r.get('generation', 0):>3} {str(r.get('pid') or units.NA):>8} {r['steps']:>6} "
                   f"{_ms(r['step_time_median_s']):>7} {_ms(r.get('compute_s')):>7} {_pct(r.get('device_busy')):>5} "
                   f"{_pct(r.get('data_wait_frac')):>5} {_pct(r.get('comm_exposed_frac')):>5} "
                   f"{_pct(r.get('ettr')):>5}  {note}")
            lines.append(row[:width])
        lines.append("COMPUTE = step - time between steps - data wait - exposed comm")
        lines.append("COMM = exposed (blocking) share")
    return "\n".join(line[:width] for line in lines) + "\n"


def _site(file: str, line: int) -> str:
    """'train.py:21': the base name keeps the line short; the JSON has the full path."""
    return f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"


def _gb(x: Any) -> str:
    return units.NA if x is None else f"{x / 1e9:.2f} GB"


def _fmt_ev(key: str, val: Any) -> str:
    if isinstance(val, float) and (key.endswith("frac") or key in ("device_busy", "loader_cpu", "mfu", "ettr")):
        return _pct(val)
    if isinstance(val, float) and key == "busbw":
        return f"{val / 1e9:.2f}GB/s"
    if isinstance(val, float):
        return f"{val:.3g}"
    return str(val)


# -- command ------------------------------------------------------------------------------------
def load_model(target: str, seconds: float, remote: Any = None) -> tuple[RunModel, dict[str, Any]]:
    """Fill a RunModel from recording files, by following a live job for ``seconds``, or (``remote``, a
    ``RelayFeed``) the job's ranks on several hosts."""
    from tui.stream import sources

    model = RunModel()
    if remote is not None:
        from tui.stream.feed import follow
        remote.model = model
        try:
            follow(remote, seconds)
        except sources.StreamError as exc:    # a host that failed: the others' ranks still make a report
            if not model.view().ranks:
                raise UserError(str(exc)) from None
        for problem in model.problems:
            print(f"perfmon report: {problem}", file=sys.stderr)
        return model, {"kind": "live", "hosts": remote.hosts, "seconds": seconds}
    looks_like_file = target.endswith(RECORD_SUFFIX) or ("/" in target and not target.endswith(SOCKET_SUFFIX))
    if sources.is_recording_target(target) or looks_like_file:
        loaded = sources.load_recordings(target)
        for rec in loaded:
            stream = str(rec.path)
            for record in rec.records:
                model.ingest(stream, record)
            model.end_stream(stream)
            if rec.problem:
                model.add_problem(rec.problem)
                print(f"perfmon report: {rec.problem}", file=sys.stderr)
        return model, {"kind": "recording", "paths": [str(r.path) for r in loaded]}
    from tui.stream import discovery

    from tui.stream.feed import LiveFeed, follow

    endpoints = discovery.resolve_live(target)
    paths = [ep.socket for ep in endpoints]
    try:
        follow(LiveFeed(model, endpoints[0].job, endpoints, rescan=False), seconds)
    except sources.StreamError as exc:
        raise UserError(str(exc)) from None
    return model, {"kind": "live", "paths": paths, "seconds": seconds}


def main(args: Any) -> int:
    """``perfmon report FILE|DIR|TARGET [--json] [--seconds S]``."""
    from tui.commands.attach import remote_feed
    model, source = load_model(args.target, float(getattr(args, "seconds", 5.0) or 5.0), remote_feed(args))
    live = source["kind"] != "recording"
    report = build_report(model, time.time() if live else None, source=source,
                          clock=time.monotonic() if live else None)
    if not report["ranks"]:
        raise UserError(f"{args.target}: no records from any rank to report on")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(render_text(report))
    return 0
