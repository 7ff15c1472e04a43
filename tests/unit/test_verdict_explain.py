"""The verdict's words: for one view per leaf (and per wording branch), the exact headline, severity,
fixes and evidence a user reads in the verdict bar, ``perfmon report`` and its JSON.

The numbers in each headline are the view's own (step time, shares, worker counts, ranks), so a
headline that quotes the wrong quantity, unit or rank fails here. Written for mutation testing
(scripts/mutation.py): the flowchart tests check which leaf is reached, these check what it says.
"""

from __future__ import annotations

import dataclasses

import pytest

from perfmon_analysis import explain, units, verdict as V
from perfmon_analysis.buffers import BLOCKING_EVENTS
from perfmon_analysis.crash import Crash
from perfmon_analysis.health import JobHealth
from perfmon_analysis.losses import Loss
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.readings import GpuRow, RankTrace, StepBar, gpu_reading
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.views import CommOpRow, MemoryMetrics
from tests.helpers.ops_jobs import view as ops_view
from tests.unit.test_straggler_verdict import LEAVES as STRAGGLERS
from tests.unit.test_stuck import SLEEPER, WAITER
from tests.unit.test_where_model import FORWARD, SLEEP, intervals
from tests.unit.verdict_synth import T0, Rank, job, records

GB = 1 << 30
PEAK = 100e12
GAP_FIXES = ["time the pauses with mon.event('checkpoint', seconds=...) (or 'eval'); key u lists the lines sampled "
             "between steps, where the pauses run",
             "checkpoints: save asynchronously (torch.distributed.checkpoint.async_save) or less often",
             "evaluation: run it less often or on fewer batches, or in another process on its own device"]


def _view(ranks=None, device="cuda", peak=PEAK, **metrics):
    """A busy single-GPU job at 50% MFU, with the given metrics replaced."""
    ranks = ranks or [Rank(gpu_util=97, flops=PEAK * 0.5 * 0.1)]
    view = job(*ranks, device=device, peak=peak).view()
    return dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, **metrics))


def _idle(**metrics):
    """The same job with the device 45% busy and no measured loss, unless given; the host 2 ms ahead of
    250 ms of device work a step."""
    base = dict(device_busy=0.45, data_wait_frac=0.0, comm_exposed_frac=0.0, syncs_per_step=0.0, mfu=0.5,
                host_lead_s=0.002, host_lead_steps=0.008, host_queued_whole_frac=0.0, device_time_median_s=0.25)
    base.update(metrics)
    return _view(**base)


def _cpu(**metrics):
    """A compute-bound CPU job (100% busy, 100 ms steps), with the given metrics replaced."""
    view = job(Rank()).view()
    return dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, **metrics))


def _comm(**metrics):
    """Waiting for peers: NCCL's kernels keep NVML's busy high while the step waits, so the device reads 90% busy."""
    return _idle(**{"device_busy": 0.9, **metrics})


VIEWS = {
    "not_measured": lambda: _view(device_busy=None, device_busy_source=None),
    "memory_ooms_device": lambda: _view(memory=MemoryMetrics(source="device", rank=0, peak_frac=0.5, peak_bytes=40 * GB,
                                                             limit_bytes=80 * GB, ooms=2)),
    "memory_retries_device": lambda: _view(memory=MemoryMetrics(source="device", rank=1, peak_frac=0.8,
                                                                alloc_retries=7, alloc_retries_rising=True)),
    "memory_peak_host": lambda: _view(device="cpu", peak=None,
                                      memory=MemoryMetrics(source="host", rank=0, peak_frac=0.9375,
                                                           peak_bytes=15 * GB, limit_bytes=16 * GB)),
    "data_preprocessing_workers": lambda: _idle(data_wait_frac=0.4, loader_workers=2, loader_cpu=0.95),
    "data_preprocessing_one_worker": lambda: _idle(data_wait_frac=0.4, loader_workers=1, loader_cpu=0.8),
    "data_preprocessing_main_process": lambda: _idle(data_wait_frac=0.4, loader_workers=0, data_cpu_frac=0.9),
    "data_loading_workers": lambda: _idle(data_wait_frac=0.3, loader_workers=4, loader_cpu=0.03),
    "data_loading_main_process": lambda: _idle(data_wait_frac=0.3, loader_workers=0, data_cpu_frac=0.01,
                                               loader_cpu=None),
    # NCCL's kernels keep NVML's busy high while the step waits for peers
    "communication": lambda: _comm(comm_exposed_frac=0.25, compute_ratio=0.95, comm_op="all_reduce",
                                   busbw=2.5e9, comm_estimated=True, samples_per_s=640.0,
                                   step_time_median_s=0.1),
    "communication_no_busbw": lambda: _comm(comm_exposed_frac=0.25, compute_ratio=0.95, comm_op=None, busbw=None,
                                            samples_per_s=None),
    "load_imbalance_compute": lambda: job(Rank(0, comm=0.052, exposed=0.050), Rank(1, comm=0.002, exposed=0.0)).view(),
    "load_imbalance_arrival": lambda: dataclasses.replace(
        _comm(comm_exposed_frac=0.3, compute_ratio=0.95, straggler_by="arrival", arrival_ratio=0.5,
              comm_op="all_gather", gap_frac=0.08), straggler_rank=0),
    "host_sync": lambda: job(Rank(gpu_util=40, syncs=3), device="cuda").view(),
    "host_sync_site": lambda: dataclasses.replace(
        job(Rank(gpu_util=40, syncs=1.5), device="cuda").view(),
        traces={0: RankTrace(steps=(StepBar(0, 0.1, 0.0, (), "train.py:10"), StepBar(1, 0.1, 0.0, (), "train.py:42"),
                                    StepBar(2, 0.1, 0.0, ())), data_wait=(), cpu=())}),
    "host_overhead": lambda: _idle(step_time_median_s=0.25),
    "not_measured_host_ahead": lambda: _idle(step_time_median_s=0.25, host_lead_s=0.4, host_lead_steps=1.6,
                                             host_queued_whole_frac=1.0, device_time_median_s=0.25),
    "not_measured_lead_unknown": lambda: _idle(step_time_median_s=0.25, host_lead_s=None, host_lead_steps=None,
                                               host_queued_whole_frac=None, device_time_median_s=None),
    "not_measured_busy_unknown_on_a_rank": lambda: job(Rank(0, gpu_util=95), Rank(1, gpu_why={
        "util": "NVML: NoPermission"}), device="cuda").view(),
    "low_fill": lambda: _view(device_busy=0.98, device_fill=0.56, sm_active=0.55, mfu=None),
    "low_fill_warn": lambda: _view(device_busy=1.0, device_fill=0.45, sm_active=0.45, mfu=0.21),
    "host_wait_cpu": lambda: job(Rank(steps=40, cpu=0.06, extra_records=intervals(40, 0.1, [(SLEEP, 160),
                                                                                            (FORWARD, 240)]))).view(),
    "host_wait_cpu_no_samples": lambda: job(Rank(steps=40, cpu=0.06)).view(),
    "host_wait_gpu": lambda: job(Rank(steps=40, gpu_util=40, syncs=0, extra_records=intervals(
        40, 0.1, [(SLEEP, 300), (FORWARD, 100)])), device="cuda").view(),
    "compute_efficiency_mfu": lambda: _view(mfu=0.12, device_busy=0.97),
    "compute_efficiency_tensor": lambda: job(Rank(gpu_util=97, tensor_active=0.004), device="cuda").view(),
    "healthy_mfu": lambda: _view(mfu=0.45, device_busy=0.97, step_time_median_s=0.1234),
    "healthy_cpu": lambda: job(Rank()).view(),
    # pytorch/examples regression/main.py: batches built in the loop, 1 ms steps, 82% of the time between them
    "healthy_steps_ettr_low": lambda: _cpu(ettr=0.18, gap_frac=0.82, step_time_median_s=0.0002),
    # the same loop as the regression example, seen by a probe that sends no stack samples between steps
    "loop_work": lambda: _cpu(ettr=1.0, gap_frac=0.3, loop_frac=0.3, pause_frac=0.0),
    "warming_up": lambda: job(Rank(steps=3)).view(),
    "slow_worker": lambda: ops_view(**STRAGGLERS[0][1]),
    "slow_stage": lambda: ops_view(**STRAGGLERS[1][1]),
    "rotating_imbalance": lambda: ops_view(**STRAGGLERS[2][1]),
    "crashed": lambda: dataclasses.replace(job(Rank(steps=3)).view(), health=JobHealth(crash=Crash(
        0, "RuntimeError", "CUDA error: device-side assert triggered", 41, "/home/u/train.py", 12, "main",
        "loss = model(x)", "exit code 1"))),
    "crashed_killed": lambda: dataclasses.replace(job(Rank()).view(), health=JobHealth(crash=Crash(
        None, None, "", 120, exit="killed by SIGKILL"))),
    "memory_leak_host": lambda: dataclasses.replace(_cpu(memory=LEAKING), health=JobHealth(growth=GROWTH)),
    "memory_past_limit_host": lambda: _cpu(memory=dataclasses.replace(
        LEAKING, peak_frac=1.14, peak_bytes=int(1.14 * 4 * GB), activations_bytes=3 * GB, other_bytes=int(0.3 * GB))),
    "communication_fsdp": lambda: dataclasses.replace(
        _comm(comm_exposed_frac=0.17, compute_ratio=0.95, comm_op="all_gather", busbw=None, samples_per_s=None),
        comm_ops=[CommOpRow("all_gather", 40, 1 << 26, 0.9, None, None, 2),
                  CommOpRow("reduce_scatter", 20, 1 << 26, 0.8, None, None, 2)]),
    "data_loading_cpu_main_process": lambda: dataclasses.replace(
        _idle(data_wait_frac=0.3, loader_workers=0, data_cpu_frac=0.01, loader_cpu=None), device_type="cpu"),
    "stuck": lambda: job(Rank(0, extra_records=[WAITER]), Rank(1, extra_records=[SLEEPER])).view(),
}

LEAKING = MemoryMetrics(source="host", rank=0, peak_frac=0.4, peak_bytes=int(1.6 * GB), limit_bytes=4 * GB,
                        params_bytes=8 << 20, grads_bytes=8 << 20, optimizer_bytes=0, activations_bytes=15 << 20,
                        other_bytes=int(1.5 * GB))
GROWTH = MemoryGrowth(rank=0, series="rss", per_step=3.6e6, per_s=90e6, steps=400, points=40, first=int(0.2 * GB),
                      last=int(1.6 * GB), fit=0.99, steady=True, kind="other", kind_per_step=3.5e6, limit=4 * GB,
                      steps_to_limit=670)
WAIT_FIXES = [
    "move the call off the training thread (a background thread or process feeding a queue), so the step never waits "
    "for it",
    "overlap it: start the request before forward and collect its result after backward (concurrent.futures)",
    "batch it: one call every N steps instead of one per step; cache what it returns",
    "a lock or GIL contention with a background thread shows as waiting too: find the other holder"]

IDLE_FIXES = [
    "`perfmon capture` (key c) records a torch.profiler trace of a few steps: its device rows show what the device "
    "waits for between kernels",
    "work on another CUDA stream (a side stream, a collective's stream) is not on the stream the step's events time: "
    "waits on it show as idle here",
    "time the collectives (mon.watch(model=ddp_model), PERFMON_NCCL_TIMING=1) so a wait for peers is measured as such"]

FILL_FIXES = [
    "a larger micro-batch per step: fewer, larger kernels that occupy every SM (gradient accumulation keeps the "
    "global batch)",
    "fuse small ops into larger kernels: torch.compile (and fused optimizers, flash attention)",
    "CUDA graphs (torch.compile(mode='reduce-overhead') or torch.cuda.graphs) for steps of many small kernels",
    "`perfmon capture` (key c) lists the kernels by device time: the largest ones with few blocks or low occupancy "
    "(registers, shared memory per block) are where the SMs sit empty"]

SUGGEST = {
    "memory_device": [   'activation checkpointing (torch.utils.checkpoint) on the largest blocks',
        'mixed precision (bf16 autocast) to halve activations',
        'smaller micro-batch with gradient accumulation to keep the global batch',
        'shard optimizer state and gradients (FSDP / ZeRO)',
        'PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation'],
}

# name: (bottleneck, severity, headline, suggestions, evidence (without notes/skipped), straggler_rank)
EXPECTED = {
    'crashed': (
        'crashed', 'crit',
        'Crashed: RuntimeError on rank 0 at step 41 (train.py:12 in main): CUDA error: device-side assert '
        'triggered (exit code 1)',
        ['the line that raised, train.py:12 in main: loss = model(x); the whole traceback is in the '
         "job's stderr (the job log when perfmon run shows the TUI)"],
        {        'crash': {        'call': 'loss = model(x)',
                           'error': 'RuntimeError',
                           'exit': 'exit code 1',
                           'file': '/home/u/train.py',
                           'function': 'main',
                           'headline': 'Crashed: RuntimeError on rank 0 at step 41 (train.py:12 in '
                                       'main): CUDA error: device-side assert triggered',
                           'line': 12,
                           'message': 'CUDA error: device-side assert triggered',
                           'rank': 0,
                           'step': 41}},
        None),
    'crashed_killed': (
        'crashed', 'crit',
        'Crashed: killed by SIGKILL at step 120',
        ["SIGKILL: the kernel's OOM killer (dmesg | grep -i kill) or the scheduler (its job log) ended it"],
        {        'crash': {        'call': None,
                           'error': None,
                           'exit': 'killed by SIGKILL',
                           'file': None,
                           'function': None,
                           'headline': 'Crashed: killed by SIGKILL at step 120',
                           'line': None,
                           'message': '',
                           'rank': None,
                           'step': 120}},
        None),
    'memory_leak_host': (
        'memory', 'warn',
        'Memory leak: host RSS grows 3.6MB every step (90.0MB/s) over the last 400 steps, now 1.7GB; most in '
        'other (recent peak 1.7GB is 40% of the 4.3GB limit); at this rate the 4.3GB limit is reached in ~670 steps',
        ['find what the loop keeps every step (host RSS grows 3.6MB per step, most in other): tensors '
         'the loop keeps every step: a loss or an output appended to a list with its graph (keep '
         'loss.item() or loss.detach()), metrics accumulated as tensors, a cache that never evicts',
         'tracemalloc snapshots a few hundred steps apart show the Python lines whose memory grows',
         "memory outside the model's tensors: the data pipeline (num_workers x prefetch_factor batches "
         "in flight), Python objects and tensors the loop keeps, libraries' own buffers"],
        {        'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 1.0,
         'memory_growth_per_step': 3600000,
         'memory_growth_rank': 0,
         'memory_peak_frac': 0.4,
         'memory_rank': 0,
         'step_time_median_s': 0.1},
        None),
    'memory_past_limit_host': (
        'memory', 'crit',
        'Memory, host RSS: recent peak 4.9GB is 114% of the 4.3GB limit',
        ['activation checkpointing (torch.utils.checkpoint) on the largest blocks',
         'mixed precision (bf16 autocast) to halve activations',
         'smaller micro-batch with gradient accumulation to keep the global batch'],
        {        'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 1.0,
         'memory_peak_frac': 1.14,
         'memory_rank': 0,
         'step_time_median_s': 0.1},
        None),
    'communication_fsdp': (
        'communication', 'warn',
        'Communication (FSDP): exposed communication is 17% (all-gather 9% + reduce-scatter 8%) of the step',
        ["fully_shard(block, reshard_after_forward=False) keeps each block's parameters gathered from "
         'forward to backward: one all-gather per block instead of two, for the memory of the gathered '
         'block (an int reshards to a smaller group instead)',
         "prefetch the next blocks' all-gathers: block.set_modules_to_forward_prefetch([next blocks]) "
         'and set_modules_to_backward_prefetch([previous blocks])',
         'with gradient accumulation, model.set_requires_gradient_sync(False) on all but the last '
         'micro-batch: one reduce-scatter per step instead of one per micro-batch',
         'MixedPrecisionPolicy(param_dtype=torch.bfloat16) halves the all-gather bytes; '
         "reduce_dtype=torch.bfloat16 halves the reduce-scatter's",
         'fully_shard each transformer block, not each layer: fewer, larger collectives; across nodes, '
         'HSDP (a 2-D mesh: shard within a node, replicate across) keeps the all-gathers on the fast '
         'links',
         "check the interconnect: busbw should approach the link's bandwidth"],
        {        'busbw': None,
         'comm_exposed_by_op': {'all_gather': 0.09, 'reduce_scatter': 0.08},
         'comm_exposed_frac': 0.17,
         'comm_op': 'all_gather',
         'compute_ratio': 0.95,
         'data_wait_frac': 0.0,
         'device_busy': 0.9,
         'step_time_median_s': 0.1},
        None),
    'data_loading_cpu_main_process': (
        'data_loading', 'crit',
        'Data loading: 30% of each step waits for the loader; not CPU-bound',
        ['raise num_workers from 0 and prefetch_factor to hide read latency',
         'faster or local storage; cache the dataset in RAM or on local SSD'],
        {        'comm_exposed_frac': 0.0,
         'data_wait_frac': 0.3,
         'device_busy': 0.45,
         'loader_cpu': 0.01,
         'step_time_median_s': 0.1},
        None),
    'not_measured': (   'not_measured',
        'warn',
        "Not measured: CUDA busy is unknown (no GPU utilization samples for this job's GPU), so whether the "
        'device is starved cannot be told; measured: exposed communication 0%, loop work between steps 0%, 100ms '
        'steps; MFU 50%',
        [   'GPU busy is the share of time a kernel ran, from NVML utilization: `nvidia-smi -q -d UTILIZATION` '
            'as this user shows whether the driver reports it; MIG slices and many vGPUs report no utilization',
            "if NVML cannot be loaded (no libnvidia-ml in the container), mount the driver's libraries (NVIDIA "
            'container toolkit) so the probe can read the GPU',
            'meanwhile, the losses that are measured still speak: a data wait or exposed communication of 10% or '
            'more would have been named'],
        {'comm_exposed_frac': 0.0, 'data_wait_frac': None, 'device_busy': None, 'step_time_median_s': 0.1},
        None),
    'memory_ooms_device': (
        'memory', 'crit',
        'Memory, device memory: 2 out-of-memory error(s)',
        SUGGEST["memory_device"],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.97,
         'memory_peak_frac': 0.5,
         'memory_rank': 0,
         'step_time_median_s': 0.1},
        None),
    'memory_retries_device': (
        'memory', 'warn',
        'Memory, device memory: allocator retries rising',
        SUGGEST["memory_device"],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.97,
         'memory_peak_frac': 0.8,
         'memory_rank': 1,
         'step_time_median_s': 0.1},
        None),
    'memory_peak_host': (
        'memory', 'warn',
        'Memory, host RSS: recent peak 16.1GB is 94% of the 17.2GB limit',
        ['activation checkpointing (torch.utils.checkpoint) on the largest blocks',
         'mixed precision (bf16 autocast) to halve activations',
         'smaller micro-batch with gradient accumulation to keep the global batch',
         'shard optimizer state and gradients (FSDP / ZeRO)'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 1.0,
         'memory_peak_frac': 0.9375,
         'memory_rank': 0,
         'step_time_median_s': 0.1},
        None),
    'data_preprocessing_workers': (
        'data_preprocessing', 'crit',
        'Data preprocessing: 40% of each step waits for the loader; its 2 workers are CPU-bound (95% of a core each)',
        ['raise num_workers from 2 (up to the free cores)',
         'move per-sample transforms to the device or batch them',
         'preprocess offline (cache decoded/tokenized data)',
         'persistent_workers=True so workers are not re-forked every epoch'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': 0.4,
         'device_busy': 0.45,
         'loader_cpu': 0.95,
         'step_time_median_s': 0.1},
        None),
    'data_preprocessing_one_worker': (
        'data_preprocessing', 'crit',
        'Data preprocessing: 40% of each step waits for the loader; its worker is CPU-bound (80% of a core)',
        ['raise num_workers from 1 (up to the free cores)',
         'move per-sample transforms to the device or batch them',
         'preprocess offline (cache decoded/tokenized data)',
         'persistent_workers=True so workers are not re-forked every epoch'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': 0.4,
         'device_busy': 0.45,
         'loader_cpu': 0.8,
         'step_time_median_s': 0.1},
        None),
    'data_preprocessing_main_process': (
        'data_preprocessing', 'crit',
        'Data preprocessing: 40% of each step waits for the loader; '
        'the main process spends 90% of the wait on CPU (num_workers=0)',
        ['use DataLoader(num_workers=N): loading runs in the training process now',
         'move per-sample transforms to the device or batch them',
         'preprocess offline (cache decoded/tokenized data)'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': 0.4,
         'device_busy': 0.45,
         'loader_cpu': 0.9,
         'step_time_median_s': 0.1},
        None),
    'data_loading_workers': (
        'data_loading', 'crit',
        'Data loading: 30% of each step waits for the loader; not CPU-bound (workers at 3% CPU)',
        ['raise num_workers from 4 and prefetch_factor to hide read latency',
         'pin_memory=True and non_blocking copies',
         'persistent_workers=True',
         'faster or local storage; cache the dataset in RAM or on local SSD'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': 0.3,
         'device_busy': 0.45,
         'loader_cpu': 0.03,
         'step_time_median_s': 0.1},
        None),
    'data_loading_main_process': (
        'data_loading', 'crit',
        'Data loading: 30% of each step waits for the loader; not CPU-bound',
        ['raise num_workers from 0 and prefetch_factor to hide read latency',
         'pin_memory=True and non_blocking copies',
         'faster or local storage; cache the dataset in RAM or on local SSD'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': 0.3,
         'device_busy': 0.45,
         'loader_cpu': 0.01,
         'step_time_median_s': 0.1},
        None),
    'communication': (
        'communication', 'warn',
        'Communication: exposed all-reduce is 25% of the step at 2.5GB/s busbw (estimated)',
        ['overlap all-reduce with backward (DDP bucket_cap_mb; no sync inside backward)',
         'gradient accumulation with no_sync() to communicate every N micro-batches',
         'gradient compression hooks (bf16/fp16 compress, PowerSGD)',
         'larger per-rank batch (about 64 samples per rank per step now)',
         "check the interconnect: busbw should approach the link's bandwidth"],
        {'busbw': 2500000000.0,
         'comm_exposed_frac': 0.25,
         'comm_op': 'all_reduce',
         'compute_ratio': 0.95,
         'data_wait_frac': 0.0,
         'device_busy': 0.9,
         'step_time_median_s': 0.1},
        None),
    'communication_no_busbw': (
        'communication', 'warn',
        'Communication: exposed collective is 25% of the step',
        ['overlap collective with backward (DDP bucket_cap_mb; no sync inside backward)',
         'gradient accumulation with no_sync() to communicate every N micro-batches',
         'gradient compression hooks (bf16/fp16 compress, PowerSGD)',
         "check the interconnect: busbw should approach the link's bandwidth"],
        {'busbw': None,
         'comm_exposed_frac': 0.25,
         'comm_op': None,
         'compute_ratio': 0.95,
         'data_wait_frac': 0.0,
         'device_busy': 0.9,
         'step_time_median_s': 0.1},
        None),
    'slow_worker': (
        'slow_worker', 'crit',
        "Slow worker: dp2 pp1, rank 6, is slower than its stage's peers on 100% of steps; every other worker waits "
        "for it (56% of the step exposed); without it: 1.8× (simulated)",
        ['replace or drain the node of rank 6 (h): a worker slow on most steps is its host or hardware (throttling, '
         'a failing device, another process)',
         'check that node: clocks and throttle reasons, ECC and link errors, other processes on its cores',
         'restart the job without that node (elastic training: exclude it) until it is fixed'],
        {'worker_standout_frac': 1.0, 'straggler_rank': 6, 'worker': 'dp2 pp1', 'slowdown': 1.6222, 'gain': 1.8}, 6),
    'slow_stage': (
        'slow_stage', 'crit',
        'Slow stage: pipeline stage 1 does the most work (36s of compute a step, 92%); the other stages wait for '
        'it; balancing the stages: 1.3× (simulated)',
        ["move layers out of stage 1 into its neighbours (the pipeline's split points)",
         'the last stage also computes the loss and the output layer, the first the embedding: give them fewer '
         'layers than the middle stages',
         'more micro-batches shrink the fill and drain bubble, not an imbalance between stages'],
        {'standout_frac': 0.0, 'stage_work_ratio': 1.5, 'stage': 1, 'slowdown': 1.4, 'gain': 1.3}, None),
    'rotating_imbalance': (
        'rotating_imbalance', 'warn',
        'Rotating imbalance: on 100% of steps one worker is much slower than its peers, a different one each time '
        '(4 workers), so every step waits for one; evening the work over the replicas: 1.6× (simulated)',
        ['pack sequences so each micro-batch holds the same number of tokens',
         "bucket samples by length: each replica's batch then costs the same",
         'split batches by tokens (or by attention cost), not by sample count'],
        {'standout_frac': 1.0, 'slowdown': 1.6, 'gain': 1.6}, None),
    'load_imbalance_compute': (
        'load_imbalance', 'crit',
        'Load imbalance: rank 1 computes 100ms/step vs 50ms on rank 0; the others wait 50% in collective',
        ['find what makes rank 1 slower: its data shard, sequence lengths, host load',
         'balance work per rank (bucket samples by length, even shards)',
         "check rank 1's host for other processes or throttling"],
        {'comm_exposed_frac': 0.5,
         'compute_ratio': 0.5,
         'data_wait_frac': None,
         'device_busy': 0.5,
         'memory_peak_frac': 0.0625,
         'step_time_median_s': 0.1,
         'straggler_rank': 1},
        1),
    'load_imbalance_arrival': (
        'load_imbalance', 'warn',
        'Load imbalance: rank 0 arrives last at all-gather; the others wait 30% of the step for it (it waits 0%); '
        'it loses 8% between steps',
        ['find what delays rank 0 outside its compute: work between steps, logging, checkpointing on that '
         'rank only, its data path',
         "check rank 0's host for other processes or throttling"],
        {'arrival_ratio': 0.5,
         'comm_exposed_frac': 0.3,
         'compute_ratio': 0.95,
         'data_wait_frac': 0.0,
         'device_busy': 0.9,
         'step_time_median_s': 0.1,
         'straggler_rank': 0},
        0),
    'host_sync': (
        'host_sync', 'crit',
        'Host-device sync: the device idles 60% of each step with no other measured cause; 3 syncs per step',
        ['remove .item() / .cpu() / print(tensor) from the step; log every N steps',
         'keep metrics on the device and read them asynchronously (non_blocking=True into pinned memory)'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.4,
         'step_time_median_s': 0.1,
         'syncs_per_step': 3.0},
        None),
    'host_sync_site': (
        'host_sync', 'crit',
        'Host-device sync: the device idles 60% of each step with no other measured cause; '
        '1.5 syncs per step (most at train.py:42)',
        ['remove .item() / .cpu() / print(tensor) from the step; log every N steps',
         'keep metrics on the device and read them asynchronously (non_blocking=True into pinned memory)'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.4,
         'step_time_median_s': 0.1,
         'syncs_per_step': 1.5},
        None),
    'host_wait_cpu': (
        'host_wait', 'warn',
        'Host wait: 40% of each step waiting in time.sleep(0.04) at train.py:21 in fetch_from_service (off CPU 40% '
        'of the step, no other measured cause)',
        ['start with time.sleep(0.04) at train.py:21 in fetch_from_service: 40% ± 3% of each step waits there '
         '(key u: every line)', *WAIT_FIXES],
        {'device_busy': 0.6, 'host_wait_frac': 1.0, 'step_time_median_s': 0.1, 'where_top': '/home/u/train.py:21'},
        None),
    'host_wait_cpu_no_samples': (
        'host_wait', 'warn',
        'Host wait: the training thread is off CPU 40% of each step with no other measured cause; no stack samples '
        'say where',
        [*WAIT_FIXES, 'py-spy dump of the training process during a step shows the call it waits in'],
        {'device_busy': 0.6, 'host_wait_frac': 1.0},
        None),
    'host_wait_gpu': (
        'host_wait', 'crit',
        'Host wait: 75% of each step waiting in time.sleep(0.04) at train.py:21 in fetch_from_service (device idle '
        '60% with no other cause; the host is off CPU in 75% of its in-step samples)',
        ['start with time.sleep(0.04) at train.py:21 in fetch_from_service: 75% ± 3% of each step waits there '
         '(key u: every line)', *WAIT_FIXES],
        {'device_busy': 0.4, 'host_wait_frac': 0.75, 'syncs_per_step': 0.0, 'where_top': '/home/u/train.py:21'},
        None),
    'host_overhead': (   'host_overhead',
        'crit',
        'Host overhead: the device idles 55% of each step with no other measured cause (busy 45% of a 250ms '
        'step); the host stays only 2ms ahead of 250ms of device work a step, too little to keep it fed; cannot '
        'tell a host that waits (I/O, a lock, a service) from launch overhead (no stack samples of the training '
        'thread in steps)',
        [   'larger batch per step',
            'torch.compile or CUDA graphs to cut launch overhead',
            'fuse small ops; avoid Python work per micro-op'],
        {   'comm_exposed_frac': 0.0,
            'data_wait_frac': 0.0,
            'device_busy': 0.45,
            'host_queued_whole_frac': 0.0,
            'step_time_median_s': 0.25,
            'syncs_per_step': 0.0},
        None),
    'not_measured_host_ahead': (   'not_measured',
        'warn',
        'Not measured: the device idles 55% of each step with no measured cause; the host finished queueing 100% '
        'of the timed steps before the device began them (400ms ahead of a 250ms step), so launches are not what '
        'idles it; what it waits '
        'for (another stream, a collective nobody timed, time outside the steps) is not measured; measured: data '
        'wait 0%, exposed communication 0%, device idle, no other cause 55%, loop work between steps 0%, 250ms '
        'steps; MFU 50%',
        IDLE_FIXES,
        {   'comm_exposed_frac': 0.0,
            'data_wait_frac': 0.0,
            'device_busy': 0.45,
            'host_queued_whole_frac': 1.0,
            'step_time_median_s': 0.25,
            'syncs_per_step': 0.0},
        None),
    'not_measured_lead_unknown': (   'not_measured',
        'warn',
        'Not measured: the device idles 55% of each step with no measured cause; measured: data wait 0%, exposed '
        'communication 0%, device idle, no other cause 55%, loop work between steps 0%, 250ms steps; MFU 50%; '
        'cannot tell a host that waits '
        '(I/O, a lock, a service) from launch overhead (no stack samples of the training thread in steps); '
        'cannot tell launch overhead from an idle the host does not cause (host lead not measured: no step of '
        'the window timed with CUDA events)',
        ["turn on CUDA step timing: mon.watch(model=...) on the model on the GPU (it times about ten steps a "
         "second; watch(gpu_events=False) turns it off)", *IDLE_FIXES],
        {   'comm_exposed_frac': 0.0,
            'data_wait_frac': 0.0,
            'device_busy': 0.45,
            'step_time_median_s': 0.25,
            'syncs_per_step': 0.0},
        None),
    'not_measured_busy_unknown_on_a_rank': (   'not_measured',
        'warn',
        'Not measured: CUDA busy is unknown (rank 1: NVML: NoPermission), so whether the device is starved '
        'cannot be told; measured: loop work between steps 0%, 100ms steps',
        [   'GPU busy is the share of time a kernel ran, from NVML utilization: `nvidia-smi -q -d UTILIZATION` '
            'as this user shows whether the driver reports it; MIG slices and many vGPUs report no utilization',
            "if NVML cannot be loaded (no libnvidia-ml in the container), mount the driver's libraries (NVIDIA "
            'container toolkit) so the probe can read the GPU',
            'meanwhile, the losses that are measured still speak: a data wait or exposed communication of 10% or '
            'more would have been named'],
        {'comm_exposed_frac': None, 'data_wait_frac': None, 'device_busy': None, 'step_time_median_s': 0.1},
        None),
    'low_fill': (   'low_fill',
        'info',
        'Low SM fill: a kernel runs 98% of each 100ms step, but the running kernels occupy 56% of the SMs (SM '
        'activity 55%): small kernels, a small batch, unfused ops or low occupancy',
        FILL_FIXES,
        {   'comm_exposed_frac': 0.0,
            'data_wait_frac': None,
            'device_busy': 0.98,
            'device_fill': 0.56,
            'sm_active': 0.55,
            'step_time_median_s': 0.1},
        None),
    'low_fill_warn': (   'low_fill',
        'warn',
        'Low SM fill: a kernel runs 100% of each 100ms step, but the running kernels occupy 45% of the SMs (SM '
        'activity 45%); MFU 21% of a 100TFLOP/s peak (device table, bf16): small kernels, a small batch, unfused '
        'ops or low occupancy',
        FILL_FIXES,
        {   'comm_exposed_frac': 0.0,
            'data_wait_frac': None,
            'device_busy': 1.0,
            'device_fill': 0.45,
            'sm_active': 0.45,
            'step_time_median_s': 0.1},
        None),
    'compute_efficiency_mfu': (
        'compute_efficiency', 'info',
        'Compute efficiency: device busy 97% but MFU 12% of a 100TFLOP/s peak (device table, bf16)',
        ["bf16 autocast (torch.autocast('cuda', dtype=torch.bfloat16))",
         'torch.backends.cuda.matmul.allow_tf32 = True for fp32 matmuls',
         'fused kernels (fused AdamW, flash attention) and torch.compile',
         'larger batch per step',
         '`perfmon profile` (key m) times each module for a few steps: which one wastes the device'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.97,
         'mfu': 0.12,
         'step_time_median_s': 0.1},
        None),
    'compute_efficiency_tensor': (
        'compute_efficiency', 'info',
        'Compute efficiency: device busy 97% but tensor cores 0% active',
        ["bf16 autocast (torch.autocast('cuda', dtype=torch.bfloat16))",
         'torch.backends.cuda.matmul.allow_tf32 = True for fp32 matmuls',
         'fused kernels (fused AdamW, flash attention) and torch.compile',
         'larger batch per step',
         '`perfmon profile` (key m) times each module for a few steps: which one wastes the device'],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.97,
         'mfu': 0.004,
         'step_time_median_s': 0.1},
        None),
    'healthy_mfu': (
        'healthy', 'ok',
        'Healthy: CUDA busy 97% of a 123ms step, no measured loss of 10% or more, MFU 45% of a 100TFLOP/s '
        'peak (device table, bf16)',
        [],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 0.97,
         'mfu': 0.45,
         'step_time_median_s': 0.1234},
        None),
    'healthy_cpu': (
        'healthy', 'ok',
        'Healthy: CPU busy 100% of a 100ms step, no measured loss of 10% or more',
        [],
        {'comm_exposed_frac': 0.0,
         'data_wait_frac': None,
         'device_busy': 1.0,
         'memory_peak_frac': 0.0625,
         'step_time_median_s': 0.1},
        None),
    'healthy_steps_ettr_low': (
        'healthy', 'warn',
        'Healthy steps (CPU busy 100% of a 200µs step, no measured loss of 10% or more), but only 18% of the time '
        'since the first step is in the training loop (ETTR): 82% is pauses between steps',
        GAP_FIXES,
        {'device_busy': 1.0, 'step_time_median_s': 0.0002},
        None),
    'loop_work': (
        'loop_work', 'warn',
        "Loop work: 30% of each step is the loop's own work between steps; cannot tell a wait (a lock, a service, "
        "a sleep) from work between steps (neither the thread's CPU time between steps nor stack samples there)",
        ['do it every N steps instead of every step (logging, metrics, validation of the batch)',
         'hand it to a background thread or process through a queue; keep the training thread stepping',
         'keep metrics on the device and read them every N steps',
         'stack samples between steps (wire 1.5) say which line: a newer probe sends them'],
        {'device_busy': 1.0, 'loop_frac': 0.3, 'step_time_median_s': 0.1},
        None),
    'warming_up': (
        'warming_up', 'info',
        'Warming up: 2 of 5 steps seen, no verdict yet',
        [],
        {'steps': 3},
        None),
    'stuck': (
        'stuck', 'crit',
        'Stuck: rank 1 never reached all_reduce #20 (train.py:10 in load_batch); 1 rank waits in it for 45s',
        ["the culprit's stack (key s in the TUI, verdict.stuck.where in the JSON) is where it left the collective "
         "order the other ranks follow",
         'a rank that skips or adds a collective (a data-dependent branch, an uneven last batch) hangs the others: '
         'make every rank call the same collectives in the same order',
         "the flight recorders (key s; verdict.stuck.calls) say whether each rank enqueued the call: one "
                   "that never did stalled on the host, one that did waits on its device or the network"],
        {'stuck': {'kind': 'collective', 'culprit_ranks': [1], 'waiting_ranks': [0], 'op': 'all_reduce',
                   'group': 'world', 'seq': 20, 'since_s': 45.0, 'loader_pid': None, 'unresponsive_ranks': [],
                   'calls': {'0': 'enqueued', '1': 'never_enqueued'},
                   'where': {'0': ['/home/u/train.py:11 in <module>',
                                   '/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252 '
                                   'in all_reduce'],
                             '1': ['/home/u/train.py:30 in <module>', '/home/u/train.py:10 in load_batch']}}},
        1),
}


def test_every_case_has_an_expectation_and_every_leaf_is_covered():
    assert set(VIEWS) == set(EXPECTED)
    assert {e[0] for e in EXPECTED.values()} == set(V.BOTTLENECKS)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_headline_severity_fixes_and_evidence(name):
    v = V.evaluate(VIEWS[name]())
    bottleneck, severity, headline, suggestions, evidence, straggler = EXPECTED[name]
    assert (v.bottleneck, v.severity) == (bottleneck, severity)
    assert v.headline == headline
    assert v.suggestions == suggestions
    assert set(evidence) <= set(v.evidence) and {k: v.evidence[k] for k in evidence} == evidence
    assert v.straggler_rank == straggler
    out = v.as_json()
    assert {k: out[k] for k in ("bottleneck", "label", "severity", "headline", "path", "evidence", "suggestions",
                                "straggler_rank")} == {
        "bottleneck": bottleneck, "label": V.CHART.outcomes[bottleneck].label, "severity": severity,
        "headline": headline,
        "path": v.path, "evidence": v.evidence, "suggestions": suggestions, "straggler_rank": straggler}
    assert out["losses"] == [x.as_json() for x in v.losses] and out["undecided"] == v.undecided


def _findings_view(**metrics):
    model = job(Rank(0, steps=20, pid=11, gpu_util=97), device="cuda", peak=PEAK)
    from tests.unit.verdict_synth import T0, records
    for rec in records(Rank(0, steps=8, pid=22, restart=1, start=T0 + 100, gpu_util=97), device="cuda", peak=PEAK):
        model.ingest("/tmp/new.sock", rec)
    view = model.view()
    return dataclasses.replace(
        view, metrics=dataclasses.replace(view.metrics, **metrics), drops_total=12,
        gpus=(GpuRow(0, gpu_reading({"index": 0, "throttle": ["idle", "sw_thermal", "hw_slowdown"]}), ()),
              GpuRow(0, gpu_reading({"index": 1, "throttle": None}), ()),
              GpuRow(1, gpu_reading({"index": 0, "throttle": ["sw_power_cap", "app_clocks"]}), ())),
        events=[{"name": "checkpoint"}, {"name": "eval"}, {"name": "warning"}])


def test_every_secondary_finding_with_its_numbers_and_message():
    mem = MemoryMetrics(source="device", fragmentation_bytes=3 * GB, reserved_bytes=10 * GB)
    v = V.evaluate(_findings_view(ettr=0.8, gap_frac=0.15, memory=mem))
    assert v.findings == [
        {"id": "step_gaps", "ettr": 0.8, "gap_frac": 0.15, "pause_frac": 0.0, "events": 2,
         "message": "ETTR 80%: time between steps is lost to checkpoints/evaluation"},
        {"id": "throttling", "gpus": [{"rank": 0, "index": 0, "reason": "hw_slowdown"},
                                      {"rank": 0, "index": 0, "reason": "sw_thermal"},
                                      {"rank": 1, "index": 0, "reason": "sw_power_cap"}],
         "message": "3 GPU clock throttle reason(s) active (power/thermal)"},
        {"id": "fragmentation", "fraction": 0.3, "bytes": 3 * GB,
         "message": "30% of reserved memory is fragmented: try expandable_segments:True"},
        {"id": "rank_restarted", "rank": 0, "generation": 1, "restart": 1, "pid": 22,
         "message": "rank 0 restarted (generation 1, pid 22)"},
        {"id": "drops", "count": 12, "message": "12 records dropped on the way; numbers may have holes"},
    ]


def test_step_gaps_without_pause_events_and_fragmentation_at_its_edge():
    edge = MemoryMetrics(source="device", fragmentation_bytes=2 * GB, reserved_bytes=10 * GB)
    view = dataclasses.replace(_findings_view(ettr=0.85, gap_frac=0.1, memory=edge), events=[], drops_total=0)
    findings = {f["id"]: f for f in V.evaluate(view).findings}
    assert findings["step_gaps"]["message"] == "ETTR 85%: time between steps is lost to pauses or stalls"
    assert findings["step_gaps"]["events"] == 0 and "fragmentation" not in findings and "drops" not in findings
    no_reserved = MemoryMetrics(source="device", fragmentation_bytes=2 * GB, reserved_bytes=0)
    view = dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, memory=no_reserved, ettr=None,
                                                                  gap_frac=None))
    assert {f["id"] for f in V.evaluate(view).findings} == {"throttling", "rank_restarted"}


def test_tracker_shows_warm_up_at_once_and_a_placeholder_while_the_first_verdict_is_confirmed():
    tracker = V.VerdictTracker()
    first = tracker.update(job(Rank(steps=3)).view())
    assert (first.bottleneck, first.pending, first.headline) == (
        "warming_up", None, "Warming up: 2 of 5 steps seen, no verdict yet")
    tracker = V.VerdictTracker()
    throttled = _findings_view(ettr=0.8, gap_frac=0.15)
    pending = tracker.update(throttled)
    assert pending == V.Verdict("warming_up", "info", "Warming up: confirming the first verdict", [], {}, [],
                                findings=V.evaluate(throttled).findings, pending="healthy")
    shown = tracker.update(throttled)
    assert (shown.bottleneck, shown.pending) == ("healthy", None)


@pytest.mark.parametrize("busbw,shown", [(999.0, "999B/s"), (1000.0, "1kB/s"), (1500.0, "1.5kB/s"),
                                         (1e6, "1MB/s"), (2.5e8, "250MB/s"), (1e9, "1GB/s")])
def test_busbw_in_the_headline_uses_the_largest_unit_it_reaches(busbw, shown):
    v = V.evaluate(_comm(comm_exposed_frac=0.25, compute_ratio=0.95, comm_op="all_reduce", busbw=busbw))
    assert v.headline == f"Communication: exposed all-reduce is 25% of the step at {shown} busbw"


def test_memory_headline_with_unknown_sizes_says_so():
    v = V.evaluate(_view(device="cpu", peak=None, memory=MemoryMetrics(source="host", peak_frac=0.95)))
    assert v.headline == "Memory, host RSS: recent peak n/a is 95% of the n/a limit"


def test_arrival_straggler_missing_from_the_rank_rows_is_still_named():
    view = dataclasses.replace(_comm(comm_exposed_frac=0.3, compute_ratio=0.95, straggler_by="arrival",
                                     arrival_ratio=0.5, comm_op=None), straggler_rank=5)
    assert V.evaluate(view).headline == ("Load imbalance: rank 5 arrives last at collective; the others wait 30% "
                                         "of the step for it (it waits n/a)")


def test_compute_straggler_without_per_rank_compute_times_says_not_available():
    view = dataclasses.replace(_comm(comm_exposed_frac=0.3, compute_ratio=0.5, straggler_by="compute"),
                               straggler_rank=1, ranks=[])
    v = V.evaluate(view)
    assert v.headline == ("Load imbalance: rank 1 computes n/a/step vs n/a on rank n/a; "
                          "the others wait 30% in collective")


def test_per_rank_batch_suggestion_divides_by_the_world_size():
    view = dataclasses.replace(_comm(comm_exposed_frac=0.25, compute_ratio=0.95, samples_per_s=640.0,
                                     step_time_median_s=0.1), world_size=2)
    assert "larger per-rank batch (about 32 samples per rank per step now)" in V.evaluate(view).suggestions


@pytest.mark.parametrize("gap,said", [(0.05, "; it loses 5% between steps"), (0.049, ""), (None, "")])
def test_arrival_straggler_mentions_its_gaps_from_five_percent(gap, said):
    view = dataclasses.replace(_comm(comm_exposed_frac=0.3, compute_ratio=0.95, straggler_by="arrival",
                                     arrival_ratio=0.5, comm_op=None, gap_frac=gap), straggler_rank=0)
    assert V.evaluate(view).headline == ("Load imbalance: rank 0 arrives last at collective; the others wait 30% "
                                         f"of the step for it (it waits 0%){said}")


def test_unknown_step_time_and_unmeasured_loader_are_said_plainly():
    assert V.evaluate(_idle(step_time_median_s=None)).headline == (
        "Host overhead: the device idles 55% of each step with no other measured cause (busy 45% of a n/a step); "
        "the host stays only 2ms ahead of 250ms of device work a step, too little to keep it fed; cannot tell a host "
        "that waits (I/O, a lock, a service) from launch overhead (no stack samples of the training thread in steps)")
    v = V.evaluate(_idle(data_wait_frac=0.3, loader_workers=None, loader_cpu=None, data_cpu_frac=None))
    assert v.bottleneck == "data_loading" and v.undecided == {"loader_cpu": v.evidence["skipped"]["loader_cpu"]}
    assert v.headline == ("Data loading: 30% of each step waits for the loader; cannot tell CPU-bound "
                          "preprocessing from slow I/O (loader CPU not measured)")
    assert v.suggestions[0] == "raise num_workers and prefetch_factor to hide read latency"


def test_rate_formatter_says_unknown_for_no_bandwidth():
    # the headline only quotes busbw when it is known; the formatter still says "unknown" for None
    assert units.bandwidth(None) == "n/a" and units.bandwidth(0.0) == "0B/s"


def test_unknown_device_busy_is_never_healthy_and_says_what_is_missing():
    """GPU activity not measured, every measured loss small: "not starved" cannot be said."""
    v = V.evaluate(_view(device_busy=None, device_busy_source=None))
    assert v.bottleneck == "not_measured" and v.severity == "warn" and v.evidence["device_busy"] is None
    assert v.as_json()["unknown"]["device_busy"].startswith("CUDA busy not measured")
    idle = [x for x in v.losses if x.id == "device_idle"][0]
    assert idle.share is None and "not measured" in idle.source


def test_warm_up_keeps_findings_and_only_load_imbalance_names_a_straggler():
    warming = job(Rank(steps=3, extra_records=[{"k": "drops", "t": 1_700_000_001.0, "count": 4}])).view()
    assert "drops" in [f["id"] for f in V.evaluate(warming).findings]
    comm = dataclasses.replace(_comm(comm_exposed_frac=0.3, compute_ratio=0.9), straggler_rank=1)
    v = V.evaluate(comm)
    assert v.bottleneck == "communication" and v.straggler_rank is None
    assert "rank_restarted" not in [f["id"] for f in v.findings]


def test_evidence_numbers_are_rounded_to_four_places():
    v = V.evaluate(_idle(device_busy=0.123456, data_wait_frac=0.0123456))
    assert v.evidence["device_busy"] == 0.1235 and v.evidence["data_wait_frac"] == 0.0123
    mem = MemoryMetrics(source="device", fragmentation_bytes=1, reserved_bytes=3)
    frag = [f for f in V.evaluate(_view(memory=mem)).findings if f["id"] == "fragmentation"]
    assert frag[0]["fraction"] == 0.3333


@pytest.mark.parametrize("name", sorted(BLOCKING_EVENTS))
def test_each_blocking_event_name_counts_as_a_pause(name):
    view = dataclasses.replace(_view(ettr=0.5), events=[{"name": name}, {"name": "warning"}])
    (gaps,) = [f for f in V.evaluate(view).findings if f["id"] == "step_gaps"]
    assert gaps["events"] == 1 and gaps["message"].endswith("lost to checkpoints/evaluation")


def test_an_ettr_of_exactly_ninety_percent_is_not_a_finding_whatever_the_windows_time_between_steps():
    """The window's time between steps is the loop's work too (a loss of its own): only ETTR says pauses."""
    assert "step_gaps" not in V.evaluate(_view(ettr=0.9, gap_frac=0.5)).finding_ids
    assert "step_gaps" in V.evaluate(_view(ettr=0.8999, gap_frac=0.0)).finding_ids


def test_an_empty_model_is_warming_up_with_zero_steps():
    from perfmon_analysis.runmodel import RunModel
    assert V.evaluate(RunModel().view()).headline == "Warming up: 0 of 5 steps seen, no verdict yet"


def test_the_probes_own_failures_are_one_finding_with_the_newest_count_per_rank_and_place():
    events = [
        {"name": "warning", "source": "perfmon", "where": "step hook", "count": 2, "rank": 0},
        {"name": "warning", "source": "perfmon", "where": "step hook", "count": 5, "rank": 0},   # running count
        {"name": "warning", "source": "perfmon", "where": "step hook", "count": 1, "rank": 1},
        {"name": "warning", "source": "perfmon", "where": "NVML", "rank": 1},                   # no count: one
        {"name": "warning", "source": "perfmon", "rank": 2, "count": 3},                        # no place
        {"name": "warning", "source": "comm", "where": "DDP", "count": 9, "rank": 0},           # not the probe's own
        {"name": "error", "source": "perfmon", "where": "x", "count": 9, "rank": 0},
    ]
    v = V.evaluate(dataclasses.replace(_view(), events=events))
    (found,) = [f for f in v.findings if f["id"] == "probe_warnings"]
    assert found == {"id": "probe_warnings", "count": 10, "where": ["NVML", "n/a", "step hook"],
                     "message": "the probe counted 10 failure(s) of its own (NVML, n/a, step hook): "
                                "numbers from those parts may be missing"}
    quiet = V.evaluate(dataclasses.replace(_view(), events=events[5:]))
    assert not [f for f in quiet.findings if f["id"] == "probe_warnings"]


def test_outcome_labels_come_from_the_rule_table_and_unknown_ids_are_spelled_out():
    assert [V.label(o.id) for o in V.CHART.outcomes.values()] == [o.label for o in V.CHART.outcomes.values()]
    assert V.label("host_sync") == "HOST-DEVICE SYNC" and V.label("data_loading") == "DATA LOADING"
    assert V.label("stuck_in_io") == "STUCK IN IO"


def test_throttled_gpus_are_listed_by_rank_then_index_an_unknown_index_first():
    view = dataclasses.replace(_view(), gpus=(
        GpuRow(0, gpu_reading({"index": 1, "throttle": ["hw_slowdown"]}), ()),
        GpuRow(0, gpu_reading({"throttle": ["sw_thermal"]}), ()),              # an older probe: no index
        GpuRow(0, gpu_reading({"index": 0, "throttle": ["sw_power_cap"]}), ())))
    (found,) = [f for f in explain.findings(view) if f["id"] == "throttling"]
    assert [(g["index"], g["reason"]) for g in found["gpus"]] == [(None, "sw_thermal"), (0, "sw_power_cap"),
                                                                   (1, "hw_slowdown")]


def test_a_straggler_on_a_multi_node_job_is_named_with_its_host():
    model = RunModel()
    for rank, host, exposed in ((0, "node1", 0.04), (1, "node2", 0.004)):
        recs = records(Rank(rank, dur=0.1, comm=exposed, gpu_util=90), world=2, device="cuda")
        recs[0]["host"] = host
        for r in recs:
            model.ingest(f"s{rank}", r)
    v = V.evaluate(model.view())
    assert v.bottleneck == "load_imbalance" and v.straggler_rank == 1
    assert v.headline.startswith("Load imbalance: rank 1 on node2 computes 96ms/step vs 60ms on rank 0")


def test_host_overhead_quotes_how_far_the_host_runs_ahead_of_the_gpu():
    recs = records(Rank(dur=0.1, gpu_util=55, syncs=0.0, gpu_time=0.1), device="cuda")
    for r in recs:
        if r["k"] == "step":
            r["lead"] = 0.0015
    model = RunModel()
    for r in recs:
        model.ingest("s", r)
    v = V.evaluate(model.view())
    assert v.bottleneck == "host_overhead"
    assert v.headline.startswith("Host overhead: the device idles 45% of each step with no other measured cause "
                                 "(busy 55% of a 100ms step); the host stays only 1.5ms ahead of 100ms of device "
                                 "work a step, too little to keep it fed")


def test_a_device_memory_verdict_speaks_of_the_windows_peak():
    mem = {"k": "memory", "t": T0 + 2.0, "reserved": 76 * GB, "peak_reserved": 76 * GB, "limit": 80 * GB}
    v = V.evaluate(job(Rank(gpu_util=97, extra_records=[mem]), device="cuda").view())
    assert v.bottleneck == "memory"
    assert v.headline == "Memory, device memory: window peak 81.6GB is 95% of the 85.9GB limit"


def test_compute_efficiency_with_a_module_profile_cites_the_slowest_module_for_its_flops():
    from tests.unit.test_profile_model import MODULES, _record
    profile = dict(_record(MODULES, peak=PEAK), t=T0 + 2.5)
    view = job(Rank(dur=0.1, flops=PEAK * 0.1 * 0.2, gpu_util=97, extra_records=[profile]), device="cuda",
               peak=PEAK).view()
    v = V.evaluate(view)
    cited = "slow: 60% of the step at 500GFLOP/s (0% of peak)"
    assert v.bottleneck == "compute_efficiency"
    assert v.headline == ("Compute efficiency: device busy 97% but MFU 20% of a 100TFLOP/s peak (device table, "
                          f"bf16); slowest for its FLOPs: {cited}")
    assert v.suggestions[0] == ("start with slow (Linear): batch its small ops into large matmuls, or fuse them "
                                "(torch.compile)")
    assert v.evidence["profile_marked"] == cited


def test_headlines_quote_the_verdicts_own_loss_accounting_not_a_second_one():
    """The explanation is handed the verdict's losses: a planted device idle share is what it quotes."""
    view = _idle(step_time_median_s=0.25)
    verdict = V.evaluate(view)
    planted = tuple(Loss(x.id, x.label, 0.33, "planted") if x.id == "device_idle" else x for x in verdict.losses)
    headline, _, _ = V.CHART.outcomes["host_overhead"].explain(view, None, planted, verdict.answers)
    assert headline.startswith("Host overhead: the device idles 33% of each step")
    assert verdict.headline.startswith("Host overhead: the device idles 55% of each step")


def test_the_loader_headline_names_the_cpu_figure_the_verdict_judged():
    """Workers of unknown number, their CPU measured: the workers are CPU-bound, not the main process."""
    busy = V.evaluate(_idle(data_wait_frac=0.3, loader_workers=None, loader_cpu=0.5, data_cpu_frac=None))
    assert busy.bottleneck == "data_preprocessing"
    assert busy.headline == ("Data preprocessing: 30% of each step waits for the loader; its workers are CPU-bound "
                             "(50% of a core each)")
    # num_workers=0: the main process's CPU inside the wait is judged, whatever a worker figure says
    main = V.evaluate(_idle(data_wait_frac=0.3, loader_workers=0, loader_cpu=0.9, data_cpu_frac=0.1))
    assert main.bottleneck == "data_loading"
    assert main.headline == "Data loading: 30% of each step waits for the loader; not CPU-bound"
    # workers whose CPU is unknown: nothing is said about CPU but that it cannot be told
    unknown = V.evaluate(_idle(data_wait_frac=0.3, loader_workers=4, loader_cpu=None, data_cpu_frac=0.1))
    assert unknown.headline == ("Data loading: 30% of each step waits for the loader; cannot tell CPU-bound "
                                "preprocessing from slow I/O (loader worker CPU not measured)")
