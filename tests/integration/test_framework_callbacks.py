"""Real Lightning and Hugging Face trainers (tiny models from configs, CPU, gradient accumulation
2, a CPU-bound collate): with perfmon's callback, and under ``perfmon run`` without it, the step
records equal the trainer's own global step, the slow collate is ``data_preprocessing``, and with
the callback perfmon's numbers are in the trainer's own logged metrics, its data wait share the
recording's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfmon_analysis.buffers import WINDOW_STEPS
from probe.recording import read_recording, recording_files

SCRIPT = Path(__file__).parent / "scripts" / "trainers.py"
STEPS = 120         # with a callback: a run well past the live window (the last 50 steps) whose numbers it logs
RUN_STEPS = WINDOW_STEPS + 10   # under perfmon run alone: the report judges the last full window


def _train(tmp_path: Path, framework: str, mode: str, steps: int) -> tuple[dict, dict, list[dict]]:
    out, rec = tmp_path / f"{framework}-{mode}.json", tmp_path / f"rec-{framework}-{mode}"
    cmd = [sys.executable, str(SCRIPT), framework, "bare" if mode == "perfmon_run" else "callback", str(out),
           str(steps)]
    env = dict(os.environ)
    if mode == "callback":
        env["PERFMON_RECORD"] = str(rec)
    else:               # perfmon run, with or without the callback
        cmd = [sys.executable, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--job", framework, "--", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [r for f in recording_files(rec) for r in read_recording(f).records if r["k"] == "step"]
    report = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "report", str(rec), "--json"],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    return json.loads(out.read_text()), report, steps


def _data_share(window: list[dict]) -> float:
    """Data wait over the iteration (a step's start to the next one's: ``dur``, its gap included), the
    whole every loss is a share of (docs/verdict.md, "One whole")."""
    return sum(s["phases"].get("data", 0.0) for s in window) / sum(s["dur"] for s in window)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "hf"])
@pytest.mark.parametrize("mode", ["callback", "perfmon_run"])
def test_steps_equal_the_trainers_and_a_slow_collate_is_data_preprocessing(tmp_path, framework, mode):
    pytest.importorskip("lightning" if framework == "lightning" else "transformers")
    planned = RUN_STEPS if mode == "perfmon_run" else STEPS
    trained, report, steps = _train(tmp_path, framework, mode, planned)
    assert trained["global_step"] == planned
    assert len(steps) == planned
    assert report["verdict"]["bottleneck"] == "data_preprocessing", report["verdict"]["headline"]
    perfmon = {k: v for k, v in trained["logged"].items() if k.startswith("perfmon/")}
    if mode != "perfmon_run":
        assert perfmon["perfmon/bottleneck/data_preprocessing"] == 1.0
        # the logged share is the data wait over the iteration, as in the recording: the share of
        # some window of recent steps (the live numbers are from the last 50 steps or 30 s,
        # whichever is shorter, computed up to 2 s before the end)
        shares = [_data_share(steps[end - n:end]) for n in range(10, WINDOW_STEPS + 1)
                  for end in range(len(steps) - WINDOW_STEPS // 2, len(steps) + 1) if end - n >= 0]
        assert min(shares) - 0.02 <= perfmon["perfmon/data_wait_ratio"] <= max(shares) + 0.02, \
            (perfmon["perfmon/data_wait_ratio"], min(shares), max(shares))
        assert perfmon["perfmon/step_time_median_seconds"] > 0
        if framework == "hf":       # the trainer counts input tokens: tokens/s from its own count
            assert perfmon["perfmon/tokens_per_second"] > 0
    else:
        assert perfmon == {}


@pytest.mark.slow
def test_the_callback_under_perfmon_run_leaves_the_steps_to_zero_code_mode_and_logs_its_numbers(tmp_path):
    """Both at once: steps are counted once (by zero-code mode), the numbers still reach the logs."""
    pytest.importorskip("lightning")
    trained, report, steps = _train(tmp_path, "lightning", "perfmon_run_with_callback", STEPS)
    assert trained["global_step"] == len(steps) == STEPS
    assert trained["logged"]["perfmon/bottleneck/data_preprocessing"] == 1.0
