#!/usr/bin/env python3
"""Mutation testing of perfmon's pure core with mutmut, driven by the unit tests.

    nice -n 15 python scripts/mutation.py                       # the default modules below
    nice -n 15 python scripts/mutation.py probe/wire.py         # any module paths
    python scripts/mutation.py --tests tests/unit tests/tui ... # other tests to drive it

It copies the working tree (tracked and untracked, not ignored files) into a scratch
directory, configures mutmut there (``source_paths`` = the packages, ``only_mutate`` =
the given modules), runs ``mutmut run`` and prints, per module, killed / survived /
total and the score (killed + timeouts over the mutants checked), then the names of
the surviving mutants (``mutmut show NAME`` inside the scratch directory prints a diff).
The repository itself is never written to. Slow (minutes per module): not in CI; the
figures go to bench/RESULTS.md. Needs ``pip install mutmut`` (3.x).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The modules mutated when none are given: the pure core (run model, verdict) and the wire.
DEFAULT_MODULES = [
    "perfmon_analysis/runmodel.py",
    "perfmon_analysis/stats.py",
    "perfmon_analysis/known.py",
    "perfmon_analysis/where_stats.py",
    "perfmon_analysis/device_stats.py",
    "perfmon_analysis/memory_stats.py",
    "perfmon_analysis/comm_stats.py",
    "perfmon_analysis/buffers.py",
    "perfmon_analysis/readings/base.py",
    "perfmon_analysis/readings/steps.py",
    "perfmon_analysis/readings/samples.py",
    "perfmon_analysis/readings/where.py",
    "perfmon_analysis/readings/stall.py",
    "perfmon_analysis/readings/profiles.py",
    "perfmon_analysis/losses.py",
    "perfmon_analysis/flowchart.py",
    "perfmon_analysis/questions.py",
    "perfmon_analysis/outcomes.py",
    "perfmon_analysis/verdict.py",
    "perfmon_analysis/explain.py",
    "perfmon_analysis/summary.py",
    "perfmon_analysis/heatmap.py",
    "probe/wire.py",
    "probe/recording.py",
]
# The unit tests of those modules and of the model pieces the run model calls (stuck, profile, capture);
# a whole-suite run per mutant would take hours on two cores.
DEFAULT_TESTS = [
    "tests/unit/test_runmodel.py",
    "tests/unit/test_stats.py",
    "tests/unit/test_buffers.py",
    "tests/unit/test_stuck.py",
    "tests/unit/test_profile_model.py",
    "tests/unit/test_capture_model.py",
    "tests/unit/test_readings.py",
    "tests/unit/test_window_memory.py",
    "tests/unit/test_losses.py",
    "tests/unit/test_verdict.py",
    "tests/unit/test_chart.py",
    "tests/unit/test_verdict_explain.py",
    "tests/unit/test_report.py",
    "tests/unit/test_summary.py",
    "tests/unit/test_heatmap.py",
    "tests/unit/test_wire.py",
    "tests/unit/test_recording.py",
]

ROOT = Path(__file__).resolve().parent.parent


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if not src.is_file() or name.startswith(("screenshots/", "mutants/")):
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def configure(dest: Path, modules: list[str], tests: list[str]) -> None:
    """Append a [tool.mutmut] table to the scratch copy's pyproject.toml."""
    # the three packages go to mutmut's copy (the tests import them); only the given modules are mutated
    packages = sorted({"probe", "perfmon_analysis", "tui"} | {m.split("/")[0] for m in modules})
    data = subprocess.run(["git", "ls-files", *packages], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.split()
    data = [f for f in data if not f.endswith(".py")]       # mutmut copies only Python files itself
    pytest_args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-o", "addopts=", "-x", "-q"]
    table = "\n[tool.mutmut]\n" + "\n".join([
        f"source_paths = {json.dumps(packages)}",
        f"only_mutate = {json.dumps(modules)}",
        f"also_copy = {json.dumps(data)}",
        f"pytest_add_cli_args = {json.dumps(pytest_args)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'process_isolation = "fork"',         # these tests never import torch: forking is safe and fastest
        "use_git_change_detection = false",
    ]) + "\n"
    with open(dest / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(table)


def results(dest: Path) -> dict[str, str]:
    """mutant name -> status, from ``mutmut results --all true``."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=dest,
                         capture_output=True, text=True).stdout
    status: dict[str, str] = {}
    for line in out.splitlines():
        name, sep, state = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            status[name] = state.strip()
    return status


def module_of(name: str, modules: list[str]) -> str:
    """``perfmon_analysis.verdict.x__explain__mutmut_3`` -> ``perfmon_analysis/verdict.py``."""
    for m in modules:
        if name.startswith(m[:-3].replace("/", ".") + ".x"):
            return m
    return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", default=DEFAULT_MODULES, help="module paths to mutate")
    ap.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="test paths that must kill the mutants")
    ap.add_argument("--children", type=int, default=2, help="parallel mutant runs (default 2)")
    ap.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one, kept)")
    ap.add_argument("--json", type=Path, help="also write the per-module figures and survivors here")
    ap.add_argument("--report-only", action="store_true", help="only summarise the results already in --workdir")
    args = ap.parse_args(argv)
    for m in args.modules:
        if not (ROOT / m).is_file():
            ap.error(f"no such module: {m}")
    if args.report_only and not args.workdir:
        ap.error("--report-only needs --workdir")

    dest = args.workdir or Path(tempfile.mkdtemp(prefix="perfmon-mutation-"))
    returncode = 0
    if not args.report_only:
        if (dest / "mutants").exists():
            shutil.rmtree(dest / "mutants")
        copy_tree(dest)
        configure(dest, args.modules, args.tests)
        print(f"mutmut in {dest} over {' '.join(args.modules)}, driven by {' '.join(args.tests)}", flush=True)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        returncode = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.children)],
                                    cwd=dest, env=env).returncode
    status = results(dest)
    if not status:
        print("mutmut produced no results", file=sys.stderr)
        return returncode or 1

    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors: dict[str, list[str]] = collections.defaultdict(list)
    for name, state in status.items():
        mod = module_of(name, args.modules)
        per[mod][state] += 1
        if state in ("survived", "no tests"):
            survivors[mod].append(name)
    report = {}
    print(f"\n{'module':<22} {'killed':>7} {'survived':>9} {'no tests':>9} {'timeout':>8} {'unchecked':>9} "
          f"{'total':>6} {'score':>6}")
    for mod in args.modules:
        c = per.get(mod, collections.Counter())
        total = sum(c.values())
        checked = total - c["not checked"]          # an interrupted run leaves mutants "not checked"
        killed = c["killed"] + c["timeout"]
        score = killed / checked if checked else 0.0
        report[mod] = {**c, "total": total, "checked": checked, "score": round(score, 4),
                       "survivors": sorted(survivors[mod])}
        print(f"{mod:<22} {c['killed']:>7} {c['survived']:>9} {c['no tests']:>9} {c['timeout']:>8} "
              f"{c['not checked']:>9} {total:>6} {100 * score:>5.1f}%")
    for mod in args.modules:
        for name in sorted(survivors[mod]):
            print(f"  {status[name]:<9} {name}")
    print(f"\ninspect a mutant: cd {dest} && {sys.executable} -m mutmut show NAME")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
