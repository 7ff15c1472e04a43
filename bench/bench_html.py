"""``perfmon report --html`` on long and wide simulated recordings: file size and generation time.

Writes the ``trends`` test scenario (tests/tui/scenarios.py: 100 ms steps, the loader falling
behind halfway, a spike, two checkpoints, memory creeping up; 8 ranks a node) as recordings, then
times the command users run, ``perfmon report --html OUT RECDIR`` in a fresh process (reading,
replaying with the verdict judged along the way, writing the page), beside the plain text
``perfmon report RECDIR`` of the same recordings (reading and one verdict).

    python bench/bench_html.py                    # 1 x 100,000 and 1,024 x 1,000
    python bench/bench_html.py --case 4x2000      # one RANKSxSTEPS case
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tui import scenarios  # noqa: E402


def run(ranks: int, steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-html-") as tmp:
        t0 = time.perf_counter()
        rec = scenarios.write("trends", Path(tmp), ranks=ranks, steps=steps)
        written = time.perf_counter() - t0
        size_in = sum(p.stat().st_size for p in rec.iterdir())
        out = Path(tmp) / "report.html"
        took = {}
        for name, extra in (("text", []), ("html", ["--html", str(out)])):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "tui.cli", "report", *extra, str(rec)], cwd=ROOT,
                                  capture_output=True, text=True)
            took[name] = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)
        print(f"{ranks} ranks x {steps} steps: recordings {size_in / 1e6:.1f} MB (written in {written:.0f} s); "
              f"report (text) {took['text']:.1f} s, report --html {took['html']:.1f} s wall; "
              f"HTML {out.stat().st_size / 1e6:.2f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="RANKSxSTEPS (default: 1x100000 and 1024x1000)")
    args = parser.parse_args()
    for case in args.case or ["1x100000", "1024x1000"]:
        ranks, steps = (int(x) for x in case.split("x"))
        run(ranks, steps)


if __name__ == "__main__":
    main()
