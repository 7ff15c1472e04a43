"""How fast the verdict follows the demo tour: seconds from each scenario switch to the verdict
(with the TUI's two-agreeing-evaluations rule) naming that scenario.

Runs ``perfmon demo --headless --record`` for the whole tour, then replays the recording
through the run model and the verdict tracker, evaluating once per second of job time as the
TUI would at 1 Hz, and reads the switches from the workload's ``demo`` events.

    python bench/bench_tour.py --ranks 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmon_analysis.runmodel import RunModel  # noqa: E402
from perfmon_analysis.verdict import VerdictTracker  # noqa: E402
from probe.recording import read_recording, recording_files  # noqa: E402
from tui.commands.demo import scenarios  # noqa: E402

# A scenario whose verdict is not its own name: step_gaps is a finding of a healthy job.
EXPECTED = {"step_gaps": "healthy"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--phase-seconds", type=float, default=scenarios.TOUR_PHASE_S)
    parser.add_argument("--trace", action="store_true", help="print the verdicts after a switch slower than 10 s")
    args = parser.parse_args()
    phases = len(scenarios.tour(args.ranks))
    seconds = phases * args.phase_seconds + 5
    rec = Path(tempfile.mkdtemp(prefix="perfmon-tour-"))
    env = {**os.environ, scenarios.PHASE_ENV: str(args.phase_seconds)}
    subprocess.run([sys.executable, "-m", "tui.cli", "demo", "--headless", "--ranks", str(args.ranks),
                    "--seconds", str(seconds), "--record", str(rec)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    records = sorted(((f.name, r) for f in recording_files(rec) for r in read_recording(f).records),
                     key=lambda sr: sr[1].get("t") or 0.0)
    switches = [(r["t"], r["scenario"]) for _, r in records if r.get("k") == "event" and r.get("name") == "demo"
                and r.get("rank", 0) in (0, None)]
    firsts: dict[float, str] = {}
    for t, name in switches:               # one switch per phase (ranks switch within a step of each other)
        if not any(abs(t - s) < 1.0 for s in firsts):
            firsts[t] = name
    model, tracker = RunModel(), VerdictTracker()
    clock, i = records[0][1]["t"], 0
    shown: list[tuple[float, str]] = []
    while i < len(records):
        clock += 1.0
        while i < len(records) and (records[i][1].get("t") or 0.0) <= clock:
            model.ingest(*records[i])
            i += 1
        verdict = tracker.update(model.view(now=clock))
        shown.append((clock, verdict.bottleneck, verdict.headline))
    print(f"{'scenario':<20} {'expected':<20} {'seconds to verdict':>18}")
    starts = sorted(firsts)
    for k, t in enumerate(starts):
        name = firsts[t]
        want = EXPECTED.get(name, name)
        end = starts[k + 1] if k + 1 < len(starts) else float("inf")
        hit = next((c for c, b, _ in shown if t <= c < end and b == want), None)
        print(f"{name:<20} {want:<20} {'never' if hit is None else f'{hit - t:.0f}':>18}")
        if args.trace and (hit is None or hit - t > 10):
            for c, b, headline in shown:
                if t <= c <= (hit if hit is not None else end):
                    print(f"    +{c - t:4.0f}s {b}: {headline}")


if __name__ == "__main__":
    main()
