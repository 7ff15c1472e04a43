"""``perfmon report``: JSON contract (schema), text form, recordings (torn, multi-rank, restarted)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.report import gains_lines, render_text
from perfmon_analysis.verdict import evaluate
from probe import wire
from probe.paths import base_name
from probe.recording import RecordingWriter
from tests.helpers.reports import REPORT_VALIDATOR, analysed, report_and_text, report_of
from tests.unit.test_stuck import SLEEPER, WAITER, two_ranks
from tests.unit.test_where_model import waiting_job
from tests.unit.verdict_synth import T0, Rank, analysis_of, between, job, records
from tui import cli

GB = 1 << 30

JOBS = {
    "healthy-cpu": lambda: job(Rank()),
    "warming": lambda: job(Rank(steps=3)),
    "data-preprocessing": lambda: job(Rank(data=0.04, loader_workers=2, loader_cpu=0.9)),
    "imbalance": lambda: job(Rank(0, comm=0.052, exposed=0.05), Rank(1, comm=0.002, exposed=0.0)),
    "gpu-compute": lambda: job(Rank(gpu_util=97, flops=1e12, throttle=["hw_thermal"]), device="cuda",
                               peak=100e12),
    "memory-oom": lambda: job(Rank(extra_records=[{"k": "event", "t": T0 + 2.9, "name": "oom"}])),
    "gaps": lambda: job(Rank(gap=0.03)),
    "empty-hello": lambda: _hello_only(),
}


def _hello_only():
    from perfmon_analysis.runmodel import RunModel
    model = RunModel()
    model.ingest("s", {"k": "hello", "t": T0, "proto": [1, 0]})
    return model


@pytest.mark.parametrize("name", sorted(JOBS))
def test_report_validates_against_the_schema(name):
    report = report_of(JOBS[name]())
    errors = sorted(REPORT_VALIDATOR.iter_errors(report), key=str)
    assert not errors, [e.message for e in errors]
    json.dumps(report, allow_nan=False)


def test_schema_rejects_a_broken_report():
    report = report_of(JOBS["healthy-cpu"]())
    report["metrics"]["data_wait_frac"] = 1.5
    report["verdict"]["bottleneck"] = "slow"
    assert len(list(REPORT_VALIDATOR.iter_errors(report))) == 2


def test_report_fields_follow_the_documented_contract():
    report = report_of(JOBS["data-preprocessing"]())
    assert report["schema"] == "perfmon.report/2" and report["job"] == "synth"
    v = report["verdict"]
    m = report["metrics"]
    assert v["bottleneck"] == "data_preprocessing" and v["path"] == ["memory", "device_busy", "data_wait",
                                                                     "loader_cpu"]
    # the evidence names the metrics it rests on; their values are stated once, in ``metrics``
    assert {"memory.peak_frac", "device_busy", "data_wait_frac", "loader_cpu"} <= set(v["evidence_metrics"])
    assert not {"data_wait_frac", "loader_cpu", "memory_peak_frac"} & set(v["evidence"])
    assert m["data_wait_frac"] == pytest.approx(0.4) and m["loader_cpu"] == 0.9
    assert m["mfu"] is None and m["tokens_per_s"] is None      # unknown is null
    assert m["memory"]["peak_bytes"] == GB and m["memory"]["params_bytes"] is None
    assert report["ranks"][0]["rank"] == 0 and report["ranks"][0]["steps"] == 30


def test_straggler_marked_in_rank_rows():
    report = report_of(JOBS["imbalance"]())
    assert report["verdict"]["straggler_rank"] == 1
    assert [r["straggler"] for r in report["ranks"]] == [False, True]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_text_form_fits_80_columns_and_leads_with_the_verdict(name):
    report, text = report_and_text(JOBS[name]())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[1].startswith("VERDICT")
    assert report["verdict"]["headline"].split()[0] in text


def test_text_shows_evidence_path_findings_and_rank_rows():
    text = report_and_text(job(Rank(0, comm=0.052, exposed=0.05, pause=0.1, pause_every=5),
                               Rank(1, comm=0.002, exposed=0.0, pause=0.1, pause_every=5)))[1]
    assert "LOAD IMBALANCE" in text and "Evidence:" in text
    flat = " ".join(text.split())
    assert "Path: memory > device_busy > data_wait > comm_exposed > straggler > load_imbalance" in flat
    assert "Finding step_gaps" in text
    rows = [line for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert len(rows) == 2 and "straggler" in rows[1]


# -- recordings through the CLI ----------------------------------------------------------------
def _write_recording(directory: Path, recs: list[dict], *, tear: int = 0) -> Path:
    hello = recs[0]
    path = directory / (base_name(hello["job"], hello["rank"], hello["restart"], hello["pid"]) + ".pmrec")
    writer = RecordingWriter(path)
    enc = wire.Encoder()
    writer.write(b"".join(RecordingWriter.wrap(enc.frame(r)) for r in recs))
    writer.close()
    if tear:
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) - tear)
    return path


def test_report_on_a_multi_rank_dir_with_a_restarted_worker(tmp_path, capsys):
    _write_recording(tmp_path, records(Rank(0, comm=0.052, exposed=0.05), world=2, bye=True))
    _write_recording(tmp_path, records(Rank(1, pid=501, comm=0.002, exposed=0.0, steps=10), world=2))
    _write_recording(tmp_path, records(Rank(1, pid=777, restart=1, comm=0.002, exposed=0.0), world=2, bye=True))
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not list(REPORT_VALIDATOR.iter_errors(report))
    assert {r["rank"]: r["generation"] for r in report["ranks"]} == {0: 0, 1: 1}
    assert report["previous_generations"] == [{"rank": 1, "pid": 501, "restart": 0}]
    assert "rank_restarted" in [f["id"] for f in report["findings"]]
    assert report["verdict"]["bottleneck"] == "load_imbalance" and report["verdict"]["straggler_rank"] == 1
    assert report["ended"] is True and report["source"]["kind"] == "recording"

    assert cli.main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "rank 1 had an earlier process (pid 501" in text
    assert max(map(len, text.splitlines())) <= 80


def test_the_facade_over_the_records_gives_the_report_the_command_prints(tmp_path, capsys):
    recs = {0: records(Rank(0, comm=0.052, exposed=0.05), world=2, bye=True),
            1: records(Rank(1, comm=0.002, exposed=0.0), world=2, bye=True)}
    paths = {rank: _write_recording(tmp_path, r) for rank, r in recs.items()}
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    direct = Analysis.of_records([(str(paths[rank]), r) for rank, r in sorted(recs.items())]).report(
        source=printed["source"])
    assert direct == printed and direct["verdict"]["bottleneck"] == "load_imbalance"


def test_torn_recording_reports_the_intact_part_and_one_line_on_stderr(tmp_path, capsys):
    path = _write_recording(tmp_path, records(Rank(0, steps=30)), tear=7)
    assert cli.main(["report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "truncated" in err[0] and str(path) in err[0]
    assert report["problems"] and report["verdict"]["bottleneck"] == "healthy"
    assert report["metrics"]["steps"] == 30  # the last sample was torn, every step survived


@pytest.mark.parametrize("argv,message", [
    (["report", "/nonexistent/rec"], "no such file or directory"),
    (["report", "no-such-job"], "no job named 'no-such-job'"),
])
def test_bad_targets_are_one_line_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_recording_with_no_ranks_is_a_user_error(tmp_path, capsys):
    path = tmp_path / "x.r0.x0.p1.pmrec"
    RecordingWriter(path).close()
    assert cli.main(["report", str(path)]) == 2
    assert "no records" in capsys.readouterr().err


def test_corrupt_recording_reports_what_came_before_the_damage(tmp_path, capsys):
    path = _write_recording(tmp_path, records(Rank(0, steps=30)))
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF           # flip a byte three quarters in
    path.write_bytes(bytes(data))
    assert cli.main(["report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert len(captured.err.strip().splitlines()) == 1 and "corrupt" in captured.err
    assert 10 < report["metrics"]["steps"] < 30 and report["problems"]


def test_sub_millisecond_steps_with_most_time_between_them_are_not_plainly_healthy():
    """pytorch/examples regression/main.py: a tiny model, batches built in the loop between 0.2 ms steps. The
    time between steps recurs on every step: the loop's own work, 60% of the iteration, judged as a loss."""
    report, text = report_and_text(job(Rank(steps=60, dur=0.0005, gap=0.0003)))
    v = report["verdict"]
    assert (v["bottleneck"], v["severity"], v["loss"]) == ("loop_work", "crit", "loop")
    assert v["headline"].startswith("Loop work: 60% of each step is the loop's own work between steps")
    assert report["metrics"]["loop_frac"] == 0.6 and report["metrics"]["ettr"] == 1.0
    row = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert row.split()[4:6] == ["500µs", "200µs"] and "0ms" not in text and "0.0s" not in text
    assert "Window: 50 steps, 25ms." in text                      # 50 steps of 500µs
    assert "COMPUTE = step - time between steps - data wait - exposed comm" in text   # why 500µs - 300µs
    assert "Where the step goes (shares of one step: from a step's start to the next's" in " ".join(text.split())


def test_a_cuda_recording_without_utilization_is_never_healthy_ok(tmp_path, capsys):
    """The hello says CUDA, the samples carry no utilization (NVML NotSupported), 60 steps, no loader:
    busy is unknown, so the report lists it and says "not measured", never healthy with severity ok."""
    recs = records(Rank(0, steps=60), device="cuda", peak=100e12)
    for rec in recs:
        if rec["k"] == "sample":     # the GPU is listed, its utilization query answers NotSupported
            rec["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util": None, "throttle": []}]
    _write_recording(tmp_path, recs)
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert "device_busy" in verdict["unknown"]
    assert (verdict["bottleneck"], verdict["severity"]) == ("not_measured", "warn")


# -- the whole text, golden ------------------------------------------------------------------------
# Two CUDA ranks: communication exposed and its collectives counted (all-reduce and a broadcast),
# SM activity, a quarter of the parameters offloaded, the energy counter, rank 1's utilization not
# readable; rank 0 sent a module profile and a torch.profiler capture of steps 20-22.
_COMM = [{"k": "comm", "t": T0 + 0.05, "world_size": 2,
          "ops": [{"op": "all_reduce", "count": 100, "bytes": 100 << 20, "seconds": 9.0,
                   "busbytes": float(100 << 20)}]},
         {"k": "comm", "t": T0 + 2.0, "world_size": 2,
          "ops": [{"op": "all_reduce", "count": 120, "bytes": 120 << 20, "seconds": 9.4,
                   "busbytes": float(120 << 20)},
                  {"op": "broadcast", "count": 1, "bytes": 1 << 20, "seconds": 0.01}]}]
_WINDOW = {"t": T0 + 2.5, "id": 1, "steps": 3, "first_step": 20, "last_step": 22, "cost": {"thread_cpu_s": 0.25}}
_PROFILE = {"k": "profile", **_WINDOW, "depth": 1, "step_s": 0.1, "timer": "cuda_events", "modules": [
    {"name": "", "type": "Net", "depth": 0, "params": 2000, "calls": 1, "fwd_s": 0.03, "bwd_s": 0.05,
     "flops": 3e9, "fwd_flops": 1e9},
    {"name": "fc1", "type": "Linear", "depth": 1, "params": 1000, "calls": 1, "fwd_s": 0.02, "bwd_s": 0.04,
     "flops": 1e9, "fwd_flops": 3e8},
    {"name": "fc2", "type": "Linear", "depth": 1, "params": 1000, "calls": 1, "fwd_s": 0.01, "bwd_s": 0.01,
     "flops": 2e9, "fwd_flops": 7e8}]}
_CAPTURE = {"k": "capture", **_WINDOW, "wall_s": 0.45, "path": "/tmp/trace.json.gz", "top": [], "gaps": []}
_GPU = dict(comm=0.03, exposed=0.02, flops=2.2e12, tokens=4096, gpu_util=70.0, sm_active=0.5, gpu_power_w=300.0,
            offloaded=0.25, syncs=1.0, loader_workers=2, loader_cpu=0.3, data=0.005)
GPU_RANKS = (Rank(0, **_GPU, extra_records=_COMM + [_PROFILE, _CAPTURE]),
             Rank(1, **{**_GPU, "gpu_util": None, "gpu_why": {"util": "NVML: not supported"}}))


CPU_PREPROCESSING_TEXT = """\
perfmon report: synth, 2 rank(s), cpu
VERDICT  DATA PREPROCESSING [crit]
  Data preprocessing: 20% of each step waits for the loader; its 2 workers are
  CPU-bound (90% of a core each)
Fixes:
  - raise num_workers from 2 (up to the free cores)
  - move per-sample transforms to the device or batch them
  - preprocess offline (cache decoded/tokenized data)
  - persistent_workers=True so workers are not re-forked every epoch
Where the step goes (shares of one step: from a step's start to the next's; over
the last 29 steps, pauses over the whole run):
  data wait                               20%  time blocked waiting for the next
                                                batch
  exposed communication          not measured  collectives not instrumented
                                                (mon.watch(model=ddp_model))
  waiting, no measured cause              11%  training thread off CPU (thread
                                                CPU time)
  loop work between steps                  1%  time between steps that recurs
                                                every step (the window's median
                                                gap), from step boundaries
  pauses between steps                    33%  occasional time between steps
                                                (checkpoints, evaluation,
                                                stalls) over the whole run: 1 -
                                                ETTR
What fixing it buys (upper bounds unless marked; 2 rank(s), 0.0014 h so far):
  loss                         speedup  CPU-h/day   so far  cost/day
  data wait                       1.2×        9.6   0.0006        24
  waiting, no measured cause      1.1×        5.1   0.0003      12.7
  loop work between steps        1.01×       0.64        0       1.6
  pauses between steps            1.5×         16   0.0009        40
  every loss over threshold       2.8×         31   0.0018      76.7
Evidence:
  memory.peak_frac=6%, data_wait_frac=20%, loader_cpu=90%,
  step_time_median_s=120ms, comm_exposed_frac=n/a, device_busy=70%
Path: memory > device_busy > data_wait > loader_cpu > data_preprocessing

Window: 29 steps, 4.98s. Steps 30, step 120ms median, 397 samples/s
Busy 47% (thread_cpu)  data wait 20%  comm n/a (exposed n/a)  MFU n/a  ETTR 60%
loader CPU 90%
Memory (host): peak 1.1GB of 17.2GB (6%)
Step time p50/p90/p99/max: window 120ms/220ms/620ms/620ms; run
  119ms/119ms/620ms/620ms
Outlier: step 9 (rank 0) 600ms, 6.0x the median: time between steps nothing
  names (502ms between steps)
Outlier: step 19 (rank 0) 600ms, 6.0x the median: time between steps nothing
  names (502ms between steps)
Outlier: step 29 (rank 0) 600ms, 6.0x the median: time between steps nothing
  names (502ms between steps)
Outlier: step 9 (rank 1) 620ms, 5.2x the median: time between steps nothing
  names (502ms between steps)
Outlier: step 19 (rank 1) 620ms, 5.2x the median: time between steps nothing
  names (502ms between steps)
Finding device_idle: waiting, no measured cause also takes 11% of each step
Finding step_gaps: ETTR 60%: time between steps is lost to pauses or stalls
Finding step_outliers: step 9 took 600ms, 6.0x the median: time between steps
  nothing names (502ms between steps) (+4 more)
Problem: rank 1's recording is torn after 3.2 MB

perfmon cost (rank 0, 4.4s, 29 steps): 0.02% of the step, 0.41% of the process
    CPU
  training thread 20µs/step, at most 627µs/step with its GIL waits
  train  step calls: 20µs/step (0.02%)
  train  wrappers: n/a (not reported (a probe that does not calibrate its
    wrappers))
  thread sender: 0.004 cores (0.40%)
  memory queue: 0
  memory viewer queues: n/a (not reported)
  memory backfill: n/a (not reported)
  io     sent: 6.59kB/s
  io     recorded: n/a (not reported)
Note: rank 1 had an earlier process (pid 999, restart 0); rows show the newest
  generation

RANK GEN      PID  STEPS    STEP COMPUTE  BUSY  DATA  COMM  ETTR  NOTE
   0   0     1000     30   100ms     n/a   47%   20%   n/a   60%
   1   0     1001     30   120ms     n/a   53%    6%   n/a   71%
COMPUTE = step - time between steps - data wait - exposed comm
COMM = exposed (blocking) share
"""


HOST_WAIT_TEXT = """\
perfmon report: synth, 1 rank(s), cpu
VERDICT  HOST WAIT [warn]
  Host wait: 40% of each step waiting in time.sleep(0.04) at train.py:21 in
  fetch_from_service (off CPU 40% of the step, no other measured cause)
Fixes:
  - start with time.sleep(0.04) at train.py:21 in fetch_from_service: 40% ± 3%
    of each step waits there (key u: every line)
  - move the call off the training thread (a background thread or process
    feeding a queue), so the step never waits for it
  - overlap it: start the request before forward and collect its result after
    backward (concurrent.futures)
  - batch it: one call every N steps instead of one per step; cache what it
    returns
  - a lock or GIL contention with a background thread shows as waiting too: find
    the other holder
Where the step goes (shares of one step: from a step's start to the next's; over
the last 39 steps, pauses over the whole run):
  data wait                      not measured  no batch fetch timed
                                                (mon.loader(...), a DataLoader
                                                under perfmon run or a trainer
                                                callback) or no step timing yet
  exposed communication                    0%  time blocked in collectives
  waiting, no measured cause              40%  training thread off CPU (thread
                                                CPU time)
  loop work between steps                  0%  time between steps that recurs
                                                every step (the window's median
                                                gap), from step boundaries
  pauses between steps                     0%  occasional time between steps
                                                (checkpoints, evaluation,
                                                stalls) over the whole run: 1 -
                                                ETTR
What fixing it buys (upper bounds unless marked; 1 rank(s), 0.0011 h so far):
  loss                         speedup  CPU-h/day   so far
  waiting, no measured cause      1.7×        9.6   0.0004
  every loss over threshold       1.7×        9.6   0.0004
  money: no price per device-hour (PERFMON_PRICE_PER_DEVICE_HOUR or
    --price-per-device-hour)
Where the unexplained time goes (stack samples in steps and between them, share
of the iteration ± 95%):
   40% ± 3%   waiting in time.sleep(0.04) at train.py:21 in fetch_from_service
               (320 samples)
   60% ± 3%   busy in torch.nn.modules.module._call_impl at train.py:30 in main
               (480 samples)
Evidence:
  memory.peak_frac=6%, device_busy=60%, comm_exposed_frac=0%, loop_frac=0%,
  step_time_median_s=100ms, data_wait_frac=n/a, host_wait_frac=100%,
  where_top=/home/u/train.py:21
Path: memory > device_busy > data_wait > comm_exposed > loop > syncs >
  host_waiting > host_wait
  skipped data_wait: loader wait not measured (wrap the loader: mon.loader(...))
  skipped syncs: CPU job: there is no host-device sync to find

Window: 39 steps, 3.9s. Steps 40, step 100ms median, 320 samples/s
Busy 60% (thread_cpu)  data wait n/a  comm 0% (exposed 0%)  MFU n/a  ETTR 100%
loader CPU n/a
Memory (host): peak 1.1GB of 17.2GB (6%)
Step time p50/p90/p99/max: window 100ms/100ms/100ms/100ms; run
  99.2ms/99.2ms/99.2ms/100ms

perfmon cost: n/a: no probe cost in the window (a probe older than wire 1.4, or
    fewer than two samples)

RANK GEN      PID  STEPS    STEP COMPUTE  BUSY  DATA  COMM  ETTR  NOTE
   0   0     1000     40   100ms   100ms   60%   n/a    0%  100%
COMPUTE = step - time between steps - data wait - exposed comm
COMM = exposed (blocking) share
"""


STUCK_TEXT = """\
perfmon report: synth, 2 rank(s), cpu
VERDICT  STUCK [crit]
  Stuck: rank 1 never reached all_reduce #20 (train.py:10 in load_batch); 1 rank
  waits in it for 45s
Fixes:
  - the culprit's stack (key s in the TUI, verdict.stuck.where in the JSON) is
    where it left the collective order the other ranks follow
  - a rank that skips or adds a collective (a data-dependent branch, an uneven
    last batch) hangs the others: make every rank call the same collectives in
    the same order
  - the flight recorders (key s; verdict.stuck.calls) say whether each rank
    enqueued the call: one that never did stalled on the host, one that did
    waits on its device or the network
Where each rank is (innermost frame last):
  rank 0 (waiting)
    /home/u/train.py:11 in <module>
    /venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:325
      2 in all_reduce
  rank 1 (culprit)
    /home/u/train.py:30 in <module>
    /home/u/train.py:10 in load_batch
Where the step goes (shares of one step: from a step's start to the next's; over
the last 29 steps, pauses over the whole run):
  data wait                      not measured  no batch fetch timed
                                                (mon.loader(...), a DataLoader
                                                under perfmon run or a trainer
                                                callback) or no step timing yet
  exposed communication          not measured  collectives not instrumented
                                                (mon.watch(model=ddp_model))
  waiting, no measured cause     not measured  CPU job: the training thread's
                                                CPU time is not reported, so a
                                                wait inside the step cannot be
                                                told from work (busy is the time
                                                not lost to a measured cause)
  loop work between steps                  0%  time between steps that recurs
                                                every step (the window's median
                                                gap), from step boundaries
  pauses between steps                     0%  occasional time between steps
                                                (checkpoints, evaluation,
                                                stalls) over the whole run: 1 -
                                                ETTR

Window: 29 steps, 2.9s. Steps 30, step 100ms median, 640 samples/s
Busy 100% (step_accounting)  data wait n/a  comm n/a (exposed n/a)  MFU n/a
ETTR 6%  loader CPU n/a
Memory (host): peak 1.1GB of 17.2GB (6%)
Step time p50/p90/p99/max: window 100ms/100ms/100ms/100ms; run
  99.2ms/99.2ms/99.2ms/100ms
Finding step_gaps: ETTR 6%: time between steps is lost to pauses or stalls

perfmon cost: n/a: no probe cost in the window (a probe older than wire 1.4, or
    fewer than two samples)

RANK GEN      PID  STEPS    STEP COMPUTE  BUSY  DATA  COMM  ETTR  NOTE
   0   0     1000     30   100ms     n/a  100%   n/a   n/a    6%
   1   0     1001     30   100ms     n/a  100%   n/a   n/a    6%  straggler
COMPUTE = step - time between steps - data wait - exposed comm
COMM = exposed (blocking) share
"""


GPU_TEXT = """\
perfmon report: synth, 2 rank(s), cuda
VERDICT  COMMUNICATION [warn]
  Communication (DDP): exposed all-reduce is 20% of the step at 52.4MB/s busbw
Fixes:
  - overlap all-reduce with backward (DDP bucket_cap_mb; no sync inside
    backward)
  - gradient accumulation with no_sync() to communicate every N micro-batches
  - gradient compression hooks (bf16/fp16 compress, PowerSGD)
  - larger per-rank batch (about 32 samples per rank per step now)
  - check the interconnect: busbw should approach the link's bandwidth
Where the step goes (shares of one step: from a step's start to the next's; over
the last 29 steps, pauses over the whole run):
  data wait                                5%  time blocked waiting for the next
                                                batch
  exposed communication                   20%  time blocked in collectives
  device idle, no other cause    not measured  GPU busy in time not measured
                                                (rank 1: NVML: not supported)
  loop work between steps                  0%  time between steps that recurs
                                                every step (the window's median
                                                gap), from step boundaries
  pauses between steps                     0%  occasional time between steps
                                                (checkpoints, evaluation,
                                                stalls) over the whole run: 1 -
                                                ETTR
What fixing it buys (upper bounds unless marked; 2 rank(s), 0.0008 h so far):
  loss                         speedup  GPU-h/day   so far
  data wait                      1.05×        2.4   0.0001
  exposed communication           1.4×        9.6   0.0003
  every loss over threshold       1.4×         14   0.0005
  money: no price per device-hour (PERFMON_PRICE_PER_DEVICE_HOUR or
    --price-per-device-hour)
  energy in data wait: at most 3J/step, 46.9mJ/sample, 0.72 kWh/day
  energy in exposed communication: at most 12J/step, 188mJ/sample, 2.88 kWh/day
Evidence:
  device_busy=n/a, data_wait_frac=5%, comm_exposed_frac=20%, compute_ratio=100%,
  step_time_median_s=100ms, busbw=52.4MB/s, comm_op=all_reduce
Path: memory > device_busy > data_wait > comm_exposed > straggler >
  communication
  skipped memory: memory limit or peak not reported

Window: 29 steps, 2.9s. Steps 30, step 100ms median, 640 samples/s
Busy n/a  fill 71% (SM activity 50%)  data wait 5%  comm 30% (exposed 20%)  MFU
22%  ETTR 100%  loader CPU 30%
Busy not measured on rank 1: NVML: not supported
25% of the parameters' bytes live in host memory (CPU embedding or offload)
Step time p50/p90/p99/max: window 100ms/100ms/100ms/100ms; run
  99.2ms/99.2ms/99.2ms/100ms

Module profile of rank 0, steps 20-22 (3 steps, 100ms each while profiled, timer
  cuda_events)
forward 33.3GFLOP/s, backward 40GFLOP/s, no peak known (PERFMON_PEAK_TFLOPS
  gives one)
Cost: profiled steps took 100ms against 100ms before (+0%); steps outside the
  profile run no hook; its own thread used 250ms CPU
Marked ▶ fc1: 60% of the step at 16.7GFLOP/s

  MODULE                PARAMS   FLOPS %FLOP     FWD     BWD %STEP  FLOP/S %PEAK
  Net                       2k      3G  100%    30ms    50ms   80%   37.5G   n/a
▶   fc1                     1k      1G   33%    20ms    40ms   60%   16.7G   n/a
    fc2                     1k      2G   67%    10ms    10ms   20%    100G   n/a

torch.profiler captures (open the traces in Perfetto or HTA):
rank 0: steps 20-22 -> /tmp/trace.json.gz
  cost: captured steps took 100ms against 100ms before (0%); its own thread used
    250ms CPU

perfmon cost: n/a: no probe cost in the window (a probe older than wire 1.4, or
    fewer than two samples)

RANK GEN      PID  STEPS    STEP COMPUTE  BUSY  DATA  COMM  ETTR  NOTE
   0   0     1000     30   100ms    75ms   70%    5%   20%  100%
   1   0     1001     30   100ms    75ms   n/a    5%   20%  100%
COMPUTE = step - time between steps - data wait - exposed comm
COMM = exposed (blocking) share
"""


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def test_the_text_of_a_cpu_job_with_a_slow_loader_golden():
    """Two CPU ranks waiting 30 and 10 ms for CPU-bound loaders, pausing 0.5 s every 10 steps, the
    probe's cost sent, rank 1 restarted once, a torn recording, priced at 2.5 a device-hour."""
    ranks = [Rank(0, data=0.03, cpu=0.07, cpu_span="body", loader_workers=2, loader_cpu=0.9, gap=0.002,
                  probe_step_s=20e-6, probe_cores=0.004, pause=0.5, pause_every=10),
             Rank(1, data=0.01, cpu=0.09, cpu_span="body", loader_workers=2, loader_cpu=0.5, gap=0.002,
                  probe_step_s=20e-6, probe_cores=0.004, pause=0.5, pause_every=10, dur=0.12)]
    view = dataclasses.replace(job(*ranks).view(), problems=["rank 1's recording is torn after 3.2 MB"])
    text = render_text(view, evaluate(view), retired=[(1, {"pid": 999, "restart": 0})], price=2.5)
    assert _lines(text) == CPU_PREPROCESSING_TEXT.splitlines()


def test_the_text_of_a_host_wait_names_the_sampled_lines_golden():
    """The where header wraps like every other line (it was cut at 80 columns)."""
    assert _lines(report_and_text(job(waiting_job(wait=0.04)))[1]) == HOST_WAIT_TEXT.splitlines()


def test_the_text_of_a_stuck_job_shows_where_each_rank_is_golden():
    assert _lines(report_and_text(two_ranks([WAITER], [SLEEPER]))[1]) == STUCK_TEXT.splitlines()


def test_the_text_of_a_gpu_job_with_a_profile_and_a_capture_golden():
    """The capture's cost line wraps in 80 columns, keeping the thread's CPU (it was cut off)."""
    _, text = analysed(analysis_of(*GPU_RANKS, device="cuda", peak=100e12))
    assert _lines(text) == GPU_TEXT.splitlines()


def _gain(label: str, share: float | None, bound: float | None, per_day: float | None, hours: float | None,
          **fields) -> dict:
    return {"loss": label.replace(" ", "_"), "label": label, "share": share, "speedup_bound": bound,
            "per_day": per_day, "device_hours": hours, "basis": "bound", "price": None, "energy": None,
            "why_no_price": "no price per device-hour (a flag)", **fields}


BASIS = {"ranks": 4, "hours": 12.5, "device_unit": "GPU-h"}


def test_the_gains_section_marks_a_simulated_gain_and_leaves_out_losses_that_take_nothing():
    v = {"gains_basis": BASIS,
         "gains": [_gain("a slow worker", 0.2, 1.5, 19.2, 10.0, basis="simulated",
                         energy={"per_step_j": 12.0, "per_sample_j": None, "per_day_kwh": 2.88}),
                   _gain("loop work between steps", 0.0, 1.0, 0.0, 0.0), _gain("idle", None, None, None, None)],
         "gains_combined": _gain("every loss over threshold", 0.2, 1.5, 19.2, 10.0)}
    assert gains_lines(v) == [
        "What fixing it buys (upper bounds unless marked; 4 rank(s), 12 h so far):",
        "  loss                         speedup  GPU-h/day   so far",
        "  a slow worker                  ~1.5×         19       10",
        "  every loss over threshold       1.5×         19       10",
        "  ~ simulated: the step without the straggler, from the ranks' operations (not a",
        "    bound)",
        "  money: no price per device-hour (a flag)",
        "  energy in a slow worker: at most 12J/step, 2.88 kWh/day",
    ]
    assert gains_lines({}) == [] and gains_lines({"gains_basis": BASIS, "gains": v["gains"][1:]}) == []


def test_priced_gains_have_a_cost_column_and_no_money_line():
    price = {"per_device_hour": 2.0, "so_far": 20.0, "per_day": 38.4}
    v = {"gains_basis": BASIS, "gains": [_gain("data wait", 0.2, 1.5, 19.2, 10.0, price=price)], "gains_combined": None}
    assert gains_lines(v) == [
        "What fixing it buys (upper bounds unless marked; 4 rank(s), 12 h so far):",
        "  loss                         speedup  GPU-h/day   so far  cost/day",
        "  data wait                       1.5×         19       10      38.4",
    ]


def test_a_source_line_is_named_by_its_files_base_name_on_any_platform():
    from perfmon_analysis.report import _site
    assert _site("C:\\Users\\u\\train.py", 21) == "train.py:21" and _site("/home/u/train.py", 3) == "train.py:3"


def test_the_json_of_a_gpu_job_has_its_collectives_its_device_and_each_ranks_row():
    report, _ = analysed(analysis_of(*GPU_RANKS, device="cuda", peak=100e12))
    REPORT_VALIDATOR.validate(report)
    # 20 all-reduces of 1 MiB in 0.4 s between the two comm records, and the broadcast
    assert report["comm_ops"] == [
        {"op": "all_reduce", "count": 20, "bytes": 20 << 20, "seconds": 0.4, "busbw": 52428800.0,
         "algbw": 52428800.0},
        {"op": "broadcast", "count": 1, "bytes": 1 << 20, "seconds": 0.01, "busbw": None, "algbw": 104857600.0}]
    assert (report["world_size"], report["device"]) == (2, {"type": "cuda", "name": "Simulated GPU"})
    assert (report["as_of"], report["drops"], report["groups"], report["straggling"], report["overhead"]) == \
        (T0 + 3.0, 0, [], None, None)
    assert report["ranks"][1] == {
        "rank": 1, "host": "node1", "pid": 1001, "restart": 0, "generation": 0, "steps": 30,
        "step_time_median_s": 0.1, "step_time_p90_s": 0.1, "step_time_p99_s": 0.1, "step_time_max_s": 0.1,
        "run_step_time_p50_s": 0.099249, "run_step_time_p90_s": 0.099249, "run_step_time_p99_s": 0.099249,
        "run_step_time_max_s": 0.1, "compute_s": 0.075, "samples_per_s": 320.0, "tokens_per_s": 40960.0,
        "device_busy": None, "device_fill": None, "data_wait_frac": 0.05, "comm_frac": 0.3,
        "comm_exposed_frac": 0.2, "syncs_per_step": 1.0, "mfu": 0.22, "ettr": 1.0, "loader_cpu": 0.3,
        "loader_workers": 2, "overhead_step_frac": None, "overhead_cpu_frac": None, "straggler": False,
        "ended": False, "drops": 0}
    assert report["profile"]["marked"] == "fc1" and report["profile"]["thread_cpu_s"] == 0.25
    assert [(c["rank"], c["first_step"], c["path"]) for c in report["captures"]] == [(0, 20, "/tmp/trace.json.gz")]


def test_an_unresponsive_rank_is_listed_with_no_stack():
    model = two_ranks([WAITER])
    for state in model._streams.values():          # rank 1's newest record arrived 25 s ago
        state.recv_clock = 1000.0 - (25.0 if state.rank == 1 else 0.5)
    view = model.view(T0 + 30 * 0.1 + 45, clock=1000.0)
    text = _lines(render_text(view, evaluate(view)))
    at = text.index("Where each rank is (innermost frame last):")
    assert text[at + 1:at + 7] == [
        "  rank 0 (waiting)",
        "    /home/u/train.py:11 in <module>",
        "    /venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:325",
        "      2 in all_reduce",
        "  rank 1 (unresponsive)",
        "    (no stack: it sent nothing)"]


def test_a_sampled_line_between_steps_says_so():
    model = job(Rank(gap=0.03, extra_records=[between(T0, T0 + 3.0, [(33, "waiting", 20, 0)])]))
    text = _lines(render_text(model.view(), evaluate(model.view())))
    at = next(i for i, line in enumerate(text) if line.startswith("Where the unexplained time goes"))
    assert text[at + 2:at + 4] == ["   30% ± 2%   waiting between steps in train at train.py:33 in train (20",
                                   "               samples)"]


def test_without_loader_workers_the_loader_cpu_is_the_main_processes_share_of_its_wait():
    model = job(Rank(data=0.03, data_cpu=0.015))
    assert "  loader CPU 50% (main process)" in render_text(model.view(), evaluate(model.view()))
