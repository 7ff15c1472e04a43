"""Inject and detach many times into one running job (``perfmon inject`` / ``detach``).

One bare run of ``tests/integration/scripts/inject_target.py`` gives the final loss; then one
run of the same script pauses every ``--segment`` steps, and each cycle injects at one pause,
lets it train a segment, reports (``perfmon report PID --json``: the steps the probe saw) and
detaches at the next. Printed: each cycle's inject / detach wall time and steps seen, then
whether the loss is bit-identical and what the target found left of perfmon at its end
(threads, fds, hooks, wrapped functions, sys.path, sys.modules, perfmon objects).

    python bench/bench_inject.py [--cycles 20] [--segment 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = [sys.executable, str(ROOT / "tests" / "integration" / "scripts" / "inject_target.py")]


def perfmon(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    return out, time.perf_counter() - t0


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--segment", type=int, default=30, help="steps between two pauses")
    args = parser.parse_args()
    steps = args.segment * (2 * args.cycles + 1)
    bare = subprocess.run([*TARGET, "--steps", str(steps)], capture_output=True, text=True, check=True)
    bare_loss = json.loads(bare.stdout.splitlines()[-1])["loss"]
    pauses = ",".join(str(args.segment * k) for k in range(1, 2 * args.cycles + 1))
    job = subprocess.Popen([*TARGET, "--steps", str(steps), "--pause-at", pauses],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def pause() -> int:
        return json.loads(job.stdout.readline())["pause"]

    def go() -> None:
        job.stdin.write("go\n")
        job.stdin.flush()

    seen, inject_s, detach_s, failures, rss_mib = [], [], [], [], []
    try:
        for cycle in range(args.cycles):
            pause()
            t0 = time.perf_counter()
            inject = subprocess.Popen([sys.executable, "-m", "tui.cli", "inject", str(job.pid), "--timeout", "60"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            inject.stderr.readline()      # hooks in place: let the job step so that the probe starts
            go()
            out, err = inject.communicate(timeout=120)
            inject_s.append(time.perf_counter() - t0)
            if inject.returncode != 0:
                failures.append(f"cycle {cycle} inject: {err.strip()}")
                break
            pause()
            report, _ = perfmon("report", str(job.pid), "--json", "--seconds", "0.5")
            seen.append(json.loads(report.stdout)["ranks"][0]["steps"] if report.returncode == 0 else None)
            detach, seconds = perfmon("detach", str(job.pid))
            detach_s.append(seconds)
            if detach.returncode != 0:
                failures.append(f"cycle {cycle} detach: {detach.stderr.strip()}")
                break
            rss_mib.append(round(_rss_kb(job.pid) / 1024, 1))     # paused, just detached
            go()
        end = json.loads(job.communicate(timeout=120)[0].splitlines()[-1])
    finally:
        job.kill()
    residue = end["residue"]
    modules = residue.pop("modules", None)
    added = sorted(set(modules["after"]) - set(modules["before"])) if modules else []
    objects = residue.pop("perfmon_objects", {"after": []})["after"]
    code = residue.pop("perfmon_code", {"after": []})["after"]    # modules, functions, classes alive
    print(f"cycles: {len(seen)}, segment {args.segment} steps; failures: {failures or 'none'}")
    print(f"steps seen per cycle: {seen}")
    print(f"inject (to socket up) median {statistics.median(inject_s):.2f} s, max {max(inject_s):.2f} s; "
          f"detach median {statistics.median(detach_s):.2f} s, max {max(detach_s):.2f} s")
    print(f"final loss {end['loss']} vs bare {bare_loss}: {'bit-identical' if end['loss'] == bare_loss else 'DIFFERS'}")
    print(f"left in the target: {residue or 'nothing'} (threads, fds, hooks, functions, sys.path, meta_path)")
    print(f"modules added: {added}; perfmon objects alive: {sorted(set(objects))} x{len(objects)}")
    print(f"perfmon's modules, functions and classes alive: {len(code)}: {sorted(set(code))}")
    print(f"resident memory: {end['rss_kb'][0] / 1024:.1f} MiB before the first injection, "
          f"{end['rss_kb'][1] / 1024:.1f} MiB at the end; after each detach (MiB): {rss_mib}")
    return 0 if not failures and end["loss"] == bare_loss and not residue and not objects else 1


if __name__ == "__main__":
    sys.exit(main())
