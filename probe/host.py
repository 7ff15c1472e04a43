"""Host numbers for the ``sample`` record: process and system CPU, RSS, memory limit.

The memory limit is what a CPU job is judged against:
``PERFMON_MEMORY_LIMIT`` if set, else the cgroup's, else the machine's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int | None:
    """'8G', '512m', '1073741824' -> bytes; None if unreadable."""
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = text[-1:] if text[-1:] in _UNITS and not text[-1:].isdigit() else ""
    number = text[: -1] if unit else text
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        return None
    return int(value) if value > 0 else None


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2, then v1), None when unlimited."""
    candidates = [Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[0] == "0":
                candidates.insert(0, Path("/sys/fs/cgroup") / parts[2].lstrip("/") / "memory.max")
    except OSError:
        pass
    for path in candidates:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        if value < (1 << 60):  # v1 reports "unlimited" as a huge number
            return value
    return None


def memory_limit() -> tuple[int, str]:
    """(bytes, where it came from) for the CPU memory verdict."""
    env = os.environ.get("PERFMON_MEMORY_LIMIT")
    if env:
        parsed = parse_bytes(env)
        if parsed:
            return parsed, "PERFMON_MEMORY_LIMIT"
    total = psutil.virtual_memory().total
    cg = cgroup_memory_limit()
    if cg is not None and cg < total:
        return cg, "cgroup"
    return total, "machine"


class HostSource:
    """Process CPU (cores busy), system CPU share, RSS and memory; about 60 µs a read."""

    name = "host"

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)
        psutil.cpu_percent(None)
        self.limit, self.limit_source = memory_limit()

    def read(self) -> dict[str, Any]:
        with self.proc.oneshot():
            cpu = self.proc.cpu_percent(None) / 100.0
            rss = self.proc.memory_info().rss
        vm = psutil.virtual_memory()
        return {"host": {
            "cpu": cpu,                                  # cores busy in this process
            "cpu_count": psutil.cpu_count() or 1,
            "sys_cpu": psutil.cpu_percent(None) / 100.0,  # share of all cores
            "rss": rss,
            "mem_used": vm.total - vm.available,
            "mem_total": vm.total,
            "mem_limit": self.limit,
            "mem_limit_source": self.limit_source,
        }}


def other_threads_cpu(proc0: float, cpu: float) -> dict[str, Any] | None:
    """A timed step's ``cpu_others`` (CPU s of the process's other threads over the step) and
    ``intra_threads`` (torch's intra-op thread count, read on the training thread, where a
    ``torch.set_num_threads`` applies): on CPU, torch's intra-op threads do part of each op while
    the training thread waits for them off its CPU, which is work, not an unexplained wait
    (``perfmon_analysis.readings.step_cpu``). One more clock read and a torch call, on timed steps only."""
    try:
        out: dict[str, Any] = {"cpu_others": max(0.0, time.process_time() - proc0 - cpu)}
        torch = sys.modules.get("torch")
        if torch is not None:
            out["intra_threads"] = int(torch.get_num_threads())
        return out
    except Exception:
        return None
