"""The window's stack samples of the training thread: per user line, with binomial error bars
(docs/verdict.md, "Where the time goes")."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from perfmon_analysis.readings import SPANS, StepReading, WhereInterval
from perfmon_analysis.views import HolderLine, WhereLine, WhereTable

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


STEP, BETWEEN = SPANS
WHERE_LINES = 20     # lines the view keeps (the probe lists at most 20 per interval and span)


def where_table(rank: int, intervals: Iterable[WhereInterval], win: list[StepReading], win_start: float | None,
                scale: float, between_share: float) -> WhereTable | None:
    """The window's stack samples: the intervals that overlap the window, summed per user line, state and
    span (the library call below a line is the one with the most samples there). A line's share of the
    iteration = its samples / all its span's samples x the span's share of the iteration: in steps, the
    sampled span's seconds x ``scale`` (the iteration's share per second of the window's in-loop time,
    ``stats.Whole``); between them, ``between_share``. Its error bar is the Wilson half-width of the sample
    proportion, scaled the same way. ``runq``: the intervals' run-queue shares (the thread runnable, no
    core free), weighted by samples. Threads seen holding the GIL while the training thread waited are
    summed the same way. Busy samples between steps taken before the loop's step lines (preparing the
    next step's input, ``probe.where.LoopLines``) are counted apart."""
    if not win or win_start is None:
        return None
    end = win[-1].t if win[-1].t is not None else win_start
    span_share = scale * sum(s.active if s.cpu_active else max(0.0, s.active - s.data) for s in win)
    total, between, hz, runq, runq_samples, between_runq, between_runq_samples = 0, 0, None, 0.0, 0, 0.0, 0
    counts: dict[tuple[str, int, str, str | None, str], list[Any]] = {}
    holders: dict[tuple[str, str, int, str, str], list[Any]] = {}
    for iv in intervals:
        if iv.t1 <= win_start or iv.t0 >= end:
            continue
        total += iv.samples
        between += iv.between_samples
        hz = iv.hz if iv.hz is not None else hz
        if iv.runq is not None and iv.samples > 0:
            runq += iv.runq * iv.samples
            runq_samples += iv.samples
        if iv.between_runq is not None and iv.between_samples > 0:
            between_runq += iv.between_runq * iv.between_samples
            between_runq_samples += iv.between_samples
        for c in iv.lines + iv.between:
            row = counts.setdefault((c.file, c.line, c.function, c.state, c.span), [0, c.call, {}, 0])
            row[0] += c.n
            row[3] += c.before
            row[1] = row[1] or c.call
            row[2][c.lib] = row[2].get(c.lib, 0) + c.n
        for h in iv.holders:
            held = holders.setdefault((h.thread, h.file, h.line, h.function, h.span), [0, h.call])
            held[0] += h.n
            held[1] = held[1] or h.call
    # never a share over the span's: the listed lines count at least what they list
    total = max(total, sum(row[0] for key, row in counts.items() if key[4] == STEP))
    between = max(between, sum(row[0] for key, row in counts.items() if key[4] == BETWEEN))
    spans = {STEP: (total, span_share), BETWEEN: (between, between_share)}
    lines = sorted((WhereLine(file=f, line=ln, function=fn, call=call,
                              lib=max(libs.items(), key=lambda kv: (kv[1], kv[0] is not None))[0], state=st,
                              samples=n, share=spans[sp][1] * n / spans[sp][0],
                              err=spans[sp][1] * wilson_half_width(n, spans[sp][0]), span=sp)
                    for (f, ln, fn, st, sp), (n, call, libs, _) in counts.items()),
                   key=lambda x: (-x.share, x.file, x.line, x.state or "", x.span))
    waiting = {sp: sum(row[0] for key, row in counts.items() if key[3] == "waiting" and key[4] == sp) for sp in spans}
    busy = {sp: sum(row[0] for key, row in counts.items() if key[3] == "busy" and key[4] == sp) for sp in spans}
    held_lines = sorted((HolderLine(thread=th, file=f, line=ln, function=fn, call=call, span=sp, samples=n,
                                    share=spans[sp][1] * n / max(1, spans[sp][0]),
                                    of_waiting=n / waiting[sp] if waiting[sp] else 1.0)
                         for (th, f, ln, fn, sp), (n, call) in holders.items()),
                        key=lambda x: (-x.share, x.thread, x.file, x.line))
    return WhereTable(rank=rank, samples=total, hz=hz, span_share=span_share, waiting=waiting[STEP],
                      busy=busy[STEP], lines=tuple(lines[:WHERE_LINES]),
                      runq=runq / runq_samples if runq_samples else None, between_samples=between,
                      between_share=between_share, between_waiting=waiting[BETWEEN],
                      between_busy=busy[BETWEEN], holders=tuple(held_lines[:WHERE_LINES]),
                      between_busy_before=sum(row[3] for key, row in counts.items()
                                              if key[3] == "busy" and key[4] == BETWEEN),
                      between_runq=between_runq / between_runq_samples if between_runq_samples else None)


def job_where(ranks: list[tuple[WhereTable | None, float | None]]) -> WhereTable | None:
    """The stack samples shown for the job, of ``(where table, off-CPU share)`` per rank: the rank with
    the most unexplained off-CPU time (in a synchronous job the others wait for it), else the one with
    the most samples."""
    tables = [(where, off_cpu) for where, off_cpu in ranks if where is not None]
    best = max(tables, key=lambda x: (x[1] if x[1] is not None else -1.0, x[0].samples), default=None)
    return best[0] if best is not None else None
