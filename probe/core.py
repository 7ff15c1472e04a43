"""The in-process probe: the hot path and the probe's own lifecycle (setup, close, fork).

The hot path (``loader``, ``step``, ``phase``) reads ``perf_counter`` and
appends a tuple to a bounded deque; nothing else. Building records, packing,
sending and recording happen on the sender thread (``probe.server``), slow
numbers on the sampler thread (``probe.sampler``). Setting up never raises:
anything that fails leaves a probe that still works for whatever did not.

This module is a little over 500 lines on purpose: the hot-path context managers and the
lifecycle share the probe's private state and are kept together; the steps zero-code mode finds are
queued by ``probe.zero_code_steps`` (a mixin),
the process's one probe is made and found by ``probe.lifecycle`` (``start``, ``current``), and
everything else (endpoints, records, the disabled probe, attachments, failure reporting, the
loader CPU policy) lives in its own module.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from probe import paths, records
from probe.attachments import Attachments
from probe.cost import CostSource, calibrate, hook_name
from probe.endpoints import cpu_name, listen_tcp, listen_unix
from probe.exceptions import exception_event
from probe.health import FailureReporter, HealthSource
from probe.host import other_threads_cpu
from probe.loader_policy import CpuTimingPolicy
from probe.recording import RecordingWriter
from probe.records import ITEM_RECORD, ITEM_STEP
from probe.sampler import Sampler, Source
from probe.server import Sender
from probe.stall import StallWatch
from probe.where import WhereSampler, sampling_hz
from probe.zero_code_steps import ZeroCodeSteps

__all__ = ["Probe", "StepArgs"]

QUEUE_ITEMS = 65_536   # hot-path buffer; at 200 B a step this bounds it near 13 MB
LOADER_ITERATORS = 16  # loaders remembered (weakly) for worker discovery; older ones are forgotten
CLOSE_SECONDS = 2.0    # close() returns within this, whatever the threads are doing
# step(): the training thread's CPU time costs two thread_time() syscalls (~0.3-1.7 µs each): read
# in every step after one that took CPU_TIMED_STEP_S or longer (at most ~0.2% of such a step), and
# in one step out of CPU_TIMED_EVERY_MASK + 1 of faster loops (a small fraction of a µs per step)
CPU_TIMED_STEP_S = 0.002
CPU_TIMED_EVERY_MASK = 31

class _Phase:
    """Reusable context manager for one phase name (no allocation per use)."""

    __slots__ = ("probe", "name", "t0", "uses")

    def __init__(self, probe: Probe, name: str) -> None:
        self.probe = probe
        self.name = name
        self.t0 = 0.0
        self.uses = 0          # times entered and left: its calibrated cost (probe.cost) per use

    def __enter__(self) -> _Phase:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        phases = self.probe._phases
        phases[self.name] = phases.get(self.name, 0.0) + (time.perf_counter() - self.t0)
        self.uses += 1
        return False


class _Step:
    """Reusable context manager for ``Probe.step()``; ``samples``/``tokens``/``flops`` are what the
    script passed for the current step (``Probe.step_args``: the watcher reads ``flops``/``tokens``)."""

    __slots__ = ("probe", "samples", "tokens", "flops")

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.samples: float | None = None
        self.tokens: float | None = None
        self.flops: float | None = None

    def __enter__(self) -> _Step:
        p = self.probe
        t = time.perf_counter()
        if p._cpu_next:
            p._cpu0, p._proc0 = time.thread_time(), time.process_time()
        else:
            p._cpu0 = None
        if p._prev_end is None:
            p._prev_end = t
            p._train_thread = threading.get_ident()
        p._in_step = True
        p._gap = t - p._prev_end - p._data   # between steps, outside the loader wait
        if p._begin_hooks:
            p._run_hooks(p._begin_hooks)
        p._own_s += time.perf_counter() - t
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        p = self.probe
        t = time.perf_counter()
        cpu = time.thread_time() - p._cpu0 if p._cpu0 is not None else None
        others = other_threads_cpu(p._proc0, cpu) if cpu is not None else None
        tokens = self.tokens
        if tokens is not None and type(tokens) is not int and type(tokens) is not float:
            self.tokens = records.host_number(tokens, p.report_error)
        extras: dict[str, Any] | None = others
        if p._end_hooks:
            extras = extras or {}
            p._run_hooks(p._end_hooks, extras, p._phases)
        if et is not None:
            p._on_step_exception(et, ev, tb)
        phases = p._phases
        p._phases = {}
        data = p._data
        p._data = 0.0
        data_cpu = p._data_cpu
        p._data_cpu = None
        p._q.append((ITEM_STEP, p._step_no, p._prev_end, t, data, phases, self.samples, self.tokens, self.flops, extras,
                     p._gap, data_cpu, cpu, records.CPU_SPAN_BODY))      # a records.StepItem
        p._cpu_next = (t - p._prev_end >= CPU_TIMED_STEP_S  # type: ignore[operator]  # __enter__ set it
                       or not p._step_no & CPU_TIMED_EVERY_MASK)
        p._step_no += 1
        p._prev_end = t
        p._in_step = False
        if p._first_end is None:
            p._first_end = t
        p._own_s += time.perf_counter() - t
        p._own_steps += 1
        return False


StepArgs = _Step   # the type of ``Probe.step_args``


class Probe(ZeroCodeSteps):
    """One per process. Use ``probe.start()`` rather than constructing it.

    ``probe.disabled._Disabled`` has the same public surface (a test walks both)."""

    def __init__(self, *, job: str, rank: int, local_rank: int, world_size: int, restart: int,
                 record: str | os.PathLike | None, serve: bool, sample_hz: float) -> None:
        self.job = job
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.restart = restart
        self.pid = os.getpid()
        self.name = paths.base_name(job, rank, restart, self.pid)
        self.socket_path: Path | None = None
        self.token_path: Path | None = None   # PERFMON_TCP: the token viewers must send
        self.record_path: Path | None = None
        self.problems: list[str] = []     # why a part is off, one line each
        self.closed = False
        self._init_hot_path()
        self._epoch = time.time() - time.perf_counter()  # perf_counter -> unix seconds
        self.attached = Attachments()                    # what probe.gpu and probe.watch attach
        self.failures = FailureReporter(self.emit)       # counted internal failures -> warning events
        self._device_reads = records.DeviceReads(self.report_error)   # step numbers left on the device
        self.device: dict[str, Any] = {"type": "cpu", "name": cpu_name(), "count": os.cpu_count() or 1}
        self.sender: Sender | None = None
        self.sampler: Sampler | None = None
        self.stall_watch: StallWatch | None = None
        self.where: WhereSampler | None = None
        self._wrapper_cost: dict[str, float] | None = None    # probe.cost.calibrate, before any thread runs
        self._wrapper_cost_why: str | None = None
        self._setup(record, serve, sample_hz)

    def _init_hot_path(self) -> None:
        """The state ``loader``, ``step`` and ``phase`` touch (also a scratch probe's: probe.cost
        calibrates their per-call cost on one)."""
        self._q: collections.deque = collections.deque(maxlen=QUEUE_ITEMS)
        self._phases: dict[str, float] = {}
        self._data = 0.0
        self._data_cpu: float | None = None   # main-thread CPU s in loader waits (single-process loaders)
        self._gap = 0.0
        self._cpu0: float | None = None        # training thread's CPU clock at the open step's begin
        self._proc0 = 0.0                      # the process's CPU clock there (all its threads)
        self._cpu_next = True                  # read it in the next step() (CPU_TIMED_STEP_S)
        self._step_no = 0
        self._prev_end: float | None = None
        self._in_step = False                  # between a step's begin and end (the stall watch reads it)
        self._train_thread: int | None = None  # the thread that runs the steps, set at the first one
        self._began: float | None = None       # first step begin seen by zero-code hooks
        self._first_end: float | None = None   # end of the first step: with the latest, the mean step
        # zero-code mode: has a batch fetch opened the next step already (its time runs from that fetch)?
        # Read by the where sampler from its thread (probe.where)
        self.opening: Callable[[], bool] | None = None
        self._phase_ctx: dict[str, _Phase] = {}
        self._step_ctx = _Step(self)
        # the probe's own time on the training thread (probe.cost): seconds inside step()'s enter and
        # exit and the zero-code step calls, hooks included, over ``_own_steps`` steps; by hook name;
        # and the calls whose cost outside those clock reads is calibrated at start-up (_wrapper_cost)
        self._own_s = 0.0
        self._own_steps = 0
        self._auto_steps = 0                   # of those, the zero-code step calls' (not ``step()``'s)
        self._batches = 0                      # batches through ``loader()``
        self._hook_s: dict[str, float] = {}
        self._hook_names: dict[Callable[..., Any], str] = {}
        # step hooks: one pair per instrumentation module (watch), bounded by the number of modules
        self._begin_hooks: list[Callable[..., Any]] = []
        self._end_hooks: list[Callable[..., Any]] = []
        self.first_batch_wait: float | None = None
        # weak references to loader iterators, for worker discovery (sampler side); bounded
        self.loader_iterators: collections.deque[weakref.ref[Any]] = collections.deque(maxlen=LOADER_ITERATORS)

    # -- public API ---------------------------------------------------------------------------
    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable``, timing how long each ``next()`` blocks (the data stall)."""
        it = iter(iterable)
        try:
            self.loader_iterators.append(weakref.ref(it))
        except TypeError:   # not weakly referable: not a DataLoader iterator, nothing to discover
            pass
        pc = time.perf_counter
        tt = time.thread_time
        t0 = pc()
        c0 = tt()
        try:
            first = next(it)
        except StopIteration:
            return
        dt = pc() - t0
        self._batches += 1
        self.first_batch_wait = dt
        self._q.append((ITEM_RECORD, {"k": "event", "t": time.time(), "name": "first_batch", "seconds": dt}))
        if self._prev_end is not None:
            self._data += dt
        if type(it).__name__ == "_MultiProcessingDataLoaderIter":   # workers load; the sampler watches them
            yield first
            while True:
                t0 = pc()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._data += pc() - t0
                self._batches += 1
                yield batch
        # This thread does the loading (num_workers=0, plain iterables): probe.loader_policy says
        # when its CPU time inside next() is read.
        if self._prev_end is not None:
            self._data_cpu = (self._data_cpu or 0.0) + (tt() - c0)
        policy = CpuTimingPolicy(left=0)
        policy.fetched(dt, timed=False)
        yield first
        while True:
            cpu0 = tt() if policy.left > 0 else None
            t0 = pc()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = pc()
            if cpu0 is not None:
                self._data_cpu = (self._data_cpu or 0.0) + (tt() - cpu0)
            dt = t1 - t0
            self._data += dt
            self._batches += 1
            policy.fetched(dt, cpu0 is not None)
            yield batch

    def step(self, samples: float | None = None, tokens: float | None = None,
             flops: float | None = None) -> _Step:
        """Context manager around one optimizer step."""
        ctx = self._step_ctx
        ctx.samples = samples
        ctx.tokens = tokens
        ctx.flops = flops
        return ctx

    def phase(self, name: str) -> _Phase:
        """Context manager timing a named phase inside the current step."""
        ctx = self._phase_ctx.get(name)
        if ctx is None:
            ctx = self._phase_ctx[name] = _Phase(self, name)
        return ctx

    def event(self, name: str, **fields: Any) -> None:
        """Annotate the stream (checkpoint, eval, custom); never raises."""
        try:
            rec = {"k": "event", "t": time.time(), "name": str(name)}
            rec.update({k: v for k, v in fields.items() if k not in ("k", "t")})
            self._q.append((ITEM_RECORD, rec))
        except Exception:
            pass

    def emit(self, record: dict[str, Any]) -> None:
        """Queue a ready-made record (sampler and instrumentation threads use this)."""
        self._q.append((ITEM_RECORD, record))

    def close(self) -> None:
        """Flush, say ``bye``, close sockets and the recording, release what is attached.

        Idempotent; returns within ``CLOSE_SECONDS`` whatever the threads are doing (a thread
        still busy then is a daemon and is left to finish or die with the process)."""
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        deadline = time.monotonic() + CLOSE_SECONDS
        try:
            watcher = self.attached.watcher
            if watcher is not None:
                watcher.close(deadline - 1.6)     # hooks removed; a FLOP count is waited for <= 0.4 s
            if self.stall_watch is not None:
                self.stall_watch.stop_event.set()
            if self.where is not None:
                self.where.stop_event.set()    # its last interval is sent on the way out
                self.where.join(max(0.0, deadline - 1.8 - time.monotonic()))
            if self.sampler is not None:
                self.sampler.stop_event.set()
                # sources call into torch (memory walker); a daemon thread inside torch's C++ code
                # while the interpreter finalizes aborts the process ("terminate called ...", exit 134)
                self.sampler.join(max(0.0, deadline - 1.4 - time.monotonic()))
                if not self.sampler.is_alive():
                    # a last sample: a job shorter than one sampling period still records its
                    # memory peak (and so an MFU); then the last totals (comm), all before bye
                    self.sampler.tick()
                    self.sampler.flush()
            for window in (self.attached.profiler, self.attached.capture):   # a result being written
                if window is not None:
                    window.join(deadline - 1.0 - time.monotonic())
            self.attached.release()
            if self.sender is not None:
                self.sender.stop_event.set()
                self.sender.stopped.wait(max(0.0, deadline - time.monotonic()))
            for path in (self.socket_path, self.token_path):
                if path is not None:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        except Exception:
            pass
        self.loader_iterators.clear()
        self._begin_hooks = []
        self._end_hooks = []

    def watch(self, model: Any = None, optimizer: Any = None, **options: Any) -> None:
        """Attach phase hooks, communication timing, memory breakdown and FLOPs (probe.watch).

        Idempotent per model/optimizer; never raises.
        """
        if self.closed:
            return
        try:
            from probe.watch import watch
            watch(self, model=model, optimizer=optimizer, **options)
        except Exception as exc:
            self.report_error("watch", exc)

    @property
    def steps(self) -> int:
        """Steps recorded so far (the next step's number)."""
        return self._step_no

    def progress(self) -> tuple[int, float | None, bool, int | None, float | None]:
        """(steps so far, ``perf_counter`` of the last progress: the end of the latest step, else the
        first step's begin; inside a step now; the training thread's id; the end of the first step):
        the stall watch's inputs."""
        last = self._prev_end if self._prev_end is not None else self._began
        return self._step_no, last, self._in_step, self._train_thread, self._first_end

    @property
    def step_args(self) -> StepArgs:
        """What the script passed to the current ``step()`` (``samples``, ``tokens``, ``flops``)."""
        return self._step_ctx

    def report_error(self, where: str, exc: BaseException) -> None:
        """The probe's own failures: counted, and a rate-limited ``warning`` event (never raises)."""
        self.failures.failed(where, exc)

    # -- hooks for instrumentation (watch, zero-code mode) ----------------------------------
    def add_step_hooks(self, begin: Callable[[], None] | None = None,
                       end: Callable[[dict[str, Any], dict[str, float]], None] | None = None) -> None:
        """Register callables run at step begin / end. ``end(extras, phases)`` fills extra step-record
        keys and may add phases (seconds by name) when the script timed none."""
        if begin is not None:
            self._hook_names[begin] = hook_name(begin)
            self._begin_hooks = self._begin_hooks + [begin]
        if end is not None:
            self._hook_names[end] = hook_name(end)
            self._end_hooks = self._end_hooks + [end]

    def remove_step_hooks(self, begin: Callable[[], None] | None = None,
                          end: Callable[[dict[str, Any], dict[str, float]], None] | None = None) -> None:
        """Unregister callables given to ``add_step_hooks`` (a profile's hooks live for its steps only)."""
        if begin is not None:
            self._begin_hooks = [h for h in self._begin_hooks if h != begin]
        if end is not None:
            self._end_hooks = [h for h in self._end_hooks if h != end]
        for hook in (begin, end):
            if hook is not None and hook not in self._begin_hooks and hook not in self._end_hooks:
                self._hook_names.pop(hook, None)

    def add_tap(self, tap: Callable[[dict[str, Any]], None]) -> None:
        """Have ``tap(record)`` called on the sender thread with the hello, then every record this
        probe sends (the framework callbacks' in-process numbers); a failing tap is dropped."""
        if self.sender is not None:
            self.sender.add_tap(tap)

    def handle_request(self, request: dict[str, Any]) -> str | None:
        """A viewer's request (sender thread): None when accepted, else why not (probe.requests)."""
        from probe.requests import handle
        return handle(self, request)

    def _run_hooks(self, hooks: list[Callable[..., Any]], *args: Any) -> None:
        """Run step hooks, adding each one's seconds to ``_hook_s`` by name (one clock read a hook)."""
        spent, names = self._hook_s, self._hook_names
        t0 = time.perf_counter()
        for hook in hooks:
            try:
                hook(*args)
            except Exception as exc:
                self.failures.failed("step hook", exc)
            t1 = time.perf_counter()
            name = names.get(hook, "step hook")
            spent[name] = spent.get(name, 0.0) + (t1 - t0)
            t0 = t1

    def _on_step_exception(self, et: Any, ev: Any, tb: Any = None) -> None:
        self._q.append((ITEM_RECORD, {"k": "event", "t": time.time(), **exception_event(et, ev, tb, self._step_no)}))

    # -- record building (sender thread) -----------------------------------------------------
    def _build(self, item: tuple) -> dict[str, Any] | None:
        if item[0] == ITEM_RECORD:
            return item[1]
        return records.step_record(records.StepItem._make(item), self._epoch, self._device_reads)

    def _hello(self) -> dict[str, Any]:
        return records.hello(self)

    # -- setup ------------------------------------------------------------------------------
    def _setup(self, record: str | os.PathLike | None, serve: bool, sample_hz: float) -> None:
        try:
            self._wrapper_cost = calibrate(self._scratch)
        except Exception as exc:
            self._wrapper_cost_why = f"calibration failed: {exc!r}"
        listener = None
        recorder = None
        tcp_listener, tcp_token = None, None
        if serve:
            try:
                listener, self.socket_path = listen_unix(self.name)
            except (paths.UnsafeDirectory, OSError) as exc:
                self._problem(f"live view off: {exc}")
            if os.environ.get("PERFMON_TCP"):
                try:
                    tcp_listener, tcp_token, self.token_path = listen_tcp(self.name, os.environ["PERFMON_TCP"])
                except (paths.UnsafeDirectory, OSError, ValueError) as exc:
                    self._problem(f"TCP view off: {exc}")
        if record:
            try:
                rec_dir = Path(record)
                rec_dir.mkdir(parents=True, exist_ok=True)
                self.record_path = rec_dir / f"{self.name}{paths.RECORD_SUFFIX}"
                recorder = RecordingWriter(self.record_path)
            except OSError as exc:
                self.record_path = None
                self._problem(f"recording off: cannot write {record}: {exc.strerror or exc}")
        for extend in _device_extensions:
            try:
                extend(self)
            except Exception as exc:
                self._problem(f"device detection failed: {exc!r}")
        self.sender = Sender(queue=self._q, build=self._build, hello=self._hello(), listener=listener,
                             tcp_listener=tcp_listener, tcp_token=tcp_token,
                             recorder=recorder, on_error=self.report_error, on_request=self.handle_request)
        self.sender.start()
        sources: list[Source] = []
        try:
            from probe.host import HostSource
            sources.append(HostSource())
        except Exception as exc:
            self._problem(f"host sampling off: {exc!r}")
        try:
            from probe.loader_workers import LoaderWorkersSource
            sources.append(LoaderWorkersSource(self))
        except Exception as exc:
            self._problem(f"loader worker sampling off: {exc!r}")
        sources.extend(self.attached.sources)
        sources.append(HealthSource(self))
        sources.append(CostSource(self))
        self.sampler = Sampler(sources, self.emit, hz=sample_hz, on_error=self.report_error)
        self.sampler.start()
        try:
            self.stall_watch = StallWatch(self, self.emit)
            self.stall_watch.start()
        except Exception as exc:
            self._problem(f"stall watch off: {exc!r}")
        try:
            where_hz = sampling_hz()
            if where_hz > 0:
                self.where = WhereSampler(self, self.emit, where_hz)
                self.where.start()
        except Exception as exc:
            self._problem(f"where sampling off: {exc!r}")
        atexit.register(self._join_at_exit)   # runs after close() (atexit is last-in, first-out)
        atexit.register(self.close)

    @classmethod
    def _scratch(cls) -> Probe:
        """A probe with hot-path state only: no thread, socket or file (``probe.cost.calibrate``)."""
        scratch = cls.__new__(cls)
        scratch._init_hot_path()
        return scratch

    def _join_at_exit(self) -> None:
        """Interpreter exit only: close() returned within its bound, but a sampler thread still inside
        torch while the interpreter finalizes aborts the process (exit 134); wait for it (<= 5 s)."""
        sampler = self.sampler
        if sampler is not None and sampler.is_alive() and os.getpid() == self.pid:
            sampler.join(5.0)

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        try:
            sys.stderr.write(f"perfmon: {message}\n")
        except (OSError, ValueError):
            pass

    def _after_fork_in_child(self) -> None:
        """Forked child (DataLoader worker): go silent; close inherited fds; touch no locks."""
        self.closed = True
        self._q = collections.deque(maxlen=0)
        self._begin_hooks = []
        self._end_hooks = []
        if self.sender is not None:
            self.sender.abandon()


# Instrumentation modules (GPU, watch) register here to fill ``Probe.device`` before hello.
_device_extensions: list[Callable[[Probe], None]] = []


def _attach_gpu(probe: Probe) -> None:
    from probe.gpu import attach
    attach(probe)


_device_extensions.append(_attach_gpu)
