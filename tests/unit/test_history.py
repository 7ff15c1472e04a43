"""The run's downsampled history: bounded, spikes kept, unknown kept unknown, fed by the run model."""

from __future__ import annotations

import math

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.history import BUCKETS, MEMORY_BUCKETS, STEP_FIELDS, History, Series
from tests.helpers import records as R


def test_series_stays_bounded_and_keeps_every_point_counted() -> None:
    s = Series(("v",), capacity=16)
    for i in range(10_000):
        s.add(float(i), (1.0,), i)
    buckets = s.buckets()
    assert len(buckets) <= 16
    assert sum(b.n for b in buckets) == 10_000
    assert buckets[0].first == 0 and buckets[-1].last == 9_999
    # consecutive, non-overlapping step ranges
    assert all(a.last + 1 == b.first for a, b in zip(buckets, buckets[1:]))


def test_a_single_spike_survives_as_its_bucket_max_and_the_mean_is_exact() -> None:
    s = Series(("v",), capacity=8, ranged=("v",))
    values = [0.1] * 50_000
    values[31_337] = 9.0
    for i, v in enumerate(values):
        s.add(float(i), (v,), i)
    buckets = s.buckets()
    spiked = [b for b in buckets if b.first <= 31_337 <= b.last]
    assert len(spiked) == 1 and spiked[0].hi[0] == 9.0
    assert all(b.hi[0] == 0.1 for b in buckets if b is not spiked[0])
    total = sum(b.mean[0] * b.n for b in buckets)  # type: ignore[operator]
    assert math.isclose(total, sum(values), rel_tol=1e-9)
    assert min(b.lo[0] for b in buckets) == 0.1  # type: ignore[type-var]


def test_unknown_values_stay_unknown_not_zero() -> None:
    s = Series(("known", "unknown"), capacity=4, ranged=("known", "unknown"))
    for i in range(100):
        s.add(float(i), (2.0, None), i)
    buckets = s.buckets()
    assert sum(b.n for b in buckets) == 100
    for b in buckets:
        assert b.mean == (2.0, None) and b.lo == (2.0, None) and b.hi == (2.0, None)


def test_a_rank_history_stays_small_however_long_the_run() -> None:
    """Both series of a rank stay at their bucket counts: the cost of 1,024 ranks is fixed."""
    h = History()
    rank = h._rank(0, "n01")

    def size() -> int:
        arrays = [a for s in (rank.steps, rank.memory) for a in (s._t0, s._t1, s._first, s._last, s._n, *s._count,
                                                                   *s._sum, *s._lo.values(), *s._hi.values())]
        return sum(a.itemsize * len(a) for a in arrays)

    for i in range(20_000):
        rank.steps.add(float(i), (0.1, 0.08, 0.01, None, 0.0), i)
        rank.memory.add(float(i), (None,) * 6 + (1e9, 2e9))
        if i == BUCKETS - 1:     # every bucket of both series in use: the most a rank holds
            assert len(rank.steps) == BUCKETS and len(rank.memory) == MEMORY_BUCKETS
            assert size() < 52_000
    assert len(rank.steps) <= BUCKETS and len(rank.memory) <= MEMORY_BUCKETS
    assert size() < 52_000


def test_verdict_changes_are_kept_once_each_with_their_time() -> None:
    h = History()
    for t, b in [(1.0, "healthy"), (2.0, "healthy"), (3.0, "data_loading"), (4.0, "data_loading"), (5.0, "healthy")]:
        h.note_verdict(t, b, "ok", "")
    assert [(c.t, c.bottleneck) for c in h.verdicts] == [(1.0, "healthy"), (3.0, "data_loading"), (5.0, "healthy")]


def _steps(rank: int, n: int, dur: float, host: str, slow_from: int | None = None) -> list[dict]:
    out = [R.hello(rank, t=1000.0, world_size=2, pid=100 + rank, host=host)]
    t = 1000.0
    for i in range(n):
        d = dur * (2 if slow_from is not None and i >= slow_from else 1)
        out.append(R.step(i, start=t, dur=d, phases={"data": d / 4}))
        t += d
        if i % 100 == 0:
            out.append(R.memory(t, device="cpu", rss=1_000_000 + i, limit=8_000_000))
    return out


def test_run_model_feeds_the_history_and_the_trend_shows_a_doubling() -> None:
    analysis = Analysis.of_records([("r0", _steps(0, 5_000, 0.01, "n01", slow_from=2_500)),
                                    ("r1", _steps(1, 5_000, 0.01, "n02"))])
    hist = analysis.history
    assert set(hist.ranks) == {0, 1}
    assert hist.ranks[0].steps.points == 5_000 and len(hist.ranks[0].steps) <= hist.capacity
    assert [m for _, m in hist.ranks[1].memory.column("limit")][0] == 8_000_000
    trend = hist.trend(20)
    step = STEP_FIELDS.index("step")
    assert math.isclose(trend[0].mean[step], 0.01) and trend[-1].mean[step] > 0.014  # type: ignore[arg-type,operator]
    assert trend[-1].hi == 0.02 and trend[0].lo == 0.01
    data = STEP_FIELDS.index("data")
    assert all(p.mean[data] is not None and math.isclose(p.mean[data], p.mean[step] / 4) for p in trend)  # type: ignore[operator]
    assert all(p.mean[STEP_FIELDS.index("comm")] is None for p in trend)   # comm never measured


def test_grid_orders_ranks_by_node_and_marks_the_slow_rank() -> None:
    analysis = Analysis.of_records([("a", _steps(0, 400, 0.01, "n02")), ("b", _steps(1, 400, 0.01, "n01")),
                                    ("c", _steps(2, 400, 0.01, "n02", slow_from=0))])
    edges, ranks, rows = analysis.history.grid("step", 10)
    assert [h.rank for h in ranks] == [0, 2, 1]         # n02's ranks together, in order of first rank
    assert len(edges) == 11 and all(len(r) == 10 for r in rows)
    slow = rows[1]
    assert all(v is None or math.isclose(v, 0.02) for v in slow) and any(v is not None for v in slow)
    _, _, shares = analysis.history.grid("data", 10, share=True)
    assert all(v is None or math.isclose(v, 0.25) for row in shares for v in row)


def test_judging_a_view_records_the_verdict_in_the_history() -> None:
    analysis = Analysis.of_records([("r0", _steps(0, 200, 0.01, "n01"))])
    snap = analysis.snapshot()
    assert [c.bottleneck for c in analysis.history.verdicts] == [snap.verdict.bottleneck]


def test_the_rank_closest_to_its_memory_limit_is_found_from_its_peak() -> None:
    from perfmon_analysis.readings import memory_reading
    h = History()
    for rank, (peak, limit) in enumerate([(6e9, 8e9), (9e9, 16e9), (7.5e9, 8e9)]):
        for used in (1e9, peak, 2e9):      # the peak passes; the newest reading is low again
            h.add_memory(rank, "n01", memory_reading({"k": "memory", "t": 1.0, "device": "cpu", "rss": int(used),
                                                      "limit": int(limit)}))
    closest = h.closest_to_memory_limit()
    assert closest is not None and closest.rank == 2 and closest.memory_peak == 7.5e9
