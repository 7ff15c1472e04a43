"""The trends screen (``t``): the whole run from the model's history, readable at 80x24."""

from __future__ import annotations

import re

from perfmon_analysis import units
from tests.helpers import records as R
from tests.tui import scenarios
from tui.app.screens.trends import TrendsScreen
from tui.app.widgets.trends import verdict_letters


async def _open_trends(pilot) -> None:
    await scenarios.settle(pilot)
    await pilot.press("t")
    await pilot.pause()


async def test_trends_screen_shows_the_run_story_at_80x24(recordings):
    app = scenarios.replay_app(recordings["trends"], verdicts=40)
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_trends(pilot)
        assert isinstance(app.screen, TrendsScreen)
        text = scenarios.screen_text(app)
        lines = text.splitlines()
        assert all(len(line) <= 80 for line in lines)
        for label in ("step time", "data wait", "between steps", "memory r", "verdict"):
            assert label in text, text
        assert "exposed comm" in text and "not measured" in text        # the scenario has no comm hooks
        assert "max 3.1s" in text, text                  # the one 3 s spike survives the downsampling
        assert "87% of limit" in text, text               # 14 GB of a 16 GiB limit
        # the verdict strip: healthy first, data loading in the second half, on the same axis
        letters = verdict_letters(app.feed.analysis.history.verdicts)
        strip = next(line for line in lines if line.startswith("verdict"))
        cells = re.match(r"verdict\s+([·A-Z]+)", strip).group(1)
        h, d = letters["healthy"], letters["data_loading"]
        assert cells.lstrip("·").startswith(h) and cells.endswith(d), strip   # ·: before the first judgement
        assert 0.35 < cells.index(d) / len(cells) < 0.6, strip
        await pilot.press("t")
        await pilot.pause()
        assert not isinstance(app.screen, TrendsScreen)


async def test_trends_screen_follows_the_model_as_records_arrive(recordings, monkeypatch):
    """Redrawn from the same model the feed fills (no second reader): new steps show on the next refresh."""
    monkeypatch.setattr("tui.app.screens.trends.REDRAW_SECONDS", 0.0)
    app = scenarios.replay_app(recordings["healthy"])
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_trends(pilot)
        analysis = app.feed.analysis
        rank0 = analysis.history.ranks[0]
        before = rank0.steps.points
        assert f"{units.count(before)} steps" in scenarios.screen_text(app)
        stream = next(r.stream for r in analysis.view().ranks if r.rank == 0)
        t = rank0.steps._t1[-1]
        for i in range(1000):
            analysis.ingest(stream, R.step(before + 10 + i, start=t + 0.1 * i, dur=0.1, phases={"data": 0.05}))
        app.refresh_view()
        await pilot.pause()
        text = scenarios.screen_text(app)
        assert f"{units.count(before + 1000)} steps" in text, text
        assert "now 50%" in text, text        # the new steps' data wait is the newest slice


def test_trends_screen_snapshot(snap_compare, recordings):
    assert snap_compare(scenarios.replay_app(recordings["trends"], verdicts=40), terminal_size=(80, 24),
                        run_before=_open_trends)
