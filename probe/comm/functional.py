"""Functional collectives (DTensor, tensor parallel, FSDP2 through ``_functional_collectives``):
timed from launch to the ``wait_tensor`` that completes them."""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Callable
from typing import Any

from probe.comm.guards import as_wrapper, is_compiling as _is_compiling, nbytes as _nbytes, tls as _tls
from probe.comm.host import CommHost
from probe.comm.tracker import CollectiveCall

# The base functions every other functional collective calls through the module's globals, so
# patching these by attribute sees each collective once. Positions: group argument; bytes(args, n).
FUNCOL_SPECS: dict[str, tuple[str, int, Callable[[tuple, int], int]]] = {
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

    def __init__(self, state: CommHost) -> None:
        self.state = state
        self.pending: collections.OrderedDict[int, tuple[Any, CollectiveCall, float]] = collections.OrderedDict()
        self.sizes: dict[str, int] = {}

    def group_size(self, group: Any, tag: str = "") -> int:
        from torch.distributed import _functional_collectives as funcol, distributed_c10d as c10d

        name = str(funcol._resolve_group_name(group, tag))
        n = self.sizes.get(name)
        if n is None:
            n = int(c10d._get_group_size_by_name(name))  # type: ignore[arg-type]  # private: a GroupName is a str
            if len(self.sizes) < 256:
                self.sizes[name] = n
        return n

    def wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        op, group_pos, nbytes_of = FUNCOL_SPECS[name]
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

        return as_wrapper(functional_collective, orig, name)

    def launched(self, op: str, group_pos: int, nbytes_of: Callable[[tuple, int], int], args: tuple,
                 kwargs: dict, result: Any, t0: float) -> None:
        group = kwargs["group"] if "group" in kwargs else args[group_pos]
        n = self.group_size(group, kwargs.get("tag", args[group_pos + 1] if len(args) > group_pos + 1 else ""))
        t1 = time.perf_counter()
        item = CollectiveCall(op, 1, nbytes_of(args, n), n, None, None, launch=t0)
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

        return as_wrapper(wait_tensor, orig, "wait_tensor")

    def waited(self, tensor: Any, t0: float, t1: float) -> None:
        entry = self.pending.pop(id(tensor), None)
        if entry is not None and entry[0]() is tensor:
            _, item, launch_cost = entry
            item.done = t1
            item.seconds = t1 - item.launch
            item.exposed = launch_cost + (t1 - t0)
        else:
            item = CollectiveCall("other", 1, _nbytes(tensor), 0, t1 - t0, t1 - t0, launch=t0, done=t1)
            item.estimated = bool(getattr(tensor, "is_cuda", False))
        self.state.tracker.add(item)
