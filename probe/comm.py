"""Collective communication: count, bytes, seconds, bus bandwidth, and the exposed part.

Sources of collectives:
* DDP: its C++ reducer calls the process group directly, invisible to Python
  (research §2.5), so ``attach_ddp`` registers a comm hook that does what DDP's
  default does (divide by the group size, all-reduce on DDP's process group, return
  the bucket) and times it. If the script already registered a hook, DDP allows no second one: we say so
  in the stream and rely on the eager patch (most Python hooks call
  ``dist.all_reduce``). A hook the script registers *after* us is run by our hook.
* ``install(probe)``: patches the ``torch.distributed`` collectives by attribute
  (FSDP2 looks them up at call time). Synchronous calls stay synchronous: flipping
  ``async_op`` would change which stream NCCL uses (PR #150398).

Timing, never blocking the host:
* CPU tensors (gloo): host time from launch to the work's future callback; a
  synchronous call or ``Work.wait()`` blocks the host for exactly its exposed time.
* CUDA tensors (NCCL): a synchronous call is bracketed by two events on the
  current stream (it runs on, or is waited for by, that stream: all exposed).
  Asynchronous works are timed only when NCCL timing is on (opt-in:
  ``TORCH_NCCL_ENABLE_TIMING=1`` or ``PERFMON_NCCL_TIMING=1``, which costs up to
  ~30% on small collectives, facebookresearch/param #203) through
  ``Work._get_duration()`` after ``is_completed()``; their exposed part is an
  estimate (the last DDP bucket cannot overlap with backward compute).

Bus bandwidth = bytes / seconds × ``probe.wire.busbw_factor`` (nccl-tests), with the collective's group size.
Every callback here is wrapped: a failure is counted, never raised into DDP or NCCL.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

from probe.tracing import compiling_check
from probe.wire import busbw_factor

_is_compiling = compiling_check()   # every wrapper's first check (probe.tracing says why)

COMM_PERIOD = 2.0      # seconds between ``comm`` records (when something changed); one more at close
MAX_ASYNC = 4096       # async works remembered for Work.wait() timing


class _Done:
    """One finished (or partly known) collective."""

    __slots__ = ("op", "count", "nbytes", "n", "seconds", "exposed", "estimated", "pass_id", "launch", "done",
                 "last")

    def __init__(self, op: str, count: int, nbytes: int, n: int, seconds: float | None, exposed: float | None,
                 estimated: bool = False, pass_id: int | None = None, launch: float = 0.0, done: float = 0.0,
                 last: bool = False) -> None:
        self.op = op
        self.count = count
        self.nbytes = nbytes
        self.n = n
        self.seconds = seconds
        self.exposed = exposed
        self.estimated = estimated
        self.pass_id = pass_id
        self.launch = launch
        self.done = done
        self.last = last


class CommTracker:
    """Collects finished collectives from any thread; the step end drains them."""

    def __init__(self) -> None:
        self.done: collections.deque = collections.deque(maxlen=100_000)
        self.totals: dict[str, tuple[int, int, float, float, int]] = {}   # op -> count, bytes, s, busbytes, timed
        self.backend: str | None = None
        self.world_size: int | None = None
        self.errors = 0
        self.nccl_timing = _env_on("PERFMON_NCCL_TIMING") or _env_on("TORCH_NCCL_ENABLE_TIMING")
        self._ddp_pending: dict[int, list[_Done]] = {}
        self._covered = float("-inf")   # host time up to which collectives were already charged

    def add(self, item: _Done) -> None:
        self.done.append(item)

    def error(self) -> None:
        self.errors += 1

    def drain(self) -> dict[str, Any] | None:
        """The step record's ``comm`` map for everything finished since the last drain.

        ``seconds`` is the time at least one collective was in flight: host-timed
        collectives queue behind each other (DDP launches many buckets at once), so
        each one is charged only the part of its launch-to-done interval not already
        covered by earlier ones (also its duration for bus bandwidth). Device-timed
        durations (NCCL events) are kernel times and are summed.
        """
        if not self.done:
            return None
        items: list[_Done] = []
        q = self.done
        while q:
            try:
                items.append(q.popleft())
            except IndexError:
                break
        self._charge_host_intervals([i for i in items if i.done and i.seconds is not None])
        ops = nbytes = 0
        seconds = exposed = 0.0
        timed = exposed_known = estimated = False
        passes: dict[int, list[_Done]] = {}
        totals = self.totals
        for item in items:
            ops += item.count
            nbytes += item.nbytes
            if item.seconds is not None:
                seconds += item.seconds
                timed = True
            if item.pass_id is not None:
                passes.setdefault(item.pass_id, []).append(item)
            elif item.exposed is not None:
                exposed += item.exposed
                exposed_known = True
            elif item.count:
                estimated = True
            if item.count:
                c, b, s, bb, tb = totals.get(item.op, (0, 0, 0.0, 0.0, 0))
                if item.seconds is not None:
                    factor = busbw_factor(item.op, item.n) or 0.0
                    totals[item.op] = (c + item.count, b + item.nbytes, s + item.seconds,
                                       bb + item.nbytes * factor, tb + item.nbytes)
                else:
                    totals[item.op] = (c + item.count, b + item.nbytes, s, bb, tb)
        for pass_id, group in passes.items():
            value, is_estimate = self._pass_exposed(pass_id, group)
            if value is not None:
                exposed += value
                exposed_known = True
            estimated = estimated or is_estimate
        if timed and exposed_known:
            exposed = min(exposed, seconds)
        return {"seconds": seconds if timed else None, "exposed": exposed if exposed_known else None,
                "bytes": nbytes, "ops": ops, "estimated": estimated}

    def _charge_host_intervals(self, items: list[_Done]) -> None:
        items.sort(key=lambda i: i.launch)
        covered = self._covered
        for item in items:
            start = max(item.launch, covered)
            item.seconds = max(0.0, item.done - start)
            covered = max(covered, item.done)
        self._covered = covered

    def _pass_exposed(self, pass_id: int, items: list[_Done]) -> tuple[float | None, bool]:
        """Exposed time of one DDP backward pass (its buckets may arrive over several drains).

        Host-timed buckets: the backward returns only when every bucket is done, and the
        last bucket is launched when the last gradient is ready, so the step is blocked
        from that launch to the last completion. Device-timed buckets (NCCL): the last
        bucket's duration, an estimate (no common clock with compute).
        """
        items = self._ddp_pending.pop(pass_id, []) + items
        last = [i for i in items if i.last]
        if not last:
            self._ddp_pending[pass_id] = items
            if len(self._ddp_pending) > 64:
                self._ddp_pending.pop(next(iter(self._ddp_pending)))
            return None, False
        last_item = last[0]
        if last_item.exposed is not None:     # host-timed (gloo)
            end = max(i.done for i in items)
            return max(0.0, end - last_item.launch), False
        if last_item.seconds is not None:
            return last_item.seconds, True
        return None, True

    def record(self) -> dict[str, Any] | None:
        """A ``comm`` record: cumulative per-op totals with bus bandwidth."""
        totals = dict(self.totals)
        if not totals:
            return None
        ops = []
        for op, (count, nbytes, seconds, busbytes, timed_bytes) in sorted(totals.items()):
            entry: dict[str, Any] = {"op": op, "count": count, "bytes": nbytes,
                                     "seconds": seconds if timed_bytes or seconds else None, "busbw": None}
            if seconds > 0 and busbytes > 0:
                entry["busbw"] = busbytes / seconds
                entry["busbytes"] = busbytes      # timed bytes x each call's group factor: windows of busbw
            ops.append(entry)
        return {"k": "comm", "t": time.time(), "backend": self.backend, "world_size": self.world_size, "ops": ops,
                "nccl_timing": self.nccl_timing}


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class CommSource:
    """Sampler source that emits the periodic ``comm`` record when totals changed."""

    name = "comm"

    def __init__(self, state: "CommState", emit: Callable[[dict[str, Any]], None]) -> None:
        self.state = state
        self.emit = emit
        self.last_emit = float("-inf")
        self.last_totals: dict = {}

    def read(self) -> dict[str, Any]:
        tracker = self.state.tracker
        if tracker.backend is None:       # watch() may come before init_process_group
            describe(self.state)
        if time.monotonic() - self.last_emit >= COMM_PERIOD:
            self.flush()
        return {}

    def flush(self) -> None:
        """Emit the cumulative totals if they changed since the last record."""
        tracker = self.state.tracker
        if tracker.totals == self.last_totals:
            return
        record = tracker.record()
        if record is not None:
            self.last_totals = dict(tracker.totals)
            self.last_emit = time.monotonic()
            self.emit(record)


# -- async works on CUDA: polled for _get_duration ----------------------------------------------

class WorkPoller:
    """Poller client: reads ``Work._get_duration()`` once ``is_completed()`` (NCCL timing on)."""

    def __init__(self, tracker: CommTracker) -> None:
        self.tracker = tracker
        self.pending: collections.deque = collections.deque(maxlen=MAX_ASYNC)   # oldest untimed beyond it
        self.broken = False
        self.closed = False     # the probe closed: nothing more is queued (CommState.close)

    def add(self, work: Any, item: _Done) -> None:
        if self.broken or self.closed:
            self.tracker.add(item)
        else:
            self.pending.append((work, item))

    def __call__(self) -> bool:
        n = len(self.pending)
        for _ in range(n):
            work, item = self.pending.popleft()
            try:
                finished = work.is_completed()
            except Exception:
                finished = True
            if not finished:
                self.pending.append((work, item))
                continue
            if not self.broken:
                try:
                    item.seconds = float(work._get_duration()) / 1e3
                except Exception:      # timing not enabled after all, or not supported
                    self.broken = True
                    self.tracker.error()
            self.tracker.add(item)         # exposed stays unknown: async on the device
        return bool(self.pending)


class EventPairPoller:
    """Poller client for synchronous CUDA collectives bracketed by two events.

    Event pairs are reused (``free``): creating CUDA events is costly (ATen pools them too).
    """

    MAX_PAIRS = 256     # in flight at most; beyond that a collective is counted but not timed

    def __init__(self, tracker: CommTracker) -> None:
        self.tracker = tracker
        self.pending: collections.deque = collections.deque()
        self.free: collections.deque = collections.deque()
        self.created = 0

    def pair(self, cuda: Any) -> tuple[Any, Any] | None:
        if self.free:
            return self.free.popleft()
        if self.created >= self.MAX_PAIRS:
            return None
        self.created += 1
        return cuda.new_event(), cuda.new_event()

    def add(self, start: Any, end: Any, item: _Done) -> None:
        self.pending.append((start, end, item))

    def __call__(self) -> bool:
        while self.pending:
            start, end, item = self.pending[0]
            if not end.query():
                return True
            self.pending.popleft()
            try:
                item.seconds = start.elapsed_time(end) / 1e3
                item.exposed = item.seconds
            except Exception:
                self.tracker.error()
            self.free.append((start, end))
            self.tracker.add(item)
        return False


# -- DDP --------------------------------------------------------------------------------------

_tls = threading.local()


def _in_hook() -> bool:
    return getattr(_tls, "depth", 0) > 0


class DdpTiming:
    """Our DDP comm hook: DDP's default all-reduce, timed; runs a later user hook instead."""

    def __init__(self, state: "CommState", ddp: Any) -> None:
        self.state = state
        self.pg = ddp.process_group
        self.n = int(self.pg.size())
        self.inner: tuple[Callable[..., Any], Any] | None = None
        self.pass_id = 0
        self.ddp_ref = ddp

    def hook(self, state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
        t0 = time.perf_counter()
        buf = bucket.buffer()
        pass_id = self.pass_id
        try:
            last = bool(bucket.is_last())
        except Exception:
            last = False
        if last:
            self.pass_id += 1
        if self.inner is not None:
            return self._run_inner(state, bucket, buf, t0, pass_id, last)
        buf.div_(self.n)
        work = self.pg.allreduce([buf])          # what the C++ reducer does: the group directly, SUM
        fut = work.get_future()
        if self.state.probe.closed:              # after close(): DDP's default, untimed
            return fut.then(_first_value)
        tracker = self.state.tracker
        try:
            nbytes = buf.numel() * buf.element_size()
            item = _Done("all_reduce", 1, nbytes, self.n, None, None, pass_id=pass_id, launch=t0, last=last)
            if buf.is_cuda:
                if tracker.nccl_timing:
                    self.state.work_poller().add(work, item)
                else:
                    tracker.add(item)
                return fut.then(_first_value)
        except Exception:
            tracker.error()
            return fut.then(_first_value)
        return fut.then(_timed_first_value(tracker, item))

    def _run_inner(self, state: Any, bucket: Any, buf: Any, t0: float, pass_id: int, last: bool) -> Any:
        hook, user_state = self.inner  # type: ignore[misc]
        nbytes = buf.numel() * buf.element_size()
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            fut = hook(user_state, bucket)
        finally:
            _tls.depth -= 1
        item = _Done("all_reduce", 1, nbytes, self.n, None, None, pass_id=pass_id, launch=t0, last=last)
        if buf.is_cuda:
            self.state.tracker.add(item)
            return fut
        return fut.then(_timed_value(self.state.tracker, item))

    # replacements for the DDP instance's registration methods ------------------------------
    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        ddp = self.ddp_ref
        ddp._check_comm_hook(hook)
        self.inner = (hook, state)
        self.state.say(f"DDP comm hook {getattr(hook, '__qualname__', hook)!r} registered after perfmon's: "
                 "perfmon runs it inside its own timing hook")

    def register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        name = str(getattr(comm_hook_type, "name", comm_hook_type))
        if name.endswith("FP16_COMPRESS"):
            self.inner = (default_hooks.fp16_compress_hook, self.pg)
        elif name.endswith("ALLREDUCE"):
            self.inner = None
        else:
            raise RuntimeError(f"perfmon: cannot emulate DDP built-in comm hook {name}")
        self.state.say(f"DDP built-in comm hook {name} registered after perfmon's: perfmon runs the Python equivalent")


def _first_value(fut: Any) -> Any:
    return fut.value()[0]


def _timed_first_value(tracker: CommTracker, item: _Done) -> Callable[[Any], Any]:
    def done(fut: Any) -> Any:
        try:
            t = time.perf_counter()
            item.done = t
            item.seconds = t - item.launch
            item.exposed = 0.0          # per bucket; the pass's tail is computed at drain
            tracker.add(item)
        except Exception:
            tracker.error()
        return fut.value()[0]
    return done


def _timed_value(tracker: CommTracker, item: _Done) -> Callable[[Any], Any]:
    def done(fut: Any) -> Any:
        try:
            t = time.perf_counter()
            item.done = t
            item.seconds = t - item.launch
            item.exposed = 0.0
            tracker.add(item)
        except Exception:
            tracker.error()
        return fut.value()
    return done


def attach_ddp(state: "CommState", ddp: Any) -> str | None:
    """Register the timing hook on a DDP module; None on success, else the reason (for the stream)."""
    if getattr(ddp, "_perfmon_ddp", None) is not None:
        return None
    if getattr(ddp, "_use_python_reducer", False):
        return "DDP communication not timed: the compiled-DDP Python reducer is in use"
    existing = list(getattr(ddp, "_comm_hooks", []) or [])
    if existing:
        names = ", ".join(getattr(h, "__qualname__", repr(h)) for h, _ in existing)
        return (f"DDP already has a comm hook ({names}); perfmon cannot add its own, so DDP traffic is "
                "seen only where that hook calls torch.distributed collectives")
    timing = DdpTiming(state, ddp)
    try:
        ddp.register_comm_hook(None, timing.hook)
    except Exception as exc:
        return (f"DDP comm hook not registered ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}); "
                "DDP traffic is not timed")
    object.__setattr__(ddp, "_perfmon_ddp", timing)
    object.__setattr__(ddp, "register_comm_hook", timing.register_comm_hook)
    object.__setattr__(ddp, "_register_builtin_comm_hook", timing.register_builtin_comm_hook)
    return None


# -- eager torch.distributed collectives ------------------------------------------------------

def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def _list_bytes(ts: Any) -> int:
    return sum(_nbytes(t) for t in ts) if ts else 0


# name -> (op, position of async_op or None, position of group, bytes(args, n), index of a tensor arg)
_SPECS: dict[str, tuple[str, int | None, int, Callable[[tuple, int], int]]] = {
    "all_reduce": ("all_reduce", 3, 2, lambda a, n: _nbytes(a[0])),
    "all_reduce_coalesced": ("all_reduce", 3, 2, lambda a, n: _list_bytes(a[0])),
    "broadcast": ("broadcast", 3, 2, lambda a, n: _nbytes(a[0])),
    "reduce": ("reduce", 4, 3, lambda a, n: _nbytes(a[0])),
    "all_gather_into_tensor": ("all_gather", 3, 2, lambda a, n: _nbytes(a[0])),
    "_all_gather_base": ("all_gather", 3, 2, lambda a, n: _nbytes(a[0])),
    "all_gather_single": ("all_gather", 3, 2, lambda a, n: _nbytes(a[0])),      # FSDP2 (torch >= 2.10)
    "all_gather": ("all_gather", 3, 2, lambda a, n: _nbytes(a[1]) * n),
    "reduce_scatter_tensor": ("reduce_scatter", 4, 3, lambda a, n: _nbytes(a[1])),
    "_reduce_scatter_base": ("reduce_scatter", 4, 3, lambda a, n: _nbytes(a[1])),
    "reduce_scatter_single": ("reduce_scatter", 4, 3, lambda a, n: _nbytes(a[1])),   # FSDP2 (torch >= 2.10)
    "reduce_scatter": ("reduce_scatter", 4, 3, lambda a, n: _list_bytes(a[1])),
    "all_to_all_single": ("all_to_all", 5, 4, lambda a, n: _nbytes(a[1])),
    "all_to_all": ("all_to_all", 3, 2, lambda a, n: _list_bytes(a[1])),
    "barrier": ("barrier", 1, 0, lambda a, n: 0),
    "send": ("send", None, 2, lambda a, n: _nbytes(a[0])),
    "recv": ("recv", None, 2, lambda a, n: _nbytes(a[0])),
    "isend": ("send", -1, 2, lambda a, n: _nbytes(a[0])),
    "irecv": ("recv", -1, 2, lambda a, n: _nbytes(a[0])),
    "gather": ("gather", 4, 3, lambda a, n: _nbytes(a[0]) * n),
    "scatter": ("scatter", 4, 3, lambda a, n: _nbytes(a[0]) * n),
}
_ARG_NAMES = {
    "all_reduce": ("tensor", "op"), "all_reduce_coalesced": ("tensors", "op"), "broadcast": ("tensor", "src"),
    "reduce": ("tensor", "dst", "op"), "all_gather_into_tensor": ("output_tensor", "input_tensor"),
    "_all_gather_base": ("output_tensor", "input_tensor"), "all_gather_single": ("output_tensor", "input_tensor"),
    "all_gather": ("tensor_list", "tensor"), "reduce_scatter_single": ("output", "input", "op"),
    "reduce_scatter_tensor": ("output", "input", "op"), "_reduce_scatter_base": ("output", "input", "op"),
    "reduce_scatter": ("output", "input_list", "op"),
    "all_to_all_single": ("output", "input", "output_split_sizes", "input_split_sizes"),
    "all_to_all": ("output_tensor_list", "input_tensor_list"), "barrier": (), "send": ("tensor", "dst"),
    "recv": ("tensor", "src"), "isend": ("tensor", "dst"), "irecv": ("tensor", "src"),
    "gather": ("tensor", "gather_list", "dst"), "scatter": ("tensor", "scatter_list", "src"),
}


class CommState:
    """Process-wide patch state (one per process; the probe that installed it receives)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.tracker = CommTracker()
        self.originals: dict[str, Callable[..., Any]] = {}
        self.funcol_originals: dict[str, Callable[..., Any]] = {}
        self.funcol: FuncolTiming | None = None
        self.orig_wait: Callable[..., Any] | None = None
        self.async_works: dict[int, tuple[Any, _Done]] = {}
        self.group_sizes: dict[int, int] = {}     # one per process group: bounded by the script's groups
        self._work_poller: WorkPoller | None = None
        self._event_poller: EventPairPoller | None = None
        self.event_backend: Any = None   # probe.gpu.cuda backend when CUDA is in use
        self.said: set[str] = set()               # messages said once; bounded by the call sites of say()

    def say(self, message: str) -> None:
        if message in self.said:
            return
        self.said.add(message)
        try:
            self.probe.event("warning", message=message, source="comm")
        except Exception:
            pass

    def close(self) -> None:
        """The probe closed: release the works and pending completions kept for timing."""
        self.async_works.clear()
        if self._work_poller is not None:
            self._work_poller.closed = True
            self._work_poller.pending.clear()
        if self._event_poller is not None:
            self._event_poller.pending.clear()

    def work_poller(self) -> WorkPoller:
        if self._work_poller is None:
            self._work_poller = WorkPoller(self.tracker)
            poller = _poller_for(self.probe)
            if poller is not None:
                poller.add(self._work_poller)
        return self._work_poller

    def event_poller(self) -> EventPairPoller:
        if self._event_poller is None:
            self._event_poller = EventPairPoller(self.tracker)
            poller = _poller_for(self.probe)
            if poller is not None:
                poller.add(self._event_poller)
        return self._event_poller

    def group_size(self, group: Any) -> int:
        key = id(group)
        n = self.group_sizes.get(key)
        if n is None:
            import torch.distributed as dist
            n = int(dist.get_world_size(group)) if group is not None else int(dist.get_world_size())
            self.group_sizes[key] = n
        return n

    # wrappers --------------------------------------------------------------------------------
    def wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        op, async_pos, group_pos, nbytes_of = _SPECS[name]
        names = _ARG_NAMES[name]
        state = self

        def collective(*args: Any, **kwargs: Any) -> Any:
            if _is_compiling() or getattr(_tls, "depth", 0) > 0 or state.probe.closed:
                return orig(*args, **kwargs)
            try:
                prepared = state._prepare(args, kwargs, names, async_pos, group_pos, nbytes_of, op)
            except Exception:
                state.tracker.error()
                prepared = None
            if prepared is None:
                return orig(*args, **kwargs)
            is_async, is_cuda, item, device = prepared
            _tls.depth = getattr(_tls, "depth", 0) + 1
            try:
                if is_async:
                    result = orig(*args, **kwargs)
                    state._track_async(result, item, is_cuda)
                    return result
                if is_cuda:
                    return state._sync_cuda(orig, args, kwargs, item, device)
                result = orig(*args, **kwargs)
                try:
                    t1 = time.perf_counter()
                    item.done = t1
                    item.seconds = item.exposed = t1 - item.launch
                    state.tracker.add(item)
                except Exception:
                    state.tracker.error()
                return result
            finally:
                _tls.depth -= 1

        collective.__wrapped__ = orig   # type: ignore[attr-defined]
        collective.__name__ = getattr(orig, "__name__", name)
        collective.__qualname__ = getattr(orig, "__qualname__", name)
        collective.__doc__ = getattr(orig, "__doc__", None)
        collective._perfmon = True      # type: ignore[attr-defined]
        return collective

    def _prepare(self, args: tuple, kwargs: dict, names: tuple, async_pos: int | None, group_pos: int,
                 nbytes_of: Callable[[tuple, int], int], op: str) -> tuple[bool, bool, _Done, Any] | None:
        if kwargs:   # normalise the leading tensor arguments given by keyword
            lead = list(args)
            for i, arg_name in enumerate(names):
                if i >= len(lead):
                    if arg_name in kwargs:
                        lead.append(kwargs[arg_name])
                    else:
                        break
            args_n = tuple(lead)
        else:
            args_n = args
        group = kwargs.get("group") if "group" in kwargs else (args[group_pos] if len(args) > group_pos else None)
        if async_pos is None:
            is_async = False
        elif async_pos == -1:
            is_async = True
        else:
            is_async = bool(kwargs["async_op"] if "async_op" in kwargs else
                            (args[async_pos] if len(args) > async_pos else False))
        n = self.group_size(group)
        nbytes = nbytes_of(args_n, n)
        tensor = _first_tensor(args_n)
        is_cuda = bool(tensor is not None and tensor.is_cuda)
        device = tensor.device.index if is_cuda else None
        return is_async, is_cuda, _Done(op, 1, nbytes, n, None, None, launch=time.perf_counter()), device

    def _sync_cuda(self, orig: Callable[..., Any], args: tuple, kwargs: dict, item: _Done, device: Any) -> Any:
        cuda = self.event_backend
        events = None
        if cuda is not None:
            try:
                events = self.event_poller().pair(cuda)
                if events is not None:
                    cuda.record_on(events[0], device)
            except Exception:
                self.tracker.error()
                events = None
        result = orig(*args, **kwargs)
        try:
            if events is not None:
                cuda.record_on(events[1], device)
                self.event_poller().add(events[0], events[1], item)
            else:
                item.estimated = True
                self.tracker.add(item)
        except Exception:
            self.tracker.error()
        return result

    def _track_async(self, work: Any, item: _Done, is_cuda: bool) -> None:
        if work is None:    # inside a coalescing manager
            self.tracker.add(item)
            return
        try:
            if is_cuda:
                if self.tracker.nccl_timing:
                    self.work_poller().add(work, item)
                else:
                    self.tracker.add(item)
                return
            works = self.async_works
            if len(works) >= MAX_ASYNC:
                works.pop(next(iter(works)))
            works[id(work)] = (work, item)
            work.get_future().then(self._async_done(item, id(work)))
        except Exception:
            self.tracker.error()

    def _async_done(self, item: _Done, key: int) -> Callable[[Any], None]:
        tracker = self.tracker
        works = self.async_works

        def done(_fut: Any) -> None:
            works.pop(key, None)   # finished: a later wait() returns at once (nothing exposed to time)
            try:
                t = time.perf_counter()
                item.done = t
                item.seconds = t - item.launch
                item.exposed = 0.0      # the host is blocked only in Work.wait(), timed there
                tracker.add(item)
            except Exception:
                tracker.error()
        return done

    def wait(self, work: Any, *args: Any, **kwargs: Any) -> Any:
        """Work.wait replacement: the host time blocked here is exposed communication."""
        entry = self.async_works.pop(id(work), None) if self.async_works else None
        if entry is None or _in_hook():
            return self.orig_wait(work, *args, **kwargs)  # type: ignore[misc]
        t0 = time.perf_counter()
        try:
            return self.orig_wait(work, *args, **kwargs)  # type: ignore[misc]
        finally:
            try:
                self.tracker.add(_Done(entry[1].op, 0, 0, entry[1].n, None, time.perf_counter() - t0))
            except Exception:
                self.tracker.error()


# -- functional collectives (DTensor, tensor parallel, torch.distributed._functional_collectives) ------
# The base functions every other functional collective calls through the module's globals, so
# patching these by attribute sees each collective once. Positions: group argument; bytes(args, n).
_FUNCOL_SPECS: dict[str, tuple[str, int, Callable[[tuple, int], int]]] = {
    "all_reduce": ("all_reduce", 2, lambda a, n: _nbytes(a[0])),
    "broadcast": ("broadcast", 2, lambda a, n: _nbytes(a[0])),
    "all_gather_single": ("all_gather", 2, lambda a, n: _nbytes(a[0]) * n),
    "all_gather_tensor": ("all_gather", 2, lambda a, n: _nbytes(a[0]) * n),           # older torch
    "reduce_scatter_single": ("reduce_scatter", 3, lambda a, n: _nbytes(a[0])),
    "reduce_scatter_tensor": ("reduce_scatter", 3, lambda a, n: _nbytes(a[0])),        # older torch
    "all_to_all_single": ("all_to_all", 3, lambda a, n: _nbytes(a[0])),
}
MAX_FUNCOL_PENDING = 1024   # launched functional collectives not yet waited for (oldest forgotten)


class FuncolTiming:
    """Times functional collectives: launch to the ``wait_tensor`` that completes them.

    Eager functional collectives return an ``AsyncCollectiveTensor`` whose first use
    calls ``wait_tensor``; the host is blocked there (CPU) or the stream waits (CUDA).
    ``seconds`` = launch to the end of that wait; ``exposed`` = the launch call plus the
    wait (host time the step could not proceed). A wait on a collective launched
    elsewhere (the backward formulas call the ops directly) is counted as op ``other``
    with its wait time. On CUDA the host times are estimates and marked so.
    """

    def __init__(self, state: "CommState") -> None:
        self.state = state
        self.pending: collections.OrderedDict[int, tuple[Any, _Done, float]] = collections.OrderedDict()
        self.sizes: dict[str, int] = {}

    def group_size(self, group: Any, tag: str = "") -> int:
        from torch.distributed import _functional_collectives as funcol
        from torch.distributed import distributed_c10d as c10d

        name = str(funcol._resolve_group_name(group, tag))
        n = self.sizes.get(name)
        if n is None:
            n = int(c10d._get_group_size_by_name(name))
            if len(self.sizes) < 256:
                self.sizes[name] = n
        return n

    def wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        op, group_pos, nbytes_of = _FUNCOL_SPECS[name]
        timing = self

        def functional_collective(*args: Any, **kwargs: Any) -> Any:
            if _is_compiling() or getattr(_tls, "depth", 0) > 0 or timing.state.probe.closed:
                return orig(*args, **kwargs)
            t0 = time.perf_counter()
            _tls.depth = getattr(_tls, "depth", 0) + 1
            try:
                result = orig(*args, **kwargs)
            finally:
                _tls.depth -= 1
            try:
                timing.launched(op, group_pos, nbytes_of, args, kwargs, result, t0)
            except Exception:
                timing.state.tracker.error()
            return result

        functional_collective.__wrapped__ = orig   # type: ignore[attr-defined]
        functional_collective.__name__ = getattr(orig, "__name__", name)
        functional_collective.__qualname__ = getattr(orig, "__qualname__", name)
        functional_collective.__doc__ = getattr(orig, "__doc__", None)
        functional_collective._perfmon = True      # type: ignore[attr-defined]
        return functional_collective

    def launched(self, op: str, group_pos: int, nbytes_of: Callable[[tuple, int], int], args: tuple,
                 kwargs: dict, result: Any, t0: float) -> None:
        group = kwargs["group"] if "group" in kwargs else args[group_pos]
        n = self.group_size(group, kwargs.get("tag", args[group_pos + 1] if len(args) > group_pos + 1 else ""))
        t1 = time.perf_counter()
        item = _Done(op, 1, nbytes_of(args, n), n, None, None, launch=t0)
        item.estimated = bool(getattr(args[0], "is_cuda", False))
        elem = getattr(result, "elem", None)       # AsyncCollectiveTensor: completed by a later wait
        if elem is None:
            item.done = t1
            item.seconds = item.exposed = t1 - t0
            self.state.tracker.add(item)
            return
        pending = self.pending
        if len(pending) >= MAX_FUNCOL_PENDING:
            pending.popitem(last=False)
        pending[id(elem)] = (weakref.ref(elem), item, t1 - t0)

    def wait(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        timing = self

        def wait_tensor(tensor: Any) -> Any:
            if _is_compiling() or timing.state.probe.closed:
                return orig(tensor)
            t0 = time.perf_counter()
            result = orig(tensor)
            try:
                timing.waited(tensor, t0, time.perf_counter())
            except Exception:
                timing.state.tracker.error()
            return result

        wait_tensor.__wrapped__ = orig   # type: ignore[attr-defined]
        wait_tensor.__name__ = getattr(orig, "__name__", "wait_tensor")
        wait_tensor.__doc__ = getattr(orig, "__doc__", None)
        wait_tensor._perfmon = True      # type: ignore[attr-defined]
        return wait_tensor

    def waited(self, tensor: Any, t0: float, t1: float) -> None:
        entry = self.pending.pop(id(tensor), None)
        if entry is not None and entry[0]() is tensor:
            _, item, launch_cost = entry
            item.done = t1
            item.seconds = t1 - item.launch
            item.exposed = launch_cost + (t1 - t0)
        else:
            item = _Done("other", 1, _nbytes(tensor), 0, t1 - t0, t1 - t0, launch=t0, done=t1)
            item.estimated = bool(getattr(tensor, "is_cuda", False))
        self.state.tracker.add(item)


_state: CommState | None = None
_install_lock = threading.Lock()


def _first_tensor(args: tuple) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for value in args:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def _poller_for(probe: Any) -> Any:
    try:
        from probe.gpu.cuda import poller_for
        return poller_for(probe)
    except Exception:
        return None


def install(probe: Any) -> CommState | None:
    """Patch the torch.distributed collectives process-wide for ``probe``. Idempotent.

    Returns the state (its ``tracker`` collects results), or None when torch.distributed
    is not available. Callers that imported a collective by name before this call
    (``from torch.distributed import all_reduce``) keep the unpatched function.
    """
    global _state
    with _install_lock:
        if _state is not None:
            if _state.probe is not probe and not getattr(probe, "closed", True):
                _state.probe = probe               # a new probe in this process: fresh totals
                _state.tracker = CommTracker()
                _state._work_poller = _state._event_poller = None
                describe(_state)
            return _state
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d
        except Exception:
            return None
        if not dist.is_available():
            return None
        state = CommState(probe)
        for name in _SPECS:
            orig = getattr(c10d, name, None)
            if orig is None or getattr(orig, "_perfmon", False):
                continue
            state.originals[name] = orig
            wrapper = state.wrap(name, orig)
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is orig:
                setattr(dist, name, wrapper)
        _patch_functional(state)
        work_cls = getattr(dist, "Work", None)
        if work_cls is not None and getattr(work_cls, "wait", None) is not None:
            orig_wait = work_cls.wait
            try:
                def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
                    return state.wait(self, *args, **kwargs)
                wait._perfmon = True   # type: ignore[attr-defined]
                state.orig_wait = orig_wait
                work_cls.wait = wait
            except (TypeError, AttributeError):
                state.orig_wait = None
        _state = state
        describe(state)
        return state


def _patch_functional(state: CommState) -> None:
    """Patch the functional collectives by attribute (imported only if torch has them)."""
    try:
        from torch.distributed import _functional_collectives as funcol
    except Exception:
        return
    timing = state.funcol = FuncolTiming(state)
    for name in _FUNCOL_SPECS:
        orig = getattr(funcol, name, None)
        if orig is None or getattr(orig, "_perfmon", False):
            continue
        if name.endswith("_tensor") and hasattr(funcol, name.replace("_tensor", "_single")):
            continue        # the deprecated spelling calls the ``_single`` one: counted there
        state.funcol_originals[name] = orig
        setattr(funcol, name, timing.wrap(name, orig))
    orig_wait = getattr(funcol, "wait_tensor", None)
    if orig_wait is not None and not getattr(orig_wait, "_perfmon", False):
        state.funcol_originals["wait_tensor"] = orig_wait
        funcol.wait_tensor = timing.wait(orig_wait)


def describe(state: CommState) -> None:
    """Fill backend/world size and switch on NCCL timing where asked (feature-detected)."""
    try:
        import torch.distributed as dist
        if not dist.is_initialized():
            return
        state.tracker.backend = str(dist.get_backend())
        state.tracker.world_size = int(dist.get_world_size())
        if state.tracker.nccl_timing and "nccl" in state.tracker.backend:
            enable_nccl_timing(dist.distributed_c10d._get_default_group(), state)
    except Exception:
        state.tracker.error()


def enable_nccl_timing(group: Any, state: CommState) -> None:
    """``pg._enable_collectives_timing()`` (torch >= 2.2); only later collectives are timed."""
    fn = getattr(group, "_enable_collectives_timing", None)
    if fn is None:
        state.say("NCCL collective timing unavailable in this torch (no _enable_collectives_timing)")
        state.tracker.nccl_timing = False
        return
    try:
        fn()
    except Exception as exc:
        state.say(f"NCCL collective timing could not be enabled: {exc!r}"[:200])
        state.tracker.nccl_timing = False


def uninstall() -> None:
    """Restore the original functions (tests)."""
    global _state
    with _install_lock:
        state = _state
        if state is None:
            return
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d
        except Exception:
            return
        for name, orig in state.originals.items():
            if getattr(getattr(c10d, name, None), "_perfmon", False):
                setattr(c10d, name, orig)
            if getattr(getattr(dist, name, None), "_perfmon", False):
                setattr(dist, name, orig)
        if state.orig_wait is not None:
            dist.Work.wait = state.orig_wait
        if state.funcol_originals:
            from torch.distributed import _functional_collectives as funcol
            for name, orig in state.funcol_originals.items():
                if getattr(getattr(funcol, name, None), "_perfmon", False):
                    setattr(funcol, name, orig)
        _state = None


def current() -> CommState | None:
    return _state
