"""Is "what fixing it buys" honest? Pairs of real CPU jobs: one with a known loss, its twin with the fix.

For each pair the slow job's report predicts ``speedup_bound`` = 1 / (1 − share) for the loss the
fix removes; the twin's throughput over the slow job's (samples/s over the report window) is the
speedup the fix bought. The twins run one after the other for the same time, in alternating order
over ``--repeats`` runs: side by side on a machine with fewer free cores than busy threads, the
slow twin's waits would hand its core to the fixed one and flatter the fix.

Pairs (the loss, then the fix):

* ``loader_workers``  one DataLoader worker sleeping on slow storage reads (~30% data wait) ->
                      two workers.
* ``prefetch``        one worker whose every 5th read is slow (3× a step), the rest fast, with
                      ``prefetch_factor=1`` (the slow reads stall the step) -> ``prefetch_factor=8``.
* ``per_step_sync``   a blocking metrics push each step, ~30% of it, in the training thread (on a
                      GPU: a ``.item()``) -> pushed from a background thread.
* ``checkpoint``      a checkpoint every 10 steps: a state copy, then a slow write (3 steps) in the
                      training thread, between steps -> the write in a background thread.
* ``no_sync``         2-rank gloo DDP, 4 micro-batches per optimizer step, gradients all-reduced
                      after each -> ``no_sync()`` for the first 3 (100 steps each, not ``--seconds``).

    python bench/bench_gains.py [--pairs NAME,...] [--seconds 10] [--repeats 3] [--parallel]

``--parallel`` runs the pairs at once (each pair's runs still one after the other): for a machine
with a core free for every busy thread, ten or more.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
PY = sys.executable

# pair -> (the loss the fix removes, extra launcher args)
PAIRS = {
    "loader_workers": "data_wait",
    "prefetch": "data_wait",
    "per_step_sync": "device_idle",
    "checkpoint": "step_gaps",
    "no_sync": "comm_exposed",
}
WIDTH, BATCH = 512, 256
DDP_STEPS = 100       # the no_sync twins' length, in optimizer steps


# -- the jobs ------------------------------------------------------------------------------------
def _model():
    import torch
    from torch import nn
    torch.set_num_threads(1)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))


def _compute_s(model) -> float:
    """Median forward+backward time of one batch on this machine now: the losses are planted from it."""
    import torch
    from torch import nn
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


class Storage:
    """Batches behind simulated storage latency (a sleep: no CPU), ``read_s(i)`` for batch i."""

    def __init__(self, read_s) -> None:
        import torch
        self.x, self.y, self.read_s = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1), read_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        time.sleep(self.read_s(i))
        return self.x.clone(), self.y.clone()


class _Every:
    """Picklable read latency: ``slow`` for every ``period``-th batch, else ``fast``."""

    def __init__(self, fast: float, slow: float, period: int) -> None:
        self.fast, self.slow, self.period = fast, slow, period

    def __call__(self, i: int) -> float:
        return self.slow if i % self.period == 0 else self.fast


def job(pair: str, fixed: bool, seconds: float) -> None:
    """One twin: trains until ``seconds`` pass, with perfmon's API (recorded via PERFMON_RECORD)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    import probe

    model = _model()
    ddp = None
    if pair == "no_sync":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = ddp = DDP(_model_wide())
    compute = _compute_s(model) if pair != "no_sync" else 0.0
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    mon = probe.start(job=f"gains-{pair}-{'fixed' if fixed else 'slow'}")
    if ddp is not None:
        mon.watch(model=ddp)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
    if pair in ("loader_workers", "prefetch"):
        if pair == "loader_workers":
            read, workers, prefetch = _Every(compute / 0.7, compute / 0.7, 1), 2 if fixed else 1, 2
        else:
            read, workers, prefetch = _Every(0.2 * compute, 3 * compute, 5), 1, 8 if fixed else 1
        batches = mon.loader(DataLoader(Storage(read), batch_size=None, num_workers=workers,
                                        persistent_workers=True, prefetch_factor=prefetch))
    else:
        batches = mon.loader(iter(lambda: (x, y), None))
    pushes: queue.Queue = queue.Queue()
    if pair in ("per_step_sync", "checkpoint") and fixed:
        threading.Thread(target=lambda: [time.sleep(s) for s in iter(pushes.get, None)], daemon=True).start()
    stop = time.monotonic() + seconds
    for i, (xb, yb) in enumerate(batches):
        # ranks stop together, at a step count (one rank leaving by its clock strands the other in its
        # all-reduce); the other jobs run for the time given
        if (i >= DDP_STEPS) if ddp is not None else time.monotonic() >= stop:
            break
        with mon.step(samples=BATCH):
            if ddp is not None:
                _accumulate(ddp, xb, yb, fixed)
            else:
                loss = nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
            opt.step()
            if pair == "per_step_sync":
                push = compute * 0.3 / 0.7          # ~30% of the step: the metrics call blocks this long
                pushes.put(push) if fixed else time.sleep(push)
        if pair == "checkpoint" and i % 10 == 9:
            state = {k: v.clone() for k, v in model.state_dict().items()}      # the copy stays in the step loop
            write = 3 * compute
            pushes.put(write) if fixed else time.sleep(write)
            del state
    mon.close()
    if ddp is not None:
        import torch.distributed as dist
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)


def _model_wide():
    from torch import nn
    return nn.Sequential(nn.Linear(WIDTH, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1))


def _accumulate(ddp, xb, yb, fixed: bool, micro: int = 4) -> None:
    """Four micro-batches of 16; the fix skips the gradient all-reduce on all but the last."""
    import contextlib

    from torch import nn
    ddp.zero_grad()
    for j in range(micro):
        sync = contextlib.nullcontext() if not fixed or j == micro - 1 else ddp.no_sync()
        with sync:
            nn.functional.mse_loss(ddp(xb[16 * j:16 * (j + 1)]), yb[16 * j:16 * (j + 1)]).backward()


# -- the driver ----------------------------------------------------------------------------------
def _launch(pair: str, fixed: bool, seconds: float, rec: Path) -> subprocess.Popen:
    env = {**os.environ, "PERFMON_RECORD": str(rec), "PYTHONPATH": str(HERE.parents[1])}
    args = [str(HERE), "job", pair, "--seconds", str(seconds)] + (["--fixed"] if fixed else [])
    if pair == "no_sync":
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    else:
        cmd = [PY, *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _report(rec: Path) -> dict:
    out = subprocess.run([PY, "-m", "tui.cli", "report", str(rec), "--json"], capture_output=True, text=True,
                         timeout=120, cwd=HERE.parents[1])
    if out.returncode != 0:
        raise SystemExit(f"report of {rec} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def run_pair(pair: str, seconds: float, tmp: Path, fixed_first: bool) -> dict:
    """The twins one after the other; the slow one's predicted bound and the speedup the fix measured."""
    recs = {fixed: tmp / f"{pair}-{'fixed' if fixed else 'slow'}-{time.monotonic_ns()}" for fixed in (False, True)}
    for fixed in ((True, False) if fixed_first else (False, True)):
        p = _launch(pair, fixed, seconds, recs[fixed])
        _, err = p.communicate(timeout=seconds + 300)
        if p.returncode != 0:
            raise SystemExit(f"{pair} ({'fixed' if fixed else 'slow'}) failed: {err[-2000:]}")
    slow, fixed = _report(recs[False]), _report(recs[True])
    loss = PAIRS[pair]
    gain = next(g for g in slow["verdict"]["gains"] if g["loss"] == loss)
    contention = [r["metrics"].get("cpu_contention_frac") for r in (slow, fixed)]
    return {"pair": pair, "loss": loss, "verdict": slow["verdict"]["bottleneck"], "share": gain["share"],
            "bound": gain["speedup_bound"], "fixed_share": next(g["share"] for g in fixed["verdict"]["gains"]
                                                                if g["loss"] == loss),
            "measured": fixed["metrics"]["samples_per_s"] / slow["metrics"]["samples_per_s"],
            "contention": max((c for c in contention if c is not None), default=None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    j = sub.add_parser("job")
    j.add_argument("pair", choices=list(PAIRS))
    j.add_argument("--fixed", action="store_true")
    j.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", action="store_true")
    args = ap.parse_args()
    if args.cmd == "job":
        job(args.pair, args.fixed, args.seconds)
        return
    print("| pair | loss (verdict) | share | predicted bound | measured speedup (each run) | measured / bound "
          "| noise | within bound + noise | share left after the fix | CPU contention |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    pairs = args.pairs.split(",")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(pairs) if args.parallel else 1) as pool:
        def runs_of(pair: str) -> list[dict]:
            return [run_pair(pair, args.seconds, Path(tmp), i % 2 == 1) for i in range(args.repeats)]

        for pair, runs in zip(pairs, pool.map(runs_of, pairs)):
            med = {k: statistics.median(r[k] for r in runs) for k in ("share", "bound", "measured", "fixed_share")}
            each = ", ".join(f"{r['measured']:.2f}" for r in runs)
            ratios = ", ".join(f"{r['measured'] / r['bound']:.2f}" for r in runs)
            cont = max((r["contention"] for r in runs if r["contention"] is not None), default=None)
            measured = [r["measured"] for r in runs]
            noise = (max(measured) - min(measured)) / med["measured"]     # run-to-run spread of the speedup
            within = "yes" if med["measured"] <= med["bound"] * (1 + noise) else "NO"
            print(f"| {pair} | {runs[0]['loss']} ({runs[0]['verdict']}) | {med['share']:.0%} | {med['bound']:.2f}× "
                  f"| {med['measured']:.2f}× ({each}) | {ratios} | ±{noise:.0%} | {within} "
                  f"| {med['fixed_share']:.0%} | {'n/a' if cont is None else f'{cont:.0%}'} |", flush=True)


if __name__ == "__main__":
    main()
