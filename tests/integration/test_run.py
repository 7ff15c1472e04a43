"""``perfmon run -- CMD``: zero-code instrumentation of plain PyTorch scripts (tests/integration/scripts).

The scripts know nothing of perfmon and print their own numbers (step count,
iteration time, ETTR) as a JSON line; each test compares those with what
``perfmon report --json`` finds in the recordings ``perfmon run --record`` made.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from probe.paths import parse_name
from probe.recording import read_recording, recording_files
from tests.helpers.cli import perfmon
from tests.integration.streamutil import wait_for

SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone"]
# the console script when the environment has it (its shebang runs the same interpreter)
TORCHRUN_BIN = ([str(Path(PY).parent / "torchrun")] if (Path(PY).parent / "torchrun").exists() else TORCHRUN[:3]) \
    + ["--standalone"]


def run_job(rec: Path, *cmd: str, timeout: float = 90, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return perfmon("run", "--no-tui", "--record", str(rec), *options, "--", *cmd, timeout=timeout)


def start_job(rec: Path, *cmd: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "tui.cli", "run", "--no-tui", "--record", str(rec), "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def report(rec: Path) -> dict:
    out = perfmon("report", str(rec), "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def steps_of(path: Path) -> list[dict]:
    return [r for r in read_recording(path).records if r["k"] == "step"]


def recorded_steps(rec: Path) -> int:
    return sum(len(steps_of(f)) for f in recording_files(rec)) if rec.exists() else 0


def test_steps_equal_optimizer_steps_and_step_time_matches_the_scripts(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("mlp_train.py"), "--steps", "40")
    assert out.returncode == 0, out.stderr
    own = last_json(out.stdout)
    files = recording_files(rec)
    assert [parse_name(f.name).pid for f in files] == [own["pid"]]
    assert read_recording(files[0]).clean
    rep = report(rec)
    assert rep["job"] == "mlp_train"
    assert rep["metrics"]["steps"] == own["optimizer_steps"] == 40
    # the median of the report's window (its last steps) among the script's own middle half of iterations,
    # which widens with a loaded machine's noise as the two medians drift apart
    q1, _, q3 = statistics.quantiles(own["iters_s"], n=4)
    assert q1 - 0.001 <= rep["metrics"]["step_time_median_s"] <= q3 + 0.001, (rep["metrics"], q1, q3)
    step = steps_of(files[0])[-1]
    assert {"data", "forward", "backward", "optimizer"} <= set(step["phases"])
    assert step["samples"] == 16


def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("mlp_train.py"), "--steps", "16", "--accum", "4", "--step-sleep", "0.04")
    assert out.returncode == 0, out.stderr
    own = last_json(out.stdout)
    rep = report(rec)
    assert rep["metrics"]["steps"] == own["optimizer_steps"] == 16
    # the median of the report's window (its last steps) among the script's own middle half of iterations,
    # which widens with a loaded machine's noise as the two medians drift apart
    q1, _, q3 = statistics.quantiles(own["iters_s"], n=4)
    assert q1 - 0.001 <= rep["metrics"]["step_time_median_s"] <= q3 + 0.001, (rep["metrics"], q1, q3)
    assert all(s["samples"] == 4 * 16 for s in steps_of(recording_files(rec)[0]))


def test_checkpoint_pauses_between_steps_are_lost_time_in_ettr(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("mlp_train.py"), "--steps", "30", "--checkpoint-every", "5",
                  "--checkpoint-seconds", "0.08")
    assert out.returncode == 0, out.stderr
    own = last_json(out.stdout)
    assert own["ettr"] < 0.8          # the pauses matter
    rep = report(rec)
    assert rep["metrics"]["steps"] == 30
    assert rep["metrics"]["ettr"] == pytest.approx(own["ettr"], abs=0.05)
    # the median of the report's window (its last steps) among the script's own middle half of iterations,
    # which widens with a loaded machine's noise as the two medians drift apart
    q1, _, q3 = statistics.quantiles(own["iters_s"], n=4)
    assert q1 - 0.001 <= rep["metrics"]["step_time_median_s"] <= q3 + 0.001, (rep["metrics"], q1, q3)


def test_manual_sgd_without_an_optimizer_is_measured_from_backward(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("manual_sgd.py"), "--iters", "30")
    assert out.returncode == 0, out.stderr
    own = last_json(out.stdout)
    rep = report(rec)
    assert rep["metrics"]["steps"] == own["iterations"] == 30
    # the median of the report's window (its last steps) among the script's own middle half of iterations,
    # which widens with a loaded machine's noise as the two medians drift apart
    q1, _, q3 = statistics.quantiles(own["iters_s"], n=4)
    assert q1 - 0.001 <= rep["metrics"]["step_time_median_s"] <= q3 + 0.001, (rep["metrics"], q1, q3)
    assert "backward" in steps_of(recording_files(rec)[0])[-1]["phases"]


@pytest.mark.slow
def test_torchrun_two_ranks_each_recorded_under_one_job(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, *TORCHRUN, "--nproc-per-node", "2", script("ddp_train.py"), "--steps", "12", timeout=120)
    assert out.returncode == 0, out.stderr
    own = {r["rank"]: r for r in json_lines(out.stdout)}
    names = [parse_name(f.name) for f in recording_files(rec)]
    assert sorted((n.job, n.rank, n.pid) for n in names) == [("ddp_train", r, own[r]["pid"]) for r in (0, 1)]
    rep = report(rec)
    assert rep["job"] == "ddp_train"
    assert {r["rank"]: r["steps"] for r in rep["ranks"]} == {0: 12, 1: 12}
    hello = read_recording(recording_files(rec)[0]).records[0]
    assert hello["world_size"] == 2 and hello["restart"] == 0
    # DDP's gradient all-reduce is timed through watch() (its comm hook), as with the API
    assert all(s["comm"]["ops"] >= 1 for f in recording_files(rec) for s in steps_of(f)[1:])
    assert rep["metrics"]["comm_frac"] > 0


@pytest.mark.slow
def test_worker_restarted_by_torchrun_starts_a_new_recording(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, *TORCHRUN_BIN, "--nproc-per-node", "1", "--max-restarts", "1", script("elastic_retry.py"),
                  timeout=120)
    assert out.returncode == 0, out.stderr
    files = {parse_name(f.name).restart: f for f in recording_files(rec)}
    assert sorted(files) == [0, 1]
    assert len(steps_of(files[0])) == 3 and len(steps_of(files[1])) == 6
    restart_events = [r for r in read_recording(files[1]).records if r["k"] == "event" and r["name"] == "restart"]
    assert restart_events and restart_events[0]["restart"] == 1
    rep = report(rec)
    assert rep["ranks"][0]["restart"] == 1 and rep["ranks"][0]["steps"] == 6
    assert any(f["id"] == "rank_restarted" for f in rep["findings"])     # the report says so


def test_exit_code_passes_through(tmp_path):
    out = perfmon("run", "--no-tui", "--", PY, "-c", "import sys; sys.exit(7)")
    assert out.returncode == 7
    out = perfmon("run", "--no-tui", "--", "sh", "-c", "kill -TERM $$")
    assert out.returncode == 128 + signal.SIGTERM


def test_exception_exit_leaves_a_complete_recording_whose_report_is_the_crash(tmp_path):
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("mlp_train.py"), "--steps", "50", "--fail-at", "6", options=("--job", "crashy"))
    assert out.returncode == 1 and "simulated failure after 6 steps" in out.stderr
    result = read_recording(recording_files(rec)[0])
    assert result.records[0]["job"] == "crashy"
    assert result.clean and result.records[-1]["k"] == "bye"
    assert len([r for r in result.records if r["k"] == "step"]) == 6
    errors = [r for r in result.records if r["k"] == "event" and r["name"] == "exception"]
    assert errors and errors[0]["error"] == "RuntimeError"
    rep = report(rec)
    crash = rep["crash"]                         # the report's story ends there: what, where, when
    assert crash["error"] == "RuntimeError" and crash["step"] == 6 and crash["exit"] == "exit code 1"
    assert crash["file"] == script("mlp_train.py") and "raise RuntimeError" in crash["call"]
    verdict = rep["verdict"]
    assert verdict["bottleneck"] == "crashed" and verdict["severity"] == "crit"
    assert verdict["headline"].startswith("Crashed: RuntimeError on rank 0 at step 6 (mlp_train.py:")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_perfmon_run_is_forwarded_and_the_recording_stays_readable(tmp_path, sig):
    rec = tmp_path / "rec"
    proc = start_job(rec, PY, script("mlp_train.py"), "--forever", "--step-sleep", "0.02")
    wait_for(lambda: recorded_steps(rec) >= 5, timeout=30, what="5 recorded steps")
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, stderr      # the job died of the forwarded signal
    (path,) = recording_files(rec)
    result = read_recording(path)
    assert result.problem in (None, "truncated"), result.message
    steps = [r["step"] for r in result.records if r["k"] == "step"]
    assert len(steps) >= 5 and steps == list(range(len(steps)))
    if sig == signal.SIGINT:   # KeyboardInterrupt: the interpreter exits normally, the probe says bye
        assert result.clean and result.records[-1]["k"] == "bye"
        assert any(r["k"] == "event" and r.get("error") == "KeyboardInterrupt" for r in result.records)


def test_sigkill_leaves_a_readable_prefix(tmp_path):
    rec = tmp_path / "rec"
    proc = start_job(rec, PY, script("mlp_train.py"), "--forever", "--step-sleep", "0.02")
    wait_for(lambda: recorded_steps(rec) >= 5, timeout=30, what="5 recorded steps")
    (path,) = recording_files(rec)
    os.kill(parse_name(path.name).pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL
    result = read_recording(path)
    assert result.problem in (None, "truncated"), result.message
    assert len([r for r in result.records if r["k"] == "step"]) >= 5


def test_a_process_that_never_trains_leaves_no_socket_and_no_recording(tmp_path, perfmon_dir):
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("inference_only.py"))
    assert out.returncode == 0, out.stderr
    assert last_json(out.stdout)["forwards"] == 21
    assert list(rec.iterdir()) == []
    assert list(perfmon_dir.iterdir()) == []


def test_dataloader_workers_are_not_instrumented(tmp_path, perfmon_dir):
    rec = tmp_path / "rec"
    # 2 fork workers, 3 epochs: workers are forked again after the probe started in the main process
    out = run_job(rec, PY, script("mlp_train.py"), "--steps", "24", "--batches", "8", "--workers", "2",
                  "--step-sleep", "0.002")
    assert out.returncode == 0, out.stderr
    own = last_json(out.stdout)
    assert [parse_name(f.name).pid for f in recording_files(rec)] == [own["pid"]]
    assert len(steps_of(recording_files(rec)[0])) == 24
    assert not list(perfmon_dir.glob("*.sock"))


def test_shell_script_running_python_is_instrumented(tmp_path):
    rec = tmp_path / "rec"
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f'#!/bin/sh\n"{PY}" "{script("mlp_train.py")}" --steps 8 --step-sleep 0.002\nexit 4\n')
    wrapper.chmod(0o755)
    out = run_job(rec, str(wrapper))
    assert out.returncode == 4, out.stderr
    assert last_json(out.stdout)["optimizer_steps"] == 8
    (path,) = recording_files(rec)
    assert parse_name(path.name).job == "train"
    assert len(steps_of(path)) == 8


def test_a_script_using_the_probe_api_is_not_counted_twice(tmp_path):
    api_script = tmp_path / "api_train.py"
    api_script.write_text(
        "import torch, probe\n"
        "mon = probe.start(job='explicit')\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(7):\n"
        "    with mon.step():\n"
        "        model(torch.randn(2, 4)).sum().backward()\n"
        "        opt.step()\n")
    rec = tmp_path / "rec"
    out = run_job(rec, PY, str(api_script))
    assert out.returncode == 0, out.stderr
    (path,) = recording_files(rec)
    assert [s["step"] for s in steps_of(path)] == list(range(7))


def test_existing_sitecustomize_still_runs(tmp_path):
    own_site = tmp_path / "site"
    own_site.mkdir()
    marker = tmp_path / "marker"
    (own_site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    rec = tmp_path / "rec"
    env = {**os.environ, "PYTHONPATH": str(own_site)}
    out = perfmon("run", "--no-tui", "--record", str(rec), "--", PY, script("manual_sgd.py"), "--iters", "5",
                  "--step-sleep", "0", env=env)
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "ran"
    assert len(steps_of(recording_files(rec)[0])) == 5


def test_bad_invocations_are_one_line():
    for args, expected in ((["run", "--no-tui"], "nothing to run"),
                           (["run", "--no-tui", "--", "no-such-command-xyz"], "command not found")):
        out = perfmon(*args)
        assert out.returncode == 2
        assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1


class Terminal:
    """``perfmon run`` on a pseudo-terminal, as a user in an SSH session or tmux pane runs it."""

    def __init__(self, *args: str) -> None:
        import fcntl
        import pty
        import struct
        import termios

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            os.environ["TERM"] = "xterm-256color"
            os.execv(PY, [PY, "-m", "tui.cli", "run", *args])
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.screen = b""
        self.status: int | None = None

    def poll(self) -> bool:
        """Read what is there; True once perfmon has exited (``status`` is then its exit code)."""
        import select

        while select.select([self.fd], [], [], 0.05)[0]:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:   # EIO: the other side closed
                break
            if not data:
                break
            self.screen += data
        if self.status is None:
            done, raw = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = os.waitstatus_to_exitcode(raw)
                self.poll()
        return self.status is not None

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def text(self) -> str:
        return self.screen.decode(errors="replace")

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def test_no_tui_in_a_terminal_gives_the_job_the_keyboard(tmp_path):
    """Interactive input reaches the job, and one Ctrl-C typed is delivered exactly once."""
    job = ("import time\nprint('got', input('name? '), flush=True)\n"
           "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n")
    term = Terminal("--no-tui", "--", PY, "-c", job)
    try:
        wait_for(lambda: term.poll() or b"name? " in term.screen, timeout=30, what="the prompt")
        term.type(b"bob\n")
        wait_for(lambda: term.poll() or b"got bob" in term.screen, timeout=10, what="the echo")
        term.type(b"\x03")
        wait_for(term.poll, timeout=20, what="perfmon to exit")
    finally:
        term.close()
    assert term.status == 130, term.text()
    assert term.text().count("interrupted") == 1


def test_tui_mode_keeps_job_output_off_the_screen_and_passes_the_exit_code(tmp_path):
    """With the TUI the job's output goes to a log file (path printed at exit), never to the terminal."""
    rec = tmp_path / "rec"
    job = f'"{PY}" "{script("mlp_train.py")}" --steps 10 --step-sleep 0.005; exit 3'
    term = Terminal("--record", str(rec), "--", "sh", "-c", job)

    def job_done_and_app_up() -> bool:
        logs = list(rec.glob("*.log")) if rec.exists() else []
        return (term.poll() or bool(logs) and '"optimizer_steps": 10' in logs[0].read_text()
                and b"\x1b[?1049h" in term.screen)   # the alternate screen: the app is up

    try:
        wait_for(job_done_and_app_up, timeout=60, what="the job to finish under the TUI")
        term.type(b"q")
        wait_for(term.poll, timeout=20, what="perfmon to exit")
    finally:
        term.close()
    text = term.text()
    assert term.status == 3, text[-2000:]
    (log,) = rec.glob("*.log")
    assert '"optimizer_steps": 10' in log.read_text() and "optimizer_steps" not in text
    assert f"job output: {log}" in text
    assert len(steps_of(recording_files(rec)[0])) == 10


def test_sigterm_with_the_tui_open_stops_the_job_closes_the_tui_and_keeps_the_recording(tmp_path):
    """The TUI's event loop owns SIGTERM while it runs: it must still pass it on to the job."""
    rec = tmp_path / "rec"
    term = Terminal("--record", str(rec), "--", PY, script("mlp_train.py"), "--steps", "100000",
                    "--step-sleep", "0.005")

    def training_under_tui() -> bool:
        files = recording_files(rec) if rec.exists() else []
        return term.poll() or (bool(files) and len(steps_of(files[0])) >= 5 and b"\x1b[?1049h" in term.screen)

    try:
        wait_for(training_under_tui, timeout=60, what="the job to train under the TUI")
        os.kill(term.pid, signal.SIGTERM)
        wait_for(term.poll, timeout=30, what="perfmon to exit after SIGTERM")
    finally:
        term.close()
    assert term.status == 128 + signal.SIGTERM, term.text()[-2000:]
    (file,) = recording_files(rec)
    result = read_recording(file)
    assert result.records and result.problem in (None, "truncated")
    assert 5 <= len(steps_of(file)) < 100000


def test_every_epochs_loader_is_found_and_no_hook_fails(tmp_path):
    """A new DataLoader iterator per epoch: each one is registered (its workers' CPU is sampled), and
    registering it once the probe has started (a deque then, a list before) raises nothing."""
    rec = tmp_path / "rec"
    out = run_job(rec, PY, script("mlp_train.py"), "--steps", "24", "--batches", "6", "--workers", "1",
                  "--step-sleep", "0.08")
    assert out.returncode == 0, out.stderr
    (path,) = recording_files(rec)
    records = read_recording(path).records
    assert [r for r in records if r["k"] == "event" and r.get("where") == "zero-code hook"] == []
    assert len([r for r in records if r["k"] == "step"]) == 24
    later = [r for r in records if r["k"] == "sample" and r["t"] > records[-1]["t"] - 0.8 * 24 * 0.08]
    assert any((r.get("host") or {}).get("loader_workers") == 1 for r in later)
