"""The run's downsampled history: bounded, spikes kept, unknown kept unknown, fed by the run model."""

from __future__ import annotations

import math

import pytest

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


def test_every_bucket_is_exactly_the_points_it_covers_however_often_the_series_halved() -> None:
    """Against the raw points: each bucket's times, labels, count, means and (ranged) extremes are
    those of the consecutive points it holds, unknown values left out, after 0 to 5 halvings."""
    import random

    rng = random.Random(3)
    for points in (5, 8, 9, 31, 100, 257):
        series = Series(("a", "b", "c"), capacity=8, ranged=("a", "c"))
        raw = []
        for i in range(points):
            values = (rng.uniform(-1, 1), None if i % 3 == 0 else rng.uniform(0, 5),
                      None if i % 4 == 1 else float("nan") if i % 7 == 2 else rng.uniform(0, 1))
            raw.append((0.5 * i, 10 + i, values))
            series.add(0.5 * i, values, label=10 + i)
        buckets = series.buckets()
        assert len(buckets) <= 8 and sum(b.n for b in buckets) == points == series.points
        assert len(series) == len(buckets)
        start = 0
        for b in buckets:
            chunk = raw[start:start + b.n]
            start += b.n
            assert (b.t0, b.t1, b.first, b.last) == (chunk[0][0], chunk[-1][0], chunk[0][1], chunk[-1][1])
            for f in range(3):
                known = [v[f] for _, _, v in chunk if v[f] is not None and v[f] == v[f]]
                mean = sum(known) / len(known) if known else None
                assert (b.mean[f] is None) == (mean is None) and (mean is None or math.isclose(b.mean[f], mean))
                ranged = f in (0, 2) and bool(known)
                assert b.lo[f] == (min(known) if ranged else None) and b.hi[f] == (max(known) if ranged else None)
        column = series.column("b")
        assert [t for t, _ in column] == [(b.t0 + b.t1) / 2 for b in buckets]
        assert [m for _, m in column] == [b.mean[1] for b in buckets]
        full = [b.n for b in buckets[:-1]]
        assert len(set(full)) <= 1 and (not full or buckets[-1].n <= full[0])    # equal spans, the last filling


def test_the_grid_and_the_trend_are_the_steps_means_per_time_slice() -> None:
    """Against the steps themselves (no halving): each cell of the grid is the mean over the rank's
    steps whose time falls in its slice (as a share of the active time with ``share``), and the
    trend's slice the mean over every rank's, with the lowest and highest step time."""
    from perfmon_analysis.readings import step_reading

    hist = History(capacity=1_000)
    raw: dict[int, list[tuple[float, float, float, float]]] = {0: [], 1: []}     # (t, dur, data, gap)
    for rank in (0, 1):
        for i in range(60):
            dur, data, gap = 0.1 + 0.001 * i * (rank + 1), 0.01 * (i % 5), 0.002 * (i % 3)
            rec = R.step(i, start=100.0 + i, dur=dur, phases={"data": data}, gap=gap)
            hist.add_step(rank, f"n{rank}", step_reading(rec))
            raw[rank].append((rec["t"], dur, data, gap))
    (t0, t1), columns = hist.span(), 7
    width = (t1 - t0) / columns
    edges, ranks, rows = hist.grid("data", columns)
    assert edges == [t0 + width * c for c in range(columns + 1)] and [h.rank for h in ranks] == [0, 1]
    _, _, shares = hist.grid("data", columns, share=True)
    trend = hist.trend(columns)
    for c in range(columns):
        inside = {rank: [p for p in pts if min(columns - 1, int((p[0] - t0) / width)) == c]
                  for rank, pts in raw.items()}
        for row, share_row, rank in zip(rows, shares, (0, 1)):
            pts = inside[rank]
            assert row[c] == pytest.approx(sum(p[2] for p in pts) / len(pts)) if pts else row[c] is None
            expected_share = sum(p[2] / (p[1] - p[3]) for p in pts) / len(pts) if pts else None
            assert share_row[c] == pytest.approx(expected_share) if pts else share_row[c] is None
        every = inside[0] + inside[1]
        point = trend[c]
        assert point.t == pytest.approx(t0 + width * (c + 0.5))
        assert point.mean[0] == pytest.approx(sum(p[1] for p in every) / len(every))
        assert (point.lo, point.hi) == (min(p[1] for p in every), max(p[1] for p in every))
    assert hist.grid("data", 0) == ([], ranks, [[], []]) and hist.trend(0) == []
    assert History().trend(5) == [] and History().span() is None


def test_a_steps_fields_split_its_active_time_and_memory_in_use_is_the_kinds_else_the_resident_set() -> None:
    from types import SimpleNamespace

    from perfmon_analysis.history import memory_used, step_values

    assert step_values(SimpleNamespace(dur=1.0, gap=0.25, data=0.125, exposed=0.0625)) == \
        (1.0, 0.5625, 0.125, 0.0625, 0.25)
    assert step_values(SimpleNamespace(dur=1.0, gap=0.25, data=0.125, exposed=None)) == (1.0, 0.625, 0.125, None, 0.25)
    assert step_values(SimpleNamespace(dur=0.5, gap=0.75, data=0.0, exposed=None))[1] == 0.0    # no active time
    assert step_values(SimpleNamespace(dur=0.5, gap=0.25, data=0.5, exposed=None))[1] == 0.0    # waited it all
    assert memory_used((1.0, 2.0, None, 4.0, None, None, 100.0, 200.0)) == 7.0
    assert memory_used((None,) * 6 + (100.0, 200.0)) == 100.0
    assert memory_used((None,) * 8) is None


def test_a_ranks_host_is_the_first_one_given_and_the_verdicts_kept_are_bounded() -> None:
    from perfmon_analysis.history import VERDICT_CHANGES
    from perfmon_analysis.readings import memory_reading, step_reading

    hist = History()

    hist.add_step(0, None, step_reading(R.step(0, start=1.0, dur=0.1)))
    hist.add_memory(0, "n01", memory_reading(R.sample(1.5, mem={"rss": 5.0})))
    hist.add_step(0, "n02", step_reading(R.step(1, start=2.0, dur=0.1)))
    hist.add_memory(1, "n03", memory_reading(R.sample(1.5, mem={"rss": 5.0})))
    assert (hist.ranks[0].host, hist.ranks[1].host) == ("n01", "n03")
    for i in range(VERDICT_CHANGES + 10):
        hist.note_verdict(float(i // 2), "data_loading" if i % 2 else "healthy", "ok", f"h{i}")
    assert len(hist.verdicts) == VERDICT_CHANGES
    assert hist.verdicts[-1].headline == f"h{VERDICT_CHANGES + 9}"           # same second: kept, with its words


def test_one_column_is_the_whole_run_and_unknown_or_idle_steps_leave_a_cell_to_the_rest() -> None:
    from perfmon_analysis.readings import step_reading

    hist = History(capacity=1_000)
    hist.add_step(0, "n", step_reading(R.step(0, start=10.0, dur=0.5, gap=0.5)))             # no active time
    hist.add_step(0, "n", step_reading(R.step(1, start=11.0, dur=1.0, phases={"data": 0.25})))
    hist.add_step(0, "n", step_reading(R.step(2, start=12.0, dur=1.0, phases={"data": 0.75})))
    _, _, rows = hist.grid("data", 1)
    assert rows == [[pytest.approx(1.0 / 3)]]
    _, _, shares = hist.grid("data", 1, share=True)
    assert shares == [[pytest.approx(0.5)]]                    # the idle step's share is left out, not 0/0
    _, _, comm = hist.grid("comm", 1)
    assert comm == [[None]]
    assert len(hist.trend(1)) == 1 and hist.trend(1)[0].mean[0] == pytest.approx(2.5 / 3)
