"""``perfmon profile`` and ``perfmon capture`` on real CPU jobs (issues 16 and 15): the inefficient block
is marked, its FLOPs match torch's own counter, module times add up to the step's phases, nothing is
left behind; a capture's trace loads and the report sums it up."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from probe.recording import read_recording, recording_files
from tests.integration.streamutil import kill_tree, wait_for
from tui.errors import UserError
from tui.stream.requests import Target, ask

SCRIPT = Path(__file__).parent / "scripts" / "profile_job.py"
READY_STEPS = 5     # a training job whose probe answers requests


def _start(tmp_path: Path, mode: str, job: str, ready_steps: int = 200,
           seconds: float = 120) -> tuple[subprocess.Popen, dict]:
    """The job, once it has trained ``ready_steps`` steps: 200 for a profile whose times are compared
    (warm steps, and the baseline its overhead is measured against); a few where only the answer to a
    request is checked."""
    env = {**os.environ, "PERFMON_JOB": job}     # PERFMON_DIR: conftest's fresh 0700 directory (a short path)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), mode, str(tmp_path), str(seconds), str(ready_steps)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for(lambda: (tmp_path / "ready").exists() or proc.poll() is not None, 120, f"{ready_steps} steps")
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    return proc, env


def _profile(env: dict, job: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui.cli", "profile", job, *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _finish(proc: subprocess.Popen, tmp_path: Path) -> dict:
    (tmp_path / "stop").write_text("")
    try:
        proc.wait(60)
    finally:
        kill_tree(proc)
    return json.loads((tmp_path / "result.json").read_text())


@pytest.mark.slow
def test_a_profile_marks_the_looped_block_counts_its_flops_and_leaves_no_hook(tmp_path):
    proc, env = _start(tmp_path, "watch", "prof")
    try:
        out = _profile(env, "prof", "--steps", "5", "--depth", "1", "--json")
        assert out.returncode == 0, out.stderr
        profile = json.loads(out.stdout)
        again = _profile(env, "prof", "--steps", "3", "--depth", "1", "--json")
    finally:
        result = _finish(proc, tmp_path)
    assert again.returncode == 0, again.stderr     # the first one ended: the next is accepted
    rows = {r["name"]: r for r in profile["modules"]}
    assert profile["marked"] == "slow", [(r["name"], r["time_share"], r["flops_per_s"]) for r in profile["modules"]]
    # FLOPs: one forward+backward of the block per step, as torch's own counter says (within 5%)
    assert rows["slow"]["flops"] == pytest.approx(result["slow_flops"], rel=0.05)
    assert rows["mid"]["flops"] == pytest.approx(result["slow_flops"], rel=0.05)   # same math, other shape
    # the children's times add up to the phases the step records measured for the same steps (15%)
    rec = [r for f in recording_files(tmp_path / "rec") for r in read_recording(f).records]
    steps = [r for r in rec if r["k"] == "step" and profile["first_step"] <= r["step"] <= profile["last_step"]]
    assert len(steps) == 5
    fwd_phase = sum(s["phases"]["forward"] for s in steps) / 5
    bwd_phase = sum(s["phases"]["backward"] for s in steps) / 5
    children = [r for r in profile["modules"] if r["depth"] == 1]
    assert sum(r["fwd_s"] for r in children) == pytest.approx(fwd_phase, rel=0.15)
    assert sum(r["bwd_s"] for r in children) == pytest.approx(bwd_phase, rel=0.15)
    # the profile reached the recording, and every hook it put on is gone
    assert [r["id"] for r in rec if r["k"] == "profile"][:1] and result["hooks_after"] == result["hooks_before"]
    assert profile["overhead"] is not None and profile["baseline_step_s"] > 0


def _names_the_running_one(message: str, prefix: str, request_id: int) -> bool:
    """A refusal that names the window in progress: still armed ("a profile (request N) is waiting
    for the current step to end") or running ("a profile is already running (request N, ...")
    depending on whether a step ended between the two requests."""
    return re.match(rf"{re.escape(prefix)} (is already running )?\(request {request_id}\b", message) is not None


@pytest.mark.slow
def test_a_second_request_while_one_runs_is_refused_and_a_job_without_a_model_says_why(tmp_path):
    proc, env = _start(tmp_path, "watch", "busy", READY_STEPS)
    try:
        target = Target(path=next(Path(os.environ["PERFMON_DIR"]).glob("*.sock")).as_posix(), label="busy")
        accepted = ask(target, "profile", {"steps": 50, "depth": 3}, 30)     # returns once accepted
        with pytest.raises(UserError) as refused:
            ask(target, "profile", {"steps": 2, "depth": 1}, 30)
        out = _profile(env, "busy", "--steps", "2")
    finally:
        _finish(proc, tmp_path)
    assert accepted["ok"] is True
    assert _names_the_running_one(str(refused.value), "busy: profile refused: a profile", accepted["id"])
    assert out.returncode == 2 and "profile refused: a profile" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 2   # "profiling ..." and the one-line refusal

    bare_dir = tmp_path / "bare"
    bare_dir.mkdir()
    proc, env = _start(bare_dir, "bare", "bare", READY_STEPS)
    try:
        out = _profile(env, "bare")
    finally:
        _finish(proc, bare_dir)
    assert out.returncode == 2
    assert "no model to profile: the job did not pass one to probe.watch(model=...)" in out.stderr


@pytest.mark.slow
def test_a_capture_of_three_steps_writes_a_trace_torch_loads_and_the_report_sums_it_up(tmp_path):
    proc, env = _start(tmp_path, "watch", "cap", READY_STEPS)
    try:
        out = subprocess.run([sys.executable, "-m", "tui.cli", "capture", "cap", "--steps", "3", "--json"],
                             capture_output=True, text=True, timeout=120, env=env)
        target = Target(path=next(Path(os.environ["PERFMON_DIR"]).glob("*.sock")).as_posix(), label="cap")
        accepted = ask(target, "capture", {"steps": 20}, 30)
        with pytest.raises(UserError) as refused:
            ask(target, "capture", {"steps": 2}, 30)
    finally:
        _finish(proc, tmp_path)
    assert out.returncode == 0, out.stderr
    capture = json.loads(out.stdout)["captures"][0]
    assert capture["steps"] == 3 and capture["error"] is None
    assert capture["path"].startswith(str(tmp_path / "rec")) and capture["path"].endswith(".pt.trace.json.gz")
    trace = json.loads(gzip.decompress(Path(capture["path"]).read_bytes()))
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert {op["name"] for op in capture["top"]} & {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear"}
    assert accepted["ok"] and _names_the_running_one(str(refused.value), "cap: capture refused: a capture",
                                                     accepted["id"])
    report = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "report", str(tmp_path / "rec"), "--json"],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    assert [c["path"] for c in report["captures"]][:1] == [capture["path"]]
