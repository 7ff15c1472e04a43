"""The ranks pane, where it is wide enough, shows each rank's p99 and longest step of the window (the
report's ``step_time_p99_s`` and ``step_time_max_s`` rows): slow steps a median hides."""

from __future__ import annotations

import re

from perfmon_analysis import units
from tests.tui import scenarios
from tests.tui.scenarios import screen_text, settle


async def test_a_wide_ranks_pane_has_each_ranks_p99_and_longest_step(recordings):
    app = scenarios.replay_app(recordings["load_imbalance"])
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        rows = {r.rank: r for r in app.view.ranks}
    head = next(line for line in text.splitlines() if "rank  steps" in line)
    assert re.search(r"comm\s+p99\s+max\s+cpu", head)
    for rank, row in rows.items():
        cells = f"{units.seconds(row.step_times.p99):>6} {units.seconds(row.step_times.max):>6}"
        assert any(re.search(rf"[┃│] {rank}\s+80 .*{re.escape(cells)}", line) for line in text.splitlines()), rank


async def test_at_120_columns_the_pane_keeps_its_usual_columns(recordings):
    app = scenarios.replay_app(recordings["load_imbalance"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        head = next(line for line in screen_text(app).splitlines() if "rank  steps" in line)
    assert "p99" not in head
