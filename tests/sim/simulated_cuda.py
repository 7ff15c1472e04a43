"""SIMULATED CUDA backend: the interface of ``probe.gpu.cuda.TorchCuda`` with scripted values.

* ``memory_stats`` returns the dict a test set (the keys of ``torch.cuda.memory_stats``).
* Events: ``record_on`` stamps the simulated device clock (``device_time``, advanced
  by the test as if kernels ran) and makes the event complete ``lag`` seconds of host
  time later, so code that polls ``query()`` sees the host running ahead of the
  device. ``elapsed_time`` refuses incomplete events, like CUDA's.
* The sync debug mode is a plain integer.
Every call is logged in ``calls`` so tests can assert what the probe never does.
Nothing here talks to a GPU.
"""

from __future__ import annotations

import time
import warnings
from typing import Any


class SimulatedEvent:
    def __init__(self, cuda: "SimulatedCuda") -> None:
        self.cuda = cuda
        self.device_t: float | None = None
        self.complete_at: float | None = None

    def query(self) -> bool:
        return self.complete_at is not None and time.perf_counter() >= self.complete_at

    def elapsed_time(self, other: "SimulatedEvent") -> float:
        if self.device_t is None or other.device_t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and other.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (other.device_t - self.device_t) * 1e3


class SimulatedCuda:
    """Stand-in for ``probe.gpu.cuda.backend``; ``name`` says it is a simulation."""

    name = "simulated CUDA"

    def __init__(self, *, stats: dict[str, Any] | None = None, total: int = 80 * (1 << 30),
                 device_name: str = "NVIDIA H100 80GB HBM3",
                 uuid: str = "GPU-00000000-sim0-0000-0000-000000000000", sync_mode: int = 0,
                 lag: float = 0.0) -> None:
        self.stats = dict(stats or {})
        self.total = total
        self.name_of_device = device_name
        self.uuid = uuid
        self.sync_mode = sync_mode
        self.lag = lag
        self.device_time = 0.0
        self.calls: list[str] = []
        self.events_created = 0

    def ready(self) -> bool:
        return True

    def memory_stats(self, index: int) -> dict[str, Any]:
        self.calls.append("memory_stats")
        return dict(self.stats)

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def total_memory(self, index: int) -> int:
        self.calls.append("total_memory")
        return self.total

    def device_name(self, index: int) -> str:
        return self.name_of_device

    def device_uuid(self, index: int) -> str | None:
        return self.uuid

    def new_event(self) -> SimulatedEvent:
        self.events_created += 1
        return SimulatedEvent(self)

    def record_on(self, event: SimulatedEvent, index: int | None = None) -> None:
        self.calls.append("record")
        event.device_t = self.device_time
        event.complete_at = time.perf_counter() + self.lag

    def run(self, seconds: float) -> None:
        """The simulated device executes ``seconds`` of work on the current stream."""
        self.device_time += seconds

    def get_sync_debug_mode(self) -> int:
        return self.sync_mode

    def set_sync_debug_mode(self, mode: int) -> None:
        self.calls.append(f"set_sync_debug_mode({mode})")
        self.sync_mode = mode

    def synchronizing_op(self) -> None:
        """A host-device sync (``loss.item()``) as c10's ``warn_or_error_on_sync`` treats it: debug mode
        1 raises the ``TORCH_WARN`` as a Python ``UserWarning`` from the caller's line (through the
        warnings filters, as torch's PyWarningHandler does), 2 raises an error, 0 says nothing."""
        from probe.gpu.cuda import SYNC_MESSAGE

        self.calls.append("sync")
        if self.sync_mode == 1:
            warnings.warn(SYNC_MESSAGE + " (simulated)", UserWarning, stacklevel=2)
        elif self.sync_mode == 2:
            raise RuntimeError(SYNC_MESSAGE + " (simulated)")


def memory_stats(*, allocated: int, reserved: int, peak: int, peak_reserved: int | None = None,
                 inactive_split: int = 0, retries: int = 0, ooms: int = 0) -> dict[str, int]:
    """A ``torch.cuda.memory_stats()``-shaped dict (only the keys the probe reads, plus noise)."""
    return {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": reserved,
        "reserved_bytes.all.peak": peak_reserved if peak_reserved is not None else reserved,
        "active_bytes.all.current": allocated,
        "inactive_split_bytes.all.current": inactive_split,
        "num_alloc_retries": retries,
        "num_ooms": ooms,
        "num_sync_all_streams": 0,
        "num_device_alloc": 12,
        "num_device_free": 3,
    }
