"""On-demand ``torch.profiler`` capture of the next N steps (a ``capture`` request; its form is in ``probe/wire.py``).

The profiler starts at the end of the step during which the request arrived and stops at the
end of the N-th step after it, both on the training thread (``probe.step_window``); nothing
runs outside those steps. Its trace is written by a thread of its own as a gzip Chrome trace
(``export_chrome_trace``: with ``distributedInfo`` when ``torch.distributed`` is initialized,
which HTA reads) beside the rank's recording, else in the socket directory. The ``capture``
record carries the path and a summary: the operators with the most self time, and on GPU the
device's busy share of the captured steps and its longest idle gaps (kernel intervals merged).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from probe import paths
from probe.step_window import StepWindow

MAX_STEPS = 20           # operator traces grow fast: a capture is a few steps
TOP_OPS = 10
TOP_GAPS = 5


class ProfilerCapture(StepWindow):
    what = "capture"
    empty = {"path": None}

    def __init__(self, probe: Any) -> None:
        super().__init__(probe)
        self.prof: Any = None
        self.thread: int | None = None     # the thread that started the profiler (only it may stop it)
        self.cuda = False
        self.start_error: str | None = None

    def request(self, request_id: int, steps: Any) -> str | None:
        torch = sys.modules.get("torch")
        if torch is None:
            return "torch is not imported in this process: nothing to capture"
        if self.state == "idle" and _profiler_running(torch):    # not idle: the profiler running is ours
            return "torch.profiler is already running in this process (the job's own profiler?)"
        profiler = self.probe.attached.profiler
        if profiler is not None and profiler.state != "idle":
            return "a module profile is running; capture after it"
        return self.arm(request_id, steps, MAX_STEPS)

    # -- training thread --------------------------------------------------------------------
    def started(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        watcher = self.probe.attached.watcher
        self.cuda = watcher is not None and watcher.device_type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.start_error = None
        try:
            self.prof = profile(activities=activities, record_shapes=False, with_stack=False)
            self.thread = threading.get_ident()
            self.prof.start()
        except Exception as exc:
            self.prof = None
            self.start_error = f"torch.profiler did not start: {exc!r}"[:300]

    def ended(self) -> None:
        if self.prof is not None:
            try:
                self.prof.stop()
            except Exception as exc:
                self.start_error = f"torch.profiler did not stop cleanly: {exc!r}"[:300]
        self.release()

    def abandon(self) -> None:
        """``Probe.close`` during a capture: stop the profiler (on the thread that started it; the
        profiler cannot be stopped from another), write nothing."""
        prof, self.prof = self.prof, None
        if prof is not None and self.thread == threading.get_ident():
            try:
                prof.stop()
            except Exception:
                pass

    # -- finishing thread -------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        prof, self.prof = self.prof, None
        record: dict[str, Any] = {"k": "capture", "t": time.time(), "id": self.request_id, "steps": self.done,
                                  "first_step": self.first_step, "last_step": self.first_step + self.done - 1,
                                  "wall_s": self.t_end - self.t_start, "path": None}
        if prof is None or self.start_error:
            record["error"] = self.start_error or "the profiler did not run"
            return record
        record["path"] = str(self._write(prof))
        record.update(summary(prof, self.cuda, self.t_end - self.t_start))
        return record

    def _write(self, prof: Any) -> Path:
        directory = self.probe.record_path.parent if self.probe.record_path is not None else paths.socket_dir()
        out = directory / f"{self.probe.name}.capture-{self.first_step}.pt.trace.json.gz"
        fd, raw = tempfile.mkstemp(suffix=".json", dir=directory)
        os.close(fd)
        try:
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        finally:
            os.unlink(raw)
        return out


def summary(prof: Any, cuda: bool, wall_s: float) -> dict[str, Any]:
    """Top operators by self time; on GPU the device busy share and the longest idle gaps."""
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = sorted(prof.key_averages(), key=lambda e: -getattr(e, key, 0.0))
    top = [{"name": str(e.key)[:120], "self_s": getattr(e, key, 0.0) / 1e6, "calls": int(e.count)}
           for e in averages[:TOP_OPS] if getattr(e, key, 0.0) > 0]
    out: dict[str, Any] = {"top": top, "device_busy": None, "gaps": []}
    if not cuda:
        return out
    intervals = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)
                       and e.time_range.end > e.time_range.start)
    merged: list[list[float]] = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if merged and wall_s > 0:
        busy = sum(b - a for a, b in merged) / 1e6
        out["device_busy"] = min(1.0, busy / wall_s)
        gaps = sorted(((merged[i + 1][0] - merged[i][1]) / 1e6, (merged[i][1] - merged[0][0]) / 1e6)
                      for i in range(len(merged) - 1))[::-1][:TOP_GAPS]
        out["gaps"] = [{"seconds": g, "at_s": at} for g, at in gaps]
    return out


def _profiler_running(torch: Any) -> bool:
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except Exception:
        return False
