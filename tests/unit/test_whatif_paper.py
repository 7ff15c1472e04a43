"""perfmon's straggler analysis on the straggler paper's three public traces (tests/data/straggler_paper,
converted by bench/paper_traces.py): the cause the paper found is named, and perfmon's figure for it is
within 10% of the paper's on S - 1 (or 0.03), through the same code as ``bench/whatif_paper.py --json``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from probe import wire

BENCH = Path(__file__).resolve().parents[2] / "bench" / "whatif_paper.py"
_spec = importlib.util.spec_from_file_location("whatif_paper", BENCH)
assert _spec is not None and _spec.loader is not None
whatif_paper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(whatif_paper)

pytestmark = pytest.mark.slow      # replays every step of 88 ranks' traces: seconds, not milliseconds


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    return {name: whatif_paper.analyse(name) for name in whatif_paper.TRACES}


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_vendored_trace_is_wire_records(name: str) -> None:
    """Every record of the fixture passes the wire schema a viewer applies to a probe's stream."""
    records = whatif_paper.records(name)
    assert {rec["k"] for _, rec in records} == {"hello", "layout", "step"}
    for _, rec in records:
        wire.validate(rec)


def test_ar_names_the_slowed_worker(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["AR"]
    assert row["cause"] == "slow_worker" and row["worker"] == {"stage": 0, "replica": 0, "rank": 0}
    assert whatif_paper.check(row) == [], row


def test_st_names_the_last_stage(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["ST"]
    assert (row["cause"], row["stage"]) == ("slow_stage", 3)
    assert whatif_paper.check(row) == [], row


def test_se_names_rotating_imbalance_with_the_heavier_stage(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["SE"]
    assert (row["cause"], row["stage"]) == ("rotating_imbalance", 1) and "worker" not in row
    assert whatif_paper.check(row) == [], row


def test_whole_slowdown_matches_the_papers_on_every_trace(rows: dict[str, dict[str, Any]]) -> None:
    for row in rows.values():
        assert whatif_paper.within(row["whole_slowdown"], row["paper_whole"]), row
