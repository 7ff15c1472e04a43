"""A request that acts on the next N whole steps (``profile``, ``capture``): the shared mechanics.

Armed on the sender thread; it starts at the end of the step during which it arrived (so the
first window step is whole), counts N step ends, then hands over to a thread of its own. The
probe's step-end hook is registered only while a window is pending, and removed after it, so
steps outside a window run none of this. One window of a kind at a time; a second request gets
the reason. Subclasses implement ``started`` and ``ended`` (training thread) and ``finish``
(their own thread, which ``emit``s the result record).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from typing import Any

ARMED_SECONDS = 60.0     # an armed window no step has started yet is replaced by a new request
EXIT_WAIT_SECONDS = 10.0  # at interpreter exit, a window's threads are waited for this long at most


class StepWindow:
    what = "window"      # the record kind and the name in refusals: "a profile is already running"
    empty: dict[str, Any] = {}   # keys the record kind requires, for a failed window's record

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self._lock = threading.Lock()
        self.state = "idle"            # idle | armed | running | finishing (+ a subclass's own)
        self.request_id: int | None = None
        self.steps = 0
        self.armed_at = 0.0
        self.done = 0
        self.first_step = 0
        self.t_start = 0.0             # perf_counter at the window's start
        self.t_end = 0.0               # ... and at the end of its N-th step
        self.hooked = False            # our step-end hook is registered
        self.finisher: threading.Thread | None = None
        self.exit_hook = False

    # -- sender thread ----------------------------------------------------------------------
    def arm(self, request_id: int, steps: Any, max_steps: int,
            configure: Callable[[], None] | None = None) -> str | None:
        """Arm a window of the next ``steps`` steps; the reason it cannot be, else None.
        ``configure`` runs once the window is sure to be armed (under the lock)."""
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= max_steps:
            return f"steps must be 1..{max_steps}"
        with self._lock:
            if self.state == "armed" and time.monotonic() - self.armed_at < ARMED_SECONDS:
                return (f"a {self.what} (request {self.request_id}) is waiting for the current step to end "
                        f"({time.monotonic() - self.armed_at:.0f} s so far)")
            if self.state not in ("idle", "armed"):
                return (f"a {self.what} is already running (request {self.request_id}, "
                        f"{self.done} of {self.steps} steps done)")
            if configure is not None:
                configure()
            self.state = "armed"
            self.request_id, self.steps = request_id, steps
            self.armed_at = time.monotonic()
        if not self.hooked:
            self.hooked = True
            self.probe.add_step_hooks(end=self._on_step_end)
        if not self.exit_hook:     # a thread of ours inside torch's C++ code at interpreter exit aborts it
            self.exit_hook = True
            atexit.register(self.join, EXIT_WAIT_SECONDS)
        return None

    # -- training thread --------------------------------------------------------------------
    def _on_step_end(self, extras: dict[str, Any], phases: dict[str, float]) -> None:
        if self.state == "armed":
            self.done = 0
            self.first_step = self.probe.steps + 1
            self.state = "running"
            self.started()
            self.t_start = time.perf_counter()
        elif self.state == "running":
            self.done += 1
            if self.done >= self.steps:
                self.t_end = time.perf_counter()
                self.ended()

    def started(self) -> None:
        """The window begins with the next step (training thread)."""

    def ended(self) -> None:
        """The N-th step ended (training thread): clean up, then ``release``."""
        self.release()

    def release(self) -> None:
        """Steps run nothing of ours any more; ``finish`` goes on on its own thread."""
        self.probe.remove_step_hooks(end=self._on_step_end)
        self.hooked = False
        self.state = "finishing"
        self.finisher = threading.Thread(target=self._finish_safely, name=f"perfmon-{self.what}", daemon=True)
        self.finisher.start()

    def join(self, timeout: float) -> None:
        """``Probe.close`` and interpreter exit: give a finishing window ``timeout`` seconds to end."""
        finisher = self.finisher
        if finisher is not None and finisher.is_alive():
            finisher.join(max(0.0, timeout))

    # -- finishing thread -------------------------------------------------------------------
    def _finish_safely(self) -> None:
        try:
            record = self.finish()
        except Exception as exc:
            record = {"k": self.what, "t": time.time(), "id": self.request_id, "steps": self.done,
                      "error": f"{self.what} failed: {exc!r}"[:300], **self.empty}
        record["cost"] = {"thread_cpu_s": time.thread_time()}   # this thread's CPU: it ran only this
        self.probe.emit(record)
        self.state = "idle"

    def finish(self) -> dict[str, Any]:   # pragma: no cover - abstract
        raise NotImplementedError
