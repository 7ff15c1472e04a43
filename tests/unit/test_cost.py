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
from perfmon_analysis.overhead import STEP_BUDGET, STEP_CALLS, WRAPPER_PARTS, finding, overhead, text_lines
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
