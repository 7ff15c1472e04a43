"""A real CPU torch job under the API whose steps wait in an unhooked call: the probe's
``where`` records name the wait's line as waiting, and its step records carry the thread's CPU time."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.mark.slow
def test_a_real_job_that_sleeps_in_its_steps_is_named_waiting_at_the_sleep_line(tmp_path):
    """A CPU torch job under the API, 40 ms of each ~100 ms step in ``time.sleep`` between forward and
    backward, 60 ms (wall) of model calls: the sleep's line is the top waiting line, with its share."""
    import subprocess
    import sys

    from probe.recording import read_recording
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch, probe\n"
        "mon = probe.start(job='sleepy')\n"
        "model = torch.nn.Linear(256, 256)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "x = torch.randn(64, 256)\n"
        "def fetch_from_service():\n"
        "    time.sleep(0.04)\n"
        "t_end = time.time() + 6\n"
        "while time.time() < t_end:\n"
        "    with mon.step():\n"
        "        t0 = time.perf_counter()\n"
        "        loss = model(x).square().mean()\n"
        "        fetch_from_service()\n"
        "        while time.perf_counter() - t0 < 0.1:\n"
        "            model(x).detach()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
        "mon.close()\n")
    env = {**os.environ, "PERFMON_RECORD": str(tmp_path / "rec")}     # PERFMON_DIR: conftest's (a short path)
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    recs = read_recording(next((tmp_path / "rec").glob("*.pmrec"))).records
    found = [r for r in recs if r["k"] == "where"]
    assert len(found) >= 2
    counts: dict = {}
    for rec in found:
        for line in rec["lines"]:
            key = (os.path.basename(line["file"]), line["line"], line["function"], line.get("state"))
            counts[key] = counts.get(key, 0) + line["n"]
    waiting = {k: n for k, n in counts.items() if k[3] == "waiting"}
    assert max(waiting, key=waiting.get) == ("train.py", 7, "fetch_from_service", "waiting")
    at_sleep = sum(n for k, n in counts.items() if k[:3] == ("train.py", 7, "fetch_from_service"))
    assert waiting[("train.py", 7, "fetch_from_service", "waiting")] >= 0.8 * at_sleep
    samples = sum(r["samples"] for r in found)
    assert 0.25 <= at_sleep / samples <= 0.6          # 40% of the step, within the sampling error
    steps = [r for r in recs if r["k"] == "step" and "cpu" in r]
    assert steps and all(r["cpu_span"] == "body" for r in steps)
    off_cpu = sum(r["dur"] - r["gap"] - r["cpu"] for r in steps) / sum(r["dur"] for r in steps)
    assert off_cpu >= 0.3                             # the sleep, and any time another process had the core


@pytest.mark.slow
def test_zero_code_steps_carry_cpu_over_their_whole_span_and_where_names_the_sleep(tmp_path):
    """``perfmon run`` on a script that knows nothing of perfmon: a DataLoader loop whose step
    sleeps 20 ms after the forward. Steps count CPU from their first fetch ("active")."""
    from probe.recording import read_recording
    from tests.helpers.cli import perfmon
    script = tmp_path / "zc.py"
    script.write_text(
        "import time, torch\n"
        "model = torch.nn.Linear(128, 128)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2048, 128)), batch_size=32)\n"
        "t_end = time.time() + 4\n"
        "while time.time() < t_end:\n"
        "    for (x,) in data:\n"
        "        loss = model(x).square().mean()\n"
        "        time.sleep(0.02)\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n")
    done = perfmon("run", "--no-tui", "--record", str(tmp_path / "rec"), "--", sys.executable, str(script),
                   env=dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stderr
    recs = read_recording(next((tmp_path / "rec").glob("*.pmrec"))).records
    steps = [r for r in recs if r["k"] == "step" and "cpu" in r]
    assert len(steps) >= 20 and all(r["cpu_span"] == "active" for r in steps)
    body = sum(r["dur"] - r["gap"] for r in steps)
    off_cpu = (body - sum(r["cpu"] for r in steps)) / body
    assert 0.3 <= off_cpu <= 1.0               # the 20 ms sleep of each ~22-35 ms step is off CPU
    assert all(r["cpu"] <= r["dur"] - r["gap"] + 1e-3 for r in steps)
    waiting: dict = {}
    for rec in (r for r in recs if r["k"] == "where"):
        for line in rec["lines"]:
            if line.get("state") == "waiting":
                key = (os.path.basename(line["file"]), line["line"])
                waiting[key] = waiting.get(key, 0) + line["n"]
    assert max(waiting, key=waiting.get) == ("zc.py", 9)
