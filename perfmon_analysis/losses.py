"""Loss accounting: where the iteration's wall time goes, one measured share per cause.

Every share is of one whole, the iteration: from one step's start to the next's (docs/verdict.md,
"One whole"). It splits into compute and losses: waiting for the next batch, waiting for peers
(exposed communication), device idle that no other measured loss explains (on a GPU the device
with nothing to do: host syncs, launch overhead, a host that waits; on a CPU the training thread
off CPU: a sleep, a lock, a remote call, a file read inside the step), the loop's own work between
steps (tokenizing, logging, a lock after the optimizer step: ``loop``), and pauses between steps
(checkpoints, evaluation, stalls: ``step_gaps``, over the run, 1 − ETTR; ``perfmon_analysis.pauses``).
Each share is measured from a named source or is unknown (``share is None`` with the reason), never
0: a zero would say "nothing lost" about time nobody measured. The measured shares never add up to
more than the whole; when they do, ``overrun`` says so (a problem, never hidden by clamping). Pure:
``account(metrics, device_type)`` depends on its inputs only; the verdict accounts once and hands the
result to everything that quotes a share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.views import Metrics

__all__ = ["LOOP", "Loss", "PAUSES", "STEP_LOSSES", "account", "by_id", "overrun"]

LOOP = "loop"              # the loop's own work between steps
# The losses of the iteration's loop, in the order the verdict's flowchart asks about them (pauses, over
# the run, are ETTR's).
STEP_LOSSES = ("data_wait", "comm_exposed", LOOP, "device_idle")
PAUSES = "step_gaps"       # pauses between steps (ETTR)
WINDOW = "window"
RUN = "run"
# Shares are rounded and sampled: measured losses may add up past the whole by this much before it is
# a problem of the accounting (two losses counting the same time) rather than noise.
OVERRUN_TOLERANCE = 0.02


@dataclass(frozen=True)
class Loss:
    """One cause of lost time. ``share`` is a fraction of the iteration (the one whole); ``span``: what
    it is measured over, the window (``WINDOW``) or the whole run (``RUN``: pauses recur less often
    than a window holds)."""

    id: str
    label: str
    share: float | None
    source: str          # how it was measured, or why it was not
    span: str = WINDOW

    @property
    def known(self) -> bool:
        return self.share is not None

    def as_json(self) -> dict[str, Any]:
        key = "source" if self.known else "why_unknown"
        return {"id": self.id, "label": self.label, "share": None if self.share is None else round(self.share, 4),
                key: self.source, "span": self.span}


def account(m: Metrics, device_type: str, comm_status: str | None = None) -> tuple[Loss, ...]:
    """The window's losses: data wait, exposed communication, device idle, gaps between steps.
    ``comm_status``: the probe's reason why communication is not timed (``JobView.comm_status``)."""
    data = Loss("data_wait", "data wait", m.data_wait_frac,
                "time blocked waiting for the next batch" if m.data_wait_frac is not None
                else "no batch fetch timed (mon.loader(...), a DataLoader under perfmon run or a trainer "
                     "callback) or no step timing yet")
    if m.comm_exposed_frac is not None:
        how = "estimated from collective times" if m.comm_estimated else "time blocked in collectives"
        if comm_status is not None:
            how += f", not all of them: {comm_status}"
        comm = Loss("comm_exposed", "exposed communication", m.comm_exposed_frac, how)
    elif m.comm_frac is not None:
        comm = Loss("comm_exposed", "exposed communication", None,
                    f"collectives take {units.pct(m.comm_frac)} of the step, the exposed part is not measured "
                    "(NCCL: PERFMON_NCCL_TIMING=1)")
    else:
        comm = Loss("comm_exposed", "exposed communication", None,
                    comm_status or "collectives not instrumented (mon.watch(model=ddp_model))")
    loop = Loss(LOOP, "loop work between steps", m.loop_frac,
                "time between steps that recurs every step (the window's median gap), from step boundaries"
                if m.loop_frac is not None else "no step timing yet")
    pauses = Loss(PAUSES, "pauses between steps", m.pause_frac,
                  "occasional time between steps (checkpoints, evaluation, stalls) over the whole run: 1 - ETTR"
                  if m.pause_frac is not None else "no step timing yet", RUN)
    return data, comm, _device_idle(m, device_type, data, loop, pauses), loop, pauses


def overrun(losses: tuple[Loss, ...]) -> float | None:
    """How far the measured losses add up past the whole (their sum − 1), when that is more than
    ``OVERRUN_TOLERANCE``: two of them count the same time, a problem the report states; else None."""
    total = sum(x.share for x in losses if x.share is not None)
    return total - 1.0 if total > 1.0 + OVERRUN_TOLERANCE else None


def _device_idle(m: Metrics, device_type: str, data: Loss, loop: Loss, pauses: Loss) -> Loss:
    """GPU idle time the other measured losses do not explain: 1 − busy − data wait − time between steps,
    busy in time (a kernel running: NVML utilization or the steps' CUDA timeline), never SM activity,
    which also counts the SMs a running kernel leaves empty (that is fill, a question of its own).

    The GPU idles while the step waits for the next batch and between steps, so those shares
    are subtracted; what is left is the host failing to feed the device (syncs,
    launch overhead). Exposed communication is not subtracted: NCCL's kernels
    keep the device busy in NVML's sense while the step waits for peers. On a
    CPU job the CPU is the device: the loss is the step body's time the
    training thread spent off CPU that exposed communication does not explain
    (``off_cpu_frac``, from the thread's CPU clock); without that clock it is
    unknown and busy is what the measured losses leave.
    """
    if device_type != "cuda":
        if m.off_cpu_frac is not None:
            return Loss("device_idle", CPU_IDLE_LABEL, m.off_cpu_frac,
                        CPU_IDLE_SOURCE if m.cpu_contention_frac is None else CPU_IDLE_SOURCE_RUNQ)
        return Loss("device_idle", CPU_IDLE_LABEL, None,
                    "CPU job: the training thread's CPU time is not reported, so a wait inside the step cannot "
                    "be told from work (busy is the time not lost to a measured cause)")
    if m.device_busy is None or m.device_busy_source not in MEASURED_BUSY:
        unknown = "; ".join(f"rank {r}: {why}" for r, why in sorted((m.device_busy_unknown or {}).items()))
        return Loss("device_idle", "device idle, no other cause", None,
                    f"GPU busy in time not measured ({unknown or 'NVML utilization not readable'})")
    rest = 1.0 - m.device_busy - (data.share or 0.0) - (loop.share or 0.0) - (pauses.share or 0.0)
    label = "NVML utilization" if m.device_busy_source == "nvml_util" else "the steps' CUDA timeline"
    return Loss("device_idle", "device idle, no other cause", max(0.0, rest),
                f"1 - GPU busy ({label}) - data wait - time between steps")


CPU_IDLE_LABEL = "waiting, no measured cause"
CPU_IDLE_SOURCE = "training thread off CPU (thread CPU time)"
CPU_IDLE_SOURCE_RUNQ = "training thread off CPU, less the time it waited for a core (thread CPU time, scheduler)"

# What each ``Metrics.device_busy_source`` means (docs/verdict.md says the same). The GPU ones
# measure time with a kernel running, never the elapsed time between two CUDA events (which includes
# idle gaps) and never SM activity (which is fill: ``Metrics.device_fill``).
BUSY_SOURCES = {
    "nvml_util": "NVML utilization: the share of time any kernel ran",
    "cuda_timeline": "the steps' CUDA timeline: time the host kept each step's work queued ahead of the device "
                     "(a lower bound, used where it proves more than NVML utilization)",
    "thread_cpu": "CPU: the training thread's CPU time in the step",
    "step_accounting": "CPU: the step time not lost to a measured cause",
}
MEASURED_BUSY = {k: BUSY_SOURCES[k] for k in ("nvml_util", "cuda_timeline")}


def by_id(losses: tuple[Loss, ...]) -> dict[str, Loss]:
    return {x.id: x for x in losses}
