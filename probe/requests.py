"""Viewer→probe requests (their form: ``probe/wire.py``), answered on the sender thread.

The sender accepts a ``request`` only from an authenticated viewer (SO_PEERCRED same user, or
the TCP token) that announced protocol 1.1, at most ``RATE`` per ``RATE_SECONDS`` per viewer,
and answers each with an ``answer`` record: accepted, or refused with a one-line reason. What
a request starts reports later in its own record kind (``profile``), to every viewer and the
recording. Handlers only validate and arm; the work happens on the training thread at a step
boundary or on a thread of its own.
"""

from __future__ import annotations

import sys
from typing import Any

RATE = 5               # requests per viewer ...
RATE_SECONDS = 10.0    # ... in this many seconds; beyond, refused

OPS = ("profile", "capture", "detach")
NOT_INJECTED = "this probe was not started by perfmon inject; stop it where it was started"


def handle(probe: Any, request: dict[str, Any]) -> str | None:
    """None when ``request`` was accepted, else why not."""
    op = request.get("op")
    if probe.closed:
        return "the job is shutting down"
    if op == "profile":
        from probe.module_profile import ModuleProfiler
        profiler = probe.attached.profiler
        if profiler is None:
            profiler = probe.attached.profiler = ModuleProfiler(probe)
        return profiler.request(request.get("id"), request.get("steps", 5), request.get("depth", 3))
    if op == "capture":
        from probe.capture import ProfilerCapture
        capture = probe.attached.capture
        if capture is None:
            capture = probe.attached.capture = ProfilerCapture(probe)
        return capture.request(request.get("id"), request.get("steps", 3))
    if op == "detach":
        injected = sys.modules.get("probe.inject")    # loaded only where perfmon inject put the probe
        if injected is None:
            return NOT_INJECTED
        return injected.detach_request(request.get("result"))
    return f"unknown request {str(op)[:30]!r} (this probe answers: {', '.join(OPS)})"
