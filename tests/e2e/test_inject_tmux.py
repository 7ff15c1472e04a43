"""``perfmon inject PID --attach`` in a real terminal (tmux): the TUI opens on the job once its
probe is up, and leaving it asks whether to detach; yes takes the probe out of the job."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_tmux import PANE_TITLES, Tmux, wait_screen
from tui.injector import why_no_rights

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed"),
              pytest.mark.skipif(why_no_rights() is not None, reason=f"no ptrace rights here: {why_no_rights()}")]
pytest.importorskip("hypno")

TARGET = Path(__file__).parents[1] / "integration" / "scripts" / "inject_target.py"


@pytest.fixture
def tmux(tmp_path):
    server = Tmux(tmp_path / "tmux.sock")
    yield server
    server.kill()


def test_inject_attach_opens_the_tui_and_leaving_it_detaches_after_asking(tmux, perfmon_dir, tmp_path):
    job = subprocess.Popen([sys.executable, str(TARGET), "--steps", "10000000", "--pause-at", "1"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    status_file = tmp_path / "status"
    try:
        assert '"pause": 1' in job.stdout.readline()      # training: torch imported, a step done
        job.stdin.write("go\n")
        job.stdin.flush()
        tmux.start(f"env PERFMON_DIR={perfmon_dir} TERM=xterm-256color {sys.executable} -m tui.cli inject "
                   f"{job.pid} --attach; echo $? > {status_file}", 120, 36)
        screen = wait_screen(tmux, lambda s: "inject_target" in s and all(t in s for t in PANE_TITLES), timeout=60)
        assert "Traceback" not in screen
        tmux.run("send-keys", "-t", "t", "q")
        wait_screen(tmux, lambda s: f"detach perfmon from {job.pid}? [Y/n]" in s, timeout=15)
        tmux.run("send-keys", "-t", "t", "Enter")
        deadline = time.monotonic() + 30
        while not status_file.exists() or not status_file.read_text().strip():
            assert time.monotonic() < deadline, tmux.screen()
            time.sleep(0.1)
        assert status_file.read_text().strip() == "0"
        assert f"{job.pid}: detached" in tmux.screen()
        assert job.poll() is None                          # the job goes on
        assert not list(perfmon_dir.glob("*.sock"))        # without its probe
        again = subprocess.run([sys.executable, "-m", "tui.cli", "detach", str(job.pid)], capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 2 and "no probe injected by perfmon" in again.stderr
    finally:
        job.kill()
        job.wait()
