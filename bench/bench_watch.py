"""Main-thread cost per step of ``Probe.watch()`` (CPU; issue #3 budget: under 20 µs).

Two identical tiny models (Linear 8->8, SGD) run the same loop through the same probe:
one watched (forward/optimizer hooks, step begin/end hooks: phases, comm drain, FLOPs
lookup), one not (and without the step hooks). cost = (watched - plain) / steps in
CPU time of the training thread (``time.thread_time``: the machine is shared, wall
time would mostly measure the neighbours), the two interleaved in chunks and
repeated, median. The model is tiny so that its own compute (~100 µs) does not
drown the difference. Also reported: the DDP comm hook's cost per bucket (one gloo
rank in this process), which adds per bucket, not per step.

    python bench/bench_watch.py [--steps 20000] [--repeats 7]
    python bench/bench_watch.py --ab /tmp/perfmon-main [--rounds 6]   # against another tree (bench/ab.py)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

import torch

import probe


def loop(mon, model, opt, x, steps: int) -> float:
    data = range(steps)
    t0 = time.thread_time()
    for _ in mon.loader(data):
        with mon.step(samples=1):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return time.thread_time() - t0


def drain(mon) -> None:
    deadline = time.monotonic() + 10
    while mon._q and time.monotonic() < deadline:
        time.sleep(0.01)


def watch_cost(steps: int, repeats: int) -> list[float]:
    mon = probe.start(job="bench-watch", serve=False)
    torch.manual_seed(0)
    plain, watched = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=1e-3)
    opt_watched = torch.optim.SGD(watched.parameters(), lr=1e-3)
    x = torch.randn(2, 8)
    mon.watch(model=watched, optimizer=opt_watched)
    hooks = (mon._begin_hooks, mon._end_hooks)
    loop(mon, watched, opt_watched, x, 200)       # warm-up; FLOPs counted once in the background
    time.sleep(1.0)
    costs = []
    chunk = 1000
    for _ in range(repeats):
        base = with_watch = 0.0
        for _ in range(steps // chunk):
            mon._begin_hooks, mon._end_hooks = [], []
            base += loop(mon, plain, opt_plain, x, chunk)
            mon._begin_hooks, mon._end_hooks = hooks
            with_watch += loop(mon, watched, opt_watched, x, chunk)
        drain(mon)
        costs.append((with_watch - base) / (steps // chunk * chunk) * 1e6)
    mon.close()
    return costs


def ddp_hook_cost(steps: int, buckets: int) -> float:
    """µs per bucket of the DDP timing hook vs DDP's C++ default, one gloo rank."""
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        def make():
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(buckets)])
            return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005)
        default, timed = make(), make()
        mon = probe.start(job="bench-ddp", serve=False)
        mon.watch(model=timed)
        x = torch.randn(2, 16)

        def run(ddp) -> float:
            t0 = time.thread_time()
            for _ in range(steps):
                ddp(x).sum().backward()
            return time.thread_time() - t0

        run(default), run(timed)
        diffs = []
        for _ in range(5):
            diffs.append((run(timed) - run(default)) / (steps * buckets) * 1e6)
        mon.close()
        return statistics.median(diffs)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ab", metavar="OTHER_TREE", help="alternate rounds with another tree's probe (bench/ab.py)")
    ap.add_argument("--rounds", type=int, default=6, help="with --ab: rounds of each tree")
    ap.add_argument("--ab-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ab:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from ab import compare
        compare("bench/bench_watch.py", args.ab, args.rounds, ["--steps", str(args.steps), "--repeats", "1"])
        return
    os.environ.setdefault("PERFMON_DIR", tempfile.mkdtemp(prefix="pm-bench-"))
    os.chmod(os.environ["PERFMON_DIR"], 0o700)
    torch.set_num_threads(1)
    costs = watch_cost(args.steps, args.repeats)
    if args.ab_json:         # one round's figure for bench/ab.py
        import json
        print(json.dumps({"watch() µs/step (thread CPU)": statistics.median(costs)}))
        return
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cpus")
    print(f"watch() main-thread cost: median {statistics.median(costs):.2f} µs/step "
          f"(min {min(costs):.2f}, max {max(costs):.2f}; {args.steps} steps x {args.repeats})")
    per_bucket = ddp_hook_cost(steps=200, buckets=20)
    print(f"DDP timing hook vs DDP's C++ all-reduce: {per_bucket:.1f} µs per bucket (1 gloo rank)")


if __name__ == "__main__":
    main()
