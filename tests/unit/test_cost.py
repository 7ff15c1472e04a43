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

from perfmon_analysis.analysis import Analysis, render_text
from perfmon_analysis.metrics import by_name
from perfmon_analysis.overhead import STEP_BUDGET, STEP_CALLS, finding, overhead
from perfmon_analysis.readings import CostReading, cost_reading
from probe import core, cost, wire
from probe.recording import read_recording
from tests.unit.verdict_synth import T0, Rank, job, records

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tui" / "schemas" / "report.schema.json").read_text())
STEP_S = 0.03       # each step's body spins this long: the probe's step calls (CPU-timed: ~5-80 µs
                    # on a loaded VM, where CPU clock reads are syscalls) stay well inside 1% of it
HOOK_S = 0.001      # the slow hook spins this long: 3% of the step, over the budget


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def slow_end_hook(extras: dict, phases: dict) -> None:
    _spin(HOOK_S)


def _run(tmp_path: Path, hook: bool) -> tuple[dict, dict]:
    """A probe recording 40 steps, its sampler ticked by hand after step 10 and at the end (the
    background sampler's period is 10 s, longer than the job); the report of the recording."""
    mon = core.Probe(job="cost", rank=0, local_rank=0, world_size=1, restart=0, record=tmp_path,
                     serve=False, sample_hz=0.1)
    try:
        if hook:
            mon.add_step_hooks(end=slow_end_hook)
        for i in range(40):
            with mon.step():
                _spin(STEP_S)
            if i == 9:
                mon.sampler.tick()
        last = mon.sampler.sample_once()
    finally:
        mon.close()
    records = read_recording(mon.record_path).records
    report = Analysis.of_records([("s", records)]).report()
    return report, last


def test_a_slow_step_hook_is_the_finding_and_named(tmp_path):
    report, last = _run(tmp_path, hook=True)
    name = f"{__name__}.slow_end_hook"
    assert dict(last["cost"]["hooks"]).keys() == {name}
    jsonschema.validate(report, SCHEMA)
    found = [f for f in report["findings"] if f["id"] == "perfmon_cost"]
    assert len(found) == 1 and found[0]["part"] == name and found[0]["kind"] == "train"
    parts = {p["part"]: p for p in report["overhead"]["parts"]}
    # the planted truth: the hook's time per step is its spin (longer where the machine preempts it),
    # and none of the step's own 30 ms
    assert HOOK_S <= parts[name]["value"] < STEP_S / 2
    step = report["metrics"]["step_time_median_s"]
    assert STEP_S + HOOK_S <= step and parts[name]["share"] == pytest.approx(parts[name]["value"] / step, rel=0.01)
    assert report["overhead"]["steps"] == 30
    assert report["metrics"]["overhead_step_frac"] == pytest.approx(report["overhead"]["step_frac"], abs=1e-6)
    assert name in render_text(report)


def test_within_budget_there_is_no_finding_and_the_step_calls_cost_microseconds(tmp_path):
    report, _ = _run(tmp_path, hook=False)
    assert not [f for f in report["findings"] if f["id"] == "perfmon_cost"]
    o = report["overhead"]
    assert o["step_frac"] is not None and o["step_frac"] < STEP_BUDGET
    calls = next(p for p in o["parts"] if p["part"] == STEP_CALLS)
    assert 0 < calls["value"] < STEP_S / 100     # the step calls: microseconds, nothing of the spin
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


def test_unmeasured_parts_are_unknown_with_why_never_zero():
    why = {"threads": "no per-thread CPU clock on this platform", "recorded_bytes": "not recording"}
    o = overhead(0, [_reading(10.0, 0.0, 0, None, why), _reading(12.0, 0.002, 100, None, why)], 0.01)
    assert o is not None and o.cpu_frac is None
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
    report = Analysis.of_records([("s", recs)]).report()
    jsonschema.validate(report, SCHEMA)
    for shown in (report["captures"][0], report["profile"]):
        assert shown["train_per_step_s"] == pytest.approx(0.05)
        assert shown["overhead"] == pytest.approx(0.5)
        assert shown["thread_cpu_s"] == 0.25
    assert "its own thread used 250ms CPU" in render_text(report)


def _header(rank: Rank) -> tuple[str, set[str]]:
    """The header's text for a job of ``rank``, and the styles of its "perfmon cost" value."""
    from tui.app.widgets.header import HeaderBar
    bar = HeaderBar()
    bar._view = job(rank).view()
    text = bar.render()
    at = text.plain.find("perfmon cost ")
    styles = {str(s.style) for s in text.spans if at >= 0 and s.start >= at + len("perfmon cost ") and s.start < at + 30}
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
        _spin(0.05)          # busy: ~50 ms of CPU on this thread's clock
        spun.set()
        done.wait(10)

    totals = cost.ThreadTotals()
    thread = threading.Thread(target=work, name="perfmon-test-window")
    thread.start()
    spun.wait(10)
    while_alive = totals.read()["test-window"]
    done.set()
    thread.join()
    assert while_alive >= 0.005
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
rec = mon.sampler.sample_once()
ids = {t.name[len("perfmon-"):]: t.native_id for t in threading.enumerate() if t.name.startswith("perfmon-")}
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
    finally:
        job.communicate("\n", timeout=30)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert set(outside) <= set(said["threads"])
    assert outside["where"] > 2 * tick      # a thread that used measurable CPU is among them
    for name, seconds in outside.items():
        # /proc counts whole clock ticks; the threads ran on for a moment after the probe's reading
        assert said["threads"][name] == pytest.approx(seconds, abs=2 * tick + 0.05 * seconds), name
