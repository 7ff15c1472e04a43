"""The run beyond its window: step-time percentiles and outliers (``perfmon_analysis.step_times``),
memory growth (``perfmon_analysis.memory_growth``) and the crash that ended it
(``perfmon_analysis.crash``), per rank and for the job. The run model puts them in each view
(``JobView.health``, ``RankView.step_times``); each rank's is recomputed only when its records changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfmon_analysis import units
from perfmon_analysis.crash import Crash, job_crash, rank_crash
from perfmon_analysis.memory_growth import SERIES_LABEL, MemoryGrowth, job_growth, rank_growth
from perfmon_analysis.readings import JobExit, StepReading
from perfmon_analysis.step_times import (
    OUTLIER_RATIO,
    Outlier,
    StepTimes,
    job_outliers,
    job_times,
    rank_outliers,
    run_times,
    window_times,
)

if TYPE_CHECKING:
    from perfmon_analysis.buffers import RankState


@dataclass(frozen=True)
class RankHealth:
    """One rank's: its window's and its run's step times, its outliers, memory growth and crash."""

    window: StepTimes
    run: StepTimes
    outliers: tuple[Outlier, ...]
    growth: MemoryGrowth | None
    crash: Crash | None


@dataclass(frozen=True)
class JobHealth:
    """The job's (``JobView.health``): the slowest rank's percentiles, the longest outliers of all ranks,
    the fastest steady memory growth, the crash that ended it. Empty before any step."""

    window: StepTimes = StepTimes(0)
    run: StepTimes = StepTimes(0)
    outliers: tuple[Outlier, ...] = ()
    growth: MemoryGrowth | None = None
    crash: Crash | None = None


OUTLIERS_EVERY = 16      # steps between two searches for outliers, unless the newest step is one


def rank_health(state: RankState, window: Sequence[StepReading], limit: int | None) -> RankHealth:
    """The rank's health over ``window`` (its window's steps) and its buffers; ``limit``: its memory limit.

    Cached on the rank (``RankState._health``), each part by what it reads, so a view where every rank
    has a new step costs little: the percentiles again, the outliers every ``OUTLIERS_EVERY`` steps (at
    once when the newest step is one), the memory growth when a memory reading arrived, the crash
    when the stream ended."""
    cache = state._health
    if state.summary_steps is not None and state.summary_times is not None:   # a relay's summary (wire 1.2)
        win, run = state.summary_times
    else:
        win, run = window_times(window), run_times(state.run_times)
    newest = state.steps[-1] if state.steps else None
    long = newest if newest is not None and run.p50 is not None and newest.dur >= OUTLIER_RATIO * run.p50 else None
    last_event = state.events[-1].t if state.events else None
    outliers = _cached(cache, "outliers", (state.run_times.n // OUTLIERS_EVERY, long.step if long is not None else None,
                                           state.ended, last_event),
                       lambda: tuple(rank_outliers(state, run.p50)))
    last_sample = state.samples[-1].t if state.samples else None
    last_memory = state.memory[-1].t if state.memory else None
    growth = _cached(cache, "growth", (last_sample, last_memory, len(state.samples), len(state.memory), limit),
                     lambda: rank_growth(state, limit))
    crash = _cached(cache, "crash", (state.ended, last_event, newest.step if newest else None),
                    lambda: rank_crash(state))
    return RankHealth(win, run, outliers, growth, crash)


def _cached(cache: dict[str, tuple[Any, Any]], part: str, key: Any, compute: Callable[[], Any]) -> Any:
    held = cache.get(part)
    if held is not None and held[0] == key:
        return held[1]
    value = compute()
    cache[part] = (key, value)
    return value


def job_health(ranks: Sequence[RankHealth], exit: JobExit | None, steps: int | None) -> JobHealth:
    """The job's health from its ranks' and ``exit``, how ``perfmon run`` saw the command end after
    ``steps`` steps (the most of any rank)."""
    return JobHealth(job_times(r.window for r in ranks), job_times(r.run for r in ranks),
                     job_outliers(list(r.outliers) for r in ranks), job_growth(r.growth for r in ranks),
                     job_crash((r.crash for r in ranks), exit, steps))


def text_lines(health: JobHealth, median: float | None) -> list[str]:
    """The report's step-time, outlier and memory-growth lines (``perfmon_analysis.report``); ``median``:
    the window's median step (the table's), shown as its p50 (a crash is the verdict's headline)."""
    lines = []
    if health.window.max is not None:
        run = health.run
        lines.append(f"Step time p50/p90/p99/max: window {_times(median, health.window)}; "
                     f"run {_times(run.p50, run)}")
    for o in health.outliers:
        lines.append(f"Outlier: step {o.step} (rank {o.rank}) {units.seconds(o.dur)}, "
                     f"{round(o.ratio, 2):.1f}x the median: {o.what}")
    g = health.growth
    if g is not None and g.steady:
        per_s = f", {units.nbytes(round(g.per_s))}/s" if g.per_s is not None and round(g.per_s) else ""
        kind_per_step = round(g.kind_per_step) if g.kind_per_step is not None else None
        kind = f"; most in {g.kind} (+{units.nbytes(kind_per_step)}/step)" if g.kind and kind_per_step else ""
        lines.append(f"Memory grows every step (rank {g.rank}): {SERIES_LABEL.get(g.series, g.series)} "
                     f"+{units.nbytes(round(g.per_step))}/step{per_s} over {g.steps} steps, "
                     f"{units.nbytes(g.first)} to {units.nbytes(g.last)}{kind}")
    return lines


def _times(p50: float | None, times: StepTimes) -> str:
    return "/".join(units.seconds(v) for v in (p50, times.p90, times.p99, times.max))
