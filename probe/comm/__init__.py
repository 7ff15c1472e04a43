"""Collective communication: count, bytes, seconds, bus bandwidth, and the exposed part.

Sources of collectives:
* DDP: its C++ reducer calls the process group directly, invisible to Python,
  so ``attach_ddp`` registers a comm hook that does what DDP's
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

from probe.comm.collectives import CommSource, CommState, current, describe, enable_nccl_timing, install, uninstall
from probe.comm.ddp import attach_ddp
from probe.comm.pollers import MAX_ASYNC, EventPairPoller, WorkPoller
from probe.comm.tracker import COMM_PERIOD, CollectiveCall, CommTracker

__all__ = ["COMM_PERIOD", "MAX_ASYNC", "CollectiveCall", "CommSource", "CommState", "CommTracker",
           "EventPairPoller", "WorkPoller", "attach_ddp", "current", "describe", "enable_nccl_timing", "install",
           "uninstall"]
