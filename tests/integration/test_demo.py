"""``perfmon demo --headless``: each scenario's real workload gets its own verdict, and the
demo always leaves nothing behind (no rank or loader-worker process, no socket).

Every test runs the real command in a subprocess: a launcher plus one or two torch
training ranks (gloo) with DataLoader workers, watched for a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jsonschema
import psutil
import pytest

from probe.recording import read_recording
from tests.helpers.reports import REPORT_SCHEMA
from tests.integration.demoutil import LOAD_IMBALANCE_SECONDS, demo_processes, run_headless
from tui.commands.demo import scenarios

ROOT = Path(__file__).parents[2]
PERFMON = [sys.executable, "-m", "tui.cli"]
# slow steps: more time for a full window; stuck: 30 steps, then the 5 s stall threshold and a repeat
SECONDS = {"data_preprocessing": 10, "data_loading": 10, "stuck": 13, "load_imbalance": LOAD_IMBALANCE_SECONDS}
DEFAULT_SECONDS = 8
CPU_SCENARIOS = [name for name, sc in scenarios.SCENARIOS.items() if not sc.needs_gpu]

pytestmark = pytest.mark.slow


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``cond`` (a process-table scan: not too often) until true or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run_demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(PERFMON + ["demo", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("name", CPU_SCENARIOS)
def test_headless_demo_names_the_scenario_as_the_bottleneck(name, perfmon_dir, request):
    sc = scenarios.SCENARIOS[name]
    if name == "load_imbalance":      # the run test_html_report.py draws: recorded, otherwise the same
        run, _ = request.getfixturevalue("load_imbalance_demo")
    else:
        run = run_headless(name, SECONDS.get(name, DEFAULT_SECONDS), perfmon_dir)
    proc = run.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    jsonschema.validate(report, REPORT_SCHEMA)
    verdict = report["verdict"]
    assert verdict["bottleneck"] == sc.expect, (verdict, report["metrics"])
    assert len(report["ranks"]) == sc.ranks and report["job"] == f"demo-{name}"
    findings = [f["id"] for f in report["findings"]]
    if sc.finding:
        assert sc.finding in findings, (report["findings"], report["metrics"])
    if name == "load_imbalance":
        assert verdict["straggler_rank"] == sc.ranks - 1
    if name == "stuck":
        stuck = verdict["stuck"]
        assert (stuck["culprit_ranks"], stuck["waiting_ranks"], stuck["op"]) == ([sc.ranks - 1], [0], "all_reduce")
        assert any(frame.endswith("in hang") for frame in stuck["where"][str(sc.ranks - 1)])
    # clean exit: no socket left, no rank or worker process left
    assert run.files_left == []
    assert run.processes_left == []
    assert run.ranks_alive == []


def test_interrupt_stops_ranks_and_loader_workers_and_removes_sockets(perfmon_dir):
    # Ctrl-C as in a terminal: a suite started in the background by a shell (``cmd &``) inherits SIGINT
    # ignored, and so would the launcher, which then never sees the signal this test sends
    launcher = subprocess.Popen(PERFMON + ["demo", "--headless", "--seconds", "300", "--scenario", "data_loading",
                                           "--ranks", "2"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: len(list(perfmon_dir.glob("*.sock"))) == 2, 90, "both ranks' sockets")
        wait_for(lambda: len(demo_processes(perfmon_dir)) >= 4, 60, "two ranks with a loader worker each")
        procs = demo_processes(perfmon_dir)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, err
    assert out == ""
    assert "Traceback" not in err
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert alive == []
    assert list(perfmon_dir.iterdir()) == []


def test_ranks_stop_by_themselves_when_the_launcher_is_killed(perfmon_dir, tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))   # a killed launcher cannot remove its log directory
    launcher = subprocess.Popen(PERFMON + ["demo", "--headless", "--seconds", "300", "--scenario", "healthy"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(list(perfmon_dir.glob("*.sock"))) == 1, 90, "the rank's socket")
        procs = demo_processes(perfmon_dir)
        assert procs
        launcher.kill()          # no chance to clean up: the ranks must notice on their own
        launcher.wait(timeout=10)
        gone, alive = psutil.wait_procs(procs, timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert alive == []
    assert list(perfmon_dir.glob("*.sock")) == []


def test_host_sync_without_a_gpu_says_so_in_one_line():
    proc = run_demo("--headless", "--scenario", "host_sync", timeout=60)
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: host_sync runs for real here")
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a GPU" in lines[0], proc.stderr


def test_two_nodes_on_this_machine_are_seen_through_a_relay_each_and_the_straggler_named_with_its_node(perfmon_dir):
    proc = run_demo("--headless", "--seconds", "8", "--scenario", "load_imbalance", "--nodes", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert {r["rank"]: r["host"] for r in report["ranks"]} == {0: "node1", 1: "node2"}
    assert report["verdict"]["bottleneck"] == "load_imbalance"
    assert report["verdict"]["headline"].startswith("Load imbalance: rank 1 on node2 computes")
    assert list(perfmon_dir.iterdir()) == [] and demo_processes(perfmon_dir) == []
    assert all(not psutil.pid_exists(r["pid"]) for r in report["ranks"])


@pytest.mark.parametrize("args, message", [
    (["--scenario", "nope"], "unknown scenario 'nope'"),
    (["--scenario", "communication", "--ranks", "1"], "needs at least 2 ranks"),
    (["--scenario", "memory", "--memory-limit", "lots"], "--memory-limit 'lots'"),
    (["--scenario", "healthy", "--seconds", "0"], "--seconds must be positive"),
    (["--scenario", "healthy"], "needs a terminal"),          # no TTY here and no --headless
    (["--scenario", "communication", "--ranks", "2", "--nodes", "3"],
     "--nodes must be between 1 and the number of ranks (2)"),
])
def test_bad_demo_arguments_are_one_line_errors(args, message, perfmon_dir):
    proc = run_demo(*args, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert list(perfmon_dir.iterdir()) == []


def test_tour_switches_scenario_inside_one_live_job(tmp_path, perfmon_dir):
    rec = tmp_path / "rec"
    # a watch of twice a phase: a phase change inside it whatever the start-up took, with time to spare
    env = dict(os.environ, **{scenarios.PHASE_ENV: "5"})
    proc = subprocess.run(PERFMON + ["demo", "--headless", "--seconds", "10", "--record", str(rec)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jsonschema.validate(json.loads(proc.stdout), REPORT_SCHEMA)
    files = list(rec.glob("*.pmrec"))
    assert len(files) == 1                       # one process ran the whole tour
    events = [r for r in read_recording(files[0]).records if r["k"] == "event" and r["name"] == "demo"]
    seen = [e["scenario"] for e in events]
    order = [s.name for s in scenarios.tour(1)]
    assert len(seen) >= 2, seen
    start = order.index(seen[0])
    assert seen == order[start:start + len(seen)], seen
    assert list(perfmon_dir.iterdir()) == []


def test_launcher_modules_do_not_import_torch():
    code = "import sys, tui.commands.demo.cli, tui.commands.demo.scenarios; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
