"""Synthetic wire records for run-model / verdict / report tests.

``Rank`` describes one rank's steady state (step time and how it splits);
``job(...)`` turns ranks into the records a probe would send and feeds them to
a ``RunModel``. Values are exact so thresholds can be probed at their edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.runmodel import RunModel
from tests.helpers import records as R

T0 = 1_700_000_000.0


@dataclass
class Rank:
    rank: int = 0
    steps: int = 30
    dur: float = 0.100             # step time (includes data and gap)
    data: float = 0.0              # loader wait per step
    gap: float = 0.0               # time between steps outside the loader, every step (the loop's own work)
    pause: float = 0.0             # a pause between steps (a checkpoint) of this many seconds ...
    pause_every: int = 0           # ... before every this many-th step (0: never), on top of ``gap``
    comm: float | None = None      # collective seconds per step (None: not measured)
    exposed: float | None = None   # blocked part of it (defaults to comm)
    syncs: float | None = None
    flops: float | None = None
    samples: float | None = 32
    tokens: float | None = None
    gpu_time: float | None = None  # device time of the step (CUDA events), on every step that has a lead
    lead: float | None = None      # how far the host finished ahead of the device (CUDA events)
    data_cpu: float | None = None
    cpu: float | None = None       # training thread CPU s per step (wire 1.3), over ``cpu_span``
    cpu_span: str | None = None    # "body" (API) | "active" (zero-code)
    gap_cpu: float | None = None   # training thread CPU s in each gap (wire 1.5, zero-code)
    loader_workers: int | None = None
    loader_cpu: float | None = None
    rss: int | None = 1 << 30
    mem_limit: int | None = 16 << 30
    gpu_util: float | None = None  # percent, NVML style
    gpu_power_w: float | None = None   # the GPU's draw: its total-energy counter (mJ) rises by this
    tensor_active: float | None = None
    sm_active: float | None = None     # GPM SM activity, 0..1 (idle time counting 0)
    gpu_why: dict[str, str] | None = None   # the GPU's ``why`` (NVML's reasons for a missing reading)
    offloaded: float | None = None     # the job device's ``offloaded`` share (CUDA)
    throttle: list[str] = field(default_factory=list)
    pid: int | None = None
    restart: int = 0
    probe_step_s: float | None = None    # the probe's own training-thread s per step (wire 1.4 ``cost``)
    probe_cores: float | None = None     # its threads' CPU, in cores, beside the process's 1 core
    start: float = T0
    extra_records: list[dict[str, Any]] = field(default_factory=list)


def between(t0: float, t1: float, lines: list[tuple[int, str, int, int]], step_lines: int = 0) -> dict[str, Any]:
    """A ``where`` record (wire 1.5) of [t0, t1] with stack samples between steps: ``lines`` as (line, state,
    samples, of them before the loop's step lines); ``step_lines`` in-step samples at /u/train.py:50."""
    return {"k": "where", "t": t1, "t0": t0, "t1": t1, "hz": 19.0, "samples": step_lines,
            "lines": [{"file": "/u/train.py", "line": 50, "function": "train", "n": step_lines, "state": "busy"}]
            if step_lines else [], "other": 0, "between_samples": sum(n for _, _, n, _ in lines),
            "between": [{"file": "/u/train.py", "line": ln, "function": "train", "n": n, "state": st, "before": b}
                        for ln, st, n, b in lines]}


def hello(r: Rank, world: int, device: str, peak: float | None, t: float) -> dict[str, Any]:
    dev: dict[str, Any] = {"type": device, "name": "Simulated GPU" if device == "cuda" else "CPU", "count": 1}
    if device == "cuda":
        dev["memory_total"] = 80 << 30
        if r.offloaded is not None:
            dev["offloaded"] = r.offloaded
    if peak is not None:
        dev["peak_flops"] = {"bf16": peak}
    return R.hello(r.rank, t=t, proto=[1, 0], job="synth", local_rank=0, world_size=world, host="node1",
                   pid=r.pid or 1000 + r.rank, restart=r.restart, device=dev)


def records(r: Rank, world: int = 1, device: str = "cpu", peak: float | None = None,
            bye: bool = False) -> list[dict[str, Any]]:
    """hello, then ``r.steps`` steps with one sample after each, then optional bye."""
    out = [hello(r, world, device, peak, r.start)]
    t = r.start
    for i in range(r.steps):
        rest = r.dur - r.data - r.gap
        phases = {"forward": rest / 2, "backward": rest / 2}
        if r.data:
            phases["data"] = r.data
        paused = r.pause if r.pause_every and i % r.pause_every == r.pause_every - 1 else 0.0
        dur = r.dur + paused
        extras: dict[str, Any] = {key: getattr(r, key) for key in ("syncs", "gpu_time", "lead", "gap_cpu")
                                  if getattr(r, key) is not None}
        if r.comm is not None:
            extras["comm"] = {"seconds": r.comm, "exposed": r.exposed if r.exposed is not None else r.comm,
                              "bytes": 4 << 20, "ops": 1}
        out.append(R.step(i, start=t, dur=dur, phases=phases, gap=r.gap + paused, samples=r.samples,
                          tokens=r.tokens, flops=r.flops, data_cpu=r.data_cpu, cpu=r.cpu, cpu_span=r.cpu_span,
                          **extras))
        t += dur
        host: dict[str, Any] = {"cpu": 1.0, "cpu_count": 8}
        if r.rss is not None:
            host["rss"] = r.rss
        if r.mem_limit is not None:
            host["mem_limit"] = r.mem_limit
            host["mem_limit_source"] = "machine"
        if r.loader_workers is not None:
            host["loader_workers"] = r.loader_workers
        if r.loader_cpu is not None:
            host["loader_cpu"] = r.loader_cpu
        sample: dict[str, Any] = {"k": "sample", "t": t, "host": host}
        if r.probe_step_s is not None:
            sample["cost"] = {"train_s": r.probe_step_s * (i + 1), "train_steps": i + 1, "hooks": {},
                              "threads": {"sender": (r.probe_cores or 0.0) * (t - r.start)},
                              "process_cpu": t - r.start, "queue_items": 0, "sent_bytes": 1000 * (i + 1), "why": {}}
        if peak is not None:   # what watch() reports: the compute dtype (the peak comes from hello's table)
            sample["compute"] = {"dtype": "bf16", "peak_flops": None, "peak_source": None}
        if r.gpu_util is not None or r.tensor_active is not None or r.throttle or r.sm_active is not None or r.gpu_why:
            gpu: dict[str, Any] = {"index": 0, "name": "Simulated GPU", "throttle": list(r.throttle)}
            if r.gpu_util is not None:
                gpu["util"] = r.gpu_util
            if r.gpu_power_w is not None:
                gpu["energy_mj"] = round(1e9 + r.gpu_power_w * (t - r.start) * 1000)
            if r.tensor_active is not None:
                gpu["tensor_active"] = r.tensor_active
            if r.sm_active is not None:
                gpu["sm_active"] = r.sm_active
            if r.gpu_why:
                gpu["why"] = dict(r.gpu_why)
            sample["gpus"] = [gpu]
        out.append(sample)
    out.extend(r.extra_records)
    if bye:
        out.append({"k": "bye", "t": t + 0.01})
    return out


def interleaved(ranks: tuple[Rank, ...], device: str = "cpu", peak: float | None = None,
                bye: bool = False) -> list[tuple[str, dict]]:
    """Every rank's (stream, record), interleaved by time like a live viewer sees them."""
    world = len(ranks)
    streams = []
    for r in ranks:
        stream = f"/tmp/synth.r{r.rank}.x{r.restart}.p{r.pid or 1000 + r.rank}.sock"
        streams.append((stream, records(r, world, device, peak, bye)))
    merged = sorted(((rec["t"], i, n, stream, rec) for i, (stream, recs) in enumerate(streams)
                     for n, rec in enumerate(recs)), key=lambda x: (x[0], x[1], x[2]))
    return [(stream, rec) for _, _, _, stream, rec in merged]


def job(*ranks: Rank, device: str = "cpu", peak: float | None = None, bye: bool = False,
        model: RunModel | None = None) -> RunModel:
    """A RunModel fed with every rank's records, interleaved by time like a live viewer sees them."""
    model = model or RunModel()
    for stream, rec in interleaved(ranks, device, peak, bye):
        model.ingest(stream, rec)
    return model


def analysis_of(*ranks: Rank, device: str = "cpu", peak: float | None = None, bye: bool = False) -> Analysis:
    """The same records through the analysis facade, as the report and the callbacks read them."""
    analysis = Analysis()
    for stream, rec in interleaved(ranks, device, peak, bye):
        analysis.ingest(stream, rec)
    return analysis
