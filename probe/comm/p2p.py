"""Point-to-point communication timed like the collectives: the other rank of a ``send``/``recv``
(``isend``/``irecv``), and ``batch_isend_irecv``, which a pipeline schedule uses to post a stage's
sends and receives together (each of its ops timed on its own work; the ops it issues inside are
not counted twice). The peer, as a global rank, is what pairs a send with its receive in the
what-if (wire 1.5 ``ops``).

Gloo's point-to-point works have no future (``Work::getFuture not implemented``), so no callback
says when they complete: ``PendingWorks`` stamps them when ``Work.wait()`` returns, or when a look
at ``is_completed()`` (at each collective or point-to-point call and each pipeline chunk) finds them
done, so a send's completion is known to within one operation of the host."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from probe.comm.guards import as_wrapper, first_tensor, in_hook, is_compiling, nbytes, tls
from probe.comm.pollers import MAX_ASYNC
from probe.comm.tracker import CollectiveCall

P2P = {"send": ("dst", "group_dst"), "recv": ("src", "group_src")}


def peer_of(op: str, args: tuple, kwargs: dict, group: Any) -> int | None:
    """The other rank of a point-to-point call (global), from ``dst``/``src`` or the group-local
    ``group_dst``/``group_src``; None for a receive from any rank or a call that says neither."""
    names = P2P.get(op)
    if names is None:
        return None
    peer = args[1] if len(args) > 1 else kwargs.get(names[0])
    if peer is None and kwargs.get(names[1]) is not None:
        import torch.distributed as dist
        local = int(kwargs[names[1]])
        return int(dist.get_global_rank(group, local)) if group is not None else local
    return int(peer) if isinstance(peer, int) else None


def wrap_batch(state: Any, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``batch_isend_irecv(p2p_op_list)``: one timed call per op, its own work when torch returns one
    per op (gloo), else the batch's last (NCCL coalesces the batch into one)."""
    def batch_isend_irecv(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        if is_compiling() or in_hook() or state.probe.closed:
            return orig(p2p_op_list, *args, **kwargs)
        state.pending.poll()
        try:
            calls = [_call(state, op) for op in p2p_op_list]
        except Exception:
            state.tracker.error()
            calls = []
        tls.depth = getattr(tls, "depth", 0) + 1
        try:
            works = orig(p2p_op_list, *args, **kwargs)
        finally:
            tls.depth -= 1
        try:
            works_list = list(works or ())
            for i, (item, is_cuda, token) in enumerate(calls):
                work = works_list[i] if len(works_list) == len(calls) else (works_list[-1] if works_list else None)
                if not state._track_async(work, item, is_cuda, token):
                    state.ledger.end(token)
        except Exception:
            state.tracker.error()
        return works
    return as_wrapper(batch_isend_irecv, orig, "batch_isend_irecv")


def _call(state: Any, p2p_op: Any) -> tuple[CollectiveCall, bool, int]:
    """(the timed call, its tensor is on CUDA, its ledger token) of one ``P2POp``."""
    kind = "send" if getattr(p2p_op.op, "__name__", "") == "isend" else "recv"
    group = p2p_op.group
    tensor = first_tensor((p2p_op.tensor,))
    is_cuda = bool(tensor is not None and tensor.is_cuda)
    size = nbytes(tensor) if tensor is not None else 0
    n = state.group_size(group)
    name, rank = state.group_identity(group)
    token = state.ledger.begin(kind, name, rank, n, size)
    peer = None if is_cuda else int(p2p_op.peer)
    return CollectiveCall(kind, 1, size, n, None, None, launch=time.perf_counter(), peer=peer), is_cuda, token


class PendingWorks:
    """Works with no future, each with its timed call and ledger token, until seen complete (bounded:
    the oldest is forgotten past ``MAX_ASYNC``, as the futures' works are)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.works: dict[int, tuple[Any, CollectiveCall, int]] = {}

    def add(self, work: Any, item: CollectiveCall, token: int) -> None:
        if len(self.works) >= MAX_ASYNC:
            self.works.pop(next(iter(self.works)))
        self.works[id(work)] = (work, item, token)

    def poll(self) -> None:
        """Stamp the works that completed since the last look."""
        if not self.works:
            return
        try:
            for key, (work, _, _) in list(self.works.items()):
                if work.is_completed():
                    self._completed(key, time.perf_counter())
        except Exception:
            self.state.tracker.error()

    def waited(self, work: Any, t0: float, t1: float) -> None:
        """``Work.wait()`` blocked from ``t0`` to ``t1``: the work is complete; a send the host waited for
        keeps when (``waited``): the host was blocked on its neighbour, a dependency, not work."""
        entry = self.works.get(id(work))
        if entry is not None and entry[1].op == "send":
            entry[1].waited = t0
        self._completed(id(work), t1)

    def clear(self) -> None:
        self.works.clear()

    def _completed(self, key: int, t: float) -> None:
        entry = self.works.pop(key, None)
        if entry is None:
            return
        _, item, token = entry
        self.state.ledger.end(token)
        item.done = t
        item.seconds = t - item.launch
        item.exposed = 0.0          # the host is blocked only in Work.wait(), timed there
        self.state.tracker.add(item)
