"""perfmon's own cost: the probe accounts for itself (``probe.cost``), the analysis turns it into
shares of the step and of the CPU (``perfmon_analysis.overhead``), the report and the verdict's
findings show it, and a part that was not measured stays unknown."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.metrics import by_name
from perfmon_analysis.overhead import (
    STEP_BUDGET,
    STEP_CALLS,
    WRAPPER_PARTS,
    Overhead,
    finding,
    overhead,
    text_lines,
    worst,
)
from perfmon_analysis.readings import CostReading, cost_reading
from probe import core, cost, wire
from probe.recording import read_recording
from tests.helpers.reports import REPORT_SCHEMA, analysed
from tests.unit.verdict_synth import T0, Rank, job, records

ROOT = Path(__file__).resolve().parents[2]
STEP_S = 0.03       # each step's body spins this long: the probe's step calls (CPU-timed: ~5-80 µs
                    # on a loaded VM, where CPU clock reads are syscalls) stay well inside 1% of it
HOOK_S = 0.001      # the slow hook spins this long: 3% of the step, over the budget


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _spin_cpu(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time, however long a loaded machine makes that."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


HOOK_TIMES: list[float] = []     # each call of the slow hook, timed from inside it


def slow_end_hook(extras: dict, phases: dict) -> None:
    t0 = time.perf_counter()
    _spin(HOOK_S)
    HOOK_TIMES.append(time.perf_counter() - t0)


@dataclasses.dataclass
class Seen:
    """What the job saw of the probe's step calls, per step after the first tick (the steps the
    report's overhead covers): wall time outside each step's body (entering and leaving ``step()``,
    the hooks included), and the slow hook's own time. A loaded machine stretches both, and the
    probe's own account of them alike."""

    outside: float
    hook: float


def _run(tmp_path: Path, hook: bool) -> tuple[dict, dict, Seen]:
    """A probe recording 40 steps, its sampler ticked by hand after step 10 and at the end (the
    background sampler's period is 10 s, longer than the job); the report of the recording."""
    mon = core.Probe(job="cost", rank=0, local_rank=0, world_size=1, restart=0, record=tmp_path,
                     serve=False, sample_hz=0.1)
    outside: list[float] = []
    HOOK_TIMES.clear()
    try:
        if hook:
            mon.add_step_hooks(end=slow_end_hook)
        for i in range(40):
            t0 = time.perf_counter()
            with mon.step():
                t1 = time.perf_counter()
                _spin(STEP_S)
                t2 = time.perf_counter()
            outside.append(time.perf_counter() - t2 + t1 - t0)
            if i == 9:
                mon.sampler.tick()
        last = mon.sampler.sample_once()
    finally:
        mon.close()
    records = read_recording(mon.record_path).records
    report, text = analysed(Analysis.of_records([("s", records)]))
    report["text"] = text      # the text report beside the JSON, for the tests that read both
    after = outside[10:]
    return report, last, Seen(sum(after) / len(after), sum(HOOK_TIMES[10:]) / len(after) if hook else 0.0)


def test_a_slow_step_hook_is_the_finding_and_named(tmp_path):
    report, last, seen = _run(tmp_path, hook=True)
    name = f"{__name__}.slow_end_hook"
    assert dict(last["cost"]["hooks"]).keys() == {name}
    jsonschema.validate(report, REPORT_SCHEMA)
    found = [f for f in report["findings"] if f["id"] == "perfmon_cost"]
    assert len(found) == 1 and found[0]["part"] == name and found[0]["kind"] == "train"
    parts = {p["part"]: p for p in report["overhead"]["parts"]}
    # the planted truth: the hook's time per step is its spin as the hook itself timed it (longer
    # where the machine preempts it), within what the job saw outside the step bodies: none of the
    # step's own 30 ms
    assert HOOK_S <= seen.hook <= parts[name]["value"] <= seen.outside
    step = report["metrics"]["step_time_median_s"]
    assert STEP_S + HOOK_S <= step and parts[name]["share"] == pytest.approx(parts[name]["value"] / step, rel=0.01)
    assert report["overhead"]["steps"] == 30
    assert report["metrics"]["overhead_step_frac"] == pytest.approx(report["overhead"]["step_frac"], abs=1e-6)
    assert name in report["text"]


def test_within_budget_there_is_no_finding_and_the_step_calls_cost_microseconds(tmp_path):
    report, last, seen = _run(tmp_path, hook=False)
    o = report["overhead"]
    calls = next(p for p in o["parts"] if p["part"] == STEP_CALLS)
    # the step calls: what the job saw outside its step bodies at most, nothing of the spin. On a
    # quiet machine that is microseconds; on a loaded one, preempted inside the calls, more: the
    # finding follows the measured share, whatever it is
    assert 0 < calls["value"] <= seen.outside
    assert o["step_frac"] is not None
    costs = [f for f in report["findings"] if f["id"] == "perfmon_cost"]
    finding = [f for f in costs if f["kind"] == "train"]
    assert bool(finding) == (o["step_frac"] > STEP_BUDGET), (o["step_frac"], costs)
    if seen.outside < STEP_BUDGET * STEP_S / 2:      # the job saw its steps' calls well within the budget
        assert not finding
    if not finding:   # the probe's threads have a budget of their own, which a loaded machine can pass
        assert bool(costs) == (o["cpu_frac"] > o["cpu_budget"] and o["cores"] > o["cpu_floor_cores"]), (o, costs)
    # step()'s call and with protocol: one a step at its calibrated cost, inside the training-thread total
    calibrated = last["cost"]["wrappers"]["step"][1]
    wrapped = next(p for p in o["parts"] if p["part"] == WRAPPER_PARTS["step"])
    assert wrapped["value"] == pytest.approx(calibrated, abs=1e-6) and 0 < calibrated
    assert "calibrated at start-up" in wrapped["source"]
    assert o["train_per_step_s"] == pytest.approx(calls["value"] + wrapped["value"], abs=2e-6)   # each rounded
    assert not {WRAPPER_PARTS["loader"], WRAPPER_PARTS["phase"]} & {p["part"] for p in o["parts"]}   # not used
    threads = {p["part"] for p in o["parts"] if p["kind"] == "thread"}
    assert {"sender", "sampler", "stall"} <= threads
    assert o["cpu_frac"] is not None and 0 < o["cpu_frac"] < 1
    recorded = next(p for p in o["parts"] if p["part"] == "recorded")
    assert recorded["value"] > 0


def _reading(t: float, train_s: float, steps: int, threads: dict | None, why: dict | None = None) -> CostReading:
    rec = {"train_s": train_s, "train_steps": steps, "hooks": {}, "threads": threads, "process_cpu": t * 2,
           "queue_items": 3, "why": why or {}}
    reading = cost_reading(rec, t)
    assert reading is not None
    return reading


def test_each_wrapper_call_is_counted_and_sent_with_its_calibrated_cost():
    mon = core.Probe(job="wrap", rank=0, local_rank=0, world_size=1, restart=0, record=None, serve=False,
                     sample_hz=0.1)
    try:
        for _ in mon.loader(range(7)):           # 7 batches, 5 steps, 3 phases in each of 4 steps
            with mon.step():
                if mon.steps < 4:
                    for name in ("forward", "backward", "forward"):
                        with mon.phase(name):
                            pass
            if mon.steps == 5:
                break
        mon.begin_step()                         # a zero-code step: not a step() call
        mon.add_step(1.0, 1.1)
        sent = mon.sampler.sample_once()["cost"]
    finally:
        mon.close()
    per_call = mon._wrapper_cost
    assert per_call is not None and per_call.keys() == {"step", "loader", "phase"}
    assert sent["wrappers"] == {"step": [5, per_call["step"]], "loader": [5, per_call["loader"]],
                                "phase": [12, per_call["phase"]]}
    assert sent["train_steps"] == 6
    assert all(seconds > 0 for seconds in per_call.values())


def test_the_calibration_charges_what_the_wrappers_clock_reads_do_not_see(monkeypatch):
    """A fake clock that moves 1 µs at each read and never in between: every wrapper's time lies
    between its reads. ``step()`` counts its enter and exit (one interval each, 2 µs) and misses
    the two around them; ``loader()`` and ``phase()`` count nothing live, their two each missed."""
    ticks = iter(range(10**9))
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 1e-6)
    calibrated = cost.calibrate(core.Probe._scratch)
    assert calibrated["step"] == pytest.approx(2e-6)
    assert calibrated["phase"] == pytest.approx(2e-6)
    assert calibrated["loader"] == pytest.approx(2e-6, abs=0.01e-6)    # and the last, empty fetch


def test_wrapper_parts_add_to_the_training_thread_cost_and_an_older_probe_leaves_them_unknown():
    def reading(t: float, train_s: float, steps: int, wrappers: dict | None, sender: float = 0.0) -> CostReading:
        rec = {"train_s": train_s, "train_steps": steps, "hooks": {}, "threads": {"sender": sender},
               "process_cpu": t, "queue_items": 0, "why": {}}
        if wrappers is not None:
            rec["wrappers"] = wrappers
        reading = cost_reading(rec, t)
        assert reading is not None
        return reading

    a = reading(10.0, 0.001, 100, {"step": [100, 0.5e-6], "loader": [100, 0.3e-6], "phase": [200, 0.5e-6]})
    b = reading(12.0, 0.001 + 100e-6, 200, {"step": [200, 0.5e-6], "loader": [200, 0.3e-6], "phase": [400, 0.5e-6]},
                sender=300e-6)
    o = overhead(0, [a, b], 0.001)
    assert o is not None
    parts = {p.name: p for p in o.parts if p.kind == "train"}
    assert parts[STEP_CALLS].value == pytest.approx(1e-6)                   # its clock reads' 100 µs / 100 steps
    assert parts["step() call"].value == pytest.approx(0.5e-6)
    assert parts["loader()"].value == pytest.approx(0.3e-6)
    assert parts["phase()"].value == pytest.approx(1.0e-6)                 # two uses a step
    assert parts["phase()"].source == "calls counted x 0.50µs a call, calibrated at start-up"
    assert o.train_per_step_s == pytest.approx(2.8e-6) and o.step_frac == pytest.approx(2.8e-3)
    # at most: as if all of the sender's 3 µs a step had kept the GIL from the training thread
    assert o.train_bound_per_step_s == pytest.approx(5.8e-6)
    assert "training thread 3µs/step, at most 6µs/step with its GIL waits" in "\n".join(text_lines(o.as_json()))
    older = overhead(0, [reading(10.0, 0.001, 100, None), reading(12.0, 0.0011, 200, None)], 0.001)
    assert older is not None and older.train_per_step_s == pytest.approx(1e-6)
    unknown = next(p for p in older.parts if p.name == "wrappers")
    assert unknown.value is None and unknown.why


def test_unmeasured_parts_are_unknown_with_why_never_zero():
    why = {"threads": "no per-thread CPU clock on this platform", "recorded_bytes": "not recording"}
    o = overhead(0, [_reading(10.0, 0.0, 0, None, why), _reading(12.0, 0.002, 100, None, why)], 0.01)
    assert o is not None and o.cpu_frac is None and o.train_bound_per_step_s is None
    parts = {p.name: p for p in o.parts}
    assert parts["threads"].value is None and parts["threads"].why == why["threads"]
    assert parts["recorded"].value is None and parts["recorded"].why == "not recording"
    assert parts["sent"].value is None
    assert o.step_frac == pytest.approx(0.002 / 100 / 0.01)
    # one sample is no interval: the whole cost is unknown, and no finding is made of it
    assert overhead(0, [_reading(10.0, 0.0, 0, {})], 0.01) is None
    assert finding(None) is None


def test_a_thread_over_the_cpu_budget_is_named():
    before = _reading(10.0, 0.0, 0, {"sender": 0.0, "where": 1.0})
    after = _reading(12.0, 0.0001, 100, {"sender": 0.01, "where": 1.5})   # where: 0.5 of 4 process CPU s
    found = finding(overhead(0, [before, after], 0.02))
    assert found is not None and found["part"] == "where" and found["kind"] == "thread"


def test_a_large_share_of_an_idle_jobs_cpu_is_no_finding_below_the_floor():
    # a job that waits on its loader used 0.02 s of CPU in 2 s; perfmon's sampler 0.008 s of it
    before = _reading(10.0, 0.0, 0, {"sampler": 0.0})
    after = _reading(12.0, 0.0001, 100, {"sampler": 0.008})
    idle = dataclasses.replace(before, process_cpu=1.0), dataclasses.replace(after, process_cpu=1.02)
    o = overhead(0, idle, 0.5)
    assert o is not None and o.cpu_frac == pytest.approx(0.0081 / 0.02) and o.cores == pytest.approx(0.0081 / 2)
    assert not o.over_budget and finding(o) is None


def _cost(t: float | None, **fields: object) -> CostReading:
    """A sample's ``cost`` at ``t`` with just ``fields``, read as the analysis reads it."""
    reading = cost_reading(fields, t)
    assert reading is not None
    return reading


# a rank's cost readings 10 s and 100 steps apart: the step calls' 20 ms, four wrappers (one never
# called in the window, one new in it, one calibrated at 0 s a call), three step hooks (one idle,
# one new), three threads (one new, and their names' order is not their totals'), memory and bytes
WINDOW = (
    _cost(100.0, train_s=0.010, train_steps=100, hooks={"h.fast": 0.001, "h.slow": 0.002, "h.idle": 0.004},
          threads={"sender": 0.1, "where": 0.5}, process_cpu=10.0, queue_items=9, viewer_bytes=0,
          sent_bytes=1000, recorded_bytes=5000, wrappers={"step": [100, 1e-6], "custom": [0, 40e-6]}),
    _cost(110.0, train_s=0.030, train_steps=200,
          hooks={"h.fast": 0.0015, "h.slow": 0.007, "h.idle": 0.004, "h.new": 0.001},
          threads={"where": 1.5, "sender": 0.3, "fresh": 2.0}, process_cpu=30.0, queue_items=4, viewer_bytes=2048,
          sent_bytes=21000, recorded_bytes=5000,
          wrappers={"step": [200, 1e-6], "phase": [0, 0.5e-6], "loader": [1, 0.0], "custom": [3, 40e-6]}),
)


def _part(name: str, kind: str, value: float | None, unit: str, share: float | None, source: str,
          why: str | None = None) -> dict:
    return {"part": name, "kind": kind, "value": value, "unit": unit, "share": share, "source": source, "why": why}


def test_the_cost_of_a_window_is_each_part_per_step_and_per_core():
    o = overhead(3, WINDOW, 0.01)
    assert o is not None
    train, hook, thread = ("training-thread clock reads around the probe's step calls",
                           "clock reads around each step hook", "the thread's CPU clock")
    calls = "calls counted x {} a call, calibrated at start-up"
    # training thread: 20 ms + the wrappers' 100 x 1 µs + 1 x 0 + 3 x 40 µs = 20.22 ms over 100 steps;
    # the step calls' own part is what is left after the hooks' and the wrappers' parts
    assert o.as_json() == {
        "rank": 3, "window_s": 10.0, "steps": 100,
        "step_frac": 0.02022, "cpu_frac": 0.161011, "train_per_step_s": 0.000202,
        "train_bound_per_step_s": 0.032202, "cores": 0.322022,
        "step_budget": 0.01, "cpu_budget": 0.05, "cpu_floor_cores": 0.05,
        "parts": [
            _part("step calls", "train", 0.000135, "s/step", 0.0135, train),
            _part("step() call", "train", 1e-06, "s/step", 0.0001, calls.format("1.00µs")),
            _part("loader()", "train", 0.0, "s/step", 0.0, calls.format("0.00µs")),
            _part("custom()", "train", 1e-06, "s/step", 0.00012, calls.format("40.00µs")),   # 1.2 µs, to 6 places
            _part("h.slow", "train", 5e-05, "s/step", 0.005, hook),       # hooks: costliest first
            _part("h.new", "train", 1e-05, "s/step", 0.001, hook),
            _part("h.fast", "train", 5e-06, "s/step", 0.0005, hook),
            _part("fresh", "thread", 0.2, "cores", 0.1, thread),           # threads: by name
            _part("sender", "thread", 0.02, "cores", 0.01, thread),
            _part("where", "thread", 0.1, "cores", 0.05, thread),
            _part("queue", "memory", 4, "items", None, "the probe's queue and buffer sizes"),
            _part("viewer queues", "memory", 2048, "bytes", None, "the probe's queue and buffer sizes"),
            _part("backfill", "memory", None, "bytes", None, "the probe's queue and buffer sizes", "not reported"),
            _part("sent", "io", 2000.0, "bytes/s", None, "the sender's byte counters"),
            _part("recorded", "io", 0.0, "bytes/s", None, "the sender's byte counters"),   # unchanged: 0, known
        ]}


def test_the_text_section_lists_every_part_with_its_share_and_why():
    o = overhead(3, WINDOW, 0.01)
    assert o is not None
    assert text_lines(o.as_json()) == [
        "perfmon cost (rank 3, 10s, 100 steps): 2.02% of the step, 16.10% of the process CPU",
        "  training thread 202µs/step, at most 32.2ms/step with its GIL waits",
        "  train  step calls: 135µs/step (1.35%)",
        "  train  step() call: 1µs/step (0.01%)",
        "  train  loader(): 0µs/step (0.00%)",
        "  train  custom(): 1µs/step (0.01%)",
        "  train  h.slow: 50µs/step (0.50%)",
        "  train  h.new: 10µs/step (0.10%)",
        "  train  h.fast: 5µs/step (0.05%)",
        "  thread fresh: 0.2 cores (10.00%)",
        "  thread sender: 0.02 cores (1.00%)",
        "  thread where: 0.1 cores (5.00%)",
        "  memory queue: 4",
        "  memory viewer queues: 2.0kB",
        "  memory backfill: n/a (not reported)",
        "  io     sent: 2kB/s",
        "  io     recorded: 0B/s",
    ]
    assert text_lines(None) == ["perfmon cost: n/a: no probe cost in the window (a probe older than wire 1.4, "
                                "or fewer than two samples)"]


def test_over_the_step_budget_the_finding_names_the_costliest_training_thread_part():
    assert finding(overhead(3, WINDOW, 0.01)) == {
        "id": "perfmon_cost", "share": 0.02022, "part": "step calls", "kind": "train", "rank": 3,
        "message": "perfmon costs 2.0% of each step on rank 3 (budget 1%), most in step calls (135µs/step)"}


def test_over_the_cpu_budget_the_finding_names_the_busiest_thread():
    before = _cost(10.0, train_s=0.0, train_steps=0, threads={"sender": 0.0, "where": 1.0, "idle": 0.5},
                   process_cpu=20.0)
    after = _cost(12.0, train_s=0.0001, train_steps=100, threads={"sender": 0.01, "where": 1.5, "idle": 0.5},
                  process_cpu=24.0)
    # (0.01 + 0.5 + 0.0001) CPU s of the process's 4 over 2 s; the idle thread used none
    assert finding(overhead(2, [before, after], 0.02)) == {
        "id": "perfmon_cost", "share": 0.127525, "part": "where", "kind": "thread", "rank": 2,
        "message": "perfmon uses 12.8% of the process's CPU on rank 2 (0.255 cores; budget 5%), "
                   "most in its where thread (0.25 cores)"}


def test_a_window_without_steps_leaves_the_step_parts_unknown_with_why():
    why = {"wrappers": "the calibration failed", "sent_bytes": "no viewer connected"}
    a = _cost(10.0, train_s=0.001, train_steps=50, hooks={"h": 0.001}, sent_bytes=100, why=why)
    b = _cost(12.0, train_s=0.002, train_steps=50, hooks={"h": 0.002}, why=why)
    o = overhead(0, [a, b], 0.01)
    assert o is not None
    assert (o.steps, o.step_frac, o.train_per_step_s, o.cpu_frac, o.cores, o.train_bound_per_step_s) == \
        (0, None, None, None, None, None)
    assert [(p.name, p.kind, p.value, p.unit, p.source, p.why) for p in o.parts] == [
        ("step calls", "train", None, "s/step", "training-thread clock reads around the probe's step calls",
         "no steps between the samples"),
        ("wrappers", "train", None, "s/step", "calls counted x the cost a call, calibrated at start-up",
         "the calibration failed"),
        ("threads", "thread", None, "cores", "the thread's CPU clock", "the probe sent no thread CPU times"),
        ("queue", "memory", None, "items", "the probe's queue and buffer sizes", "not reported"),
        ("viewer queues", "memory", None, "bytes", "the probe's queue and buffer sizes", "not reported"),
        ("backfill", "memory", None, "bytes", "the probe's queue and buffer sizes", "not reported"),
        ("sent", "io", None, "bytes/s", "the sender's byte counters", "no viewer connected"),
        ("recorded", "io", None, "bytes/s", "the sender's byte counters", "not reported"),
    ]
    assert not o.over_budget and finding(o) is None
    # where the probe says why it did not measure a part, that is the part's why
    said = {"train": "the step calls are not timed", "backfill": "no backfill buffer"}
    o = overhead(0, [dataclasses.replace(a, why=tuple(said.items())), dataclasses.replace(b, why=tuple(said.items()))],
                 0.01)
    assert o is not None
    whys = {p.name: p.why for p in o.parts}
    assert (whys[STEP_CALLS], whys["backfill"]) == (said["train"], said["backfill"])


def test_without_the_training_threads_total_the_threads_cost_is_still_known():
    a = _cost(10.0, train_s=0.001, train_steps=50, threads={"sender": 0.0}, process_cpu=1.0)
    b = _cost(12.0, train_steps=150, threads={"sender": 0.2}, process_cpu=3.0)
    o = overhead(0, [a, b], 0.01)
    assert o is not None and o.steps == 100
    assert (o.train_per_step_s, o.step_frac, o.train_bound_per_step_s) == (None, None, None)
    assert o.cores == pytest.approx(0.1) and o.cpu_frac == pytest.approx(0.1)    # 0.2 CPU s of 2 s, of 2 CPU s


def test_without_the_process_cpu_threads_have_cores_but_no_share():
    a = _cost(10.0, train_s=0.0, train_steps=0, threads={"sender": 0.0}, process_cpu=1.0)
    b = _cost(12.0, train_s=0.001, train_steps=100, threads={"sender": 0.2})
    o = overhead(0, [a, b], 0.01)
    assert o is not None and o.cpu_frac is None and o.cores == pytest.approx(0.1005)
    sender = next(p for p in o.parts if p.name == "sender")
    assert sender.value == pytest.approx(0.1) and sender.share is None


def test_without_a_median_step_no_part_has_a_share_of_the_step():
    o = overhead(3, WINDOW, None)
    assert o is not None and o.step_frac is None and o.train_per_step_s == pytest.approx(202.2e-6)
    train = [p for p in o.parts if p.kind == "train"]
    assert len(train) == 7 and all(p.share is None and p.value is not None for p in train)


def test_the_window_runs_from_its_first_timed_reading_to_its_last():
    def at(t: float | None, steps: int) -> CostReading:
        return _cost(t, train_s=steps * 1e-5, train_steps=steps, threads={}, process_cpu=0.0 if t is None else t)

    o = overhead(0, [at(None, 0), at(0.0, 10), at(1.0, 20), at(4.0, 110), at(None, 500)], 0.001)
    assert o is not None and (o.seconds, o.steps) == (4.0, 100) and o.train_per_step_s == pytest.approx(1e-5)
    assert overhead(0, [at(5.0, 10), at(5.0, 20)], 0.001) is None        # no time between them
    assert overhead(0, [at(5.0, 10), at(4.0, 20)], 0.001) is None        # out of order


def test_the_jobs_cost_is_the_rank_with_the_largest_share_of_its_step_then_of_its_cpu():
    def rank(n: int, step_frac: float | None, cpu_frac: float | None) -> Overhead:
        return Overhead(rank=n, seconds=1.0, steps=1, step_frac=step_frac, cpu_frac=cpu_frac,
                        train_per_step_s=None, parts=())

    assert worst([None, rank(0, None, 0.9), rank(1, 0.001, None), None]).rank == 1
    assert worst([rank(0, 0.002, None), rank(1, 0.002, 0.0)]).rank == 1
    assert worst([rank(0, None, 0.5), rank(1, None, None)]).rank == 0
    assert worst([rank(0, 0.1, 0.1), rank(1, 0.3, 0.01), rank(2, 0.2, 0.5)]).rank == 1
    assert worst([None]) is None and worst([]) is None


def test_a_window_shorter_than_the_sample_period_still_has_the_cost(tmp_path):
    """Steps of a fraction of a millisecond: the window's 50 steps fit between two samples, and the
    cost is the rate between the last two."""
    mon = core.Probe(job="fast", rank=0, local_rank=0, world_size=1, restart=0, record=tmp_path,
                     serve=False, sample_hz=0.1)
    try:
        for i in range(400):
            with mon.step():
                _spin(0.0002)
            if i == 9:
                mon.sampler.tick()
        mon.sampler.sample_once()
    finally:
        mon.close()
    report = Analysis.of_records([("s", read_recording(mon.record_path).records)]).report()
    assert report["window"]["steps"] == 50
    assert report["overhead"] is not None and report["overhead"]["steps"] == 390
    assert report["metrics"]["overhead_step_frac"] is not None


def test_profile_and_capture_windows_report_their_cost_in_the_same_terms():
    recs = records(Rank(steps=40, dur=0.1))
    for rec in recs:     # steps 30-32 ran under the window: 50 ms slower each
        if rec["k"] == "step" and 30 <= rec["step"] <= 32:
            rec["dur"] = 0.15
    window = {"t": T0 + 4.5, "id": 1, "steps": 3, "first_step": 30, "last_step": 32, "cost": {"thread_cpu_s": 0.25}}
    recs += [{"k": "capture", **window, "wall_s": 0.45, "path": "/tmp/trace.json.gz", "top": [], "gaps": []},
             {"k": "profile", **window, "depth": 1, "step_s": 0.15, "modules": []}]
    report, text = analysed(Analysis.of_records([("s", recs)]))
    jsonschema.validate(report, REPORT_SCHEMA)
    for shown in (report["captures"][0], report["profile"]):
        assert shown["train_per_step_s"] == pytest.approx(0.05)
        assert shown["overhead"] == pytest.approx(0.5)
        assert shown["thread_cpu_s"] == 0.25
    assert "its own thread used 250ms CPU" in text


def _header(rank: Rank) -> tuple[str, set[str]]:
    """The header's text for a job of ``rank``, and the styles of its "perfmon cost" value."""
    from tui.app.widgets.header import HeaderBar
    bar = HeaderBar()
    bar._view = job(rank).view()
    text = bar.render()
    at = text.plain.find("perfmon cost ")
    styles = {str(s.style) for s in text.spans
              if at >= 0 and s.start >= at + len("perfmon cost ") and s.start < at + 30}
    return text.plain, styles


def test_the_header_shows_the_cost_warned_over_budget_and_nothing_when_unknown():
    from tui.app.widgets import glyphs
    within, styles = _header(Rank(steps=30, probe_step_s=20e-6, probe_cores=0.004))
    assert "perfmon cost 0.02% of step, 0.42% of CPU" in within and not any(glyphs.WARN in s for s in styles)
    over, styles = _header(Rank(steps=30, probe_step_s=0.005, probe_cores=0.004))
    assert "perfmon cost 5.00% of step" in over and any(glyphs.WARN in s for s in styles)
    assert "perfmon cost" not in _header(Rank(steps=30))[0]      # an older probe: not shown, never 0


def test_the_cost_rides_in_samples_of_wire_1_4():
    assert wire.PROTO >= (1, 4)
    rec = {"k": "sample", "t": 1.0, "cost": {"train_s": 0.1}}
    assert wire.validate(rec) is rec
    with pytest.raises(wire.ProtocolError):
        wire.validate({"k": "sample", "t": 1.0, "cost": [1]})
    assert by_name("overhead_step_frac").prometheus == "perfmon_overhead_step_ratio"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU clocks are Linux's")
def test_a_finished_thread_keeps_its_cpu_in_its_names_total():
    import threading
    spun, done = threading.Event(), threading.Event()

    def work() -> None:
        _spin_cpu(0.05)      # busy: 50 ms of CPU on this thread's clock
        spun.set()
        done.wait(10)

    totals = cost.ThreadTotals()
    thread = threading.Thread(target=work, name="perfmon-test-window")
    thread.start()
    spun.wait(10)
    while_alive = totals.read()["test-window"]
    done.set()
    thread.join()
    assert while_alive >= 0.05
    assert totals.read()["test-window"] == while_alive          # kept after it exits, never dropped
    # join() returns when Python is done with the thread; the kernel's thread can outlive it briefly
    # (seen on a 6.18 kernel): wait for the kernel to drop it, then its clock must read as gone
    task = Path(f"/proc/self/task/{thread.native_id}")
    deadline = time.monotonic() + 10
    while task.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not task.exists()
    assert cost.thread_cpu(thread.native_id) is None            # its clock is gone: an error, not a crash


def _proc_cpu(pid: int, tid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


JOB = """
import json, sys, threading, time
import torch
from probe import core
mon = core.Probe(job="cpu", rank=0, local_rank=0, world_size=1, restart=0, record=None, serve=True, sample_hz=10)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
end = time.time() + 3
while time.time() < end:
    with mon.step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
ids = {t.name[len("perfmon-"):]: t.native_id for t in threading.enumerate() if t.name.startswith("perfmon-")}
for _ in range(2):      # a reading before the test reads /proc, and one after
    rec = mon.sampler.sample_once()
    print(json.dumps({"threads": rec["cost"]["threads"], "ids": ids}), flush=True)
    sys.stdin.readline()
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU clocks and /proc are Linux's")
def test_thread_cpu_agrees_with_proc_read_from_outside():
    job = subprocess.Popen([sys.executable, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           cwd=ROOT, env={**os.environ, "PERFMON_WHERE_HZ": "200"})
    try:
        said = json.loads(job.stdout.readline())
        outside = {name: _proc_cpu(job.pid, tid) for name, tid in said["ids"].items()}
        job.stdin.write("\n")
        job.stdin.flush()
        after = json.loads(job.stdout.readline())
    finally:
        job.communicate("\n", timeout=30)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert set(outside) <= set(said["threads"]) and set(outside) <= set(after["threads"])
    assert outside["where"] > 2 * tick      # a thread that used measurable CPU is among them
    for name, seconds in outside.items():
        # read from outside between the probe's two readings, however long a loaded machine made
        # that: /proc counts whole clock ticks (utime and stime apart, each truncated)
        assert said["threads"][name] - 2 * tick <= seconds <= after["threads"][name] + 2 * tick, name
