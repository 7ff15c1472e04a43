"""The checks. Each plants a known truth in a short workload, measures that truth with a clock the
probe does not use (the training thread's CPU clock and run-queue wait, the workload's own
``perf_counter`` around what it planted, the host clock across a device synchronize, the kernel
lengths it chose), and compares it with what perfmon reports. A check passes only when the two
agree, so a broken measurement fails it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from perfmon_analysis import units
from tui.commands.doctor.table import Check
from tui.commands.doctor.workloads import STEPS, WINDOW, Mlp, one_thread, run_job, run_queue_wait

# The probe counts a step's time as CPU busy unless a measured cause took it. The kernel's clocks say
# how much of it the training thread wanted a CPU: on one (its CPU clock) or waiting for one on a
# loaded machine (its run-queue wait; where the kernel does not expose it, the CPU clock alone is a
# lower bound). A loop that does not compute is near 0 on both.
CPU_AGREE = 0.25
SHARE_TOL = 0.05          # a planted loss, read back as a share of the step
ETTR_TOL = 0.05
PAUSE_EVERY = 5           # the between-steps check's checkpoint cadence: a pause, not the loop's own work


def _leaf(view: Any) -> str:
    from perfmon_analysis.verdict import evaluate

    return evaluate(view).bottleneck


def _share(view: Any, loss_id: str) -> float | None:
    from perfmon_analysis.losses import account

    return next((loss.share for loss in account(view.metrics, view.device_type) if loss.id == loss_id), None)


def _pts(x: float) -> str:
    return f"{x * 100:.0f} pts"


_pct = units.pct


def _num(x: float | None) -> str:
    return units.NA if x is None else f"{x:.2f}"


def _ms(x: float | None) -> str:
    return units.NA if x is None else f"{x * 1000:.1f} ms"


def _watched(mon: Any, mlp: Mlp) -> float:
    """Watch the model, warm it up, and return one step's compute time by the loop's own clock."""
    mon.watch(model=mlp.model, optimizer=mlp.opt)
    mlp.work()
    t0 = time.perf_counter()
    mlp.work()
    return time.perf_counter() - t0


# -- on every machine ------------------------------------------------------------------------------
def compute_bound(work: Callable[[], None] | None = None) -> Check:
    """A loop of training steps: healthy, with a CPU busy the training thread's CPU clock confirms.
    ``work`` replaces the step's compute (a test plants a loop that only sleeps)."""
    mlp = Mlp()
    step_work = work or mlp.work
    start: list[Any] = []
    end: list[Any] = []

    def clocks() -> tuple[float, float | None, float]:
        return time.thread_time(), run_queue_wait(), time.perf_counter()

    def body(mon: Any) -> None:
        _watched(mon, mlp)
        for i in range(STEPS):
            if i == STEPS - WINDOW:
                start.extend(clocks())
            with mon.step(samples=len(mlp.x)):
                step_work()
        end.extend(clocks())

    with one_thread():
        view = run_job("compute", body)
    wall = end[2] - start[2]
    on_cpu = (end[0] - start[0]) / wall
    queued = (end[1] - start[1]) / wall if start[1] is not None and end[1] is not None else None
    wanted = on_cpu + (queued or 0.0)
    busy, leaf = view.metrics.device_busy, _leaf(view)
    ok = leaf == "healthy" and busy is not None and abs(busy - wanted) <= CPU_AGREE
    return Check("compute-bound loop", f"healthy, CPU busy = thread on/waiting for CPU ± {_pts(CPU_AGREE)}",
                 f"{leaf}, CPU busy {_pct(busy)}; training thread on CPU {_pct(on_cpu)}, "
                 f"waiting for a core {_pct(queued)}", ok)


def loader_wait(name: str, ratio: float) -> Check:
    """The same loop fed by a loader that sleeps ``ratio`` times the step's compute: a data wait of
    the share the loader's own clock planted, named by the verdict as data loading."""
    mlp = Mlp()
    slept: list[float] = []
    spans: list[float] = []

    def body(mon: Any) -> None:
        wait = ratio * _watched(mon, mlp)

        def batches() -> Iterator[Any]:
            while True:
                t0 = time.perf_counter()
                time.sleep(wait)              # a loader waiting on slow storage: no CPU used
                slept.append(time.perf_counter() - t0)
                yield mlp.x

        it = iter(mon.loader(batches()))
        for _ in range(STEPS):
            t0 = time.perf_counter()          # loader wait + step: the probe's active step time
            xb = next(it)
            with mon.step(samples=len(xb)):
                mlp.work()
            spans.append(time.perf_counter() - t0)

    with one_thread():
        view = run_job(name.replace(" ", "-"), body)
    planted = sum(slept[-WINDOW:]) / sum(spans[-WINDOW:])
    share, leaf = _share(view, "data_wait"), _leaf(view)
    ok = leaf == "data_loading" and share is not None and abs(share - planted) <= SHARE_TOL
    return Check(name, f"data_loading, data wait {_pct(planted)} ± {_pts(SHARE_TOL)}",
                 f"{leaf}, data wait {_pct(share)}", ok)


def wait_in_step(ratio: float = 0.6) -> Check:
    """The loop with an unhooked wait inside each step (a call to a slow service, standing in for an
    RPC, a lock, a file read): ``ratio`` times the step's compute asleep between forward and the
    rest. The off-CPU loss must be the share the loop's own clock planted, named ``host_wait``.

    On a busy machine the thread also waits for a core, in its compute and as it wakes. perfmon
    splits that off as CPU contention, estimated from its stack sampler's run-queue reads, whose
    records (``probe.where.INTERVAL_S``) are longer than this whole job: the split is shown, and the
    sum is judged, against the sleeps plus the run-queue wait the kernel counted in the same steps."""
    mlp = Mlp()
    slept: list[float] = []
    queued: list[float] = []
    spans: list[float] = []

    def body(mon: Any) -> None:
        wait = ratio * _watched(mon, mlp)
        for _ in range(STEPS):
            t0, q0 = time.perf_counter(), run_queue_wait()
            with mon.step(samples=len(mlp.x)):
                mlp.work()
                t1, w0 = time.perf_counter(), run_queue_wait()
                time.sleep(wait)              # the service answers: no CPU used, nothing perfmon hooks
                w1 = run_queue_wait()
                woke = w1 - w0 if w0 is not None and w1 is not None else 0.0
                slept.append(time.perf_counter() - t1 - woke)
            spans.append(time.perf_counter() - t0)
            q1 = run_queue_wait()
            queued.append(q1 - q0 if q0 is not None and q1 is not None else 0.0)

    with one_thread():
        view = run_job("wait-in-step", body)
    whole = sum(spans[-WINDOW:])
    planted, runq = sum(slept[-WINDOW:]) / whole, sum(queued[-WINDOW:]) / whole
    share, leaf = _share(view, "device_idle"), _leaf(view)
    contention = view.metrics.cpu_contention_frac or 0.0
    ok = leaf == "host_wait" and share is not None and abs(share + contention - planted - runq) <= SHARE_TOL
    return Check("unhooked wait in each step",
                 f"host_wait, off CPU {_pct(planted)} + waiting for a core {_pct(runq)} ± {_pts(SHARE_TOL)}",
                 f"{leaf}, off CPU {_pct(share)} + waiting for a core {_pct(contention)}", ok)


def between_steps(ratio: float = 1.0) -> Check:
    """The loop with ``ratio`` times its steps' compute spent in pauses between them (a checkpoint every
    ``PAUSE_EVERY`` steps): ETTR is the share of wall time in the loop by the loop's own clock. A pause
    between every two steps would be the loop's own work, a loss of its own, not ETTR's."""
    mlp = Mlp()
    inside: list[float] = []
    span: list[float] = []

    def body(mon: Any) -> None:
        pause = ratio * PAUSE_EVERY * _watched(mon, mlp)
        first = time.perf_counter()
        for i in range(STEPS):
            t0 = time.perf_counter()
            with mon.step(samples=len(mlp.x)):
                mlp.work()
            inside.append(time.perf_counter() - t0)
            if i < STEPS - 1 and i % PAUSE_EVERY == PAUSE_EVERY - 1:
                time.sleep(pause)
        span.append(time.perf_counter() - first)

    with one_thread():
        view = run_job("between-steps", body)
    planted = sum(inside) / span[0]
    ettr = view.metrics.ettr
    ok = ettr is not None and abs(ettr - planted) <= ETTR_TOL
    return Check("time between steps", f"ETTR {_num(planted)} ± {ETTR_TOL}", f"ETTR {_num(ettr)}", ok)


def cpu_checks() -> list[Check]:
    """The workloads every machine can run."""
    return [compute_bound(), loader_wait("known wait in each step", 0.5),
            loader_wait("loop starved by its loader", 3.0), wait_in_step(), between_steps()]


# -- on a GPU host ------------------------------------------------------------------------------------
def cpu_job_on_gpu_host() -> Check:
    """The CPU model on a machine with a GPU: the job's device is where its tensors live, so the
    verdict is a CPU one (busy from step accounting), not an idle GPU's."""
    mlp = Mlp()

    def body(mon: Any) -> None:
        _watched(mon, mlp)
        for _ in range(STEPS):
            with mon.step(samples=len(mlp.x)):
                mlp.work()

    with one_thread():
        view = run_job("cpu-job-on-gpu-host", body)
    leaf = _leaf(view)
    return Check("CPU-only job on the GPU host", "cpu job: healthy",
                 f"{view.device_type} job: {leaf} (busy from {view.metrics.device_busy_source})",
                 view.device_type == "cpu" and leaf == "healthy")
