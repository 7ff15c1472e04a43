"""``perfmon attach`` in a real terminal (tmux) beside a real CPU training job.

The job (jobs/io_bound_job.py) waits on slow storage in its loader, so the
verdict must be data_loading. Each size checks: panes and the verdict appear
within 10 s, ``q`` ends the program at once with status 0, and no traceback
is on the screen or in stderr. A last test closes the terminal under the
viewer (what an SSH drop does) and checks that the process goes away.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.streamutil import kill_tree  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")]

JOB = Path(__file__).parent / "jobs" / "io_bound_job.py"
PANE_TITLES = ("device", "data", "comm")


class Tmux:
    """A private tmux server (its own socket) so tests never touch the user's sessions."""

    def __init__(self, socket_path: Path) -> None:
        self.socket = str(socket_path)

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def start(self, command: str, width: int, height: int) -> None:
        self.run("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), command)
        self.run("set-option", "-t", "t", "remain-on-exit", "on")

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def pane(self, fmt: str) -> str:
        return self.run("display-message", "-p", "-t", "t", fmt).strip()

    def kill(self) -> None:
        self.run("kill-server", check=False)


@pytest.fixture(scope="module")
def training_job(tmp_path_factory):
    """One real job for the module (torch import is the slow part), with its own socket dir."""
    sock_dir = tmp_path_factory.mktemp("e2e-sock")
    os.chmod(sock_dir, 0o700)
    env = {**os.environ, "PERFMON_DIR": str(sock_dir)}
    proc = subprocess.Popen([sys.executable, str(JOB), "e2e-io", "120"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    first = proc.stdout.readline().strip()
    assert first.endswith(".sock"), proc.stderr.read()
    yield env
    proc.kill()
    proc.wait()


@pytest.fixture
def tmux(tmp_path):
    server = Tmux(tmp_path / "tmux.sock")
    yield server
    server.kill()


def attach_command(env: dict, exec_: bool = True) -> str:
    # Textual draws on stderr, so it stays on the terminal: a traceback would land on the screen too
    return (f"{'exec ' if exec_ else ''}env PERFMON_DIR={env['PERFMON_DIR']} TERM=xterm-256color "
            f"{sys.executable} -m tui.cli attach e2e-io")


def wait_screen(tmux: Tmux, cond, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux.screen()
        if cond(screen):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"screen not as expected after {timeout}s:\n{screen}")


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_attach_names_the_real_bottleneck_and_quits_at_once(training_job, tmux, size, tmp_path):
    status_file = tmp_path / "status"
    started = time.monotonic()
    # the shell writes the exit status to a file: tmux 3.3 sometimes leaves a dead pane's process
    # unreaped, and then never reports #{pane_dead_status}
    tmux.start(attach_command(training_job, exec_=False) + f"; echo $? > {status_file}", *size)
    screen = wait_screen(tmux, lambda s: "DATA LOADING" in s and all(t in s for t in PANE_TITLES), timeout=120)
    took = time.monotonic() - started
    assert "Traceback" not in screen
    assert "e2e-io" in screen and "path:" in screen
    tmux.run("send-keys", "-t", "t", "q")
    # "at once": no slower than the viewer started and drew its verdict on this machine now (2 s at
    # the least), so a load that slows everything moves the bound too; a quit that waits out a
    # timeout or a join does not fit in it
    quit_bound = max(2.0, took)
    deadline = time.monotonic() + quit_bound
    while not status_file.exists() or not status_file.read_text().strip():
        assert time.monotonic() < deadline, f"q did not end perfmon attach within {quit_bound:.1f} s"
        time.sleep(0.05)
    assert status_file.read_text().strip() == "0"
    assert "Traceback" not in tmux.screen()
    print(f"{size}: verdict on screen {took:.2f}s after launch")


def test_closing_the_terminal_ends_the_viewer(training_job, tmux):
    import psutil
    tmux.start(attach_command(training_job), 100, 30)
    wait_screen(tmux, lambda s: "DATA LOADING" in s, timeout=120)
    pid = int(tmux.pane("#{pane_pid}"))
    viewer = psutil.Process(pid)
    tmux.kill()   # the pty goes away, as with a dropped SSH connection
    deadline = time.monotonic() + 60.0       # bounds a failure only: a viewer left running never ends
    while viewer.is_running() and viewer.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the viewer is still running after its terminal went away"
        time.sleep(0.05)


def test_attach_to_a_stuck_job_names_the_culprit_and_s_shows_where_each_rank_is(tmp_path, tmux):
    """2 gloo ranks, rank 1 asleep before its 20th all-reduce; the same diagnosis as
    ``perfmon report`` on the screen, and each rank's stack behind ``s``."""
    script = Path(__file__).parents[1] / "integration" / "scripts" / "stuck_jobs.py"
    sock_dir = os.environ["PERFMON_DIR"]       # conftest's fresh 0700 directory: a short path for the sockets
    mark = tmp_path / "mark"
    env = {**os.environ, "PERFMON_DIR": str(sock_dir), "PERFMON_JOB": "e2e-stuck", "PERFMON_STALL_S": "2"}
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(script), "collective", str(mark)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not mark.exists():
            assert job.poll() is None and time.monotonic() < deadline, "the job did not reach its stall"
            time.sleep(0.2)
        tmux.start(f"exec env PERFMON_DIR={sock_dir} TERM=xterm-256color {sys.executable} -m tui.cli attach e2e-stuck",
                   120, 36)
        # the culprit's own stall record names its line; until it arrives it is named by elimination
        screen = wait_screen(tmux, lambda s: "never reached all_reduce #20 (stuck_jobs.py:" in s, 120)
        assert "STUCK" in screen and "stuck_jobs.py:" in screen and "✖" in screen   # ranks pane: the culprit
        tmux.run("send-keys", "-t", "t", "s")
        screen = wait_screen(tmux, lambda s: "culprit" in s and "waiting" in s, 60)
        assert "in collective" in screen and "in all_reduce" in screen
        assert "Traceback" not in screen
    finally:
        kill_tree(job)
