"""The verdict bar says what fixing the bottleneck buys: the speedup bound and device-hours a day,
money with a price, in short on a narrow terminal; ``attach`` takes the price from its flag."""

from __future__ import annotations

import pytest

from perfmon_analysis import units
from perfmon_analysis.analysis import Analysis
from tests.tui import scenarios
from tests.tui.scenarios import settle
from tui import cli
from tui.app.perfmon_app import PerfmonApp
from tui.commands.attach import build_app
from tui.stream.feed import ReplayFeed
from tui.stream.sources import load_recordings


def _app(recording, price=None) -> PerfmonApp:
    return PerfmonApp(ReplayFeed(Analysis(), load_recordings(recording), speed=None), watch_terminal=False,
                      price=price)


def _bar(app) -> list[str]:
    return scenarios.screen_text(app).splitlines()[-3:]


@pytest.mark.parametrize("size,shown", [
    ((120, 36), "fixing it: up to 1.8× faster, 11 CPU-h/day ({money}/day) · fix:"),
    ((80, 24), "up to 1.8×, 11 CPU-h/day ({money}/day) · fix: raise")])
async def test_the_bar_prices_the_named_loss(recordings, size, shown):
    app = _app(recordings["data_preprocessing"], price=2.0)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        gain = app.verdict.gains.of("data_wait")
        assert gain.speedup_bound == pytest.approx(1 / (1 - app.view.metrics.data_wait_frac))
        assert gain.per_day == pytest.approx(24 * app.view.metrics.data_wait_frac * (1 - app.view.metrics.gap_frac))
        assert shown.format(money=units.money(2.0 * gain.per_day)) in _bar(app)[0]


async def test_no_gain_line_for_a_healthy_job(recordings):
    app = _app(recordings["healthy"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert _bar(app)[0].strip().startswith("fix: nothing to fix")


def test_attach_passes_its_price_to_the_bar_and_refuses_a_bad_one(recordings, capsys):
    assert build_app(str(recordings["healthy"]), speed=None, price=2.5)._verdict_bar.price == 2.5
    assert cli.main(["attach", str(recordings["healthy"]), "--price-per-device-hour", "-3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--price-per-device-hour must be a price of zero or more" in err[0]
