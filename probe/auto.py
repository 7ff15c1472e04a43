"""Zero-code instrumentation (``perfmon run``): measure a training script that knows nothing of perfmon.

``probe/autostart/sitecustomize.py`` calls ``install()`` right after a process of
the job imports torch. Until training is seen the probe stays dormant: no
socket, no thread, no file; only hooks that stamp ``perf_counter`` and feed
``probe.stepfinder.StepFinder`` (which documents the step rules):

* global optimizer step pre/post hooks (``register_optimizer_step_*_hook``) and a
  wrapper on ``Optimizer.__init__`` (a process with no optimizer is in backward mode);
* a wrapper on ``torch.autograd.backward`` (``Tensor.backward`` calls it);
* the batch-fetch clock on the DataLoader iterator's ``__next__`` (``probe.fetches``: data wait,
  batch size; the trainer callbacks time their data wait with the same clock);
* forward hooks: global ones while dormant, to find the root modules of the
  training forward; then only on those roots (global hooks put every module call
  on PyTorch's slow path).

At the first step end (training seen) the probe starts (``probe.start()``: job,
rank, restart count and recording directory come from the environment that
``perfmon run`` and torchrun set), ``watch()`` is called on the root model and
optimizer when the probe has it, and each later step is queued with its own
boundaries (``Probe.add_step``). A process that never trains (the torchrun
launcher, DataLoader workers, helper scripts) never starts a probe. A script
that uses the probe API itself wins: zero-code mode stands aside. Every hook
swallows its own errors; nothing here raises into the script.

``uninstall()`` takes all of it out again (``perfmon detach``, ``probe.inject``). This module
is a little over 500 lines on purpose: the undoing sits beside the hooks and wrappers it undoes.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
import warnings
import weakref
from _thread import get_ident
from collections.abc import Iterable, MutableSequence
from typing import Any, TypedDict

from probe import fetches, forks
from probe.exceptions import exception_event
from probe.hooks import Hook, remove_all
from probe.part_names import part_name
from probe.stepfinder import StepFinder
from probe.tracing import HiddenPhases, compiling_check, dynamo_has_compiled, run_eagerly

GLOBAL_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
IDLE_MODULE_CALLS = 50_000   # module calls with no backward at all: an inference-only process, stop watching
LATE_ROOT_STEPS = 3           # steps a probe started before any forward waits to see one (probe.inject)
_pc = time.perf_counter
_tt = time.thread_time
_auto: _Auto | None = None


class _Auto:
    """Hook state of one process. The hooks below are module functions reading ``_auto``."""

    def __init__(self, torch: Any, job: str | None = None, running: bool = False) -> None:
        self.torch = torch
        self.job = job                          # the name ``perfmon inject --job`` gave (else the default)
        # installed in a running process: the first forward seen may be an inner module of one that
        # began before the hooks (DDP's module under DDP.forward), so roots are taken after the start
        self.running = running
        self.finder = StepFinder(self._emit, self._on_open, self._on_eval)
        self.off = False
        self.errors = 0
        self.probe: Any = None
        self.emitted = 0
        self.train_thread: int | None = None
        self.fwd_module: Any = None             # outermost training forward in progress
        self.bwd_active = False
        self.opt_outer: int | None = None       # id of the outermost optimizer stepping
        self.optimizer_ref: Any = None          # weakref to the last optimizer that stepped
        self.built_ref: Any = None              # weakref to the last optimizer built
        self.opt_hooks_seen = False             # an optimizer step ran its hooks (eager): no version checks
        self.versions = -1                      # sum of a few parameters' version counters at the last check
        self.versions_of: Any = None            # weakref.finalize holding those parameters (track_versions)
        self.backward_since_check = False       # a backward returned since the last version check
        self.hidden = HiddenPhases(self._say)
        self.roots: list[weakref.ref] = []      # outermost training modules seen
        self.global_handles: list[Any] = []
        self.root_handles: list[Any] = []
        self.opt_handles: list[Any] = []
        self.idle_calls = 0
        self.backward_seen = False
        self.first_batch: float | None = None
        self.iterators: MutableSequence[weakref.ref[Any]] = []     # the probe's deque once it runs
        self.iter_id = 0
        self.end_cpu: float | None = None        # thread CPU clock at the last step's end
        self.gap_cpu: float | None = None        # ... and the CPU s from there to the open step's start
        self.roots_pending = False               # started before any forward was seen: find the roots later
        self.excepthook: Any = None              # (ours, the one it chains to), once chained
        self.evals: list[dict[str, Any]] = []    # eval-shaped work seen before the probe started
        self.trained_roots: list[weakref.ref] = []   # the roots hooked at start (optimizer part names)

    # -- steps ----------------------------------------------------------------------------------
    def _emit(self, start: float, end: float, phases: dict[str, float], samples: int | None,
              data_cpu: float | None) -> None:
        if self.probe is None:
            self.start()
        mon = self.probe
        if mon is None or self.off:
            return
        if mon.steps != self.emitted:   # the script records steps through the API itself
            self.turn_off()
            return
        if self.roots_pending:
            self._late_roots()
        if not self.hidden.done and self.finder.last_parts <= 1:   # a step of several parts names them instead
            self.hidden.step(phases, ("forward", "backward", "optimizer") if self.finder.optimizers
                             else ("forward", "backward"))
        gap_cpu, self.gap_cpu = self.gap_cpu, None
        mon.add_step(start, end, phases, samples=samples, data_cpu=data_cpu, gap_cpu=gap_cpu)
        self.end_cpu = _tt()
        self.emitted += 1

    def _on_eval(self, start: float, end: float, forwards: int, cpu0: float | None) -> None:
        """Eval-shaped work (training forwards that no backward followed) was cut off the step's start:
        an ``eval`` event, a pause between steps (``perfmon_analysis.buffers.BLOCKING_EVENTS``); the step's
        CPU clock starts again at the training batch."""
        event = {"seconds": end - start, "forwards": forwards, "source": "zero-code",
                 "message": f"{forwards} training-mode forwards with no backward after them (an evaluation run "
                            "without no_grad()/model.eval()?): time between steps"}
        if self.probe is None:
            self.evals.append(event)
            return
        self.probe.event("eval", **event)
        if self.finder.is_open:
            self.probe.restart_step_clock(cpu0)

    def _say(self, message: str) -> None:
        if self.probe is not None:
            self.probe.event("warning", message=message, source="zero-code")

    def _on_open(self) -> None:
        """A step opened: its CPU time counts from its start: the first fetch's start when it opened
        there, the previous step's end when it opened there (a backward with no forward seen)."""
        finder = self.finder
        cpu0 = finder.start_cpu if finder.start_cpu is not None else \
            self.end_cpu if finder.prev_end is not None and finder.start == finder.prev_end else None
        if self.end_cpu is not None and finder.prev_end is not None:
            # the training thread's CPU between the last step's end and this one's start (the batch fetch
            # that opened it is the step's): the loop's own work there, busy or waiting
            cpu0 = _tt() if cpu0 is None else cpu0
            self.gap_cpu = max(0.0, cpu0 - self.end_cpu)
        if self.probe is not None:
            self.probe.begin_step(cpu0)

    # -- start at the first training step ----------------------------------------------------
    def start(self) -> None:
        """Training seen: start the probe, narrow the forward hooks to the roots, call watch()."""
        from probe import core, lifecycle

        if self.probe is not None or self.off:
            return
        self.train_thread = get_ident()
        if lifecycle.current() is not None:      # the script started the probe itself: the API wins
            self.turn_off()
            return
        mon = lifecycle.start(self.job, **_distributed_rank(self.torch))
        if not isinstance(mon, core.Probe):
            self.turn_off()
            return
        self.probe = mon
        mon.opening = self.finder.opening
        restart = mon.restart
        if restart > 0:
            mon.event("restart", restart=restart, max_restarts=_env_int("TORCHELASTIC_MAX_RESTARTS"),
                      message=f"worker restarted by torchrun (restart {restart}); earlier attempts are separate "
                              "recordings")
        for event in self.evals:
            mon.event("eval", **event)
        self.evals = []
        if self.first_batch is not None:
            mon.first_batch_wait = self.first_batch
            mon.event("first_batch", seconds=self.first_batch)
        mon.loader_iterators.extend(self.iterators)
        self.iterators = mon.loader_iterators
        ref = self.optimizer_ref or self.built_ref
        if self.running:
            self.roots = []
        self._watch(self._hook_roots(), ref() if ref is not None else None)
        atexit.register(self.flush)   # registered after the probe's close: runs before it
        _chain_excepthook(self)

    def _watch(self, models: list[Any], optimizer: Any = None) -> None:
        """``watch()`` the roots and the optimizer: communication, memory, FLOPs, device timing
        (phases come from the hooks here). Idempotent per model and optimizer."""
        mon = self.probe
        watch = getattr(mon, "watch", None)
        if callable(watch) and (models or optimizer is not None):
            try:
                watch(model=models or None, optimizer=optimizer, phases=False)
            except Exception as exc:
                mon.report_error("watch", exc)

    def _late_roots(self) -> None:
        """Step end after a start that had seen no forward (``perfmon inject`` entered after the step's
        forward): the roots seen since get their hooks and their ``watch()`` now; after
        ``LATE_ROOT_STEPS`` steps without a training forward, the global hooks go anyway."""
        if self.roots or self.emitted >= LATE_ROOT_STEPS:
            self.roots_pending = False
            self._watch(self._hook_roots(late=True))

    def _hook_roots(self, late: bool = False) -> list[Any]:
        """Replace the global forward hooks by hooks on the trainable roots; return those roots.

        When torch.compile has already compiled code the global hooks stay: Dynamo guards on
        their number, so removing them would recompile; inside compiled code they cost nothing.
        With no root seen yet (the first step was entered after its forward) they stay until
        ``_late_roots``.
        """
        roots = [m for m in (r() for r in self.roots) if m is not None and _trainable(m)]
        self.roots = []
        if not roots and self.global_handles and not late:
            self.roots_pending = True
            return roots
        if dynamo_has_compiled():
            return roots
        remove_all(self.global_handles)
        self.trained_roots = [weakref.ref(m) for m in roots]
        for module in roots:
            try:
                self.root_handles.append(module.register_forward_pre_hook(Hook(_fwd_pre)))
                self.root_handles.append(module.register_forward_hook(Hook(_fwd_post), always_call=True))
            except Exception as exc:
                self.fail(exc)
        return roots

    def track_versions(self, optimizer: Any) -> None:
        """Follow a few of this optimizer's parameters (``check_unseen_step``) for as long as it lives.

        A finalizer holds them, so the optimizer's last step is still seen when the
        script drops the optimizer before exit; it holds nothing the optimizer does not.
        """
        if self.versions_of is not None:
            self.versions_of.detach()
        params = [p for group in optimizer.param_groups[:2] for p in group["params"][:2]]
        self.versions = -1
        self.versions_of = weakref.finalize(optimizer, self.check_unseen_step, params)
        self.versions_of.atexit = False

    def check_unseen_step(self, params: list[Any] | None = None) -> None:
        """End the step if an optimizer step ran where no hook sees it (inside a compiled region).

        Optimizers update parameters in place, which bumps their version counters
        (from compiled code too); reading a counter is a field read, no device sync.
        """
        if self.opt_hooks_seen or self.off:
            return
        if params is None:
            alive = self.versions_of.peek() if self.versions_of is not None else None
            if alive is None:
                return
            params = alive[2][0]
        total = 0
        for p in params:
            total += p._version
        previous, self.versions = self.versions, total
        backward, self.backward_since_check = self.backward_since_check, False
        if previous >= 0 and total != previous and backward:   # an update follows a backward
            if self.optimizer_ref is None:
                self.optimizer_ref = self.built_ref
            self.finder.optimizer_unseen(_pc())

    def fetched(self, it: Any, batch: Any, t0: float, t1: float, c0: float | None, c1: float | None) -> None:
        """A DataLoader fetch (``probe.fetches``), on whichever thread made it."""
        if self.off or (self.train_thread is not None and get_ident() != self.train_thread):
            return                          # a prefetch thread's fetch: the training thread did not wait
        try:
            if id(it) != self.iter_id:
                self.iter_id = id(it)
                _register_iterator(self, it)
            cpu = c1 - c0 if c0 is not None and c1 is not None else None
            if self.first_batch is None:    # worker start-up: reported apart, as probe.loader() does
                self.first_batch = t1 - t0
                t0, c0, cpu = t1, c1, None
            if c0 is None and self.probe is not None:   # the clock a step opening at this fetch counts from
                c0 = _tt()
            self.check_unseen_step()
            self.finder.fetch(t0, t1, _batch_size(self.torch, batch), cpu, id(it), c0)
        except Exception as exc:
            self.fail(exc)

    def note_root(self, module: Any) -> None:
        if (self.probe is None or self.roots_pending) and not any(r() is module for r in self.roots) \
                and len(self.roots) < 16:
            self.roots.append(weakref.ref(module))

    def arm_global_hooks(self) -> None:
        """The global forward hooks that find the model's roots; once: handles lost by arming twice
        would outlive ``uninstall``."""
        if self.global_handles:
            return
        # torch.compile warns about global hooks on every compiled-module call; these are ours and
        # fire only once per call (the outermost-forward check), so that warning says nothing to the user
        warnings.filterwarnings("ignore", message=GLOBAL_HOOKS_WARNING, category=UserWarning)
        mod = self.torch.nn.modules.module
        self.global_handles = [mod.register_module_forward_pre_hook(_fwd_pre),
                               mod.register_module_forward_hook(_fwd_post, always_call=True)]

    def flush(self) -> None:
        if not self.off and os.getpid() == _pid:
            try:
                self.check_unseen_step()
                self.finder.flush()
            except Exception as exc:
                self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """A hook failed: counted; the first failure becomes a warning event in the stream."""
        self.errors += 1
        if self.errors == 1 and self.probe is not None:
            self.probe.report_error("zero-code hook", exc)

    def turn_off(self) -> None:
        """Stand aside for good: the hooks that cost something are removed, the wrappers pass through."""
        self.off = True
        fetches.unlisten(self.fetched)
        remove_all(self.global_handles)
        remove_all(self.root_handles)
        remove_all(self.opt_handles)


# -- hooks (hot path: cheap checks first, errors counted, never raised) ------------------------
def _fwd_pre(module: Any, args: Any) -> None:
    if _is_compiling():
        return
    a = _auto
    if a is None or a.fwd_module is not None or a.off:
        return
    try:
        if a.probe is None:
            a.idle_calls += 1
            if a.idle_calls > IDLE_MODULE_CALLS and not a.backward_seen:
                remove_all(a.global_handles)   # inference only so far; re-armed by the first backward
                return
        if a.bwd_active or not getattr(module, "training", False) or not a.torch.is_grad_enabled():
            return                          # checkpoint recompute, evaluation
        if a.train_thread is not None and get_ident() != a.train_thread:
            return
        a.fwd_module = module
        a.check_unseen_step()
        a.finder.forward_begin(_pc())
        a.note_root(module)
    except Exception as exc:
        a.fail(exc)


def _fwd_post(module: Any, args: Any, output: Any) -> None:
    if _is_compiling():
        return
    a = _auto
    if a is None or module is not a.fwd_module:
        return
    a.fwd_module = None
    try:
        a.finder.forward_end(_pc())
    except Exception as exc:
        a.fail(exc)


def _opt_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return None
    a = _auto
    if a is None or a.off:
        return None
    oid = id(optimizer)
    if a.opt_outer is not None and a.opt_outer != oid:
        return None                         # an optimizer stepped inside another (ZeRO's inner one)
    a.opt_outer = oid
    try:
        a.finder.optimizer_begin(_pc())
    except Exception as exc:
        a.fail(exc)
    return None


def _opt_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return
    a = _auto
    if a is None or a.off or a.opt_outer != id(optimizer):
        return
    a.opt_outer = None
    a.opt_hooks_seen = True
    try:
        a.optimizer_ref = weakref.ref(optimizer)
        if a.probe is None:
            a.start()       # inside the first step, where the script's own timer sees the start-up cost too
        if id(optimizer) not in a.finder.labels:
            a.finder.labels[id(optimizer)] = part_name(optimizer, a.trained_roots, a.finder.labels.values())
        a.finder.optimizer_end(_pc(), id(optimizer))
    except Exception as exc:
        a.fail(exc)


def _wrap_backward(orig: Any) -> Any:
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        a = _auto
        if _is_compiling() or a is None or a.off or a.bwd_active:
            return orig(*args, **kwargs)    # nested (reentrant checkpointing) or off
        a.bwd_active = True
        try:
            if not a.backward_seen:
                a.backward_seen = True
                if a.probe is None and not a.global_handles:
                    a.arm_global_hooks()   # dropped as inference-only earlier
            a.check_unseen_step()
            a.finder.backward_begin(_pc())
        except Exception as exc:
            a.fail(exc)
        try:
            result = orig(*args, **kwargs)
        finally:
            a.bwd_active = False
            a.backward_since_check = True
        try:
            if a.probe is None and a.finder.optimizers == 0:
                a.start()   # a backward ends a step when there is no optimizer: training seen
            a.finder.backward_end(_pc())
        except Exception as exc:
            a.fail(exc)
        return result
    return backward


def _wrap_optimizer_init(orig: Any) -> Any:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        a = _auto
        if a is not None:
            a.finder.optimizers += 1
            a.built_ref = weakref.ref(self)
            try:
                a.track_versions(self)
            except Exception as exc:
                a.fail(exc)
    return __init__


# -- helpers ----------------------------------------------------------------------------------
def _register_iterator(a: _Auto, it: Any) -> None:
    """Let the sampler find the loader's worker processes (as ``Probe.loader`` does)."""
    if any(r() is it for r in list(a.iterators)[-8:]):   # a list before the probe starts, its deque after
        return
    a.iterators.append(weakref.ref(it))


def _batch_size(torch: Any, batch: Any) -> int:
    for _ in range(3):
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.dim() else 0
        if isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            return 0
    return 0


def _trainable(module: Any) -> bool:
    return any(p.requires_grad for p in module.parameters())


class _RankArgs(TypedDict, total=False):
    rank: int
    world_size: int


def _distributed_rank(torch: Any) -> _RankArgs:
    """Rank and world size from an initialized process group (mp.spawn jobs set no RANK variable)."""
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
    except Exception:
        pass
    return {}


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _chain_excepthook(a: _Auto) -> None:
    """An uncaught exception becomes an event in the stream before the interpreter exits."""
    previous = sys.excepthook

    def excepthook(et: Any, ev: Any, tb: Any) -> None:
        try:
            if a.probe is not None and not a.off:
                fields = exception_event(et, ev, tb, a.emitted)
                a.probe.event(fields.pop("name"), **fields)
        except Exception:
            pass
        previous(et, ev, tb)

    sys.excepthook = excepthook
    a.excepthook = (excepthook, previous)


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) is not the training process: zero-code mode is off there."""
    if _auto is not None:
        _auto.off = True
        _auto.global_handles = []
        _auto.root_handles = []
        _auto.opt_handles = []


_pid = os.getpid()
_is_compiling = compiling_check()   # replaced in install(), once torch is imported


def active() -> bool:
    """Zero-code mode (``perfmon run``) is finding this process's steps."""
    return _auto is not None and not _auto.off and _pid == os.getpid()


def install(optimizers: Iterable[Any] = (), job: str | None = None, running: bool = False) -> None:
    """Put the dormant hooks in place (once per process); called right after torch is imported,
    or in a running process (``probe.inject``, ``running``) with the ``optimizers`` it built already
    and the ``job`` name its injector gave (``PERFMON_JOB`` still wins, as for ``probe.start``)."""
    global _auto, _pid, _is_compiling
    if _auto is not None or os.environ.get("PERFMON_DISABLE") == "1":
        return
    import torch

    _is_compiling = compiling_check()
    from torch.optim import optimizer as optim_mod

    a = _auto = _Auto(torch, job, running)
    _pid = os.getpid()
    # armed before the wrapped backward exists: the training thread's backward may re-arm them
    # (``_wrap_backward``) while this runs on the injector's thread
    a.arm_global_hooks()
    a.opt_handles = [optim_mod.register_optimizer_step_pre_hook(_opt_pre),
                     optim_mod.register_optimizer_step_post_hook(_opt_post)]
    torch.optim.Optimizer.__init__ = _wrap_optimizer_init(  # type: ignore[method-assign]  # the hook is the patch
        torch.optim.Optimizer.__init__)
    torch.autograd.backward = _wrap_backward(torch.autograd.backward)
    for optimizer in optimizers:
        a.finder.optimizers += 1
        a.built_ref = weakref.ref(optimizer)
        a.track_versions(optimizer)
    fetches.listen(a.fetched)
    # never compiled as frames of their own (probe.tracing); the wrappers only at their own level
    run_eagerly(_fwd_pre, _fwd_post, _opt_pre, _opt_post, _Auto.start, _Auto.flush, _Auto.fail, _Auto.fetched,
                _Auto.check_unseen_step, _Auto.track_versions, _Auto.arm_global_hooks, _register_iterator, _batch_size)
    run_eagerly(torch.optim.Optimizer.__init__, torch.autograd.backward, recursive=False)
    forks.after_in_child(_after_fork_in_child)


def uninstall() -> list[str]:
    """Undo ``install()`` and stop the probe it started (``perfmon detach``): hooks removed, wrapped
    functions restored, the probe closed, atexit and excepthook entries gone. Returns what could
    not be restored (a wrapper someone wrapped again stays, as a pass-through)."""
    global _auto
    a = _auto
    if a is None:
        return []
    left: list[str] = []
    a.turn_off()
    if a.versions_of is not None:
        a.versions_of.detach()
    torch = a.torch
    left += _unwrap(torch.optim.Optimizer, "__init__", _wrap_optimizer_init)
    left += _unwrap(torch.autograd, "backward", _wrap_backward)
    if a.excepthook is not None:
        ours, previous = a.excepthook
        if sys.excepthook is ours:
            sys.excepthook = previous
        else:
            left.append("sys.excepthook (chained again after perfmon's)")
    atexit.unregister(a.flush)
    warnings.filters[:] = [f for f in warnings.filters  # type: ignore[index]  # a list (typeshed: Sequence)
                           if not (f[0] == "ignore" and getattr(f[1], "pattern", None) == GLOBAL_HOOKS_WARNING)]
    mon = a.probe
    if mon is not None:
        attached = mon.attached
        exit_joins = [mon.close, mon._join_at_exit] + [
            part.join for part in (getattr(attached.watcher, "flops", None), attached.profiler, attached.capture)
            if part is not None]
        mon.close()
        for fn in exit_joins:       # the process goes on: nothing of the probe's may run at its exit
            atexit.unregister(fn)
    _auto = None
    return left


def _unwrap(owner: Any, name: str, wrapper_factory: Any) -> list[str]:
    """Put back the original under one of our ``functools.wraps`` wrappers (found by its code)."""
    current = getattr(owner, name)
    ours = wrapper_factory(None).__code__
    if getattr(current, "__code__", None) is ours:
        setattr(owner, name, current.__wrapped__)
        return []
    return [f"{getattr(owner, '__name__', owner)}.{name} (wrapped again after perfmon)"]
