"""CUDA completion poller: wake-ups per second, and the host-lead error they buy.

Every poller wake-up takes the GIL from the training thread to ask CUDA events whether
they are done. The job is SIMULATED (tests/sim/simulated_cuda.py: one stream on the
host's clock, events complete when the stream reaches them): each step records the step
timer's four events around ``gpu_ms`` of kernels, and the host runs at most ``ahead``
steps in front of the device (as a job that reads an older step's loss does), or is
slower than the device (starved). No GPU is involved: the figures are the poller's
schedule, not driver costs.

"before" is the previous schedule (poll every 5 ms while anything is pending, every
50 ms otherwise; no wake-up on new work), kept here as ``FixedPoller``; "after" is
``probe.gpu.cuda.Poller`` with the step timer's completion estimate. Rounds alternate
before/after in one run. Lead error = lead the timer reports − true lead (the simulated
event's device time − the host time the step ended).

    python bench/bench_poller.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # for tests.sim

from probe.gpu.cuda import Poller, StepTimer  # noqa: E402
from tests.sim.simulated_cuda import SimulatedCuda  # noqa: E402


class FixedPoller(Poller):
    """The previous schedule, for comparison: 5 ms while busy, 50 ms while idle."""

    PERIOD = 0.005
    IDLE_PERIOD = 0.05

    def wake(self, after: float = 0.0) -> None:      # the previous poller had no wake-up
        pass

    def run(self) -> None:
        while not self.stop_event.is_set() and self.alive():
            busy = self.poll_once() is not None
            self.stop_event.wait(self.PERIOD if busy else self.IDLE_PERIOD)


class EveryStepTimer(StepTimer):
    """The previous step timer: a lead for every step."""

    TIME_EVERY = 0.0


def job(kind: str, seconds: float, gpu_ms: float, host_ms: float, ahead: int) -> dict[str, float]:
    cuda = SimulatedCuda()
    poller = (FixedPoller if kind == "before" else Poller)(alive=lambda: True)
    timer = (EveryStepTimer if kind == "before" else StepTimer)(cuda, poller=poller)
    collected: list[dict] = []
    truth: dict[int, tuple[float, float]] = {}    # step -> (host end, device time of its end event)
    t0 = time.perf_counter()
    step = 0
    while time.perf_counter() - t0 < seconds:
        if gpu_ms:
            timer.begin()
            cuda.run(gpu_ms * 0.3e-3)
            timer.forward_end()
            cuda.run(gpu_ms * 0.6e-3)
            timer.backward_end()
            cuda.run(gpu_ms * 0.1e-3)
            timed = timer.cur is not None
            timer.end(step)
            if timed:
                truth[step] = (timer.pending[-1].host_end, timer.pending[-1].events[3].device_t)
        step += 1
        while timer.results:
            collected.append(timer.results.popleft())
        if host_ms:
            time.sleep(host_ms / 1e3)
        behind = cuda.free_at - time.perf_counter() - ahead * gpu_ms / 1e3
        if behind > 0:
            time.sleep(behind)   # the host blocks on an older step's result
    elapsed = time.perf_counter() - t0
    cuda.synchronize()
    deadline = time.monotonic() + 2
    while timer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    wakeups = poller.wakeups
    poller.stop()
    errors, leads = [], []
    collected.extend(timer.results)
    for result in collected:
        if "lead" not in result:
            continue
        host_end, device_end = truth[result["gpu_step"]]
        true_lead = max(0.0, device_end - host_end)
        leads.append(true_lead)
        errors.append(result["lead"] - true_lead)
    return {"wakeups_per_s": wakeups / elapsed, "steps_per_s": step / elapsed, "leads_per_s": len(leads) / elapsed,
            "true_lead_ms": statistics.median(leads) * 1e3 if leads else float("nan"),
            "err_med_ms": statistics.median(errors) * 1e3 if errors else float("nan"),
            "err_max_ms": max(errors) * 1e3 if errors else float("nan")}


CASES = {   # name: (gpu ms per step, host ms per step, steps the host may run ahead)
    "GPU-bound, 50 ms steps, host 2 steps ahead": (50.0, 1.0, 2),
    "GPU-bound, 10 ms steps, host 1 step ahead": (10.0, 1.0, 1),
    "starved: 2 ms kernels, 10 ms host": (2.0, 10.0, 1),
    "no device work (eval, checkpoint)": (0.0, 10.0, 0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| case | poller | wake-ups/s (median of rounds) | steps/s | leads/s | true lead ms | "
          "lead error median ms | lead error max ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (gpu_ms, host_ms, ahead) in CASES.items():
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for kind in ("before", "after"):     # interleaved: the machine's load hits both alike
                runs[kind].append(job(kind, args.seconds, gpu_ms, host_ms, ahead))
        for kind, results in runs.items():
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            print(f"| {name} | {kind} | {med['wakeups_per_s']:.0f} | {med['steps_per_s']:.1f} | "
                  f"{med['leads_per_s']:.1f} | {med['true_lead_ms']:.1f} | {med['err_med_ms']:.2f} | "
                  f"{med['err_max_ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
