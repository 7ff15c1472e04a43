"""The eager ``torch.distributed`` collectives, patched by attribute for one probe per process
(FSDP2 looks them up at call time), plus ``Work.wait``; ``install``/``uninstall``/``current``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from probe.comm.functional import FUNCOL_SPECS, FuncolTiming
from probe.comm.guards import (
    as_wrapper,
    first_tensor as _first_tensor,
    in_hook as _in_hook,
    is_compiling as _is_compiling,
    list_bytes as _list_bytes,
    nbytes as _nbytes,
    tls as _tls,
)
from probe.comm.p2p import PendingWorks, peer_of, wrap_batch
from probe.comm.pollers import MAX_ASYNC, EventPairPoller, WorkPoller, gpu_poller
from probe.comm.tracker import COMM_PERIOD, CollectiveCall, CommTracker, Ledger

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
        self.async_works: dict[int, tuple[Any, CollectiveCall]] = {}
        self.pending = PendingWorks(self)     # works with no future (gloo's point-to-point)
        self.group_sizes: dict[int, int] = {}     # one per process group: bounded by the script's groups
        self.group_names: dict[int, tuple[str, int | None]] = {}   # same key: (name, this rank in it)
        self.ledger = Ledger()                    # sequence numbers and calls in flight, for stall records
        self._work_poller: WorkPoller | None = None
        self._event_poller: EventPairPoller | None = None
        self.event_backend: Any = None   # probe.gpu.cuda backend when CUDA is in use
        self.said: set[str] = set()               # messages said once; bounded by the call sites of say()

    def say(self, message: str, unmeasured: str | None = None) -> None:
        if message in self.said:
            return
        self.said.add(message)
        try:
            if unmeasured is None:
                self.probe.event("warning", message=message, source="comm")
            else:
                self.probe.event("warning", message=message, source="comm", unmeasured=unmeasured)
        except Exception:
            pass

    def close(self) -> None:
        """The probe closed: release the works and pending completions kept for timing."""
        self.async_works.clear()
        self.pending.clear()
        if self._work_poller is not None:
            self._work_poller.closed = True
            self._work_poller.pending.clear()
        if self._event_poller is not None:
            self._event_poller.pending.clear()

    def work_poller(self) -> WorkPoller:
        if self._work_poller is None:
            self._work_poller = WorkPoller(self.tracker)
            poller = gpu_poller(self.probe)
            if poller is not None:
                poller.add(self._work_poller)
        return self._work_poller

    def event_poller(self) -> EventPairPoller:
        if self._event_poller is None:
            self._event_poller = EventPairPoller(self.tracker)
            poller = gpu_poller(self.probe)
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

    def group_identity(self, group: Any) -> tuple[str, int | None]:
        """The group's name as every rank of it knows it ("world" for the default group; torch
        numbers the others in creation order) and this rank's place in it."""
        key = id(group)
        ident = self.group_names.get(key)
        if ident is None:
            import torch.distributed as dist
            name = "world"
            try:
                c10d = dist.distributed_c10d
                if group is not None and group is not c10d._get_default_group():
                    name = str(getattr(group, "group_name", None) or c10d._get_process_group_name(group))
            except Exception:
                name = f"group@{key:x}"
            try:
                rank: int | None = int(dist.get_rank(group))
            except Exception:
                rank = None
            ident = self.group_names[key] = (name, rank)
        return ident

    # wrappers --------------------------------------------------------------------------------
    def wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        op, async_pos, group_pos, nbytes_of = _SPECS[name]
        names = _ARG_NAMES[name]
        state = self

        def collective(*args: Any, **kwargs: Any) -> Any:
            if _is_compiling() or getattr(_tls, "depth", 0) > 0 or state.probe.closed:
                return orig(*args, **kwargs)
            state.pending.poll()
            try:
                prepared = state._prepare(args, kwargs, names, async_pos, group_pos, nbytes_of, op)
            except Exception:
                state.tracker.error()
                prepared = None
            if prepared is None:
                return orig(*args, **kwargs)
            is_async, is_cuda, item, device, token = prepared
            _tls.depth = getattr(_tls, "depth", 0) + 1
            try:
                if is_async:
                    result = orig(*args, **kwargs)
                    if state._track_async(result, item, is_cuda, token):
                        token = 0      # stays open until its work completes
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
                if token:
                    state.ledger.end(token)

        return as_wrapper(collective, orig, name)

    def _prepare(self, args: tuple, kwargs: dict, names: tuple, async_pos: int | None, group_pos: int,
                 nbytes_of: Callable[[tuple, int], int], op: str
                 ) -> tuple[bool, bool, CollectiveCall, Any, int] | None:
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
        group_name, group_rank = self.group_identity(group)
        token = self.ledger.begin(op, group_name, group_rank, n, nbytes)
        # host-timed calls carry where they went: the step's operations (wire 1.5 ``ops``)
        peer = None if is_cuda else peer_of(op, args_n, kwargs, group)
        item = CollectiveCall(op, 1, nbytes, n, None, None, launch=time.perf_counter(), peer=peer,
                              group=None if is_cuda or op in ("send", "recv") else group_name)
        return is_async, is_cuda, item, device, token

    def _sync_cuda(self, orig: Callable[..., Any], args: tuple, kwargs: dict, item: CollectiveCall, device: Any) -> Any:
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

    def _track_async(self, work: Any, item: CollectiveCall, is_cuda: bool, token: int) -> bool:
        """Time an async work; True when the ledger entry ``token`` is now closed by its completion
        (a host-side CPU work), False when the caller closes it at return (CUDA: the device part
        is the flight recorder's to see)."""
        if work is None:    # inside a coalescing manager
            self.tracker.add(item)
            return False
        try:
            if is_cuda:
                if self.tracker.nccl_timing:
                    self.work_poller().add(work, item)
                else:
                    self.tracker.add(item)
                return False
            works = self.async_works
            if len(works) >= MAX_ASYNC:
                works.pop(next(iter(works)))
            works[id(work)] = (work, item)
            try:
                future = work.get_future()
            except RuntimeError:        # gloo's send/recv works have none: completion seen by polling
                self.pending.add(work, item, token)
                return True
            future.then(self._async_done(item, id(work), token))
            return True
        except Exception:
            self.tracker.error()
            return False

    def _async_done(self, item: CollectiveCall, key: int, token: int) -> Callable[[Any], None]:
        tracker = self.tracker
        works = self.async_works
        ledger = self.ledger

        def done(_fut: Any) -> None:
            works.pop(key, None)   # finished: a later wait() returns at once (nothing exposed to time)
            ledger.end(token)
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
                t1 = time.perf_counter()
                self.tracker.add(CollectiveCall(entry[1].op, 0, 0, entry[1].n, None, t1 - t0))
                self.pending.waited(work, t0, t1)
            except Exception:
                self.tracker.error()


class CommSource:
    """Sampler source that emits the periodic ``comm`` record when totals changed."""

    name = "comm"

    def __init__(self, state: CommState, emit: Callable[[dict[str, Any]], None]) -> None:
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


_state: CommState | None = None
_install_lock = threading.Lock()


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
        orig_batch = getattr(c10d, "batch_isend_irecv", None)
        if orig_batch is not None and not getattr(orig_batch, "_perfmon", False):
            state.originals["batch_isend_irecv"] = orig_batch
            c10d.batch_isend_irecv = wrap_batch(state, orig_batch)
            if getattr(dist, "batch_isend_irecv", None) is orig_batch:
                dist.batch_isend_irecv = c10d.batch_isend_irecv
        patch_functional(state)
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


def patch_functional(state: CommState) -> None:
    """Patch the functional collectives by attribute (imported only if torch has them)."""
    try:
        from torch.distributed import _functional_collectives as funcol
    except Exception:
        return
    timing = state.funcol = FuncolTiming(state)
    for name in FUNCOL_SPECS:
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
            dist.Work.wait = state.orig_wait  # type: ignore[method-assign]  # the patch undone
        if state.funcol_originals:
            from torch.distributed import _functional_collectives as funcol
            for name, orig in state.funcol_originals.items():
                if getattr(getattr(funcol, name, None), "_perfmon", False):
                    setattr(funcol, name, orig)
        _state = None


def current() -> CommState | None:
    return _state
