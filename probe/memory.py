"""Where the memory goes: parameters, gradients, optimizer state, activations, cache, other.

* Parameter and optimizer-state bytes come from walking the watched models and
  optimizers on the sampler thread, de-duplicated by storage (views and tied
  weights count once; DTensor/FSDP parameters count their local shard). The walk
  is repeated only when a cheap signature changes (parameter and optimizer-state
  counts) or every ``REWALK_SECONDS``. Gradients are measured on the training
  thread, in the optimizer pre-hook: autograd assigns ``.grad`` without the GIL,
  so reading it from another thread during backward would race.
* CUDA: one ``memory_stats()`` per sample (each ``memory_allocated()``-style call
  rebuilds the whole dict). Activations = peak allocated − (params + grads +
  optimizer state); the peak is the allocator's since its last reset, and the
  probe never resets it (that would break the user's own peak tracking). Cache =
  reserved − allocated; fragmentation = inactive split bytes; other = what NVML
  says the process (or the device, when we are its only process) uses beyond
  what PyTorch reserved: CUDA context, NCCL buffers, cuBLAS workspaces.
* CPU: activations are the bytes autograd saves for backward, measured on one
  forward every ``ACTIVATION_SAMPLE_SECONDS`` with saved-tensor hooks; other = RSS
  − tensors we know; the limit is the cgroup's or the machine's (probe.host).
"""

from __future__ import annotations

import resource
import sys
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

REWALK_SECONDS = 60.0
MEMORY_PERIOD = 2.0          # seconds between memory reads on the sampler thread
HEARTBEAT_SECONDS = 30.0     # a memory record at least this often even when nothing changed
CHANGE_BYTES = 1 << 20       # smaller changes do not make a new record
ACTIVATION_SAMPLE_SECONDS = 30.0


def local_tensor(t: Any) -> Any:
    """The part of ``t`` this rank holds: a DTensor's local shard, else ``t``."""
    if type(t).__name__ == "DTensor":
        local = getattr(t, "_local_tensor", None)
        if local is None and hasattr(t, "to_local"):
            local = t.to_local()
        return local if local is not None else t
    return t


def storage_bytes(t: Any, seen: set, device_type: str | None = None) -> int:
    """Bytes of ``t``'s storage unless already counted (or on another device type)."""
    t = local_tensor(t)
    if device_type is not None and t.device.type != device_type:
        return 0
    if t.device.type == "meta":
        return 0
    key: tuple[Any, ...]
    try:
        storage = t.untyped_storage()
        key = (t.device.type, t.device.index, storage.data_ptr())
        nbytes = storage.nbytes()
    except Exception:   # tensors without storage (some subclasses): count their elements
        key = ("id", id(t))
        nbytes = t.numel() * t.element_size()
    if key[-1] == 0 and key[0] != "id":   # empty storage
        return 0
    if key in seen:
        return 0
    seen.add(key)
    return int(nbytes)


class StateWalker:
    """Cached bytes of parameters, gradients and optimizer state of what ``watch()`` saw."""

    def __init__(self) -> None:
        self.models: list[weakref.ref] = []
        self.optimizers: list[weakref.ref] = []
        self.device_type: str | None = None
        self.last: dict[str, int] = {}
        self.signature: tuple | None = None
        self.walked_at = 0.0
        self.grads_seen = 0
        self.need_grads = True     # the training thread measures gradients once, where they exist
        self.param_keys: frozenset = frozenset()

    def add_model(self, model: Any) -> None:
        self.models.append(weakref.ref(model))
        self.signature = None
        self.need_grads = True

    def add_optimizer(self, optimizer: Any) -> None:
        self.optimizers.append(weakref.ref(optimizer))
        self.signature = None
        self.need_grads = True

    def capture_grads(self) -> None:
        """Gradient bytes, measured where gradients surely exist (the optimizer pre-hook).

        ``zero_grad(set_to_none=True)`` frees them every step, so the sampler thread
        may never see them. Runs once (and again when the parameter set changes).
        """
        seen: set = set()
        grads = [p.grad for p in self._params() if p.grad is not None]
        if grads:
            self.need_grads = False
            self.grads_seen = sum(storage_bytes(g, seen, self.device_type) for g in grads)
            self.signature = None   # the next walk reports them

    def _params(self) -> list[Any]:
        params: list[Any] = []
        ids: set[int] = set()
        for ref in self.models:
            model = ref()
            if model is not None:
                for p in model.parameters():
                    if id(p) not in ids:
                        ids.add(id(p))
                        params.append(p)
        for ref in self.optimizers:
            opt = ref()
            if opt is not None:
                for group in opt.param_groups:
                    for p in group["params"]:
                        if id(p) not in ids:
                            ids.add(id(p))
                            params.append(p)
        return params

    def _state_tensors(self) -> Iterable[Any]:
        torch = sys.modules["torch"]
        for ref in self.optimizers:
            opt = ref()
            if opt is None:
                continue
            for state in list(opt.state.values()):
                if isinstance(state, dict):
                    for value in list(state.values()):
                        if isinstance(value, torch.Tensor):
                            yield value

    def _signature(self, params: list[Any]) -> tuple:
        states = 0
        for ref in self.optimizers:
            opt = ref()
            if opt is not None:
                states += sum(len(s) for s in list(opt.state.values()) if isinstance(s, dict))
        return (len(params), states)

    def measure(self, now: float | None = None) -> dict[str, int]:
        """{params, grads, optimizer, trainable (element count)} in bytes; cached.

        ``grads`` is what ``capture_grads`` last measured (the memory gradients take
        when they exist: ``zero_grad(set_to_none=True)`` frees them every step).
        """
        now = time.monotonic() if now is None else now
        params = self._params()
        sig = self._signature(params)
        if sig == self.signature and now - self.walked_at < REWALK_SECONDS:
            return self.last
        if self.signature is not None and sig[0] != self.signature[0]:
            self.need_grads = True
        dt = self.device_type
        seen: set = set()
        out = {"params": sum(storage_bytes(p, seen, dt) for p in params)}
        self.param_keys = frozenset(seen)
        out["grads"] = self.grads_seen
        out["optimizer"] = sum(storage_bytes(t, seen, dt) for t in self._state_tensors())
        out["trainable"] = sum(p.numel() for p in params if p.requires_grad)
        self.last = out
        self.signature = sig
        self.walked_at = now
        return out


class SavedTensorMeter:
    """Bytes autograd saves for backward during one forward (CPU activations).

    Uses ``torch.autograd.graph.saved_tensors_hooks`` with pack/unpack that return
    the tensor unchanged, so training is not altered; parameters are excluded. A pack
    that fails to size its tensor leaves that forward's total short: the result is then
    unknown (None), and the first error of the forward goes to ``on_error`` at ``stop``.
    """

    def __init__(self, param_keys: Callable[[], frozenset],
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.param_keys = param_keys
        self.on_error = on_error
        self.ctx: Any = None
        self.seen: set = set()
        self.total = 0
        self.error: BaseException | None = None   # the first pack failure of this forward
        self.result: int | None = None
        self.next_due = 0.0        # perf_counter time of the next measurement

    def due(self, now: float) -> bool:
        return self.ctx is None and now >= self.next_due

    def _pack(self, t: Any) -> Any:
        try:
            self.total += storage_bytes(t, self.seen)
        except Exception as exc:
            if self.error is None:
                self.error = exc
        return t

    @staticmethod
    def _unpack(t: Any) -> Any:
        return t

    def start(self) -> None:
        torch = sys.modules["torch"]
        self.seen = set(self.param_keys())
        self.total = 0
        self.error = None
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self.ctx.__enter__()

    def stop(self, now: float) -> None:
        ctx, self.ctx = self.ctx, None
        if ctx is None:
            return
        ctx.__exit__(None, None, None)
        error, self.error = self.error, None
        self.result = self.total if error is None else None
        self.next_due = now + ACTIVATION_SAMPLE_SECONDS
        self.seen = set()
        if error is not None and self.on_error is not None:
            self.on_error("saved-tensor meter", error)


def cuda_memory(stats: dict[str, Any], state: dict[str, int] | None, total: int | None,
                nvml_used: int | None) -> dict[str, Any]:
    """The ``memory`` record fields for one CUDA device from one ``memory_stats()`` dict."""
    allocated = stats.get("allocated_bytes.all.current")
    reserved = stats.get("reserved_bytes.all.current")
    peak = stats.get("allocated_bytes.all.peak")
    out: dict[str, Any] = {
        "allocated": allocated,
        "reserved": reserved,
        "peak": peak,
        "peak_reserved": stats.get("reserved_bytes.all.peak"),
        "cache": reserved - allocated if reserved is not None and allocated is not None else None,
        "fragmentation": stats.get("inactive_split_bytes.all.current"),
        "alloc_retries": stats.get("num_alloc_retries"),
        "ooms": stats.get("num_ooms"),
        "limit": total,
        "other": max(0, nvml_used - reserved) if nvml_used is not None and reserved is not None else None,
    }
    if state:
        out.update(params=state["params"], grads=state["grads"], optimizer=state["optimizer"])
        if peak is not None:
            out["activations"] = max(0, peak - state["params"] - state["grads"] - state["optimizer"])
    return out


def cpu_memory(rss: int, peak_rss: int | None, state: dict[str, int] | None, activations: int | None,
               limit: int | None) -> dict[str, Any]:
    """The ``memory`` record fields for a CPU job."""
    peak = max(peak_rss, rss) if peak_rss is not None else None   # ru_maxrss is updated lazily
    out: dict[str, Any] = {"rss": rss, "peak": peak, "limit": limit, "activations": activations}
    known = activations or 0
    if state:
        out.update(params=state["params"], grads=state["grads"], optimizer=state["optimizer"])
        known += state["params"] + state["grads"] + state["optimizer"]
    out["other"] = max(0, rss - known)
    return out


def peak_rss() -> int | None:
    """Peak RSS of this process (Linux reports ru_maxrss in KiB)."""
    try:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (OSError, ValueError):
        return None


class MemorySource:
    """Sampler source that emits ``memory`` records on change, at most every MEMORY_PERIOD."""

    name = "memory"

    def __init__(self, emit: Callable[[dict[str, Any]], None], walker: StateWalker, *, device_type: str,
                 index: int | None = None, cuda: Any = None, nvml: Any = None, nvml_device: Any = None,
                 activations: SavedTensorMeter | None = None) -> None:
        self.emit = emit
        self.walker = walker
        self.device_type = device_type
        self.index = index
        self.cuda = cuda
        self.nvml = nvml
        self.nvml_device = nvml_device
        self.activations = activations
        self.last_read = float("-inf")
        self.last_emit = float("-inf")
        self.last_record: dict[str, Any] | None = None
        self.total: int | None = None
        self.limit: tuple[int, str] | None = None
        self.proc: Any = None

    def retarget(self, device_type: str, index: int | None, nvml_device: Any,
                 activations: SavedTensorMeter | None) -> None:
        """The job moved to another device (``Watcher._set_device``): read that one from now on."""
        self.device_type, self.index, self.nvml_device, self.activations = device_type, index, nvml_device, activations
        self.total = None
        self.limit = None
        self.last_read = float("-inf")

    def read(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self.last_read < MEMORY_PERIOD:
            return {}
        self.last_read = now
        record = self.build(now)
        if record is not None and self._changed(record, now):
            self.last_record = record
            self.last_emit = now
            self.emit(record)
        return {}

    def build(self, now: float) -> dict[str, Any] | None:
        state = self._state(now)
        if self.device_type == "cuda":
            fields = self._cuda(state)
            device = f"cuda:{self.index}" if self.index is not None else "cuda"
        else:                      # CPU, and devices without allocator statistics here (host view)
            fields = self._cpu(state)
            device = self.device_type
        if fields is None:
            return None
        return {"k": "memory", "t": time.time(), "device": device, **fields}

    def _state(self, now: float) -> dict[str, int] | None:
        if not self.walker.models and not self.walker.optimizers:
            return None
        try:
            return self.walker.measure(now)
        except RuntimeError:     # optimizer state grew while we iterated it (first step): next time
            return self.walker.last or None

    def _cuda(self, state: dict[str, int] | None) -> dict[str, Any] | None:
        cuda = self.cuda
        if cuda is None or not cuda.ready():
            return None
        index = self.index if self.index is not None else cuda.current_device()
        stats = cuda.memory_stats(index)
        if not stats:
            return None
        if self.total is None:
            self.total = cuda.total_memory(index)
        return cuda_memory(stats, state, self.total, self._nvml_used())

    def _nvml_used(self) -> int | None:
        if self.nvml is None or self.nvml_device is None:
            return None
        used, nprocs = self.nvml.process_used(self.nvml_device)
        if used is None and nprocs == 1:   # the driver may report host PIDs: we are its only process
            used = self.nvml.memory_used(self.nvml_device)
        return used

    def _cpu(self, state: dict[str, int] | None) -> dict[str, Any]:
        if self.proc is None:
            import psutil

            from probe.host import memory_limit
            self.proc = psutil.Process()
            self.limit = memory_limit()
        rss = self.proc.memory_info().rss
        acts = self.activations.result if self.activations is not None else None
        out = cpu_memory(rss, peak_rss(), state, acts, self.limit[0] if self.limit else None)
        if self.limit:
            out["limit_source"] = self.limit[1]
        return out

    def _changed(self, record: dict[str, Any], now: float) -> bool:
        last = self.last_record
        if last is None or now - self.last_emit >= HEARTBEAT_SECONDS:
            return True
        for key, value in record.items():
            if key in ("t", "k"):
                continue
            old = last.get(key)
            if key in ("ooms", "alloc_retries", "params", "grads", "optimizer", "limit"):
                if value != old:
                    return True
            elif isinstance(value, (int, float)) and isinstance(old, (int, float)):
                if abs(value - old) >= CHANGE_BYTES:
                    return True
            elif value != old:
                return True
        return False
