"""torch.compile under perfmon, repeated: the issue's 10-line script, N times with the API and N under `perfmon run`.

Each run must exit 0, print the bare run's final loss to the last bit, and leave a
recording of exactly 120 steps. Prints one line per mode: runs passed / runs.

    python bench/bench_compile.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent('''
    import contextlib, sys, torch, torch.nn as nn
    torch.manual_seed(0)
    api = "--api" in sys.argv
    if api:
        import probe
        mon = probe.start(job="compile-bench")
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if api:
        mon.watch(model=model, optimizer=opt)
    cm = torch.compile(model)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for i in range(120):
        with mon.step() if api else contextlib.nullcontext():
            loss = ((cm(x) - y) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
    print("final", loss.item().hex())
''')


def steps_in(record: Path) -> int:
    out = subprocess.run([sys.executable, "-m", "tui.cli", "report", str(record), "--json"], capture_output=True,
                         text=True, cwd=ROOT)
    return json.loads(out.stdout)["metrics"]["steps"] if out.returncode == 0 else -1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="perfmon-compile-"))
    script = work / "c.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bare = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=work)
    expected = bare.stdout.split()[-1]
    for mode in ("api", "run"):
        ok = 0
        t0 = time.perf_counter()
        for i in range(args.runs):
            rec = work / f"{mode}{i}"
            if mode == "api":
                cmd = [sys.executable, str(script), "--api"]
                run_env = {**env, "PERFMON_RECORD": str(rec)}
            else:
                cmd = [sys.executable, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--",
                       sys.executable, str(script)]
                run_env = env
            proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env, cwd=work)
            loss = proc.stdout.split()[-1] if proc.stdout.split() else "?"
            if proc.returncode == 0 and loss == expected and steps_in(rec) == 120:
                ok += 1
            else:
                print(f"  {mode} run {i}: exit {proc.returncode}, loss {loss} (bare {expected})\n"
                      f"{proc.stderr[-2000:]}", file=sys.stderr)
        print(f"{mode}: {ok}/{args.runs} runs ran to the end with the bare run's loss"
              f" and 120 steps in the recording ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
