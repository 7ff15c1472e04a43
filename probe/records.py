"""Records the probe builds on the sender thread: ``step`` from a hot-path tuple, and ``hello``."""

from __future__ import annotations

import platform
import sys
import time
from typing import Any

from probe import wire

CPU_SPAN_BODY = "body"      # API: __enter__ to __exit__ of step(), the loader wait before it left out
CPU_SPAN_ACTIVE = "active"  # zero-code and trainer callbacks: the step's start to its end, loader waits in it


def step_record(item: tuple, epoch: float) -> dict[str, Any]:
    """``item`` is the hot path's tuple (``probe.core``); ``epoch`` turns perf_counter into unix seconds."""
    _, step_no, start, end, data, phases, samples, tokens, flops, extras, gap, data_cpu, cpu, cpu_span = item
    dur = end - start
    phases = dict(phases)
    if data:
        phases["data"] = data
    known = sum(v for v in phases.values())
    gap = max(0.0, gap)
    phases["other"] = max(0.0, dur - known - gap)   # phases + gap add up to dur
    rec: dict[str, Any] = {"k": "step", "t": end + epoch, "step": step_no, "start": start + epoch,
                           "dur": dur, "phases": phases, "gap": gap}
    if samples is not None:
        rec["samples"] = samples
    if tokens is not None:
        rec["tokens"] = tokens
    if flops is not None:
        rec["flops"] = flops
    if data_cpu is not None:
        rec["data_cpu"] = data_cpu
    if cpu is not None:
        rec["cpu"] = cpu
        rec["cpu_span"] = cpu_span
    if extras:
        rec.update(extras)
    return rec


def hello(probe: Any) -> dict[str, Any]:
    torch_mod = sys.modules.get("torch")
    return {"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "job": probe.job, "rank": probe.rank,
            "local_rank": probe.local_rank, "world_size": probe.world_size, "host": platform.node(),
            "pid": probe.pid, "restart": probe.restart, "argv": [str(a)[:200] for a in sys.argv[:32]],
            "torch": getattr(torch_mod, "__version__", None), "device": probe.device, "name": probe.name,
            "python": platform.python_version()}
