"""Communication over the window (perfmon_analysis.comm_stats): each collective's counts, bytes, seconds and
bus bytes in the window from the probe's running totals, the job's table of collectives with its
bandwidths, and the straggler rules over the ranks' compute and arrival.

A rank's ``comm`` records (tests/helpers/records.py) go into its buffers as the run model holds them."""

from __future__ import annotations

from typing import Any

from perfmon_analysis.buffers import RankState
from perfmon_analysis.comm_stats import STRAGGLER_RATIO, comm_delta, comm_rows, find_straggler, relative
from perfmon_analysis.readings import comm_reading
from perfmon_analysis.views import CommOpRow
from tests.helpers import records as R


def op(name: str, count: int | None, nbytes: int, seconds: float, **fields: Any) -> dict[str, Any]:
    out = {"op": name, "bytes": nbytes, "seconds": seconds, **fields}
    if count is not None:
        out["count"] = count
    return out


def rank_with(*comms: tuple[float, list[dict[str, Any]]]) -> RankState:
    """A rank whose buffers hold the ``comm`` records (time, ops) in order."""
    state = RankState(0, "r0", R.hello(0, t=0.0), 0)
    for t, ops in comms:
        state.comm.append(comm_reading(R.comm(t, ops)))
    return state


TOTALS = [
    (10.0, [op("all_reduce", 10, 1000, 1.0, busbytes=1500.0), op("barrier", 3, 0, 0.25)]),
    (20.0, [op("all_reduce", 20, 3000, 2.0, busbytes=4000.0), op("barrier", 3, 0, 0.25)]),
    (30.0, [op("all_reduce", 40, 9000, 4.0, busbytes=9500.0), op("barrier", 3, 0, 0.25),
            op("broadcast", 2, 64, 0.5), op("send", 5, 100, 0.75, busbw=200.0), op("recv", None, 50, 0.5)]),
]


def test_the_windows_collectives_are_the_totals_since_the_newest_record_before_it():
    delta = comm_delta(rank_with(*TOTALS), 15.0)
    # from the 10 s record: the barrier did nothing since, broadcast, send and recv are new (counted from 0),
    # send's bus bytes are its busbw x seconds (from 0), recv without a count counts none
    assert delta == {"all_reduce": (30, 8000, 3.0, 8000.0), "broadcast": (2, 64, 0.5, None),
                     "send": (5, 100, 0.75, 150.0), "recv": (0, 50, 0.5, None)}


def test_a_window_shorter_than_the_record_period_takes_the_latest_period():
    # no record at or before 25 s but the 20 s one, and none at all before 5 s: the last period stands in
    assert comm_delta(rank_with(*TOTALS), 25.0)["all_reduce"] == (20, 6000, 2.0, 5500.0)
    assert comm_delta(rank_with(*TOTALS), 5.0)["all_reduce"] == (20, 6000, 2.0, 5500.0)
    assert comm_delta(rank_with(*TOTALS), None)["all_reduce"] == (20, 6000, 2.0, 5500.0)
    assert comm_delta(rank_with(*TOTALS), 20.0)["all_reduce"] == (20, 6000, 2.0, 5500.0)


def test_a_record_at_time_zero_is_before_a_window_that_starts_after_it():
    state = rank_with((0.0, [op("all_reduce", 1, 10, 0.5)]), (1.0, [op("all_reduce", 2, 20, 1.0)]),
                      (3.0, [op("all_reduce", 7, 70, 3.5)]))
    assert comm_delta(state, 0.5) == {"all_reduce": (6, 60, 3.0, None)}


def test_one_record_is_the_totals_since_the_probe_started_and_none_is_nothing():
    assert comm_delta(rank_with(TOTALS[0]), 15.0) == {"all_reduce": (10, 1000, 1.0, 1500.0),
                                                     "barrier": (3, 0, 0.25, None)}
    assert comm_delta(rank_with(), 15.0) == {}


def test_an_op_timed_again_without_new_calls_counts_its_seconds():
    state = rank_with((10.0, [op("all_gather", 4, 400, 2.0)]), (20.0, [op("all_gather", 4, 400, 2.5)]))
    assert comm_delta(state, 15.0) == {"all_gather": (0, 0, 0.5, None)}


def test_the_jobs_collectives_sum_the_ranks_and_average_their_bandwidths_longest_first():
    rows = comm_rows([
        {"all_reduce": (10, 4000, 2.0, 6000.0), "broadcast": (1, 100, 0.5, None), "barrier": (2, 0, 0.25, None)},
        {"all_reduce": (10, 4000, 4.0, 0.0), "broadcast": (1, 100, 0.0, None)},
    ])
    assert rows == [CommOpRow(op="all_reduce", count=20, bytes=8000, seconds=6.0, busbw=3000.0, algbw=1500.0, ranks=2),
                    CommOpRow(op="broadcast", count=2, bytes=200, seconds=0.5, busbw=None, algbw=200.0, ranks=2),
                    CommOpRow(op="barrier", count=2, bytes=0, seconds=0.25, busbw=None, algbw=None, ranks=2)]
    assert comm_rows([]) == []


def test_a_one_byte_collective_has_its_bandwidths():
    assert comm_rows([{"all_reduce": (1, 1, 0.5, 1.0)}]) == [
        CommOpRow(op="all_reduce", count=1, bytes=1, seconds=0.5, busbw=2.0, algbw=2.0, ranks=1)]


def test_a_rank_whose_compute_is_under_the_ratio_of_the_fastest_is_the_compute_straggler():
    assert STRAGGLER_RATIO == 0.7
    assert find_straggler([(0, 1.0, 1.5), (1, 2.0, 2.5), (2, 1.2, None)]) == (0.5, 0.6, 1, "compute")


def test_a_rank_arriving_late_without_slower_compute_is_the_arrival_straggler():
    assert find_straggler([(0, 1.0, 1.0), (1, 1.0, 2.0)]) == (1.0, 0.5, 1, "arrival")
    assert find_straggler([(0, 1.0, 1.0), (1, 1.0, 1.25)]) == (1.0, 0.8, None, None)
    assert find_straggler([(0, 1.0, 1.0), (1, 1.0, None)]) == (1.0, None, None, None)


def test_straggling_needs_two_ranks_with_their_compute_measured():
    assert find_straggler([(0, 1.0, 1.0), (1, None, 3.0)]) == (None, None, None, None)
    assert find_straggler([]) == (None, None, None, None)


def test_the_relative_score_is_fastest_over_slowest_and_one_when_nothing_took_time():
    assert relative([(0, 2.0), (3, 8.0), (1, 4.0)]) == (0.25, 3)
    assert relative([(0, 0.0), (1, 0.0)]) == (1.0, 0)
