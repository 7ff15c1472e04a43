"""A job that stopped: real CPU jobs (gloo) judged live by ``perfmon report --json``.

Each job writes a mark file when its stall begins; the test then asks the live job for a
report until it says ``stuck`` or the deadline passes, and checks who is named and where.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.streamutil import kill_tree, wait_for
from tui.injector import why_no_rights
from tui.stream import native

SCRIPT = Path(__file__).parent / "scripts" / "stuck_jobs.py"
STALL_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# STALL LINE" in line)


def _start(tmp_path: Path, mode: str, ranks: int, **env: str) -> tuple[subprocess.Popen, Path, dict]:
    perfmon_dir = os.environ["PERFMON_DIR"]     # conftest's fresh 0700 directory: a short path for the sockets
    mark = tmp_path / "mark"
    env = {**os.environ, "PERFMON_DIR": perfmon_dir, "PERFMON_JOB": f"stuck-{mode}", **env}
    cmd = [sys.executable, str(SCRIPT), mode, str(mark)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *cmd[1:]]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, mark, env


def _stop(proc: subprocess.Popen) -> None:
    kill_tree(proc)


def _report(env: dict, job: str, seconds: float = 3.0) -> dict:
    out = subprocess.run([sys.executable, "-m", "tui.cli", "report", job, "--json", "--seconds", str(seconds)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _until_stuck(env: dict, job: str, deadline: float, seconds: float = 3.0,
                 done=lambda stuck: True) -> tuple[dict, float]:
    """Live reports until the verdict is stuck (and ``done``) or the deadline; (report, when)."""
    while True:
        rep = _report(env, job, seconds)
        stuck = rep["verdict"]["stuck"]
        if rep["verdict"]["bottleneck"] == "stuck" and done(stuck):
            return rep, time.time()
        assert time.time() < deadline, f"not stuck by the deadline: {rep['verdict']['headline']}"


def _mark(mark: Path, proc: subprocess.Popen) -> list[str]:
    wait_for(lambda: mark.exists() and mark.read_text().endswith("\n") or proc.poll() is not None, 90,
             "the job to reach its stall")
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    return mark.read_text().split()


@pytest.mark.slow
def test_a_rank_asleep_before_its_20th_all_reduce_is_named_within_40s(tmp_path):
    """With a 5 s threshold to keep the suite short; bench/bench_stuck.py measures the default (15 s floor)."""
    proc, mark, env = _start(tmp_path, "collective", 2, PERFMON_STALL_S="5")
    try:
        stalled_at = float(_mark(mark, proc)[0])
        rep, when = _until_stuck(env, "stuck-collective", stalled_at + 40)
    finally:
        _stop(proc)
    stuck = rep["verdict"]["stuck"]
    assert when - stalled_at < 40
    assert (stuck["kind"], stuck["culprit_ranks"], stuck["waiting_ranks"]) == ("collective", [1], [0])
    assert (stuck["op"], stuck["group"], stuck["seq"]) == ("all_reduce", "world", 20)
    assert any(f.startswith(f"{SCRIPT}:{STALL_LINE} in collective") for f in stuck["where"]["1"]), stuck["where"]
    assert stuck["where"]["0"][-1].endswith("in all_reduce")
    assert rep["verdict"]["headline"].startswith(
        f"Stuck: rank 1 never reached all_reduce #20 (stuck_jobs.py:{STALL_LINE} in collective); 1 rank waits in it")
    assert stuck["calls"] == {"0": "enqueued", "1": "never_enqueued"}


@pytest.mark.slow
def test_the_real_flight_recorder_of_a_gloo_job_holds_the_call_one_rank_never_enqueued(tmp_path, monkeypatch):
    """torch's generic recorder records gloo collectives by default (TORCH_FR_BUFFER_SIZE unset):
    rank 0, waiting in all_reduce #4, holds it enqueued and not completed; rank 1 enqueued 3."""
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(var, raising=False)
    proc, mark, _ = _start(tmp_path, "flight", 2)
    outs = [mark.with_name(f"{mark.name}.{rank}") for rank in (0, 1)]
    try:
        wait_for(lambda: all(o.exists() for o in outs) or proc.poll() is not None, 90, "both ranks' recorders")
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        waiting, behind = (json.loads(o.read_text())["flight"] for o in outs)
    finally:
        _stop(proc)
    assert waiting["sources"] == behind["sources"] and "generic" in waiting["sources"]
    assert waiting["entries"] == [{"op": "all_reduce", "group": "world", "seq": 4, "state": "enqueued",
                                   "backend": "gloo"}]
    assert (waiting["groups"]["world"]["enqueued"], waiting["groups"]["world"]["completed"]) == (4, 3)
    assert behind["groups"]["world"]["enqueued"] == 3 and all(e["seq"] <= 3 for e in behind["entries"])


@pytest.mark.slow
def test_a_hung_loader_worker_is_named_by_pid(tmp_path):
    proc, mark, env = _start(tmp_path, "loader", 1, PERFMON_STALL_S="2")
    try:
        stalled_at, pid = _mark(mark, proc)
        rep, _ = _until_stuck(env, "stuck-loader", float(stalled_at) + 40,
                              done=lambda s: s["loader_pid"] is not None)
    finally:
        _stop(proc)
    stuck = rep["verdict"]["stuck"]
    assert stuck["kind"] == "data" and stuck["culprit_ranks"] == [0] and stuck["loader_pid"] == int(pid)
    assert f"worker {pid} of rank 0 is idle at 0% CPU" in rep["verdict"]["headline"]


@pytest.mark.slow
def test_a_rank_holding_the_gil_is_unresponsive_and_the_other_waits(tmp_path):
    proc, mark, env = _start(tmp_path, "gil", 2, PERFMON_STALL_S="2")
    try:
        stalled_at = float(_mark(mark, proc)[0])
        t0 = time.monotonic()
        rep, _ = _until_stuck(env, "stuck-gil", stalled_at + 60, seconds=5.0,
                              done=lambda s: s["unresponsive_ranks"] == [1] and s["waiting_ranks"] == [0])
        assert time.monotonic() - t0 < 60          # every report returned: no viewer thread hung
        again = _report(env, "stuck-gil")           # rank 0's probe still answers and still reports
        assert again["verdict"]["stuck"]["waiting_ranks"] == [0]
    finally:
        _stop(proc)
    stuck = rep["verdict"]["stuck"]
    assert stuck["culprit_ranks"] == [1] and (stuck["op"], stuck["seq"]) == ("all_reduce", 20)
    assert "rank 1 never reached all_reduce #20 (no record for" in rep["verdict"]["headline"]


@pytest.mark.skipif(why_no_rights() is not None, reason=f"no ptrace rights here: {why_no_rights()}")
def test_py_spy_reads_the_stack_of_a_process_holding_the_gil_from_outside(tmp_path, monkeypatch):
    # py-spy is in the test extra; its command sits beside this interpreter, on PATH once the venv is
    # active and put there here when pytest runs as .venv/bin/python without activating it
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert native.available(), "py-spy is not installed: pip install -e '.[test]'"
    code = ("import ctypes, sys\ndef hold_the_gil():\n    print('ready', flush=True)\n"
            "    ctypes.PyDLL(None).sleep(30)\nhold_the_gil()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        dump = native.dump(proc.pid)
        assert "hold_the_gil" in dump, dump
    finally:
        proc.kill()
        proc.wait()
