"""Run model + verdict speed for a 64-rank job: ingest cost per record and the cost of one
``view()`` + ``evaluate()`` when every rank has new steps (the TUI's worst case) and when
nothing changed. Prints results; targets: ingest O(1) (a few µs), view+verdict well under
250 ms so the TUI can re-evaluate several times a second."""

from __future__ import annotations

import sys
import time

from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.verdict import evaluate

RANKS = 64
T0 = 1_700_000_000.0


def step(rank: int, i: int, t: float) -> dict:
    return {"k": "step", "t": t + 0.1, "step": i, "start": t, "dur": 0.1, "gap": 0.0,
            "phases": {"data": 0.01, "forward": 0.03, "backward": 0.04, "optimizer": 0.01, "other": 0.01},
            "comm": {"seconds": 0.02, "exposed": 0.01, "bytes": 1 << 24, "ops": 4, "estimated": False},
            "samples": 32, "tokens": 32 * 512, "flops": 1e12, "syncs": 0}


def sample(t: float) -> dict:
    return {"k": "sample", "t": t, "host": {"cpu": 1.2, "rss": 1 << 31, "mem_limit": 1 << 36, "loader_workers": 4,
                                            "loader_cpu": 0.3},
            "gpus": [{"index": 0, "util": 91, "mem_used": 1 << 34, "mem_total": 80 << 30, "throttle": []}]}


def main() -> None:
    clock = time.process_time if "--cpu" in sys.argv else time.perf_counter   # --cpu: this process's CPU time
    model = RunModel()
    for r in range(RANKS):
        model.ingest(f"s{r}", {"k": "hello", "t": T0, "proto": [1, 0], "job": "bench", "rank": r, "world_size": RANKS,
                               "pid": 100 + r, "restart": 0, "host": "n", "device": {"type": "cuda",
                                                                                      "peak_flops": {"bf16": 1e15}}})
    n_steps = 2000
    records = [(f"s{r}", step(r, i, T0 + i * 0.1)) for i in range(n_steps) for r in range(RANKS)]
    t = clock()
    for stream, rec in records:
        model.ingest(stream, rec)
    ingest = (clock() - t) / len(records)
    for r in range(RANKS):
        model.ingest(f"s{r}", sample(T0 + n_steps * 0.1))

    times_changed = []
    for k in range(20):
        for r in range(RANKS):
            i = n_steps + k
            model.ingest(f"s{r}", step(r, i, T0 + i * 0.1))
        t = clock()
        view = model.view()
        evaluate(view)
        times_changed.append(clock() - t)
    times_same = []
    for _ in range(20):
        t = clock()
        evaluate(model.view())
        times_same.append(clock() - t)
    def med(xs):
        return sorted(xs)[len(xs) // 2]
    print(f"ranks={RANKS} steps/rank={n_steps}")
    print(f"ingest: {ingest * 1e6:.2f} us/record")
    print(f"view+evaluate, every rank changed: median {med(times_changed) * 1e3:.1f} ms, "
          f"max {max(times_changed) * 1e3:.1f} ms")
    print(f"view+evaluate, nothing changed:    median {med(times_same) * 1e3:.1f} ms, "
          f"max {max(times_same) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
