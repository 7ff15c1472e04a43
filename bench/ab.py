"""Two versions of perfmon timed against each other in one run: a benchmark's rounds alternate between
this tree and another (a checkout of main, say), each round in a fresh process running this tree's
benchmark script with ``PYTHONPATH`` putting that tree's packages first, so the same measurement
times both versions and machine noise falls on both alike. A benchmark takes part by accepting
``--ab-json`` (print one JSON object of its figures as its last line) and ``--ab OTHER_TREE``.

    git archive main | tar -x -C /tmp/perfmon-main
    python bench/bench_hot_path.py --ab /tmp/perfmon-main
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def one_round(script: str, tree: Path, args: list[str]) -> dict[str, float]:
    """The figures of one round of this tree's ``script`` with ``tree``'s packages imported."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(HERE / script), *args, "--ab-json"], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=1800, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(script: str, other: str, rounds: int, args: list[str]) -> None:
    """Alternate ``rounds`` rounds of ``script`` between ``other`` and this tree; print each figure's
    median and range for both, and the difference of the medians."""
    trees = {"other": Path(other).resolve(), "this": HERE}
    got: dict[str, list[dict[str, float]]] = {"other": [], "this": []}
    for i in range(rounds):
        for name in (("other", "this") if i % 2 == 0 else ("this", "other")):
            got[name].append(one_round(script, trees[name], args))
    print(f"{script}: {rounds} rounds alternated, other = {trees['other']}, this = {trees['this']}")
    print(f"{'figure':<28} {'other (min-max)':>24} {'this (min-max)':>24} {'this - other':>13}")
    for key in got["this"][0]:
        a, b = [r[key] for r in got["other"]], [r[key] for r in got["this"]]
        print(f"{key:<28} {statistics.median(a):>8.2f} ({min(a):.2f}-{max(a):.2f}){'':>6} "
              f"{statistics.median(b):>8.2f} ({min(b):.2f}-{max(b):.2f}){'':>6} "
              f"{statistics.median(b) - statistics.median(a):>+9.2f}")
