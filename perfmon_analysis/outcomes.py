"""The flowchart's outcomes, one class each: the label, the pane that holds its evidence, the loss
it names, and the headline and fixes it gives, which quote the job's own numbers (docs/verdict.md).

Pure: everything comes from the ``JobView`` and the verdict's own loss accounting and answers
(passed in, never recomputed, so a headline quotes the shares the verdict judged); every number
goes through ``perfmon_analysis.units``. ``OUTCOMES`` lists them; ``perfmon_analysis.verdict``
joins them with the questions into its chart.
"""

from __future__ import annotations

from typing import Any

from perfmon_analysis import units
from perfmon_analysis.advice import PARALLELISM, comm_fixes, comm_what, exposed_split, loader_fixes, parallelism
from perfmon_analysis.buffers import MIN_STEPS
from perfmon_analysis.explain import gaps_lost, peak_note, tensor_active, where_text, who
from perfmon_analysis.flowchart import FILL_CRIT, LATE_GAP_MIN, LOADER_MAIN, Answer, Explained, Losses, Outcome, round4
from perfmon_analysis.health_verdict import Crashed, memory_explained, memory_severity
from perfmon_analysis.loop_outcomes import (
    STEP,
    LoopWorkOutcome,
    gil_fixes,
    gil_text,
    holder,
    loop_prep,
    loop_wait,
    via_loop,
)
from perfmon_analysis.losses import LOOP, by_id
from perfmon_analysis.questions import busy_missing
from perfmon_analysis.views import JobView, RankView, WhereLine

Answers = dict[str, Answer]
_pct = units.pct


def _step(m: Any) -> str:
    """The window's median step; unknown when no step was timed (never '0ms')."""
    return units.seconds(m.step_time_median_s or None)


def _idle_text(view: JobView, losses: Losses) -> str:
    idle = by_id(losses)["device_idle"].share
    if view.device_type != "cuda":
        if idle is None:
            return "no measured loss explains the step's time"
        return f"the training thread is off CPU {_pct(idle)} of each step with no other measured cause"
    lead = view.metrics.host_lead_s
    # the starvation signal: a host that keeps only a few ms ahead of the GPU cannot keep it fed
    ahead = f" (the host runs {units.seconds(lead)} ahead of it)" if lead is not None else ""
    return f"the device idles {_pct(idle)} of each step with no other measured cause{ahead}"


def _top_waiting(view: JobView) -> WhereLine | None:
    return next(iter(view.where.top(1, "waiting")), None) if view.where is not None else None


def _rank_row(ranks: list[RankView], rank: int) -> RankView | None:
    return next((r for r in ranks if r.rank == rank), None)


_STUCK_FIXES = {
    "collective": ["the culprit's stack (key s in the TUI, verdict.stuck.where in the JSON) is where it left "
                   "the collective order the other ranks follow",
                   "a rank that skips or adds a collective (a data-dependent branch, an uneven last batch) "
                   "hangs the others: make every rank call the same collectives in the same order",
                   "the flight recorders (key s; verdict.stuck.calls) say whether each rank enqueued the call: one "
                   "that never did stalled on the host, one that did waits on its device or the network"],
    "data": ["a worker idle at 0% CPU waits on I/O or a lock (network filesystem, a dead connection): "
             "check what it reads; DataLoader(timeout=...) turns a hang into an error",
             "a worker that is gone died (OOM killer, a crash in native code): see dmesg and its stderr"],
    "between_steps": ["its stack shows the call it is in: checkpoint writes to network storage and evaluation "
                      "loops are the usual ones; time them with mon.event('checkpoint', seconds=...)"],
    "in_step": ["its stack shows the call it is in: a custom op, a lock, or a host loop that never ends"],
    "unresponsive": ["a process that sends nothing holds the GIL in native code or is stopped (SIGSTOP, "
                     "swapped out): `py-spy dump --native --pid PID` shows its native stack",
                     "the other ranks' stacks show what they wait for"],
}


class Stuck(Outcome):
    id = "stuck"
    label = "STUCK"
    pane = "ranks"

    def applies(self, view: JobView) -> bool:
        """Before everything, warming up included: a stopped job has no steps to judge."""
        return view.stuck is not None

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        return "crit"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        stuck = view.stuck
        if stuck is None:
            return "Stuck", [], {}
        return f"Stuck: {stuck.headline}", list(_STUCK_FIXES.get(stuck.kind, [])), {"stuck": stuck.as_json()}


class WarmingUp(Outcome):
    id = "warming_up"
    label = "WARMING UP"

    def applies(self, view: JobView) -> bool:
        return view.warming_up

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        return "info"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        steps = max((r.window_steps for r in view.ranks), default=0)
        return f"Warming up: {steps} of {MIN_STEPS} steps seen, no verdict yet", [], {"steps": view.metrics.steps}


class MemoryFull(Outcome):
    """Full, out of memory, or growing every step: the words and fixes are ``health_verdict``'s."""

    id = "memory"
    label = "MEMORY"
    pane = "memory"

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        return memory_severity(view)

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        return memory_explained(view)


class DataLoading(Outcome):
    id = "data_loading"
    label = "DATA LOADING"
    pane = "data"
    loss = "data_wait"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        fixes = loader_fixes(view, preprocessing=False)
        cpu = answers["loader_cpu"]
        said = "" if not cpu.asked else "; not CPU-bound" if cpu.measure == LOADER_MAIN else \
            f"; not CPU-bound (workers at {_pct(cpu.value)} CPU)"
        return f"Data loading: {_pct(m.data_wait_frac)} of each step waits for the loader{said}", fixes, {}


class DataPreprocessing(Outcome):
    id = "data_preprocessing"
    label = "DATA PREPROCESSING"
    pane = "data"
    loss = "data_wait"

    def named(self, answers: Answers) -> str | None:
        return LOOP if via_loop(answers) else self.loss

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        if via_loop(answers):        # the batch built on the training thread between steps
            return loop_prep(view, losses)
        m = view.metrics
        w = m.loader_workers
        cpu = answers["loader_cpu"]
        workers = f"its {w} workers" if w else "its workers"
        who = (f"the main process spends {_pct(cpu.value)} of the wait on CPU (num_workers=0)"
               if cpu.measure == LOADER_MAIN
               else f"its worker is CPU-bound ({_pct(cpu.value)} of a core)" if w == 1
               else f"{workers} are CPU-bound ({_pct(cpu.value)} of a core each)")
        fixes = loader_fixes(view, preprocessing=True)
        return f"Data preprocessing: {_pct(m.data_wait_frac)} of each step waits for the loader; {who}", fixes, {}


class Communication(Outcome):
    id = "communication"
    label = "COMMUNICATION"
    pane = "comm"
    loss = "comm_exposed"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        op = (m.comm_op or "collective").replace("_", "-")
        bw = f" at {units.bandwidth(m.busbw)} busbw" if m.busbw else ""
        est = " (estimated)" if m.comm_estimated else ""
        fixes = comm_fixes(view, op)
        if m.samples_per_s is not None and m.step_time_median_s:
            per_step = m.samples_per_s * m.step_time_median_s / max(1, view.world_size)
            fixes.append(f"larger per-rank batch (about {units.count(per_step)} samples per rank per step now)")
        fixes.append("check the interconnect: busbw should approach the link's bandwidth")
        used = parallelism(view.comm_ops)
        by = f" ({', '.join(PARALLELISM[p] for p in used)})" if used else ""
        split = {s.op: round4(s.share) for s in exposed_split(view)}
        return (f"Communication{by}: {comm_what(view, op)} of the step{bw}{est}", fixes,
                {"busbw": round4(m.busbw), "comm_op": m.comm_op, **({"comm_exposed_by_op": split} if split else {})})


class LoadImbalance(Outcome):
    id = "load_imbalance"
    label = "LOAD IMBALANCE"
    pane = "ranks"
    loss = "comm_exposed"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        op = (m.comm_op or "collective").replace("_", "-")
        row = _rank_row(view.ranks, straggler) if straggler is not None else None
        if m.straggler_by == "arrival":
            own = _pct(row.comm_exposed_frac if row else None)
            gap = f"; it loses {_pct(m.gap_frac)} between steps" if m.gap_frac and m.gap_frac >= LATE_GAP_MIN else ""
            headline = (f"Load imbalance: {who(view, straggler)} arrives last at {op}; the others wait "
                        f"{_pct(m.comm_exposed_frac)} of the step for it (it waits {own}){gap}")
            fixes = [f"find what delays rank {straggler} outside its compute: work between steps, logging, "
                     "checkpointing on that rank only, its data path",
                     f"check rank {straggler}'s host for other processes or throttling"]
            return headline, fixes, {"straggler_rank": straggler, "arrival_ratio": round4(m.arrival_ratio)}
        fast = min((r for r in view.ranks if r.compute_s is not None), key=lambda r: r.compute_s or 0.0, default=None)
        slow = units.seconds(row.compute_s if row else None)
        quick = units.seconds(fast.compute_s if fast else None)
        headline = (f"Load imbalance: {who(view, straggler)} computes {slow}/step vs {quick} on rank "
                    f"{fast.rank if fast else units.NA}; the others wait {_pct(m.comm_exposed_frac)} in {op}")
        fixes = [f"find what makes rank {straggler} slower: its data shard, sequence lengths, host load",
                 "balance work per rank (bucket samples by length, even shards)",
                 f"check rank {straggler}'s host for other processes or throttling"]
        return headline, fixes, {"straggler_rank": straggler, "compute_ratio": round4(m.compute_ratio)}


class HostSync(Outcome):
    id = "host_sync"
    label = "HOST-DEVICE SYNC"
    pane = "timeline"
    loss = "device_idle"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        site = next((s.sync_site for t in view.traces.values() for s in reversed(t.steps) if s.sync_site), None)
        where = f" (most at {site})" if site else ""
        return (f"Host-device sync: {_idle_text(view, losses)}; "
                f"{units.number(m.syncs_per_step, 2)} syncs per step{where}",
                ["remove .item() / .cpu() / print(tensor) from the step; log every N steps",
                 "keep metrics on the device and read them asynchronously (non_blocking=True into pinned memory)"],
                {"syncs_per_step": round4(m.syncs_per_step)})


_WAIT_FIXES = ["move the call off the training thread (a background thread or process feeding a queue), so the "
               "step never waits for it",
               "overlap it: start the request before forward and collect its result after backward "
               "(concurrent.futures)",
               "batch it: one call every N steps instead of one per step; cache what it returns",
               "a lock or GIL contention with a background thread shows as waiting too: find the other holder"]


class HostWait(Outcome):
    """The host thread waits off CPU inside the step, or in the loop's own work between steps: the top
    waiting line of that span says where, and a thread seen holding the GIL meanwhile is named."""

    id = "host_wait"
    label = "HOST WAIT"
    pane = "timeline"
    loss = "device_idle"

    def named(self, answers: Answers) -> str | None:
        return LOOP if via_loop(answers) else self.loss

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        if via_loop(answers):
            return loop_wait(view, losses)
        idle = by_id(losses)["device_idle"].share
        line = _top_waiting(view)
        held = holder(view, STEP)
        if view.device_type != "cuda":
            off = f"off CPU {_pct(idle)} of the step, no other measured cause"
        else:
            off = (f"device idle {_pct(idle)} with no other cause; the host is off CPU in "
                   f"{_pct(view.metrics.host_wait_frac)} of its in-step samples")
        fixes = list(_WAIT_FIXES)
        extra: dict[str, Any] = {}
        gil = ""
        if held is not None:
            fixes = gil_fixes(held) + fixes
            extra["gil_holder"] = held.as_json()
            gil = f"; {gil_text(held)}"
        if line is None:
            return (f"Host wait: {_idle_text(view, losses)}; no stack samples say where{gil}",
                    fixes + ["py-spy dump of the training process during a step shows the call it waits in"], extra)
        fixes.insert(0, f"start with {where_text(line)}: {_pct(line.share)} ± {_pct(line.err)} of each step waits "
                        "there (key u: every line)")
        extra["where_top"] = f"{line.file}:{line.line}"
        return f"Host wait: {_pct(line.share)} of each step waiting in {where_text(line)} ({off}){gil}", fixes, extra


class HostOverhead(Outcome):
    """The device idles in time and the host's lead is too short to hide it (docs/verdict.md, the host
    rule): the host launches each step while the device runs it, so launch and Python overhead leave
    the device waiting. On a CPU job, the unexplained loss the thread's clock cannot tell apart."""

    id = "host_overhead"
    label = "HOST OVERHEAD"
    pane = "timeline"
    loss = "device_idle"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        ahead = answers.get("host_ahead")
        fixes = ["larger batch per step", "torch.compile or CUDA graphs to cut launch overhead",
                 "fuse small ops; avoid Python work per micro-op"]
        if view.device_type == "cuda" and ahead is not None and ahead.asked:
            idle = by_id(losses)["device_idle"].share
            return (f"Host overhead: the device idles {_pct(idle)} of each step with no other measured cause (busy "
                    f"{_pct(m.device_busy)} of a {_step(m)} step); the host stays only {units.seconds(m.host_lead_s)} "
                    f"ahead of {units.seconds(m.device_time_median_s)} of device work a step, too little to keep it "
                    "fed", fixes, {})
        return f"Host overhead: {_idle_text(view, losses)} (busy {_pct(m.device_busy)} of a {_step(m)} step)", fixes, {}


_FILL_FIXES = ["a larger micro-batch per step: fewer, larger kernels that occupy every SM (gradient accumulation "
               "keeps the global batch)",
               "fuse small ops into larger kernels: torch.compile (and fused optimizers, flash attention)",
               "CUDA graphs (torch.compile(mode='reduce-overhead') or torch.cuda.graphs) for steps of many small "
               "kernels",
               "`perfmon capture` (key c) lists the kernels by device time: the largest ones with few blocks or low "
               "occupancy (registers, shared memory per block) are where the SMs sit empty"]


class LowFill(Outcome):
    """Busy in time, poorly filled: a kernel runs most of the step, but the running kernels occupy few
    of the SMs (small kernels, a small batch, unfused ops, low occupancy). Measured by GPM (Hopper and
    newer): SM activity over busy, against NVIDIA's line for effective use (docs/verdict.md). It comes
    before compute_efficiency (MFU < 30%) in the chart: it is one cause of a low MFU, measured directly,
    with fixes of its own; a warning under 50%, which NVIDIA calls likely ineffective, else information
    as compute_efficiency is."""

    id = "low_fill"
    label = "LOW SM FILL"
    pane = "device"

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        fill = view.metrics.device_fill
        return "warn" if fill is not None and fill < FILL_CRIT else "info"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        mfu = f"; MFU {_pct(m.mfu)} {peak_note(view)}".rstrip() if m.mfu is not None else ""
        headline = (f"Low SM fill: a kernel runs {_pct(m.device_busy)} of each {_step(m)} step, but the running "
                    f"kernels occupy {_pct(m.device_fill)} of the SMs (SM activity {_pct(m.sm_active)}){mfu}: "
                    "small kernels, a small batch, unfused ops or low occupancy")
        return headline, list(_FILL_FIXES), {"device_fill": round4(m.device_fill), "sm_active": round4(m.sm_active)}


class ComputeEfficiency(Outcome):
    id = "compute_efficiency"
    label = "COMPUTE EFFICIENCY"
    pane = "device"

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        return "info"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        if m.mfu is not None:
            what = f"MFU {_pct(m.mfu)}" + (f" {peak_note(view)}" if m.peak_flops else "")
            extra: dict[str, Any] = {"mfu": round4(m.mfu)}
        else:
            what = f"tensor cores {_pct(tensor_active(view))} active"
            extra = {}
        fixes = ["bf16 autocast (torch.autocast('cuda', dtype=torch.bfloat16))",
                 "torch.backends.cuda.matmul.allow_tf32 = True for fp32 matmuls",
                 "fused kernels (fused AdamW, flash attention) and torch.compile", "larger batch per step"]
        cited = view.profile.citation() if view.profile is not None else None
        if cited is None:
            fixes.append("`perfmon profile` (key m) times each module for a few steps: which one wastes the device")
            return f"Compute efficiency: device busy {_pct(m.device_busy)} but {what}", fixes, extra
        extra["profile_marked"] = cited
        return (f"Compute efficiency: device busy {_pct(m.device_busy)} but {what}; slowest for its FLOPs: {cited}",
                [f"start with {view.profile.marked.name} ({view.profile.marked.type}): "  # type: ignore[union-attr]
                 "batch its small ops into large matmuls, or fuse them (torch.compile)", *fixes], extra)


_GAP_FIXES = ["time the pauses with mon.event('checkpoint', seconds=...) (or 'eval'); key u lists the lines sampled "
              "between steps, where the pauses run",
              "checkpoints: save asynchronously (torch.distributed.checkpoint.async_save) or less often",
              "evaluation: run it less often or on fewer batches, or in another process on its own device"]


class Healthy(Outcome):
    """Healthy steps and loop; the pauses between steps (ETTR, over the run) are not a loss the walk names,
    so the headline says them too."""

    id = "healthy"
    label = "HEALTHY"

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        """Healthy steps, but a tenth of the run lost to pauses between them is not ok."""
        return "ok" if gaps_lost(view.metrics) is None else "warn"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        judged = answers["device_busy"]      # busy while the loop runs: pauses are said apart
        busy = f"{view.device_type.upper()} busy {_pct(judged.value if judged.asked else m.device_busy)}"
        note = f" {peak_note(view)}" if m.peak_flops else ""
        extra = f", MFU {_pct(m.mfu)}{note}" if m.mfu is not None else ""
        gaps = gaps_lost(m)
        if gaps is None:
            return f"Healthy: {busy} of a {_step(m)} step, no measured loss of 10% or more{extra}", [], {}
        return (f"Healthy steps ({busy} of a {_step(m)} step, no measured loss of 10% or more{extra}), "
                f"but {gaps}"), list(_GAP_FIXES), {}


_BUSY_FIXES = {
    "cuda": ["GPU busy is the share of time a kernel ran, from NVML utilization: `nvidia-smi -q -d UTILIZATION` "
             "as this user shows whether the driver reports it; MIG slices and many vGPUs report no "
             "utilization",
             "if NVML cannot be loaded (no libnvidia-ml in the container), mount the driver's libraries "
             "(NVIDIA container toolkit) so the probe can read the GPU",
             "meanwhile, the losses that are measured still speak: a data wait or exposed communication of 10% "
             "or more would have been named"],
}

_COMM_FIXES = [
    "time it: run the job under `perfmon run` (zero-code mode times DDP's gradient all-reduce) or call "
    "mon.watch(model=ddp_model) in the script",
    "without a restart: `perfmon capture JOB --steps 3` records a torch.profiler trace of each rank, whose "
    "collectives show how long each step waits in them",
    "the ranks pane's compute times show whether one rank is slower and the others wait for it",
]


class NotMeasured(Outcome):
    """A question the walk could not pass: the device's busy share is unknown and no measured loss
    is large, or communication of a job of several ranks is not timed while much of each step has
    no measured cause. Says what is missing and what the measured numbers still say; never a
    healthy verdict."""

    id = "not_measured"
    label = "NOT MEASURED"
    pane = "device"

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        return "warn"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: Answers) -> Explained:
        m = view.metrics
        known = [x for x in losses if x.id != "step_gaps" and x.share is not None]
        said = ", ".join(f"{x.label} {_pct(x.share)}" for x in known) or "no loss measured"
        mfu = f"; MFU {_pct(m.mfu)}" if m.mfu is not None else ""
        comm = answers.get("comm_exposed")
        if comm is not None and comm.otherwise == "not_measured" and answers["device_busy"].asked:
            idle = by_id(losses)["device_idle"]
            ranks = max(view.world_size, len(view.ranks))
            headline = (f"Not measured: communication is not timed in this {ranks}-rank job ({comm.reason}), and "
                        f"{idle.label} is {_pct(idle.share)} of each step, which may be waiting in collectives; "
                        f"measured: {said}, {_step(m)} steps{mfu}")
            return headline, list(_COMM_FIXES), {}
        if answers["device_busy"].asked and by_id(losses)["device_idle"].share is not None:
            return _idle_not_explained(view, losses, answers, said, mfu)
        why = busy_missing(view)
        headline = (f"Not measured: {view.device_type.upper()} busy is unknown ({why}), so whether the device is "
                    f"starved cannot be told; measured: {said}, {_step(m)} steps{mfu}")
        return headline, list(_BUSY_FIXES.get(view.device_type, [])), {}


_IDLE_FIXES = ["`perfmon capture` (key c) records a torch.profiler trace of a few steps: its device rows show what "
               "the device waits for between kernels",
               "work on another CUDA stream (a side stream, a collective's stream) is not on the stream the step's "
               "events time: waits on it show as idle here",
               "time the collectives (mon.watch(model=ddp_model), PERFMON_NCCL_TIMING=1) so a wait for peers is "
               "measured as such"]


def _idle_not_explained(view: JobView, losses: Losses, answers: Answers, said: str, mfu: str) -> Explained:
    """The device idles in time and no measured cause explains it, while the host is not shown to be the
    cause: its lead says it keeps each step queued, or its lead is not measured. What is known is said,
    and what is not; never "the CPU cannot feed it"."""
    m = view.metrics
    idle = by_id(losses)["device_idle"].share
    ahead = answers.get("host_ahead")
    if ahead is not None and ahead.answer == "yes":
        known = (f"the host finished queueing {_pct(m.host_queued_whole_frac)} of the timed steps before the device "
                 f"began them ({units.seconds(m.host_lead_s)} ahead of a {units.seconds(m.device_time_median_s)} "
                 "step), so "
                 "launches are not what idles it; what it waits for (another stream, a collective nobody timed, "
                 "time outside the steps) is not measured")
        fixes = list(_IDLE_FIXES)
    else:       # the lead is not measured: the undecided questions say what cannot be told
        known = ""
        fixes = ["turn on CUDA step timing: mon.watch(model=...) on the model on the GPU (it times about ten steps a "
                 "second; watch(gpu_events=False) turns it off)", *_IDLE_FIXES]
    headline = (f"Not measured: the device idles {_pct(idle)} of each step with no measured cause"
                f"{'; ' + known if known else ''}; measured: {said}, {_step(m)} steps{mfu}")
    return headline, fixes, {}


OUTCOMES: tuple[Outcome, ...] = (Crashed(), Stuck(), WarmingUp(), MemoryFull(), DataLoading(), DataPreprocessing(),
                                 Communication(), LoadImbalance(), HostSync(), HostWait(), HostOverhead(),
                                 LoopWorkOutcome(), LowFill(), ComputeEfficiency(), Healthy(), NotMeasured())
