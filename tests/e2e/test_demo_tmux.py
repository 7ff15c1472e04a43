"""Plain ``perfmon demo`` in a real terminal (tmux): the tour's live TUI shows a verdict
within 20 s, and ``q`` or Ctrl-C stops the workload and leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import psutil
import pytest

from tests.e2e.test_tmux import PANE_TITLES, Tmux, wait_screen
from tests.integration.demoutil import demo_processes as workload_processes

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")]


@pytest.fixture
def tmux(tmp_path):
    server = Tmux(tmp_path / "tmux.sock")
    yield server
    server.kill()


@pytest.mark.parametrize("key", ["q", "C-c"])
def test_plain_demo_shows_a_verdict_and_quits_cleanly(tmux, perfmon_dir, tmp_path, key):
    status_file = tmp_path / "status"
    started = time.monotonic()
    # the shell writes the exit status to a file: tmux 3.3 sometimes leaves a dead pane's process
    # unreaped, and then never reports #{pane_dead_status}
    tmux.start(f"env PERFMON_DIR={perfmon_dir} TERM=xterm-256color {sys.executable} -m tui.cli demo; "
               f"echo $? > {status_file}", 120, 36)
    screen = wait_screen(tmux, lambda s: "HEALTHY" in s and all(t in s for t in PANE_TITLES), timeout=20)
    took = time.monotonic() - started
    assert "Traceback" not in screen
    assert "demo-tour" in screen
    procs = workload_processes(perfmon_dir)
    assert procs, "the demo's training rank is not running"
    tmux.run("send-keys", "-t", "t", key)
    deadline = time.monotonic() + 10.0     # the rank finishes its step, then the launcher returns
    while not status_file.exists() or not status_file.read_text().strip():
        assert time.monotonic() < deadline, f"{key} did not end perfmon demo within 10 s"
        time.sleep(0.1)
    assert status_file.read_text().strip() == "0"
    assert "Traceback" not in tmux.screen()
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert alive == []
    assert os.listdir(perfmon_dir) == []
    print(f"verdict on screen {took:.1f}s after `perfmon demo` started")
