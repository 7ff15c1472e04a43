"""What FLOP counting costs the training loop: step time with ``watch(count_flops=True)`` (the
default, and what ``perfmon run`` does) against ``count_flops=False``, and against no probe.

FLOPs are counted once, for a meta replica of the model on a background thread; the training
thread's own module calls must stay on their fast path. Each mode runs in its own process,
interleaved A/B/C over ``--rounds`` so machine noise hits all three alike; the figure is the
median step time over the steady-state steps (after the count finished) and over the first
``--early`` steps (while it may still run), as ratios to the bare loop.

    python bench/bench_flops.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = textwrap.dedent('''
    import json, sys, time, torch, torch.nn as nn
    torch.set_num_threads(1); torch.manual_seed(0)
    mode, steps = sys.argv[1], int(sys.argv[2])
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.GELU())], nn.Linear(512, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 512), torch.randn(64, 1)
    if mode != "bare":
        import probe
        mon = probe.start(job="flops-bench", serve=False)
        mon.watch(model=model, optimizer=opt, count_flops=(mode == "count"))
    times, flops_seen = [], None
    for i in range(steps):
        t0 = time.perf_counter()
        if mode == "bare":
            loss = nn.functional.mse_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        else:
            with mon.step(samples=64):
                loss = nn.functional.mse_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        times.append(time.perf_counter() - t0)
    if mode != "bare":
        mon.close()
    print(json.dumps(times))
''')


def run(mode: str, steps: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", JOB, mode, str(steps)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--early", type=int, default=20)
    args = parser.parse_args()
    modes = ("bare", "no-count", "count")
    early: dict[str, list[float]] = {m: [] for m in modes}
    steady: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            times = run(mode, args.steps)
            early[mode].append(statistics.median(times[1:args.early + 1]))
            steady[mode].append(statistics.median(times[args.steps // 2:]))
    base_e, base_s = statistics.median(early["bare"]), statistics.median(steady["bare"])
    print(f"{'mode':<10} {'early ms':>9} {'x bare':>7} {'steady ms':>10} {'x bare':>7}")
    for mode in modes:
        e, s = statistics.median(early[mode]), statistics.median(steady[mode])
        print(f"{mode:<10} {e * 1e3:>9.2f} {e / base_e:>7.3f} {s * 1e3:>10.2f} {s / base_s:>7.3f}")


if __name__ == "__main__":
    main()
