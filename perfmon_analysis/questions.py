"""The flowchart's questions, one class each: what it asks, against which threshold and source,
how it is measured, and where the walk goes when it cannot be (docs/verdict.md §2).

The order follows the seed's triage (常见瓶颈识别流程): memory first, then "is the device
starved?", then the largest measured loss names the cause (data wait, exposed communication,
the loop's own work between steps, device idle with no other cause), then compute efficiency.
``QUESTIONS`` lists them in the order the verdict asks them; ``perfmon_analysis.verdict`` joins them into its chart.
"""

from __future__ import annotations

from perfmon_analysis import units
from perfmon_analysis.explain import peak_note, tensor_active
from perfmon_analysis.flowchart import (
    COMM_EXPOSED_MIN,
    DATA_WAIT_MIN,
    DEVICE_BUSY_MIN,
    FILL_MIN,
    HOST_AHEAD_SHARE,
    HOST_WAIT_MIN,
    LOADER_CPU_BOUND,
    LOADER_MAIN,
    LOADER_WORKERS,
    LOOP_PREP_MIN,
    LOSS_MIN,
    LOSS_THRESHOLD,
    MEMORY_PEAK_MAX,
    MFU_MIN,
    STRAGGLER_RATIO_MAX,
    SYNCS_PER_STEP_MIN,
    TENSOR_ACTIVE_MIN,
    Answer,
    Losses,
    Question,
)
from perfmon_analysis.health_verdict import leak
from perfmon_analysis.losses import LOOP, PAUSES, STEP_LOSSES, Loss, by_id
from perfmon_analysis.views import JobView

_pct = units.pct


def qualifying(losses: Losses) -> list[Loss]:
    """Step losses measured at or over their own threshold, largest first."""
    out = [x for x in losses if x.id in LOSS_THRESHOLD and x.share is not None and x.share >= LOSS_THRESHOLD[x.id]]
    return sorted(out, key=lambda x: -(x.share or 0.0))


def ask_largest(q: Question, loss: Loss, losses: Losses, reason: str = "") -> Answer:
    """Is this measured loss over its threshold and at least as large as every other one that is?"""
    fired = qualifying(losses)
    larger = next((x for x in fired if (x.share or 0.0) > (loss.share or 0.0)), None)
    if loss in fired and larger is not None:
        return q.judged(loss.share, False, reason, decided_by=f"{larger.label} {_pct(larger.share)} is larger")
    return q.judged(loss.share, loss in fired, reason)


class Memory(Question):
    """An OOM or allocator retries in the window decide it whatever the peak says; so does memory that
    grows every step (a leak, ``perfmon_analysis.memory_growth``), whatever the limit."""

    id = "memory"
    text = "OOM or allocator retries in the window, the window's peak over 90% of the limit, or memory growing " \
           "every step?"
    quantity = "memory_peak_frac"
    threshold = MEMORY_PEAK_MAX
    source = "PyTorch Profiler TB plugin memory rule (peak > 0.9 x device memory), over the window"
    yes, no, unmeasured = "memory", "device_busy", "device_busy"
    op = ">"
    short = "mem"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        m = view.metrics.memory
        if m.ooms:
            return self.judged(m.peak_frac, True, f"{m.ooms} out-of-memory error(s) in the window",
                               decided_by=f"{m.ooms} OOM")
        if m.alloc_retries_rising:
            return self.judged(m.peak_frac, True, f"allocator retries rising ({m.alloc_retries} so far)",
                               decided_by="allocator retries rising")
        growth = leak(view)
        grows = f"{growth.label} grows {units.nbytes(growth.per_step)} every step" if growth is not None else ""
        if m.peak_frac is None:
            if growth is not None:
                return self.judged(None, True, grows, decided_by=grows)
            return self.unasked("memory limit or peak not reported")
        if growth is not None and not self.fires(m.peak_frac):
            return self.judged(m.peak_frac, True, grows, decided_by=grows)
        return self.judged(m.peak_frac, self.fires(m.peak_frac), grows)


class DeviceBusy(Question):
    """The gate: starved when busy is low or one measured loss is 10% or more. "Not starved" needs
    busy measured: small or zero measured losses say nothing about the time they do not cover, so
    the gate cannot be passed unmeasured (the outcome is ``not_measured``). Busy is judged while the
    loop runs: the share of the iteration left after pauses between steps (over the run, ETTR's), so
    a job that pauses to checkpoint is not starved for it."""

    id = "device_busy"
    text = "Is the device starved: busy under 70% while the loop runs, or one measured loss 10% or more?"
    quantity = "device_busy"
    threshold = DEVICE_BUSY_MIN
    source = ("common triage: GPU utilization < 70% points at communication or data loading; one loss >= 10%: "
              "perfmon loss accounting (docs/verdict.md)")
    yes, no, unmeasured = "data_wait", "fill", "not_measured"
    op = "<"
    short = "busy"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        busy = in_loop(view.metrics.device_busy, by_id(losses)[PAUSES].share)
        known = [x for x in losses if x.id in STEP_LOSSES and x.share is not None]
        big = max(known, key=lambda x: x.share or 0.0, default=None)
        low = busy is not None and self.fires(busy)
        if big is not None and (big.share or 0.0) >= LOSS_MIN and not low:
            return self.judged(busy, True, f"{big.label} is {_pct(big.share)} of the step (>= {_pct(LOSS_MIN)})",
                               decided_by=f"a loss of {_pct(big.share)} ≥{_pct(LOSS_MIN)}")
        if busy is None:
            return self.unasked(f"{view.device_type.upper()} busy not measured ({busy_missing(view)})")
        paused = busy != view.metrics.device_busy
        return self.judged(busy, low, view.metrics.device_busy_source or "",
                           "busy while the loop runs (pauses between steps out)" if paused else "")


def in_loop(busy: float | None, pauses: float | None) -> float | None:
    """A share of the whole as a share of the loop's time: pauses between steps taken out."""
    if busy is None or pauses is None or pauses >= 1.0:
        return busy
    return min(1.0, busy / (1.0 - pauses))


def busy_missing(view: JobView) -> str:
    """Why a device's busy share is unknown, in the probe's words where it gave any: each rank whose
    busy is not measured, with NVML's reason (a rank without it makes the job's busy unknown)."""
    unknown = view.metrics.device_busy_unknown
    if unknown:
        ranks = sorted(unknown, key=lambda r: int(r) if r.isdigit() else 0)
        return "; ".join(f"rank {r}: {unknown[r]}" for r in ranks)
    if view.device_type == "cuda":
        return view.device_status or "no GPU utilization samples for this job's GPU"
    return "no step timing yet"


class DataWait(Question):
    id = "data_wait"
    text = "Is waiting for the next batch the largest loss, at 5% or more of the step?"
    quantity = "data_wait_frac"
    threshold = DATA_WAIT_MIN
    source = "PyTorch Profiler TB plugin DataLoader rule (> 5% of step time)"
    yes, no, unmeasured = "loader_cpu", "comm_exposed", "comm_exposed"
    short = "data"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        d = by_id(losses)["data_wait"]
        if d.share is None:
            return self.unasked("loader wait not measured (wrap the loader: mon.loader(...))")
        return ask_largest(self, d, losses)


class LoaderCpu(Question):
    """Without workers the loading runs in the training process: its CPU share inside the data wait
    is the measure; with workers, their CPU per worker."""

    id = "loader_cpu"
    text = "Are the loader workers (or the main process) CPU-bound?"
    quantity = "loader_cpu"
    threshold = LOADER_CPU_BOUND
    source = "perfmon: I/O-bound workers sit near 0% CPU, CPU-bound ones >= 30% even on a contended host"
    yes, no, unmeasured = "data_preprocessing", "data_loading", "data_loading"
    short = "loader"
    decides_between = "CPU-bound preprocessing from slow I/O"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        m = view.metrics
        if m.loader_workers == 0 or (m.loader_workers is None and m.loader_cpu is None):
            if m.data_cpu_frac is not None:
                return self.judged(m.data_cpu_frac, self.fires(m.data_cpu_frac),
                                   "num_workers=0: main-process CPU share of the data wait", LOADER_MAIN)
            return self.unasked("loader CPU not measured: cannot tell preprocessing from I/O", measure=LOADER_MAIN)
        if m.loader_cpu is None:
            return self.unasked("loader worker CPU not measured: cannot tell preprocessing from I/O",
                                measure=LOADER_WORKERS)
        return self.judged(m.loader_cpu, self.fires(m.loader_cpu), f"{m.loader_workers} workers", LOADER_WORKERS)


class CommExposed(Question):
    """Untimed in a job of several ranks (not at all, or DDP's own traffic while the script's other
    collectives are timed: ``comm_status``), communication cannot be ruled out as the time nothing
    measured explains when that time is the larger: the walk then stops at ``not_measured`` rather
    than blame it on the host (the outcomes after this question all claim it)."""

    id = "comm_exposed"
    text = "Is blocking on communication the largest loss, at 10% or more of the step?"
    quantity = "comm_exposed_frac"
    threshold = COMM_EXPOSED_MIN
    source = "PyTorch Profiler TB plugin communication rule (> 10%)"
    yes, no, unmeasured = "worker_slow", "loop", "loop"      # straggler_verdict's questions, then Straggler
    short = "comm"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        c = by_id(losses)["comm_exposed"]
        idle = by_id(losses)["device_idle"]
        several = view.world_size > 1 or len(view.ranks) > 1
        unexplained = idle.share is not None and idle.share >= LOSS_MIN and idle.share > (c.share or 0.0)
        if c.share is None:
            if view.metrics.comm_frac is not None:
                return self.unasked(f"communication takes {_pct(view.metrics.comm_frac)} of the step but its "
                                    "exposed part is not measured (NCCL: PERFMON_NCCL_TIMING=1)")
            reason = view.comm_status or "collectives not measured (mon.watch(model=ddp_model) measures them)"
            return self.unasked(reason, otherwise="not_measured" if several and unexplained else None)
        if view.comm_status is not None and several and unexplained:
            return self.unasked(f"{view.comm_status} (the {_pct(c.share)} timed is the other collectives)",
                                otherwise="not_measured")
        return ask_largest(self, c, losses, "estimated" if view.metrics.comm_estimated else "")


class Straggler(Question):
    id = "straggler"
    text = "Is one rank slower than the rest (fastest/slowest < 0.7)?"
    quantity = "compute_ratio"
    threshold = STRAGGLER_RATIO_MAX
    source = "NVIDIA Resiliency Extension relative straggler score 0.7; HTA late-arrival straggler"
    yes, no, unmeasured = "load_imbalance", "communication", "communication"
    op = "<"
    unit = "ratio"
    short = "balance"
    decides_between = "a slow rank from slow communication"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        m = view.metrics
        if view.layout.stages > 1:
            return self.unasked("pipeline stages do different work by design: their compute is not compared",
                                applies=False)
        if m.compute_ratio is None:
            if view.world_size <= 1 and len(view.ranks) <= 1:
                return self.unasked("one rank: there is no peer to wait for", applies=False)
            return self.unasked("needs compute time of two or more ranks")
        if m.straggler_by == "arrival":
            return self.judged(m.compute_ratio, True,
                               f"compute is even, but rank {view.straggler_rank} reaches the collective last "
                               f"(arrival ratio {units.ratio(m.arrival_ratio)})",
                               decided_by=f"rank {view.straggler_rank} arrives last")
        return self.judged(m.compute_ratio, self.fires(m.compute_ratio))


class LoopWork(Question):
    """Time between steps that recurs on every step (``perfmon_analysis.pauses``) is the loop's own
    cost, judged as any other loss; the occasional pauses are ETTR's."""

    id = "loop"
    text = "Is the loop's own work between steps the largest loss, at 10% or more of the step?"
    quantity = "loop_frac"
    threshold = LOSS_MIN
    source = "perfmon loss accounting (docs/verdict.md, Between steps)"
    yes, no, unmeasured = "loop_waiting", "syncs", "syncs"
    short = "loop"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        loop = by_id(losses)[LOOP]
        if loop.share is None:
            return self.unasked(loop.source)
        return ask_largest(self, loop, losses)


class LoopWaiting(Question):
    id = "loop_waiting"
    text = "The loop's work between steps: is the training thread off CPU (waiting) for most of it?"
    quantity = "loop_wait_frac"
    threshold = HOST_WAIT_MIN
    source = ("perfmon: the training thread's CPU clock over the gaps (zero-code), else between-step stack samples "
              "(off CPU = under half the wall time); most is the majority")
    yes, no, unmeasured = "host_wait", "loop_feeds", "loop_work"
    short = "wait"
    decides_between = "a wait (a lock, a service, a sleep) from work between steps"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        frac = view.metrics.loop_wait_frac
        if frac is None:
            return self.unasked("neither the thread's CPU time between steps nor stack samples there")
        return self.judged(frac, self.fires(frac), "the training thread's time off CPU between steps")


class LoopFeeds(Question):
    id = "loop_feeds"
    text = "Is the busy work between steps preparing the next step's input (before the step's lines in the loop)?"
    quantity = "loop_prep_frac"
    threshold = LOOP_PREP_MIN
    source = ("perfmon: busy between-step stack samples taken in the loop before the lines it runs its step from "
              "(probe.where.LoopLines)")
    yes, no, unmeasured = "data_preprocessing", "loop_work", "loop_work"
    short = "feeds"
    decides_between = "preparing the next batch from other work between steps"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        frac = view.metrics.loop_prep_frac
        if frac is None:
            return self.unasked("no busy stack samples between steps say where in the loop they are")
        return self.judged(frac, self.fires(frac), "busy between-step samples before the step's lines")


class Syncs(Question):
    id = "syncs"
    text = "The device idles with no other measured cause: does every step force a host-device sync?"
    quantity = "syncs_per_step"
    threshold = SYNCS_PER_STEP_MIN
    source = "synchronous device-to-host copies in the model code (.item(), .cpu()) idle the GPU"
    yes, no, unmeasured = "host_sync", "host_waiting", "host_waiting"
    unit = "count"
    short = "syncs"
    decides_between = "host-device syncs from launch overhead or an unmeasured loss"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        """A sync costs the time it leaves the device idle: syncs count only with the device idle in
        time (busy, never SM fill) for 10% of the step or more; one that never idles it costs nothing."""
        if view.device_type != "cuda":
            return self.unasked("CPU job: there is no host-device sync to find", applies=False)
        s = view.metrics.syncs_per_step
        if s is None:
            return self.unasked("syncs not counted (opt-in: watch(syncs=True) or PERFMON_SYNCS=1)")
        idle = by_id(losses)["device_idle"].share
        if idle is None:
            return self.unasked("device idle in time not measured: the time syncs cost cannot be told")
        if self.fires(s) and idle < LOSS_MIN:
            return self.judged(s, False, f"the device idles only {_pct(idle)} of the step: the syncs cost little",
                               decided_by=f"device idle {_pct(idle)} < {_pct(LOSS_MIN)}")
        return self.judged(s, self.fires(s))


class HostWaiting(Question):
    id = "host_waiting"
    text = "The host thread: is it off CPU (waiting) for most of the unexplained time?"
    quantity = "host_wait_frac"
    threshold = HOST_WAIT_MIN
    source = ("perfmon: in-step stack samples with the thread's CPU clock (off CPU = under half the wall time); "
              "a CPU job's unexplained loss is off-CPU time by definition")
    yes, no, unmeasured = "host_wait", "host_ahead", "host_ahead"
    short = "wait"
    decides_between = "a host that waits (I/O, a lock, a service) from launch overhead"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        if view.device_type != "cuda":
            if by_id(losses)["device_idle"].share is None:
                return self.unasked("the training thread's CPU time is not reported")
            return self.judged(1.0, self.fires(1.0), "CPU job: the unexplained loss is the training thread's time "
                                                     "off CPU")
        ahead = view.metrics.host_queued_whole_frac
        if ahead is not None and ahead >= HOST_AHEAD_SHARE:
            return self.unasked("the host keeps each step queued ahead of the device: whether it waits does not "
                                "idle the device", applies=False)
        frac = view.metrics.host_wait_frac
        if frac is None:
            return self.unasked("no stack samples of the training thread in steps")
        n = (view.where.waiting + view.where.busy) if view.where is not None else 0
        return self.judged(frac, self.fires(frac), f"{n} stack samples")


class HostAhead(Question):
    """The host is blamed only with evidence: the device idles in time (this question is reached on the
    device-idle branch) and the host's lead is too short to hide it. A host that finished queueing most
    steps before the device began them (the probe asks each timed step's first event as the host ends
    it) kept a step of work queued: its idle then comes from something else (another stream, a
    collective nobody timed, time outside the steps), which is not measured. Without timed steps the
    host is not measured either, never guessed."""

    id = "host_ahead"
    text = "Is the host a step or more ahead of the device (most steps queued whole before the device begins them)?"
    quantity = "host_queued_whole_frac"
    threshold = HOST_AHEAD_SHARE
    source = ("PyTorch CUDA semantics: a device runs its queue in order, back to back; a host that queues each "
              "step whole before the device starts it cannot be what idles it")
    yes, no, unmeasured = "not_measured", "host_overhead", "not_measured"
    unit = "ratio"
    short = "lead"
    decides_between = "launch overhead from an idle the host does not cause"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        if view.device_type != "cuda":
            return self.unasked("CPU job: no device queue for the host to keep ahead of", applies=False)
        ahead = view.metrics.host_queued_whole_frac
        if ahead is None:
            return self.unasked("host lead not measured: no step of the window timed with CUDA events")
        lead = units.seconds(view.metrics.host_lead_s)
        step = units.seconds(view.metrics.device_time_median_s)
        return self.judged(ahead, self.fires(ahead), f"{_pct(ahead)} of the timed steps queued whole; lead {lead} "
                                                     f"over a {step} step on the device")


class Fill(Question):
    """Not starved: busy in time, but do the running kernels use the device? SM activity over busy is
    the share of SMs a running kernel occupies (docs/verdict.md, "Busy and fill"). It comes before MFU
    because it measures one cause of a low MFU directly, from the hardware, and names its fixes; MFU
    needs a FLOP count and a peak, and is often unknown. Without GPM (before Hopper) it is not
    measured, and the walk asks about MFU."""

    id = "fill"
    text = "Busy in time: do the running kernels fill the device (SM activity over busy 80% or more)?"
    quantity = "device_fill"
    threshold = FILL_MIN
    source = ("NVIDIA DCGM user guide, profiling metrics: SM activity of 0.8 or more is necessary for effective "
              "use of the GPU, under 0.5 likely ineffective")
    yes, no, unmeasured = "low_fill", "mfu", "mfu"
    op = "<"
    short = "fill"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        if view.device_type != "cuda":
            return self.unasked("CPU job: no SMs to fill", applies=False)
        fill = view.metrics.device_fill
        if fill is None:
            return self.unasked("SM activity not measured (GPM: Hopper and newer)")
        return self.judged(fill, self.fires(fill), f"SM activity {_pct(view.metrics.sm_active)} over busy "
                                                   f"{_pct(view.metrics.device_busy)}")


class Mfu(Question):
    """MFU unknown ends at healthy: the device is busy and no measured loss is large; efficiency is
    then listed as not measured."""

    id = "mfu"
    text = "Not starved: is MFU under 30% (or are the tensor cores idle)?"
    quantity = "mfu"
    threshold = MFU_MIN
    source = "Llama 3 (arXiv 2407.21783) 38-43% MFU, PaLM (arXiv 2204.02311) 46%"
    yes, no, unmeasured = "compute_efficiency", "healthy", "healthy"
    op = "<"
    short = "MFU"

    def ask(self, view: JobView, losses: Losses) -> Answer:
        mfu = view.metrics.mfu
        if mfu is not None:
            return self.judged(mfu, self.fires(mfu), peak_note(view))
        tensor = tensor_active(view) if view.device_type == "cuda" else None
        if tensor is not None:
            return self.judged(tensor, tensor < TENSOR_ACTIVE_MIN, "tensor-core activity (MFU unknown)",
                               "tensor-core activity", TENSOR_ACTIVE_MIN)
        if view.device_type != "cuda":
            return self.unasked("CPU job: no peak FLOP/s known (set PERFMON_PEAK_TFLOPS for an MFU)")
        return self.unasked("MFU unknown: pass flops= to mon.step() or mon.watch(model=...)")


QUESTIONS: tuple[Question, ...] = (Memory(), DeviceBusy(), DataWait(), LoaderCpu(), CommExposed(), Straggler(),
                                   LoopWork(), LoopWaiting(), LoopFeeds(), Syncs(), HostWaiting(), HostAhead(), Fill(),
                                   Mfu())
