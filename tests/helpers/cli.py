"""The ``perfmon`` command line as a user runs it: this interpreter's ``tui.cli`` in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

PERFMON = [sys.executable, "-m", "tui.cli"]


def perfmon(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``perfmon ARGS``, its output captured as text; ``env`` is the whole environment (None: this one's)."""
    return subprocess.run([*PERFMON, *args], capture_output=True, text=True, timeout=timeout, env=env, **kwargs)


def report_until(done: Callable[[dict], bool], *args: str, env: dict[str, str] | None = None,
                 seconds: float = 1.0, give_up: float = 240.0) -> dict:
    """``perfmon report ARGS --json`` of a live job, asked again with twice the window until
    ``done(report)``. A report's window counts from the command's start (its relays' start-up
    included), which a loaded machine stretches: the test waits on what the report says, and
    ``give_up`` only bounds a failure."""
    deadline = time.monotonic() + give_up
    while True:
        out = perfmon("report", *args, "--json", "--seconds", f"{seconds:g}", env=env)
        report = json.loads(out.stdout) if out.returncode == 0 else None
        if report is not None and done(report):
            return report
        assert time.monotonic() < deadline, (out.returncode, out.stderr[-2000:], report)
        seconds *= 2
