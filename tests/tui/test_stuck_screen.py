"""The stacks screen's rank lines keep a separator between every field, also in a screenshot's text."""

from __future__ import annotations

import html
import re

from tests.tui import scenarios
from tests.tui.scenarios import settle


def _runs_per_row(svg: str) -> dict[float, list[str]]:
    """Each row of an exported screenshot as its text runs, in order, each read without its edge
    whitespace (how a run is read on its own: a text extractor, a copy from the image)."""
    rows: dict[float, list[str]] = {}
    for found in re.finditer(r'<text[^>]*\by="([0-9.]+)"[^>]*>([^<]*)</text>', svg):
        rows.setdefault(float(found.group(1)), []).append(html.unescape(found.group(2)).replace("\xa0", " ").strip())
    return rows


async def test_each_rank_line_separates_rank_role_time_and_place_even_run_by_run(recordings):
    app = scenarios.replay_app(recordings["stuck"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        svg = app.export_screenshot()
    rows = ["".join(runs) for runs in _runs_per_row(svg).values()]
    waiting = next(row for row in rows if row.startswith("rank 0"))
    culprit = next(row for row in rows if row.startswith("rank 1"))
    assert waiting == "rank 0·waiting·45s · in all_reduce #41·node-a pid 4000"
    assert culprit == "rank 1·culprit·45s · train.py:30 in load_shard·node-a pid 4001"
