"""perfmon's straggler analysis on the straggler paper's three public traces, against the paper's results.

The traces (converted by ``bench/paper_traces.py`` into the records a probe sends, vendored in
``tests/data/straggler_paper/`` with their license) are read by perfmon's run model like a recording,
over a window that holds every step, and the view's ``straggling`` is compared with the paper's own
figures (``expected.json``, from its ``result-*.json``): the cause named, and perfmon's slowdown for
it against the paper's, within 10% of S − 1 or 0.03, whichever is larger.

    python bench/whatif_paper.py [--json]

``--json`` prints one object per trace per line: {"trace", "cause", "named", "slowdown", "paper", ...}:
``slowdown`` perfmon's figure for the cause it names, ``paper`` the paper's figure for it (the slow
worker's replica, the slow stage, and for rotating imbalance the whole slowdown S; for SE also the
heavier stage's, ``stage_slowdown`` against ``paper_stage``), ``gain`` what removing the cause buys
(the measured step over the simulated one without it), ``seconds`` the analysis time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.stragglers import ROTATING, SLOW_STAGE, SLOW_WORKER

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "straggler_paper"
TRACES = ("AR", "ST", "SE")
EXPECTED_CAUSE = {"AR": SLOW_WORKER, "ST": SLOW_STAGE, "SE": ROTATING}


def records(name: str) -> list[tuple[int, dict[str, Any]]]:
    """The trace's [rank, record] pairs, in the order a recording of each rank holds them."""
    body = gzip.decompress((DATA / f"{name}.msgpack.gz").read_bytes())
    return [(int(rank), rec) for rank, rec in msgpack.unpackb(body, raw=False, strict_map_key=True)]


def model(name: str) -> RunModel:
    """A run model fed the trace, its window wide enough for every step."""
    m = RunModel(window_steps=10_000, window_seconds=1e12)
    for rank, rec in records(name):
        m.ingest(f"{name}/rank{rank}", rec)
    return m


def within(ours: float | None, paper: float) -> bool:
    """The acceptance line: ``ours`` − 1 within 10% of ``paper`` − 1, or 0.03, whichever is larger."""
    return ours is not None and abs(ours - paper) <= max(0.1 * abs(paper - 1.0), 0.03)


def analyse(name: str) -> dict[str, Any]:
    """perfmon's reading of one trace beside the paper's figures."""
    expected = json.loads((DATA / "expected.json").read_text())[name]
    t0 = time.perf_counter()
    view = model(name).view()
    seconds = time.perf_counter() - t0
    s, layout = view.straggling, view.layout
    out: dict[str, Any] = {"trace": name, "cause": s.cause if s else None, "named": None,
                           "slowdown": _r(s.slowdown) if s else None, "paper": None, "gain": _r(s.gain) if s else None,
                           "whole_slowdown": _r(s.whole) if s else None, "paper_whole": _r(expected["S"]),
                           "steps": s.steps if s else 0, "seconds": round(seconds, 2)}
    if s is None:
        return out
    if s.cause == SLOW_WORKER and s.worker is not None:
        out["named"] = f"worker {layout.worker_label(*s.worker)} (rank {s.rank})"
        out["worker"] = {"stage": s.worker[0], "replica": s.worker[1], "rank": s.rank}
        out["paper"] = _r(expected["by_replica"][str(s.worker[1])])
    elif s.cause == SLOW_STAGE and s.stage is not None:
        out["named"] = f"stage {s.stage}"
        out["stage"] = s.stage
        out["paper"] = _r(expected["by_stage"][str(s.stage)])
    elif s.cause == ROTATING:
        out["named"] = f"a different worker each step ({s.workers_standing_out} replicas stood out)" + (
            f"; stage {s.stage} the heavier" if s.stage is not None else "")
        out["paper"] = _r(expected["S"])
        if s.stage is not None:
            out.update(stage=s.stage, stage_slowdown=_r(s.stage_slowdown),
                       paper_stage=_r(expected["by_stage"][str(s.stage)]))
    return out


def check(row: dict[str, Any]) -> list[str]:
    """What in ``row`` misses the acceptance line (empty when it meets it)."""
    name = row["trace"]
    misses = []
    if row["cause"] != EXPECTED_CAUSE[name]:
        misses.append(f"{name}: cause {row['cause']}, the paper's is {EXPECTED_CAUSE[name]}")
    if row["paper"] is not None and not within(row["slowdown"], row["paper"]):
        misses.append(f"{name}: slowdown {row['slowdown']} against the paper's {row['paper']}")
    if "paper_stage" in row and not within(row.get("stage_slowdown"), row["paper_stage"]):
        misses.append(f"{name}: stage slowdown {row['stage_slowdown']} against the paper's {row['paper_stage']}")
    return misses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="perfmon's what-if on the straggler paper's traces")
    parser.add_argument("--json", action="store_true", help="one JSON object per trace per line")
    args = parser.parse_args(argv)
    misses: list[str] = []
    for name in TRACES:
        row = analyse(name)
        misses += check(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{name}: {row['cause']} — {row['named']}: {row['slowdown']}× (paper {row['paper']}×), "
                  f"removing it buys {row['gain']}×; every straggler {row['whole_slowdown']}× "
                  f"(paper {row['paper_whole']}×), {row['steps']} steps in {row['seconds']} s", flush=True)
    for line in misses:
        print(line, file=sys.stderr)
    return 1 if misses else 0


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


if __name__ == "__main__":
    sys.exit(main())
