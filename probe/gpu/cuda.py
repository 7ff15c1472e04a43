"""CUDA-side measurements that never synchronize the host with the device.

* ``TorchCuda``: the only place that calls ``torch.cuda``. Tests swap ``backend``
  for a simulated one (tests/sim), so every path here runs without a GPU.
* ``Poller``: a background thread that asks CUDA events and NCCL works whether
  they are done (``query()``/``is_completed()`` never block) and only then reads
  their times (``elapsed_time``/``_get_duration`` require completion). It sleeps
  while nothing is pending and, while something is, as long as its clients expect.
* ``EventPool``: timing events reused across module profiles.
* ``StepTimer``: a reused pool of timing events recorded on the current stream at
  step and phase boundaries of a sampled subset of steps, ten a second (creating events
  is costly, so they are pooled, as ATen's EventPool does). The host time at which the
  step's last event is seen complete, minus the host time it was recorded, is how far the
  host runs ahead of the device: near zero means the device is starved.
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

This module is a little over 500 lines on purpose: the poller's schedule and the step
timer's answers to it are one protocol (``Poller``'s docstring), read and tuned together
(bench/bench_poller.py), beside the one backend they both drive.
"""

from __future__ import annotations

import atexit
import collections
import math
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

SYNC_MESSAGE = "called a synchronizing CUDA operation"   # TORCH_WARN text in c10/cuda/CUDAFunctions.h
PROTOTYPE_MESSAGE = "Synchronization debug mode is a prototype feature"   # torch's warning on switching it on


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

    def copy_to_host(self, tensor: Any) -> tuple[Any, Any]:
        """A non-blocking copy of a CUDA tensor into pinned host memory (what ``non_blocking=True``
        gives for device to host) and an event recorded after it on the tensor's current stream:
        the copy may be read once the event's ``query()`` is True. The host never waits here."""
        torch = self._torch()
        host = tensor.detach().to("cpu", non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
        return host, event

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
    """Polls completion of device work while any is pending; sleeps while none is.

    A client is a callable saying what it still waits for: False (nothing), True (something,
    no idea when it completes) or a number (something, expected done in that many seconds).
    Every ``query()`` takes the GIL from the training thread, so the poller wakes no more
    than the answers need:

    * nothing pending: it sleeps until ``wake(after)`` (a client's work went from none to
      some, expected done in ``after`` s), or ``IDLE`` seconds; ``IDLE_POLLING`` while a
      client that never calls it (the communication pollers) is registered;
    * pending with an estimate: it sleeps that long (the step timer's estimate keeps the
      host-lead error within a quarter of the lead, see ``StepTimer.poll``);
    * pending without one: it backs off from ``MIN_WAIT``, doubling, up to ``MAX_WAIT``.

    Waits are clamped to [``MIN_WAIT``, ``MAX_WAIT``]: ``MAX_WAIT`` bounds how late a
    completion is seen while work is pending. bench/bench_poller.py measures the wake-ups.
    A failing client is reported at each failure (rate-limited by ``on_error``, that is
    ``Probe.report_error``) and dropped after ``MAX_ERRORS`` failures in a row.
    """

    MIN_WAIT = 0.001    # the finest lead the poller resolves: a starved device's lead is a few ms
    MAX_WAIT = 0.05     # latest a pending completion is seen (a 50 ms step at 20 steps/s)
    IDLE = 0.25         # every client calls wake(): a safety net only
    # A client that never calls wake() (communication pollers) is looked at as often as before:
    # its collectives are charged to the step whose end drains them, so a late look would move
    # them to a later step.
    IDLE_POLLING = 0.05
    MAX_ERRORS = 5

    def __init__(self, alive: Callable[[], bool],
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        super().__init__(name="perfmon-poller", daemon=True)
        self.alive = alive
        self.on_error = on_error
        self.clients: list[Callable[[], Any]] = []   # one per timer/poller kind: bounded by the code
        self.waking: list[Callable[[], Any]] = []    # those among them that call wake()
        self.errors: dict[int, int] = {}
        self.dropped = 0          # clients dropped after MAX_ERRORS failures (probe.health reports it)
        self.wakeups = 0          # polls so far (bench/bench_poller.py reads it)
        self.due = 0.0            # perf_counter time of the next poll, by the clients' answers
        self.requested = math.inf  # an earlier time asked for by wake()
        self.backoff = self.MIN_WAIT
        self.stop_event = threading.Event()
        self.wakeup = threading.Event()   # set by wake() and stop()

    def add(self, client: Callable[[], Any], wakes: bool = False) -> None:
        """Register ``client``; ``wakes``: it calls ``wake()`` whenever it gets work to wait for."""
        if self.stop_event.is_set():
            return
        self.clients = self.clients + [client]
        if wakes:
            self.waking = self.waking + [client]
        if not self.is_alive() and not self.stop_event.is_set():
            try:
                self.start()
            except RuntimeError:   # already started
                pass
        self.wake()

    def wake(self, after: float = 0.0) -> None:
        """A client has work pending where it had none, expected done in ``after`` seconds: poll
        then (``MIN_WAIT`` at the soonest) unless a poll is due earlier. Any thread; a few
        attribute reads and writes and, only when the poll moves earlier, one ``Event.set``."""
        self.backoff = self.MIN_WAIT
        due = time.perf_counter() + min(self.MAX_WAIT, max(self.MIN_WAIT, after))
        if due < min(self.due, self.requested):
            self.requested = due
            self.wakeup.set()

    def run(self) -> None:
        while not self.stop_event.is_set() and self.alive():
            self.due = self.requested = math.inf    # a wake() from here on is seen after the poll
            wait = self.poll_once()
            self.due = time.perf_counter() + (self.idle_wait() if wait is None else wait)
            while not self.stop_event.is_set():
                self.wakeup.clear()
                remaining = min(self.due, self.requested) - time.perf_counter()
                if remaining <= 0:
                    break
                self.wakeup.wait(remaining)   # set by wake() when it moves the next poll earlier

    def idle_wait(self) -> float:
        """How long to sleep with nothing pending."""
        return self.IDLE if len(self.waking) == len(self.clients) else self.IDLE_POLLING

    def stop(self, timeout: float = 1.0) -> None:
        self.stop_event.set()
        self.wakeup.set()
        if self.is_alive():
            self.join(timeout)
        self.clients = []
        self.waking = []

    def poll_once(self) -> float | None:
        """Ask every client once: None when nothing is pending, else seconds until the next poll."""
        self.wakeups += 1
        wait: float | None = None
        backed_off = False
        for client in self.clients:
            try:
                answer = client()
                self.errors[id(client)] = 0
            except Exception as exc:
                self._failed(client, exc)
                continue
            if answer is True:
                due = self.backoff
                backed_off = True
            elif answer is False or answer is None:
                continue
            else:
                due = float(answer)
            wait = due if wait is None else min(wait, due)
        if wait is None:
            self.backoff = self.MIN_WAIT
            return None
        if backed_off:
            self.backoff = min(self.MAX_WAIT, self.backoff * 2)
        return min(self.MAX_WAIT, max(self.MIN_WAIT, wait))

    def _failed(self, client: Callable[[], Any], exc: Exception) -> None:
        n = self.errors.get(id(client), 0) + 1
        self.errors[id(client)] = n
        if self.on_error is not None:
            try:
                self.on_error("device poller", exc)
            except Exception:
                pass
        if n >= self.MAX_ERRORS:
            self.clients = [c for c in self.clients if c is not client]
            self.waking = [c for c in self.waking if c is not client]
            self.errors.pop(id(client), None)
            self.dropped += 1


def poller_for(probe: Any) -> Poller:
    """The probe's completion poller thread (``probe.attached.poller``; created on first use,
    stopped at ``close()`` and at exit, so it is never inside a CUDA call while the interpreter
    finalizes)."""
    poller = probe.attached.poller
    if poller is None:
        poller = Poller(alive=lambda: not probe.closed, on_error=probe.report_error)
        probe.attached.poller = poller
        atexit.register(poller.stop)
    return poller


class EventPool:
    """Reused timing events (creating one is costly; ATen's EventPool reuses them too).

    ``take`` on the thread that records, ``give`` on the one that read them; deque ends are
    thread-safe. At most ``keep`` free events are kept between uses."""

    def __init__(self, cuda: Any, keep: int = 4096) -> None:
        self.cuda = cuda
        self.keep = keep
        self.free: collections.deque = collections.deque()
        self.created = 0

    def take(self) -> Any:
        try:
            return self.free.pop()
        except IndexError:
            self.created += 1
            return self.cuda.new_event()

    def give(self, events: Any) -> None:
        for event in events:
            if len(self.free) >= self.keep:
                return
            self.free.append(event)


class _Pending:
    __slots__ = ("step", "host_end", "events", "fwd", "bwd", "whole")

    def __init__(self, step: int, host_end: float, events: list, fwd: int, bwd: bool, whole: bool) -> None:
        self.step = step
        self.host_end = host_end
        self.events = events
        self.fwd = fwd
        self.bwd = bwd
        self.whole = whole   # the device had not begun the step when the host finished queueing it


class StepTimer:
    """Device time and the host's lead for a sampled subset of steps, from pooled events: [start,
    forward end, backward end, step end], recorded for one step per ``TIME_EVERY`` seconds, and
    whether the host queued the step whole (its start event had not run when the host finished it).

    The lead needs the host time at which the step's last event completes, which only a poll at that
    moment sees, so the poller looks at a timed step on a schedule (``poll``). The other steps record
    no event at all: on the first GPU run (an H200; README, "GPU: what is verified") the step hooks
    with event records on every step and sync counting took 57 + 54 µs, 2% of a 6.8 ms step, so a
    5 ms step records events on one step in twenty (bench/RESULTS.md, "GPU step cost"). The viewer
    reads device time and lead as medians over a window of steps at 1-2 Hz, which ten timed steps a
    second fill. Given the probe's ``poller``, the timer registers there and calls ``wake`` when a
    timed step ends."""

    POOL = 64    # event sets in flight at most; beyond that a step goes untimed
    # Ten timed steps a second: enough for the window's medians, and polling every step of a 100-step/s
    # job would wake the poller 100-300 times a second (bench/bench_poller.py).
    TIME_EVERY = 0.1
    # The schedule for a timed step: the first look at half the previous lead (a lead that halves is
    # still seen at its true value within one timed step), then looks spaced a quarter of the time
    # waited so far, so a lead reads at most ~25% (or Poller.MIN_WAIT) long.
    FIRST_LOOK = 0.5
    PRECISION = 0.25

    def __init__(self, cuda: Any, index: int | None = None, poller: Poller | None = None) -> None:
        self.cuda = cuda
        self.index = index
        self.free: collections.deque = collections.deque()
        self.created = 0
        self.cur: list | None = None
        self.n_fwd = 0
        self.bwd = False
        self.pending: collections.deque = collections.deque()      # timed steps, oldest first
        self.results: collections.deque = collections.deque(maxlen=64)
        self.skipped = 0
        self.timed = 0
        self.last_lead: float | None = None
        self.last_begin = -math.inf
        self.wake: Callable[[float], None] | None = None
        if poller is not None:
            self.wake = poller.wake
            poller.add(self.poll, wakes=True)

    # main thread ---------------------------------------------------------------------------
    def begin(self) -> None:
        now = time.perf_counter()
        if now - self.last_begin < self.TIME_EVERY:
            self.cur = None               # an untimed step: no event, a clock read and a comparison
            return
        events = self.free.popleft() if self.free else None
        if events is None:
            if self.created >= self.POOL:
                self.cur = None
                self.skipped += 1
                return
            events = [self.cuda.new_event() for _ in range(4)]
            self.created += 1
        self.last_begin = now
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
        # Asked here, on the training thread, as the host finishes queueing the step: exact, where the
        # lead depends on when the poller runs (late behind a GIL the launching thread holds).
        whole = not events[0].query()
        self.pending.append(_Pending(step, time.perf_counter(), events, self.n_fwd, self.bwd, whole))
        self.cur = None
        self.timed += 1
        if self.wake is not None:
            lead = self.last_lead
            self.wake(0.0 if lead is None else self.FIRST_LOOK * lead)

    def take(self) -> dict[str, Any] | None:
        """Newest completed step's device numbers (older ones are superseded)."""
        newest = None
        while self.results:
            newest = self.results.popleft()
        return newest

    # poller thread -------------------------------------------------------------------------
    def poll(self) -> bool | float:
        """Collect completed steps. Then: False when nothing is pending; else seconds until the
        oldest pending step is worth another look (True before any lead is known: the poller's own
        back-off)."""
        while self.pending:
            head = self.pending[0]
            if not head.events[3].query():
                break
            seen = time.perf_counter()     # after the query: a lead is never read short
            self.pending.popleft()
            try:
                self.results.append(self._result(head, seen))
            finally:
                self.free.append(head.events)
        if not self.pending:
            return False
        if self.last_lead is None:
            return True
        age = time.perf_counter() - self.pending[0].host_end
        return max(self.FIRST_LOOK * self.last_lead - age, self.PRECISION * age)

    def _result(self, done: _Pending, seen: float) -> dict[str, Any]:
        start, fwd, bwd, end = done.events
        self.last_lead = max(0.0, seen - done.host_end)
        result: dict[str, Any] = {"gpu_step": done.step, "gpu_time": start.elapsed_time(end) / 1e3,
                                  "lead": self.last_lead, "whole": done.whole}
        if done.fwd == 1 and done.bwd:   # device phases only when unambiguous
            result["gpu_phases"] = {"forward": start.elapsed_time(fwd) / 1e3,
                                    "backward": fwd.elapsed_time(bwd) / 1e3,
                                    "optimizer": bwd.elapsed_time(end) / 1e3}
        return result


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
        warnings.filters[0] = (action, self, category, module, lineno)  # type: ignore[index]  # a list (typeshed: Sequence)
        self.installed = True

    def ensure_first(self) -> None:
        """Step begin: put the counter back in front of any filter added since (no-op when it is)."""
        filters = warnings.filters
        if filters and filters[0][1] is self:
            return
        filters[:] = [("ignore", self, Warning, None, 0)] + [f for f in filters if f[1] is not self]  # type: ignore[index]  # a list (typeshed: Sequence)
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
    # torch warns once that the debug mode is a prototype: the user did not ask for it, and under
    # ``-W error`` that warning would raise and leave counting off; it is ignored for this one call
    quiet = ("ignore", re.compile(re.escape(PROTOTYPE_MESSAGE)), Warning, None, 0)
    warnings.filters.insert(0, quiet)  # type: ignore[attr-defined]  # a list (typeshed: Sequence)
    warnings._filters_mutated()   # type: ignore[attr-defined]
    try:
        cuda.set_sync_debug_mode(1)
    except Exception as exc:
        return f"host-device sync counting off: {exc!r}"[:200]
    finally:
        warnings.filters[:] = [f for f in warnings.filters if f is not quiet]  # type: ignore[index]  # a list (typeshed: Sequence)
        warnings._filters_mutated()   # type: ignore[attr-defined]
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
        warnings.filters[:] = [f for f in warnings.filters if f[1] is not counter]  # type: ignore[index]  # a list (typeshed: Sequence)
        warnings._filters_mutated()   # type: ignore[attr-defined]
    except Exception:
        pass
