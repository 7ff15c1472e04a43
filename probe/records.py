"""Records the probe builds on the sender thread: ``step`` from a hot-path tuple, and ``hello``."""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from probe import wire

CPU_SPAN_BODY = "body"      # API: __enter__ to __exit__ of step(), the loader wait before it left out
CPU_SPAN_ACTIVE = "active"  # zero-code and trainer callbacks: the step's start to its end, loader waits in it


DEVICE_WAIT = 5.0      # seconds the sender waits for a step's device number to reach the host
# What the hot path queues (``Probe._q``): (ITEM_STEP, ...) a ``StepItem``, or (ITEM_RECORD, record).
ITEM_STEP = 0
ITEM_RECORD = 1


class StepItem(NamedTuple):
    """One finished step as the hot path queues it (``probe.core``: ``step()``'s exit and zero-code
    ``add_step``), read here by name on the sender thread. The training thread appends a plain tuple
    in this field order (``StepItem(...)`` costs a Python-level call there, ~0.3-0.5 µs a step;
    bench/RESULTS.md "Hot path"); ``Probe._build`` makes it a ``StepItem`` once it is off that thread,
    and tests/unit/test_probe_records.py ties every field the hot path fills to its name.
    Times are ``perf_counter`` seconds."""

    kind: int                      # ITEM_STEP
    step: int
    start: float                   # the previous step's end (the step's ``dur`` includes the gap before it)
    end: float
    data: float                    # seconds blocked in the loader
    phases: dict[str, float]
    samples: float | None
    tokens: Any                    # a number, or a ``DeviceScalar`` read here
    flops: Any
    extras: dict[str, Any] | None  # keys the step hooks added (comm, mem, lead, ...)
    gap: float                     # time between steps, outside the loader wait
    data_cpu: float | None
    cpu: float | None              # training thread CPU seconds over ``cpu_span``
    cpu_span: str | None


class DeviceScalar:
    """A step number (``tokens=`` given as a device tensor) not yet on the host.

    Reading a CUDA tensor's value synchronizes the reading thread with the device; on the
    training thread that stalls the host's run-ahead every step. So at step end the training
    thread only enqueues a copy into pinned host memory and an event after it (both
    non-blocking, ``TorchCuda.copy_to_host``), and the sender thread reads the copy when it
    builds the step record, once the event has completed: it waits for the device (its
    viewer I/O with it, for at most the host's lead), the training thread never does.
    Deferring the read to the next step's end instead would not do: a host running several
    steps ahead would still find the copy incomplete, and a read there would sync. A device
    tensor this module cannot copy (``event`` None: not CUDA) is read on the sender thread
    as it is. ``scale`` carries a factor applied on read (6·N·tokens, ``flops.six_n``).
    """

    __slots__ = ("host", "event", "scale")

    def __init__(self, host: Any, event: Any = None, scale: float = 1.0) -> None:
        self.host = host
        self.event = event
        self.scale = scale

    def scaled(self, factor: float) -> DeviceScalar:
        return DeviceScalar(self.host, self.event, self.scale * factor)


def host_number(value: Any, on_error: Callable[[str, BaseException], None]) -> Any:
    """A step argument that is not a Python number, at step end on the training thread: a CPU
    tensor (or numpy scalar) becomes its number; a device tensor is not read here (that would
    synchronize the host with the device): a CUDA one is copied without blocking and read on
    the sender thread, any other is handed to the sender thread as it is (``DeviceScalar``); a failure
    goes to ``on_error`` and leaves the number unknown."""
    try:
        device = getattr(value, "device", None)
        if device is None or getattr(device, "type", device) == "cpu":
            return float(value)
        if getattr(value, "is_cuda", False):
            from probe.gpu import cuda
            return DeviceScalar(*cuda.backend.copy_to_host(value))
        return DeviceScalar(value)
    except Exception as exc:
        on_error("step argument", exc)
        return None


class DeviceReads:
    """Sender thread: reads ``DeviceScalar``s, waiting for their copy at most ``DEVICE_WAIT``.

    After a wait timed out (a hung device) the next reads do not wait until a copy is
    found complete again, so the records queued behind (stall events) still go out. What is
    not read is None (unknown) and goes to ``on_error``."""

    def __init__(self, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.on_error = on_error
        self.hung = False

    def read(self, value: Any) -> float | None:
        if not isinstance(value, DeviceScalar):
            return value
        try:
            event = value.event
            if event is not None and not event.query():
                if self.hung or not self._wait(event):
                    self.hung = True
                    raise TimeoutError(f"device copy of a step value not complete after {DEVICE_WAIT:.0f} s")
            self.hung = False
            return float(value.host) * value.scale
        except Exception as exc:
            if self.on_error is not None:
                self.on_error("device step value", exc)
            return None

    @staticmethod
    def _wait(event: Any) -> bool:
        """Poll ``query()`` (never blocks, holds no lock) from 1 ms, doubling to 50 ms."""
        deadline = time.monotonic() + DEVICE_WAIT
        pause = 0.001
        while not event.query():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        return True


def step_record(item: StepItem, epoch: float, reads: DeviceReads | None = None) -> dict[str, Any]:
    """The ``step`` record of one hot-path step; ``epoch`` turns perf_counter into unix seconds;
    ``reads`` turns device numbers (``DeviceScalar``) into host ones."""
    dur = item.end - item.start
    phases = dict(item.phases)
    if item.data:
        phases["data"] = item.data
    known = sum(v for v in phases.values())
    gap = max(0.0, item.gap)
    phases["other"] = max(0.0, dur - known - gap)   # phases + gap add up to dur
    rec: dict[str, Any] = {"k": "step", "t": item.end + epoch, "step": item.step, "start": item.start + epoch,
                           "dur": dur, "phases": phases, "gap": gap}
    for key, value in (("samples", item.samples), ("tokens", item.tokens), ("flops", item.flops),
                       ("data_cpu", item.data_cpu)):
        if value is not None:
            rec[key] = value
    if item.cpu is not None:
        rec["cpu"] = item.cpu
        rec["cpu_span"] = item.cpu_span
    if item.extras:
        rec.update(item.extras)
        if "ops" in item.extras:
            _relative_ops(rec, item.start)
    if isinstance(rec.get("tokens"), DeviceScalar) or isinstance(rec.get("flops"), DeviceScalar):
        _read_device_values(rec, reads or DeviceReads())
    return rec


def _relative_ops(rec: dict[str, Any], start: float) -> None:
    """The step's operations (perf_counter) as wire 1.5 ``ops``: s after the step's start, host clock."""
    rec["ops"] = [[op[0], round(op[1] - start, 6), round(op[2], 6), *op[3:5], *(round(w - start, 6) for w in op[5:])]
                  for op in rec["ops"]]
    rec["ops_clock"] = "host"
    if not rec.get("ops_dropped"):
        rec.pop("ops_dropped", None)


def _read_device_values(rec: dict[str, Any], reads: DeviceReads) -> None:
    """Device numbers -> host numbers; one not read is left out (unknown), as is a 6·N·tokens
    estimate from zero tokens (``flops.six_n`` gives none for a host zero either)."""
    if isinstance(rec.get("tokens"), DeviceScalar):
        tokens = reads.read(rec["tokens"])
        if tokens is None:
            del rec["tokens"]
        else:
            rec["tokens"] = tokens
    if isinstance(rec.get("flops"), DeviceScalar):
        flops = reads.read(rec["flops"])
        if flops:
            rec["flops"] = flops
        else:
            del rec["flops"]
            rec.pop("flops_source", None)


def hello(probe: Any) -> dict[str, Any]:
    torch_mod = sys.modules.get("torch")
    return {"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "job": probe.job, "rank": probe.rank,
            "local_rank": probe.local_rank, "world_size": probe.world_size, "host": platform.node(),
            "pid": probe.pid, "restart": probe.restart, "argv": [str(a)[:200] for a in sys.argv[:32]],
            "torch": getattr(torch_mod, "__version__", None), "device": probe.device,
            "gpus": probe.attached.gpu.host if probe.attached.gpu is not None else None, "name": probe.name,
            "python": platform.python_version()}
