"""The refresh timer thins itself by what a refresh costs: a few ranks refresh at 4 Hz, a thousand
at 2 Hz, never less often."""

from __future__ import annotations

import itertools
import time

from tui.app.perfmon_app import REFRESH_BUDGET, PerfmonApp, ticks_to_skip

TICK = 0.25     # 4 Hz


def test_a_cheap_refresh_keeps_every_tick():
    assert ticks_to_skip(0.002, TICK) == 0
    assert ticks_to_skip(TICK * REFRESH_BUDGET, TICK) == 0      # exactly the budget


def test_a_costly_refresh_lets_a_tick_pass_to_stay_within_the_budget():
    assert ticks_to_skip(0.026, TICK) == 1      # 260 ms budgeted: every other tick
    assert ticks_to_skip(0.024, TICK) == 0


def test_the_screen_still_refreshes_twice_a_second():
    assert ticks_to_skip(5.0, TICK) == 1
    assert ticks_to_skip(5.0, 0.5) == 0


def test_the_timer_refreshes_every_other_tick_when_a_refresh_takes_60_ms(monkeypatch):
    app = PerfmonApp(refresh_hz=1 / TICK, watch_terminal=False)
    refreshed = []
    app.refresh_view = lambda: refreshed.append(len(refreshed))
    clock = itertools.count(0.0, 0.06)          # each refresh: 60 ms between its two readings
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    ticks = []
    for _n in range(8):
        before = len(refreshed)
        app._tick()
        ticks.append(len(refreshed) > before)
    assert ticks == [True, False] * 4
