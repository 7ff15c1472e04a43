"""DDP: its C++ reducer calls the process group directly, invisible to Python, so ``attach_ddp``
registers a comm hook that does what DDP's default does and times it (see ``probe.comm``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from probe.comm.guards import tls as _tls
from probe.comm.host import CommHost
from probe.comm.tracker import CollectiveCall, CommTracker, Ledger


class DdpTiming:
    """Our DDP comm hook: DDP's default all-reduce, timed; runs a later user hook instead."""

    def __init__(self, state: CommHost, ddp: Any) -> None:
        self.state = state
        self.pg = ddp.process_group
        self.n = int(self.pg.size())
        self.inner: tuple[Callable[..., Any], Any] | None = None
        self.pass_id = 0
        self.ddp_ref = ddp

    def hook(self, state, bucket):  # unannotated: DDP rejects non-GradBucket annotations
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
            item = CollectiveCall("all_reduce", 1, nbytes, self.n, None, None, pass_id=pass_id, launch=t0, last=last,
                                  group=None if buf.is_cuda else self.state.group_identity(self.pg)[0])
            token = self._enter(nbytes)
            if buf.is_cuda:
                self.state.ledger.end(token)     # the device part is the flight recorder's to see
                if tracker.nccl_timing:
                    self.state.work_poller().add(work, item)
                else:
                    tracker.add(item)
                return fut.then(_first_value)
        except Exception:
            tracker.error()
            return fut.then(_first_value)
        return fut.then(_timed(tracker, item, first=True, ledger=self.state.ledger, token=token))

    def _enter(self, nbytes: int) -> int:
        """The bucket's all-reduce in the ledger (open until its future completes)."""
        name, rank = self.state.group_identity(self.pg)
        return self.state.ledger.begin("all_reduce", name, rank, self.n, nbytes)

    def _run_inner(self, state: Any, bucket: Any, buf: Any, t0: float, pass_id: int, last: bool) -> Any:
        hook, user_state = self.inner  # type: ignore[misc]
        nbytes = buf.numel() * buf.element_size()
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            fut = hook(user_state, bucket)
        finally:
            _tls.depth -= 1
        item = CollectiveCall("all_reduce", 1, nbytes, self.n, None, None, pass_id=pass_id, launch=t0, last=last,
                              group=None if buf.is_cuda else self.state.group_identity(self.pg)[0])
        if buf.is_cuda:
            self.state.tracker.add(item)
            return fut
        return fut.then(_timed(self.state.tracker, item, first=False, ledger=self.state.ledger,
                               token=self._enter(nbytes)))

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


def _timed(tracker: CommTracker, item: CollectiveCall, first: bool, ledger: Ledger, token: int
           ) -> Callable[[Any], Any]:
    """The future's callback: close the ledger entry, charge the bucket's all-reduce (exposed 0 per
    bucket: the pass's tail is computed at drain), then hand DDP the value it expects (``first``:
    the first tensor)."""
    def done(fut: Any) -> Any:
        ledger.end(token)
        try:
            t = time.perf_counter()
            item.done = t
            item.seconds = t - item.launch
            item.exposed = 0.0
            tracker.add(item)
        except Exception:
            tracker.error()
        return fut.value()[0] if first else fut.value()
    return done


def attach_ddp(state: CommHost, ddp: Any) -> str | None:
    """Register the timing hook on a DDP module; None on success, else the reason (for the stream)."""
    if getattr(ddp, "_perfmon_ddp", None) is not None:
        return None
    injected = sys.modules.get("probe.inject")
    if injected is not None and injected.installed():
        return ("DDP communication not timed: a DDP comm hook cannot be removed again, and a probe started by "
                "perfmon inject leaves nothing behind at detach")
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
