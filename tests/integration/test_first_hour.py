"""What a user hits in the first hour (issue 44), as real small CPU jobs under ``perfmon run``, each timing
itself, judged by ``perfmon report --json``: a leak (with and without a memory limit), a GAN and a WGAN (a
step is an iteration), an evaluation pass run without ``no_grad()`` (a pause, not part of a step).

The jobs (tests/integration/scripts) run once each, all at once, for the whole module; every test reads
their reports. A crash is judged on test_run.py's failing job, an FSDP2 job's advice on
tests/compat/test_fsdp2.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probe.recording import read_recording, recording_files

SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
MB = 1 << 20
LIMIT = 256 * MB        # under where the leaking job ends: torch alone takes more, and it keeps 1MB a step

JOBS: dict[str, tuple[list[str], dict[str, str]]] = {
    "leak": (["mlp_train.py", "--steps", "120", "--leak-mb", "1"], {}),
    "leak_limit": (["mlp_train.py", "--steps", "120", "--leak-mb", "1"], {"PERFMON_MEMORY_LIMIT": str(LIMIT)}),
    "gan": (["gan_train.py", "--iters", "30"], {}),
    "wgan": (["gan_train.py", "--iters", "12", "--critic", "5", "--sleep", "0.005"], {}),
    # 50 ms of sleep a step: a loaded host's scheduling hiccups (the probe's step-end work falls in the
    # script's own step but between perfmon's) stay small beside it
    "eval": (["mlp_train.py", "--steps", "40", "--eval-every", "10", "--eval-batches", "8", "--step-sleep", "0.05"],
             {}),
}


class Run:
    """One job's run: its own numbers (its last JSON line), its report, its step records."""

    def __init__(self, own: dict, report: dict, steps: list[dict], events: list[dict]) -> None:
        self.own, self.report, self.steps, self.events = own, report, steps, events

    def finding(self, fid: str) -> dict:
        return next(f for f in self.report["findings"] if f["id"] == fid)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("first-hour")
    procs = {}
    for name, (args, env) in JOBS.items():
        rec = base / name
        # 4 samples a second: the leak's RSS series needs readings across its ~3 s of steps
        environ = {k: v for k, v in os.environ.items() if k != "PERFMON_MEMORY_LIMIT"}
        environ.update(PERFMON_SAMPLE_HZ="4", **env)
        procs[name] = (rec, subprocess.Popen(
            [PY, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--", PY, str(SCRIPTS / args[0]), *args[1:]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ))
    out = {}
    for name, (rec, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr[-3000:]
        own = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
        rep = subprocess.run([PY, "-m", "tui.cli", "report", str(rec), "--json"], capture_output=True, text=True,
                             timeout=60)
        assert rep.returncode == 0, rep.stderr
        records = [r for f in recording_files(rec) for r in read_recording(f).records]
        out[name] = Run(own, json.loads(rep.stdout), [r for r in records if r["k"] == "step"],
                        [r for r in records if r["k"] == "event"])
    return out


@pytest.mark.parametrize("name", ["leak", "leak_limit"])
def test_a_leak_is_named_with_its_growth_rate_with_or_without_a_limit(runs, name):
    run = runs[name]
    growth = run.report["memory_growth"]
    assert growth["steady"] and growth["series"] == "rss" and growth["kind"] == "other", growth
    assert growth["per_step_bytes"] == pytest.approx(run.own["rss_growth_per_step"], rel=0.2)
    verdict = run.report["verdict"]
    assert verdict["bottleneck"] == "memory" and verdict["headline"].startswith("Memory leak: host RSS grows")
    assert "loss.detach()" in verdict["suggestions"][0]          # what grows gets the advice, first
    assert run.finding("memory_growth")["per_step_bytes"] == growth["per_step_bytes"]
    past = run.report["metrics"]["memory"]["peak_frac"] >= 1.0
    assert past == (name == "leak_limit")
    assert verdict["severity"] == ("crit" if past else "warn")


@pytest.mark.parametrize("name", ["gan", "wgan"])
def test_a_gan_step_is_its_iteration(runs, name):
    run = runs[name]
    assert run.report["metrics"]["steps"] == run.own["iterations"]
    assert run.report["metrics"]["step_time_median_s"] == pytest.approx(run.own["iter_median_s"], rel=0.25)
    assert {"Discriminator", "Generator"} <= set(run.steps[-1]["phases"])     # the parts, by module


def test_an_evaluation_without_no_grad_is_a_pause_and_its_steps_outliers(runs):
    run = runs["eval"]
    assert run.report["metrics"]["ettr"] == pytest.approx(run.own["ettr"], abs=0.1)
    assert run.own["ettr"] < 0.9                                   # the pauses matter
    evals = [e for e in run.events if e["name"] == "eval"]
    assert len(evals) == 3 and all(e["forwards"] == 8 for e in evals)
    assert run.report["metrics"]["steps"] == run.own["optimizer_steps"]
    assert run.report["metrics"]["step_time_median_s"] == pytest.approx(run.own["iter_median_s"], rel=0.25)
    outliers = run.report["step_outliers"]
    assert {o["step"] for o in outliers} == {10, 20, 30} and {o["cause"] for o in outliers} == {"eval"}
    assert "8 training-mode forwards with no backward" in run.finding("step_outliers")["message"]
    assert "step_gaps" in [f["id"] for f in run.report["findings"]]
    m = run.report["metrics"]
    assert m["step_time_max_s"] >= 3 * m["step_time_median_s"] and m["run_step_time_max_s"] == m["step_time_max_s"]
