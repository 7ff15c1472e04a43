"""Snapshots of the main screen in four verdict states at 120x36 and 80x24 (and the flowchart).

The data are fixed recordings (tests/tui/scenarios.py) replayed to their end at
once, and the clock is the recordings' own: nothing on screen depends on the
wall time or the machine. Review changes with the HTML report before running
``pytest --snapshot-update``.
"""

from __future__ import annotations

import pytest

from tests.tui import scenarios

SIZES = [(120, 36), (80, 24)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scenario", list(scenarios.SCENARIOS))
def test_main_screen(snap_compare, recordings, scenario, size):
    assert snap_compare(scenarios.replay_app(recordings[scenario]), terminal_size=size,
                        run_before=scenarios.settle)


def test_flowchart_screen(snap_compare, recordings):
    async def open_chart(pilot):
        await scenarios.settle(pilot)
        await pilot.press("f")
        await pilot.pause()

    assert snap_compare(scenarios.replay_app(recordings["load_imbalance"]), terminal_size=(120, 36),
                        run_before=open_chart)


def test_where_screen(snap_compare, recordings):
    async def open_where(pilot):
        await scenarios.settle(pilot)
        await pilot.press("u")
        await pilot.pause()

    assert snap_compare(scenarios.replay_app(recordings["host_wait"]), terminal_size=(120, 36), run_before=open_where)


def test_stuck_screen(snap_compare, recordings):
    async def open_stacks(pilot):
        await scenarios.settle(pilot)
        await pilot.press("s")
        await pilot.pause()

    assert snap_compare(scenarios.replay_app(recordings["stuck"]), terminal_size=(120, 36), run_before=open_stacks)
