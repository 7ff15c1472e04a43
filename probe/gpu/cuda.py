"""CUDA-side measurements that never synchronize the host with the device.

* ``TorchCuda``: the only place that calls ``torch.cuda``. Tests swap ``backend``
  for a simulated one (tests/sim), so every path here runs without a GPU.
* ``Poller``: a background thread that asks CUDA events and NCCL works whether
  they are done (``query()``/``is_completed()`` never block) and only then reads
  their times (``elapsed_time``/``_get_duration`` require completion).
* ``StepTimer``: a reused pool of timing events recorded on the current stream at
  step and phase boundaries (creating events is costly, so they are pooled, as
  ATen's EventPool does). The host time at which the step's last event is seen
  complete, minus the host time it was recorded, is how far the host runs ahead
  of the device: near zero means the device is starved.
* ``SyncCounter`` (opt-in: ``watch(syncs=True)`` or ``PERFMON_SYNCS=1``): counts host-device
  synchronizations with ``torch.cuda.set_sync_debug_mode("warn")``. PyTorch offers no hook on
  its C++ warnings (``TORCH_WARN`` becomes a Python warning, through the user's filters), so
  the counter is a ``warnings`` filter entry kept first in the list: it is put back in front
  at every step begin, so ``-W error``, ``PYTHONWARNINGS=error`` and any filter added between
  steps (``catch_warnings`` + ``simplefilter("error"|"ignore")`` around the loop) neither turn
  a sync into an exception nor silence the count. A filter added *inside* a step takes
  precedence until the next step begins: there a sync warning meets that filter (raised
  under "error", uncounted under "ignore"). That is why counting is opt-in. Not covered by
  the debug mode (documented by PyTorch): ``torch.cuda.synchronize()``, event syncs,
  allocator-caused syncs, torch.distributed and torch.sparse.
"""

from __future__ import annotations

import atexit
import collections
import sys
import threading
import time
import warnings
from typing import Any, Callable

SYNC_MESSAGE = "called a synchronizing CUDA operation"   # TORCH_WARN text in c10/cuda/CUDAFunctions.h


class TorchCuda:
    """The real CUDA device, reached through torch only when the script already uses it."""

    name = "torch.cuda"

    @staticmethod
    def _torch() -> Any:
        return sys.modules.get("torch")

    def ready(self) -> bool:
        """True when torch is imported and CUDA is initialized (we never initialize it)."""
        torch = self._torch()
        try:
            return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())
        except Exception:
            return False

    def memory_stats(self, index: int) -> dict[str, Any]:
        return self._torch().cuda.memory_stats(index)

    def device_count(self) -> int:
        return self._torch().cuda.device_count()

    def current_device(self) -> int:
        return self._torch().cuda.current_device()

    def total_memory(self, index: int) -> int:
        return int(self._torch().cuda.get_device_properties(index).total_memory)

    def device_name(self, index: int) -> str:
        return str(self._torch().cuda.get_device_name(index))

    def device_uuid(self, index: int) -> str | None:
        uuid = getattr(self._torch().cuda.get_device_properties(index), "uuid", None)
        return str(uuid) if uuid is not None else None

    def tensor_device(self, tensor: Any) -> tuple[str, int | None]:
        """Where a tensor lives: ("cuda", index), ("cpu", None), ... (``tensor.device``)."""
        device = tensor.device
        return str(device.type), device.index

    def allocating_devices(self) -> list[int]:
        """CUDA devices on which this process holds allocated tensor memory, without initializing
        CUDA (empty until the script initializes it) and without creating a context: the caching
        allocator's counters are host-side."""
        if not self.ready():
            return []
        cuda = self._torch().cuda
        return [i for i in range(cuda.device_count()) if cuda.memory_allocated(i) > 0]

    def new_event(self) -> Any:
        return self._torch().cuda.Event(enable_timing=True)

    def record_on(self, event: Any, index: int | None = None) -> None:
        """Record on the current stream of device ``index`` (current device when None)."""
        if index is None:
            event.record()
        else:
            event.record(self._torch().cuda.current_stream(index))

    def pending(self, index: int) -> bool:
        """Work queued on the device's default stream is not finished (``query()`` never blocks).
        A watcher thread's current stream is the default one, so side streams are not seen."""
        return not self._torch().cuda.default_stream(index).query()

    def get_sync_debug_mode(self) -> int:
        return int(self._torch().cuda.get_sync_debug_mode())

    def set_sync_debug_mode(self, mode: int) -> None:
        self._torch().cuda.set_sync_debug_mode(mode)


backend: Any = TorchCuda()


class Poller(threading.Thread):
    """Polls completion of device work every few ms while any is pending.

    Clients are callables returning True while they still wait for something.
    A failing client is dropped after ``MAX_ERRORS`` failures in a row.
    """

    PERIOD = 0.005      # lead resolution; ~200 wake-ups/s only while work is pending
    IDLE = 0.05
    MAX_ERRORS = 5

    def __init__(self, alive: Callable[[], bool]) -> None:
        super().__init__(name="perfmon-poller", daemon=True)
        self.alive = alive
        self.clients: list[Callable[[], bool]] = []   # one per timer/poller kind: bounded by the code
        self.errors: dict[int, int] = {}
        self.dropped = 0          # clients dropped after MAX_ERRORS failures (probe.health reports it)
        self.stop_event = threading.Event()

    def add(self, client: Callable[[], bool]) -> None:
        if self.stop_event.is_set():
            return
        self.clients = self.clients + [client]
        if not self.is_alive() and not self.stop_event.is_set():
            try:
                self.start()
            except RuntimeError:   # already started
                pass

    def run(self) -> None:
        while not self.stop_event.is_set() and self.alive():
            busy = self.poll_once()
            self.stop_event.wait(self.PERIOD if busy else self.IDLE)

    def stop(self, timeout: float = 1.0) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout)
        self.clients = []

    def poll_once(self) -> bool:
        busy = False
        for client in self.clients:
            try:
                busy = bool(client()) or busy
                self.errors[id(client)] = 0
            except Exception:
                n = self.errors.get(id(client), 0) + 1
                self.errors[id(client)] = n
                if n >= self.MAX_ERRORS:
                    self.clients = [c for c in self.clients if c is not client]
                    self.errors.pop(id(client), None)
                    self.dropped += 1
        return busy


def poller_for(probe: Any) -> Poller:
    """The probe's completion poller thread (``probe.attached.poller``; created on first use,
    stopped at ``close()`` and at exit, so it is never inside a CUDA call while the interpreter
    finalizes)."""
    poller = probe.attached.poller
    if poller is None:
        poller = Poller(alive=lambda: not probe.closed)
        probe.attached.poller = poller
        atexit.register(poller.stop)
    return poller


class _Pending:
    __slots__ = ("step", "host_end", "events", "fwd", "bwd")

    def __init__(self, step: int, host_end: float, events: list, fwd: int, bwd: bool) -> None:
        self.step = step
        self.host_end = host_end
        self.events = events
        self.fwd = fwd
        self.bwd = bwd


class StepTimer:
    """Device time per step from pooled events: [start, forward end, backward end, step end]."""

    POOL = 64    # event sets in flight at most; beyond that a step goes untimed

    def __init__(self, cuda: Any, index: int | None = None) -> None:
        self.cuda = cuda
        self.index = index
        self.free: collections.deque = collections.deque()
        self.created = 0
        self.cur: list | None = None
        self.n_fwd = 0
        self.bwd = False
        self.pending: collections.deque = collections.deque()
        self.results: collections.deque = collections.deque(maxlen=64)
        self.skipped = 0

    # main thread ---------------------------------------------------------------------------
    def begin(self) -> None:
        events = self.free.popleft() if self.free else None
        if events is None:
            if self.created >= self.POOL:
                self.cur = None
                self.skipped += 1
                return
            events = [self.cuda.new_event() for _ in range(4)]
            self.created += 1
        self.cuda.record_on(events[0], self.index)
        self.cur = events
        self.n_fwd = 0
        self.bwd = False

    def forward_end(self) -> None:
        if self.cur is not None:
            self.cuda.record_on(self.cur[1], self.index)
            self.n_fwd += 1

    def backward_end(self) -> None:
        if self.cur is not None:
            self.cuda.record_on(self.cur[2], self.index)
            self.bwd = True

    def end(self, step: int) -> None:
        events = self.cur
        if events is None:
            return
        self.cuda.record_on(events[3], self.index)
        self.pending.append(_Pending(step, time.perf_counter(), events, self.n_fwd, self.bwd))
        self.cur = None

    def take(self) -> dict[str, Any] | None:
        """Newest completed step's device numbers (older ones are superseded)."""
        newest = None
        while self.results:
            newest = self.results.popleft()
        return newest

    # poller thread -------------------------------------------------------------------------
    def poll(self) -> bool:
        while self.pending:
            head = self.pending[0]
            start, fwd, bwd, end = head.events
            if not end.query():
                return True
            now = time.perf_counter()
            self.pending.popleft()
            try:
                result: dict[str, Any] = {"gpu_step": head.step, "gpu_time": start.elapsed_time(end) / 1e3,
                                          "lead": max(0.0, now - head.host_end)}
                if head.fwd == 1 and head.bwd:   # device phases only when unambiguous
                    result["gpu_phases"] = {"forward": start.elapsed_time(fwd) / 1e3,
                                            "backward": fwd.elapsed_time(bwd) / 1e3,
                                            "optimizer": bwd.elapsed_time(end) / 1e3}
                self.results.append(result)
            finally:
                self.free.append(head.events)
        return False


class SyncCounter:
    """Counts warnings whose text starts with ``message`` and the line that raised them.

    The counter is a ``warnings`` filter entry ("ignore") whose message matcher is
    this object: CPython calls ``matcher.match(text)`` for every warning, and the
    calling Python frame is the user's line that triggered the synchronizing op.
    """

    def __init__(self, message: str = SYNC_MESSAGE) -> None:
        self.message = message
        self.count = 0
        self.sites: dict[tuple[str, int], int] = {}
        self.installed = False

    def match(self, text: str) -> bool:
        if not text.startswith(self.message):
            return False
        try:
            frame = sys._getframe(1)
            key = (frame.f_code.co_filename, frame.f_lineno)
        except Exception:
            key = ("?", 0)
        self.count += 1
        self.sites[key] = self.sites.get(key, 0) + 1
        return True

    def install_filter(self) -> None:
        """Put our matcher at the front of the filters (``filterwarnings`` also resets
        every module's once-registry, so already-seen call sites are counted too)."""
        warnings.filterwarnings("ignore", message=self.message)
        action, _regex, category, module, lineno = warnings.filters[0]
        warnings.filters[0] = (action, self, category, module, lineno)
        self.installed = True

    def ensure_first(self) -> None:
        """Step begin: put the counter back in front of any filter added since (no-op when it is)."""
        filters = warnings.filters
        if filters and filters[0][1] is self:
            return
        filters[:] = [("ignore", self, Warning, None, 0)] + [f for f in filters if f[1] is not self]
        warnings._filters_mutated()   # type: ignore[attr-defined]  # drop once-registries, as filterwarnings does

    def take(self) -> tuple[int, str | None]:
        """(syncs since the last call, "file:line" of the most frequent one)."""
        if not self.count:
            return 0, None
        count, sites = self.count, self.sites
        self.count = 0
        self.sites = {}
        (path, line), _ = max(sites.items(), key=lambda kv: kv[1])
        return count, f"{path}:{line}"

    def __repr__(self) -> str:   # shows up in warnings.filters listings
        return f"<perfmon sync counter {self.message!r}>"


def enable_sync_counting(cuda: Any, counter: SyncCounter) -> str | None:
    """Switch the debug mode to "warn" and install the counter; None on success, else why not."""
    try:
        mode = cuda.get_sync_debug_mode()
    except Exception as exc:
        return f"host-device sync counting off: {exc!r}"[:200]
    if mode != 0:
        return "host-device sync counting off: the script already uses torch.cuda.set_sync_debug_mode"
    try:
        cuda.set_sync_debug_mode(1)
    except Exception as exc:
        return f"host-device sync counting off: {exc!r}"[:200]
    counter.install_filter()
    return None


def disable_sync_counting(cuda: Any, counter: SyncCounter) -> None:
    """Undo ``enable_sync_counting`` (probe closed): debug mode off, the counter's filter removed."""
    try:
        if cuda.get_sync_debug_mode() == 1:
            cuda.set_sync_debug_mode(0)
    except Exception:
        pass
    try:
        warnings.filters[:] = [f for f in warnings.filters if f[1] is not counter]
        warnings._filters_mutated()   # type: ignore[attr-defined]
    except Exception:
        pass
