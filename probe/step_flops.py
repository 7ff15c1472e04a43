"""FLOPs per step for the MFU, counted once per input signature and never on the training thread.

A root module's forward with a new input signature (shape, dtype, grad mode) is replayed on a
meta-device copy by a background thread (``probe.flops.count_meta``); a model that cannot be
copied is counted live for one step with a thread-local dispatch mode (not under compile, where
a mode would change what dynamo traces). Counted steps say ``flops_source: "counted"``; until a
count exists, or beyond ``MAX_FLOP_SIGNATURES``, the step falls back to 6·N·tokens ("6N").
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Any

from probe import flops
from probe.tracing import contains_compiled, dynamo_has_compiled

MAX_FLOP_SIGNATURES = 16     # distinct input shapes counted; beyond that, 6·N·tokens
MAX_COUNT_SECONDS = 5.0      # a count slower than this stops further counting


class StepFlops:
    """One watcher's FLOP accounting (training thread, except ``_count``)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.cache: dict[tuple, int] = {}
        self.failed: set[tuple] = set()           # with cache: at most MAX_FLOP_SIGNATURES keys
        self.replay_blockers: dict[int, str | None] = {}   # one per root module watched
        self.count_request: tuple | None = None
        self.counting: tuple | None = None        # key being counted on the background thread
        self.count_thread: threading.Thread | None = None
        self.live: tuple[flops.LiveCount, tuple] | None = None
        self.live_thread: int | None = None
        self.counting_off = False
        self.source: str | None = None            # of the latest step: "user" | "counted" | "6N"
        torch = sys.modules.get("torch")
        self.grad_enabled = torch.is_grad_enabled if torch is not None else (lambda: True)
        self.tensor_type: type[Any] = torch.Tensor if torch is not None else type(None)
        self.reset()

    def reset(self) -> None:
        """A step begins."""
        self.step_flops = 0
        self.step_unknown: list[tuple] = []

    def before_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        """A root forward starts: add its cached count, or arrange for this signature to be counted."""
        if self.probe.step_args.flops is not None:
            return
        if not kwargs and len(args) == 1 and isinstance(args[0], self.tensor_type):
            sig: tuple = (args[0].shape, args[0].dtype)      # the common case, without building tuples
        else:
            sig = flops.signature(args, kwargs)
        grad = self.grad_enabled()
        key = (id(module), sig, grad)
        value = self.cache.get(key)
        if value is not None:
            self.step_flops += value
            return
        self.step_unknown.append(key)
        if (self.counting_off or key in self.failed
                or len(self.cache) + len(self.failed) >= MAX_FLOP_SIGNATURES
                or self.count_request is not None or self.counting is not None or self.live is not None):
            return
        target = flops.unwrap_module(module)
        blocker = self.replay_blockers.get(id(target), "unchecked")
        if blocker == "unchecked":
            blocker = flops.meta_replay_blocker(target)
            self.replay_blockers[id(target)] = blocker
        if blocker is None:
            self.count_request = (target, key, flops.to_meta(args), flops.to_meta(kwargs), grad)
        elif not contains_compiled(module) and not dynamo_has_compiled():   # a dispatch mode alters what dynamo traces
            live = flops.LiveCount()
            live.start()
            self.live = (live, key)
            self.live_thread = threading.get_ident()

    def end_step(self, extras: dict[str, Any], n_fwd: int, n_params: int, flops_per_step: Any) -> None:
        """The step's ``flops`` and ``flops_source``: the user's, counted, else 6·N·tokens."""
        ctx = self.probe.step_args
        if ctx.flops is not None:
            self.source = "user"
            return
        if flops_per_step is not None:
            extras["flops"] = float(flops_per_step)
            extras["flops_source"] = self.source = "user"
            return
        if self.live is not None:
            live, key = self.live
            self.live = None
            try:
                total = live.stop()
                self.cache[key] = total // max(1, self.step_unknown.count(key))
            except Exception as exc:
                self.failed.add(key)
                self.probe.report_error("FLOP count", exc)
        if self.count_request is not None:
            self._start_count()
        unknown = self.step_unknown
        if unknown and all(k in self.cache for k in unknown):
            self.step_flops += sum(self.cache[k] for k in unknown)
            unknown = []
        if n_fwd and not unknown and self.step_flops:
            extras["flops"] = float(self.step_flops)
            extras["flops_source"] = self.source = "counted"
            return
        estimate = flops.six_n(n_params, ctx.tokens)
        if estimate is not None:
            extras["flops"] = estimate
            extras["flops_source"] = self.source = "6N"

    def _start_count(self) -> None:
        """Count the requested signature on a meta copy, off the training thread.

        At interpreter exit a count still running is waited for (bounded): a daemon
        thread inside torch's C++ code while the interpreter finalizes aborts the process.
        """
        request, self.count_request = self.count_request, None
        self.counting = request[1]   # type: ignore[index]
        thread = threading.Thread(target=self._count, args=request,  # type: ignore[arg-type]  # one is pending
                                  name="perfmon-flops", daemon=True)
        if self.count_thread is None:
            atexit.register(self.join)
        self.count_thread = thread
        thread.start()

    def join(self, timeout: float = 2 * MAX_COUNT_SECONDS) -> None:   # atexit: a thread inside torch
        # while the interpreter finalizes aborts the process; close() passes its own, shorter bound
        thread = self.count_thread
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, timeout))

    def close(self, deadline: float) -> None:
        """Stop counting; wait for a running count until ``deadline`` (time.monotonic())."""
        self.count_request = None
        live, self.live = self.live, None
        if live is not None and self.live_thread == threading.get_ident():
            try:   # a step's live count ends here: its step-end hook no longer runs
                live[0].stop()
            except Exception:
                pass
        self.join(deadline - time.monotonic())

    def _count(self, target: Any, key: tuple, margs: tuple, mkwargs: dict, grad: bool) -> None:
        t0 = time.perf_counter()
        try:
            try:
                replica = flops.meta_replica(target)
            except Exception as exc:     # cannot copy: a real step will be counted instead
                self.replay_blockers[id(target)] = f"no meta copy: {exc!r}"
                return
            forward, total = flops.count_meta(replica, margs, mkwargs, backward=grad)
            self.cache[key] = total if grad else forward
        except Exception as exc:
            self.failed.add(key)
            self.probe.event("warning", source="watch",
                             message=f"FLOPs not counted for an input shape (meta replay failed: {exc!r})"[:300])
        finally:
            self.counting = None
            if time.perf_counter() - t0 > MAX_COUNT_SECONDS:
                self.counting_off = True
