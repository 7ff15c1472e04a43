"""The window's stack samples per user line (perfmon_analysis.where_stats): which intervals count, how
lines, library calls and GIL holders are summed over them, each line's share of the iteration and its
Wilson error bar, and which rank's table the job shows.

Inputs are the module's own types: ``where`` records as the probe sends them (checked by the wire,
read by ``where_interval``) and step records from tests/helpers/records.py read by ``step_reading``."""

from __future__ import annotations

import math
from typing import Any

import pytest

from perfmon_analysis.readings import StepReading, WhereInterval, step_reading, where_interval
from perfmon_analysis.views import HolderLine, WhereLine, WhereTable
from perfmon_analysis.where_stats import Z95, job_where, where_table, wilson_half_width
from probe import wire
from tests.helpers import records as R

TRAIN = "/home/u/train.py"


def where(t0: float, t1: float, samples: int, lines: list[dict[str, Any]] | None = None,
          **fields: Any) -> WhereInterval:
    """A ``where`` record over [t0, t1] (``fields``: hz, runq, between, holders, ...), as the run model reads it."""
    rec = wire.validate({"k": "where", "t": t1, "t0": t0, "t1": t1, "samples": samples, "lines": lines or [],
                         **fields})
    iv = where_interval(rec)
    assert iv is not None
    return iv


def line(no: int, n: int, state: str | None = "busy", function: str = "step_fn", **fields: Any) -> dict[str, Any]:
    out = {"file": TRAIN, "line": no, "function": function, "n": n, **fields}
    if state is not None:
        out["state"] = state
    return out


def holder(thread: str, file: str, no: int, function: str, span: str, n: int, **fields: Any) -> dict[str, Any]:
    return {"thread": thread, "file": file, "line": no, "function": function, "span": span, "n": n, **fields}


def steps(count: int, start: float = 100.0, active_span_last: bool = False) -> list[StepReading]:
    """``count`` 1 s steps from ``start``, each with a 0.25 s loader wait before its 0.75 s body; the last
    one's CPU span the whole active step when ``active_span_last`` (zero-code mode)."""
    out = []
    for i in range(count):
        span = "active" if active_span_last and i == count - 1 else "body"
        s = step_reading(R.step(i + 1, start=start + i, dur=1.0, phases={"data": 0.25}, cpu=0.5, cpu_span=span))
        assert s is not None
        out.append(s)
    return out


# -- the whole table ------------------------------------------------------------------------------
SPAN = 0.25 * (3 * 0.75 + 1.0)      # scale 0.25 x (three 0.75 s bodies + one 1 s active step)
BETWEEN = 0.125


def _golden_intervals() -> list[WhereInterval]:
    return [
        where(98.0, 100.0, 50, [line(90, 50)]),             # ends as the window starts: not in it
        where(99.0, 101.0, 16, [line(10, 4), line(10, 4, lib="torch.mm"),
                                line(20, 8, "waiting", "fetch", call="time.sleep(1)")],
              hz=20.0, runq=0.5, between_samples=8, between_runq=0.25,
              between=[line(30, 4, function="loop", before=2), line(40, 4, "waiting", "loop", before=1)],
              holders=[holder("ckpt", "/x/ck.py", 7, "save", "between", 1),
                       holder("loader", "/x/io.py", 5, "read", "step", 4)]),
        where(101.0, 101.5, 1, [line(20, 1, "waiting", "fetch")], hz=10.0, runq=1.0, between_samples=2),
        where(101.5, 103.5, 16, [line(10, 2, lib="torch.mm", call="y = x @ w"),
                                 line(20, 4, "waiting", "fetch"), line(50, 2, None, "log"), line(50, 2, "busy", "log")],
              runq=0.25, between_samples=8, between_runq=0.75,
              between=[line(30, 4, function="loop", before=1, call="next(it)")],
              holders=[holder("loader", "/x/io.py", 5, "read", "step", 4, call="f.read()"),
                       holder("ckpt", "/x/ck.py", 7, "save", "between", 1)]),
        where(103.5, 103.9, 0, between_samples=1, between_runq=1.0),
        where(104.0, 106.0, 50, [line(90, 50)]),             # starts as the window ends: not in it
    ]


def _line(no: int, function: str, call: str | None, lib: str | None, state: str | None, n: int, span: str,
          share: float, total: int) -> WhereLine:
    return WhereLine(file=TRAIN, line=no, function=function, call=call, lib=lib, state=state, samples=n,
                     share=share * n / total, err=share * wilson_half_width(n, total), span=span)


def test_the_windows_table_sums_its_intervals_per_line_state_and_span_golden():
    table = where_table(3, _golden_intervals(), steps(4, active_span_last=True), 100.0, 0.25, BETWEEN)
    assert table == WhereTable(
        rank=3, samples=33, hz=10.0, span_share=0.8125, waiting=13, busy=12,
        lines=(_line(20, "fetch", "time.sleep(1)", None, "waiting", 13, "step", SPAN, 33),
               _line(10, "step_fn", "y = x @ w", "torch.mm", "busy", 10, "step", SPAN, 33),
               _line(30, "loop", "next(it)", None, "busy", 8, "between", BETWEEN, 19),
               _line(50, "log", None, None, None, 2, "step", SPAN, 33),
               _line(50, "log", None, None, "busy", 2, "step", SPAN, 33),
               _line(40, "loop", None, None, "waiting", 4, "between", BETWEEN, 19)),
        runq=13 / 33, between_samples=19, between_share=0.125, between_waiting=4, between_busy=8,
        holders=(HolderLine(thread="loader", file="/x/io.py", line=5, function="read", call="f.read()", span="step",
                            samples=8, share=SPAN * 8 / 33, of_waiting=8 / 13),
                 HolderLine(thread="ckpt", file="/x/ck.py", line=7, function="save", call=None, span="between",
                            samples=2, share=BETWEEN * 2 / 19, of_waiting=2 / 4)),
        between_busy_before=3, between_runq=9 / 17)
    assert SPAN == 0.8125


def test_no_window_or_no_window_start_is_no_table():
    ivs = [where(99.0, 101.0, 4, [line(10, 4)])]
    assert where_table(0, ivs, [], 100.0, 0.5, 0.0) is None
    assert where_table(0, ivs, steps(2), None, 0.5, 0.0) is None


def test_a_one_step_window_counts_the_intervals_that_start_before_its_end():
    ivs = [where(99.0, 100.5, 4, [line(10, 4)], hz=20.0), where(100.5, 101.5, 2, [line(10, 2)]),
           where(101.0, 102.0, 8, [line(10, 8)])]
    table = where_table(0, ivs, steps(1), 100.0, 1.0, 0.0)
    assert table is not None
    assert (table.samples, table.hz, table.span_share, [(x.line, x.samples) for x in table.lines]) == \
        (6, 20.0, 0.75, [(10, 6)])


def test_a_last_step_without_its_time_ends_the_window_at_its_start():
    last = step_reading({"k": "step", "step": 2, "start": 101.0, "dur": 1.0})
    assert last is not None and last.t is None
    ivs = [where(99.0, 100.5, 4, [line(10, 4)]), where(100.5, 101.5, 2, [line(10, 2)])]
    table = where_table(0, ivs, [*steps(1), last], 100.0, 0.5, 0.0)
    assert table is not None and (table.samples, table.span_share) == (4, 0.5 * (0.75 + 1.0))


def test_the_listed_lines_count_at_least_the_samples_they_list_in_each_span():
    # a probe whose counts disagree: 2 in-step samples but 4 listed, 1 between steps but 3 listed
    ivs = [where(100.0, 102.0, 2, [line(10, 4)], between_samples=1, between=[line(30, 3, function="loop")])]
    table = where_table(0, ivs, steps(2), 100.0, 0.5, 0.25)
    assert table is not None
    assert (table.samples, table.between_samples) == (4, 3)
    assert [(x.line, x.span, x.share) for x in table.lines] == [(10, "step", 0.75), (30, "between", 0.25)]


def test_a_lines_library_call_is_its_most_sampled_a_named_one_winning_a_tie():
    ivs = [where(100.0, 101.0, 10, [line(10, 2), line(10, 2, lib="torch.mm"), line(20, 3, lib="torch.relu"),
                                    line(20, 2, lib="torch.add")]),
           where(101.0, 102.0, 4, [line(20, 2, lib="torch.add")])]
    table = where_table(0, ivs, steps(2), 100.0, 0.5, 0.0)
    assert table is not None
    # line 20: torch.add 2 + 2 over torch.relu 3, whichever came first; line 10: torch.mm ties the unnamed frames
    assert [(x.line, x.samples, x.lib) for x in table.lines] == [(20, 7, "torch.add"), (10, 4, "torch.mm")]


def test_a_gil_holder_in_a_span_without_samples_or_waits_counts_one_sample_and_all_of_the_wait():
    ivs = [where(100.0, 102.0, 4, [line(10, 4)], holders=[holder("ckpt", "/x/ck.py", 7, "save", "between", 3)])]
    table = where_table(0, ivs, steps(2), 100.0, 0.5, 0.25)
    assert table is not None and table.between_samples == 0 and table.between_waiting == 0
    assert table.holders == (HolderLine(thread="ckpt", file="/x/ck.py", line=7, function="save", call=None,
                                        span="between", samples=3, share=0.75, of_waiting=1.0),)
    assert (table.runq, table.between_runq) == (None, None)


# -- the job's table -------------------------------------------------------------------------------
def _table(samples: int) -> WhereTable:
    return WhereTable(rank=samples, samples=samples, hz=None, span_share=0.5, waiting=0, busy=samples, lines=())


def test_the_job_shows_the_rank_with_the_most_unexplained_off_cpu_time():
    a, b, c = _table(50), _table(10), _table(90)
    assert job_where([(a, 0.1), (b, 0.3), (None, 0.9), (c, None)]) is b


def test_without_off_cpu_shares_the_job_shows_the_rank_with_the_most_samples():
    a, b, c = _table(10), _table(90), _table(50)
    assert job_where([(a, None), (b, None), (c, None)]) is b
    assert job_where([(a, None), (b, 0.0)]) is b
    assert job_where([(None, 0.5)]) is None and job_where([]) is None


# -- the error bar --------------------------------------------------------------------------------
def test_the_error_bar_of_no_trials_is_the_whole_range_and_of_one_trial_the_wilson_width():
    assert wilson_half_width(0, 0) == 1.0
    assert wilson_half_width(3, -1) == 1.0
    # n = total = 1: p = 1, the half-width is z/(1 + z^2) x sqrt(z^2 / 4) = z^2 / (2 (1 + z^2))
    assert wilson_half_width(1, 1) == pytest.approx(Z95 ** 2 / (2 * (1 + Z95 ** 2)), rel=1e-12)
    assert wilson_half_width(1, 1) == pytest.approx(0.39672534, abs=1e-8)
    assert math.isclose(wilson_half_width(1, 2, z=1.0), 1.0 / 1.5 * math.sqrt(0.125 + 0.0625), rel_tol=1e-12)
