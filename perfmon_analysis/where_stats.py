"""The window's stack samples of the training thread: per user line, with binomial error bars
(docs/verdict.md, "Where the time goes")."""

from __future__ import annotations

import math
from typing import Any, Iterable

from perfmon_analysis.readings import StepReading, WhereInterval
from perfmon_analysis.views import WhereLine, WhereTable

# 95% two-sided normal quantile, for the binomial error bars of the where-table's shares.
Z95 = 1.959964


def wilson_half_width(n: int, total: int, z: float = Z95) -> float:
    """Half-width of the Wilson score interval for n successes in ``total`` trials: the binomial
    error of a sampled share. Unlike n/total ± z·sqrt(p(1-p)/total) it is not 0 at 0 or all
    samples, where a handful of samples says little."""
    if total <= 0:
        return 1.0
    p = n / total
    return z / (1.0 + z * z / total) * math.sqrt(p * (1.0 - p) / total + z * z / (4.0 * total * total))


WHERE_LINES = 20     # lines the view keeps (the probe lists at most 20 per interval)


def where_table(rank: int, intervals: Iterable[WhereInterval], win: list[StepReading],
                win_start: float | None) -> WhereTable | None:
    """The window's stack samples: the intervals that overlap the window, summed per user line and
    state (the library call below a line is the one with the most samples there). A line's share
    of the active step = its samples / all in-step samples x the share of the step the samples
    span; its error bar is the Wilson half-width of the sample proportion, scaled the same way.
    ``runq``: the intervals' run-queue shares (the thread runnable, no core free), weighted by samples."""
    if not win or win_start is None:
        return None
    end = win[-1].t if win[-1].t is not None else win_start
    active = sum(s.active for s in win)
    span = sum(s.active if s.cpu_active else max(0.0, s.active - s.data) for s in win)
    span_share = span / active if active > 0 else 1.0
    total, hz, runq, runq_samples = 0, None, 0.0, 0
    counts: dict[tuple[str, int, str, str | None], list[Any]] = {}
    for iv in intervals:
        if iv.t1 <= win_start or iv.t0 >= end:
            continue
        total += iv.samples
        hz = iv.hz if iv.hz is not None else hz
        if iv.runq is not None and iv.samples > 0:
            runq += iv.runq * iv.samples
            runq_samples += iv.samples
        for c in iv.lines:
            row = counts.setdefault((c.file, c.line, c.function, c.state), [0, c.call, {}])
            row[0] += c.n
            row[1] = row[1] or c.call
            row[2][c.lib] = row[2].get(c.lib, 0) + c.n
    total = max(total, sum(row[0] for row in counts.values()))   # never a share over 1
    lines = sorted((WhereLine(file=f, line=ln, function=fn, call=call,
                              lib=max(libs.items(), key=lambda kv: (kv[1], kv[0] is not None))[0], state=st,
                              samples=n, share=span_share * n / total,
                              err=span_share * wilson_half_width(n, total))
                    for (f, ln, fn, st), (n, call, libs) in counts.items()),
                   key=lambda x: (-x.samples, x.file, x.line, x.state or ""))
    return WhereTable(rank=rank, samples=total, hz=hz, span_share=span_share,
                      waiting=sum(x.samples for x in lines if x.state == "waiting"),
                      busy=sum(x.samples for x in lines if x.state == "busy"), lines=tuple(lines[:WHERE_LINES]),
                      runq=runq / runq_samples if runq_samples else None)





def job_where(ranks: list[tuple[WhereTable | None, float | None]]) -> WhereTable | None:
    """The stack samples shown for the job, of ``(where table, off-CPU share)`` per rank: the rank with
    the most unexplained off-CPU time (in a synchronous job the others wait for it), else the one with
    the most samples."""
    tables = [(where, off_cpu) for where, off_cpu in ranks if where is not None]
    best = max(tables, key=lambda x: (x[1] if x[1] is not None else -1.0, x[0].samples), default=None)
    return best[0] if best is not None else None
