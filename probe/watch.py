"""``Probe.watch(model=..., optimizer=...)``: attach what can be attached automatically.

* Phases from hooks when the script marks none in a step: forward = the root
  module's forward calls; backward = from the end of a forward to the next forward
  or the optimizer step (loss computation included); optimizer = the optimizer's
  step (pre/post step hooks). Gradient clipping lands in backward.
* Communication (probe.comm): DDP comm hook, patched torch.distributed collectives.
* Memory breakdown (probe.memory) on the sampler thread.
* CUDA only: device time per step from pooled events and the host's lead
  (probe.gpu.cuda), host-device sync counts.
* FLOPs per step (probe.step_flops) and the compute dtype and peak for MFU.

``watch()`` is idempotent per model and optimizer, can be called late (after some
steps), with only an optimizer, and from inside an optimizer step hook (hook
registration is then deferred to the next step, because adding a hook while the
optimizer iterates its hooks would raise in the training loop). It never raises.

The job's device is learned from the watched parameters and again whenever it changes
(``probe.gpu.job``: a ``watch()`` before ``model.cuda()``); the change is applied at the next
step begin. This module is a little over 500 lines on purpose: the hooks and the
device-dependent parts they drive (events, sync counting, memory source, peak FLOP/s) share the
watcher's state and are reconfigured together.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

from probe import comm, flops, layout
from probe.gpu import cuda as gpu_cuda
from probe.gpu.job import STEP_DEVICE_EVERY, job_placement, output_placement
from probe.hooks import Hook, remove_all
from probe.memory import MemorySource, SavedTensorMeter, StateWalker
from probe.step_flops import StepFlops
from probe.tracing import HiddenPhases, compiling_check, dynamo_has_compiled, run_eagerly

_perf_counter = time.perf_counter
_is_compiling = compiling_check()   # every hook's first statement (probe.tracing says why)

_OPTIONS = {"flops_per_step", "peak_flops", "phases", "comm", "memory", "syncs", "gpu_events", "count_flops"}


def watch(probe: Any, model: Any = None, optimizer: Any = None, **options: Any) -> Watcher:
    watcher = probe.attached.watcher
    if watcher is None:
        watcher = Watcher(probe)
        probe.attached.watcher = watcher
    watcher.configure(options)
    inside_step = _inside_optimizer_step()
    for opt in _as_list(optimizer):
        try:        # one object that cannot be watched must not cost the others
            watcher.add_optimizer(_unwrap_optimizer(opt), defer=inside_step)
        except Exception as exc:
            probe.report_error("watch optimizer", exc)
    for mod in _as_list(model):
        try:
            watcher.add_model(mod)
        except Exception as exc:
            probe.report_error("watch model", exc)
    if model is None and optimizer is None and watcher.options["comm"]:
        watcher._attach_comm(None)     # ``watch()`` alone: the script's own collectives are timed too
    return watcher


def _unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (Accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``): wrappers that skip ``Optimizer.__init__`` have no hook
    registries, and the wrapped optimizer's step is the one that runs."""
    for _ in range(3):
        if hasattr(optimizer, "_optimizer_step_pre_hooks"):
            return optimizer
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None:
            return optimizer
        optimizer = inner
    return optimizer


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]


def _inside_optimizer_step() -> bool:
    """True when called (through any hooks) from inside ``Optimizer.step``."""
    target = os.path.join("torch", "optim", "optimizer.py")
    frame: FrameType | None = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(target):
            return True
        frame = frame.f_back
    return False


class ComputeSource:
    """``compute`` sample section: what MFU needs besides the step records."""

    name = "compute"

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def read(self) -> dict[str, Any]:
        w = self.watcher
        return {"compute": {"dtype": w.dtype, "peak_flops": w.peak, "peak_source": w.peak_source,
                            "flops_source": w.flops.source, "params": w.n_params, "device": w.device_label(),
                            "hidden_phases": w.hidden.hidden or None}}


class Watcher:
    """Hooks and per-step state for one probe (main thread unless noted)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.options: dict[str, Any] = {"phases": True, "comm": True, "memory": True, "syncs": None,
                                        "gpu_events": True, "count_flops": True, "flops_per_step": None,
                                        "peak_flops": None}
        self.model_ids: set[int] = set()
        self.optimizer_ids: set[int] = set()
        self.models: list[weakref.ref] = []
        self.optimizers: list[weakref.ref] = []
        self.walker = StateWalker()
        self.deferred: list[Any] = []
        self.handles: list[Any] = []
        self.device_type: str | None = None
        self.device_index: int | None = None
        self.pending_device: tuple[str, int | None] | None = None   # set by probe.gpu.job, applied at step begin
        self.step_device: tuple[str, int | None] | None = None      # where the root forward's output lives
        self.step_device_due = 0.0
        self.n_params = 0
        self.dtype: str | None = None
        self.peak: float | None = None
        self.peak_source: str | None = None
        self.param_dtype: Any = None
        self.comm_state: comm.CommState | None = None
        self.timer: gpu_cuda.StepTimer | None = None
        self.syncs: gpu_cuda.SyncCounter | None = None
        self.meter: SavedTensorMeter | None = None
        self.memory_source: MemorySource | None = None
        self.sources_added = False
        self.comm_source_added = False
        self.flops = StepFlops(probe)
        torch = sys.modules.get("torch")
        self.grad_enabled = torch.is_grad_enabled if torch is not None else (lambda: True)
        self.phases_on = self.flops_on = self.count_flops = True
        self.hidden = HiddenPhases(lambda message: probe.event("warning", message=message, source="watch"),
                                   hint="to time them, pass the module torch.compile returns to watch()")
        # per-step state
        self._reset_step()
        self.fwd_depth = 0
        self.opt_depth = 0
        probe.add_step_hooks(self._begin, self._end)

    def _reset_step(self) -> None:
        self.fwd = 0.0
        self.bwd = 0.0
        self.opt = 0.0
        self.n_fwd = 0
        self.fwd_t0 = 0.0
        self.last_fwd_end = 0.0
        self.bwd_open = False
        self.opt_t0 = 0.0

    # -- configuration --------------------------------------------------------------------
    def configure(self, options: dict[str, Any]) -> None:
        unknown = set(options) - _OPTIONS
        if unknown:
            self.probe.event("warning", message=f"watch(): unknown option(s) ignored: {', '.join(sorted(unknown))}")
        for key in _OPTIONS & set(options):
            self.options[key] = options[key]
        self.phases_on = bool(self.options["phases"])
        self.flops_on = bool(self.options["count_flops"]) or self.options["flops_per_step"] is not None
        self.count_flops = bool(self.options["count_flops"]) and self.options["flops_per_step"] is None
        if options.get("peak_flops") is not None or options.get("flops_per_step") is not None:
            self._update_peak()

    def device_label(self) -> str | None:
        if self.device_type is None:
            return None
        return f"{self.device_type}:{self.device_index}" if self.device_index is not None else self.device_type

    def add_model(self, model: Any) -> None:
        if id(model) in self.model_ids:
            return
        self.model_ids.add(id(model))
        self.models.append(weakref.ref(model))
        self.walker.add_model(model)
        self._learn_device(model.parameters())
        self.n_params = self._count_params()
        # first, to time the whole forward; when phases come from elsewhere (zero-code mode, whose
        # hook opens the step), after the existing hooks, so a forward's FLOPs land in its own step
        pre = model.register_forward_pre_hook(Hook(self._fwd_pre), with_kwargs=True, prepend=self.phases_on)
        post = model.register_forward_hook(Hook(self._fwd_post), with_kwargs=True, always_call=True)
        self.handles += [pre, post]
        if self.options["comm"]:
            self._attach_comm(getattr(model, "_orig_mod", model))   # torch.compile(DDP(...)): the DDP inside
        self._ensure_sources()

    def add_optimizer(self, optimizer: Any, defer: bool = False) -> None:
        if id(optimizer) in self.optimizer_ids:
            return
        self.optimizer_ids.add(id(optimizer))
        self.optimizers.append(weakref.ref(optimizer))
        self.walker.add_optimizer(optimizer)
        self._learn_device(p for g in optimizer.param_groups for p in g["params"])
        self.n_params = self.n_params or self._count_params()
        if defer:
            self.deferred.append(optimizer)
        else:
            self._hook_optimizer(optimizer)
        if self.options["comm"]:
            self._attach_comm(None)
        self._ensure_sources()

    def _hook_optimizer(self, optimizer: Any) -> None:
        self.handles.append(optimizer.register_step_pre_hook(self._opt_pre))
        self.handles.append(optimizer.register_step_post_hook(self._opt_post))

    def _run_deferred(self) -> None:
        pending, self.deferred = self.deferred, []
        for optimizer in pending:
            try:
                self._hook_optimizer(optimizer)
            except Exception as exc:
                self.probe.report_error("watch optimizer hooks", exc)

    def _count_params(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in self.walker._params():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total

    def _learn_device(self, params: Any) -> None:
        """``watch()`` time (training thread): the device of the parameters just given (CUDA when any of
        them is on CUDA: a CPU embedding in front of GPU layers is a CUDA job)."""
        params = list(params)
        if not params:
            return
        if self.param_dtype is None:
            self.param_dtype = params[0].dtype
        placed = job_placement(params, None)
        if placed is not None:
            self._set_device(placed[0])

    def watched_params(self) -> Iterator[Any]:
        """Sampler thread: every parameter of the live watched models and optimizers (may repeat one)."""
        for ref in self.models:
            model = ref()
            if model is not None:
                yield from model.parameters()
        for ref in self.optimizers:
            optimizer = ref()
            for group in (optimizer.param_groups if optimizer is not None else []):
                yield from group["params"]

    def placement(self) -> tuple[tuple[str, int | None], float | None] | None:
        """Sampler thread (``probe.gpu.job``): where the job computes now, from all its tensors (every
        watched parameter, and the root forward's output), with the share of parameter bytes in host
        memory on a CUDA job; None when nothing watched is alive. The training thread is not touched."""
        return job_placement(self.watched_params(), self.step_device)

    def device_moved(self, placement: tuple[str, int | None]) -> None:
        """Sampler thread: the job's device changed; the training thread applies it at the next step
        begin, so a step's CUDA events and sync counting start and end on the same configuration."""
        if placement != (self.device_type, self.device_index):
            self.pending_device = placement

    def _set_device(self, placement: tuple[str, int | None]) -> None:
        """Training thread: (re)configure every device-dependent part for ``placement``."""
        self.pending_device = None
        kind, index = placement
        cuda = gpu_cuda.backend
        if kind == "cuda" and index is None:
            index = _safe(cuda.current_device)
        if kind != "cuda":
            index = None
        if (kind, index) == (self.device_type, self.device_index):
            return
        if self.device_type == "cuda":
            self._teardown_cuda(cuda)
        self.device_type, self.device_index = kind, index
        self.walker.device_type = kind
        self.dtype = None                   # the compute dtype is read again at the next forward
        if kind == "cuda":
            self._setup_cuda(cuda)
        self._update_peak()
        if self.memory_source is not None:
            self.meter = (SavedTensorMeter(lambda: self.walker.param_keys, self.probe.report_error)
                          if kind == "cpu" else None)
            self.memory_source.retarget(kind, self.device_index, self._nvml_device(), self.meter)
        if self.comm_state is not None and kind == "cuda" and self.comm_state.event_backend is None:
            self.comm_state.event_backend = cuda

    def _teardown_cuda(self, cuda: Any) -> None:
        """The job left the GPU (``model.cpu()``): no more events or sync counting."""
        self.timer = None
        if self.syncs is not None:
            gpu_cuda.disable_sync_counting(cuda, self.syncs)
            self.syncs = None

    def _nvml_device(self) -> Any:
        gpu = self.probe.attached.gpu
        devices = gpu.source.devices if gpu is not None and self.device_type == "cuda" else []
        return devices[0] if len(devices) == 1 else None

    def _setup_cuda(self, cuda: Any) -> None:
        if not cuda.ready():
            self.probe.event("warning", source="watch",
                             message="the model is on CUDA but CUDA is not initialized: no device timing")
            return
        if self.options["gpu_events"]:
            self.timer = gpu_cuda.StepTimer(cuda, poller=gpu_cuda.poller_for(self.probe))
        if self.options["syncs"] or (self.options["syncs"] is None and os.environ.get("PERFMON_SYNCS") == "1"):
            counter = gpu_cuda.SyncCounter()
            why_not = gpu_cuda.enable_sync_counting(cuda, counter)
            if why_not is None:
                self.syncs = counter
            else:
                self.probe.event("warning", message=why_not, source="watch")
        if self.device_index is not None:
            from probe import gpu
            gpu.refine(self.probe, self.device_index, cuda)

    def _update_peak(self) -> None:
        """Peak FLOP/s for the compute dtype: user's, else $PERFMON_PEAK_TFLOPS (or $PERFMON_PEAK_FLOPS),
        else the device table. The override also gives a CPU job an MFU."""
        if self.options.get("peak_flops"):
            self.peak, self.peak_source = float(self.options["peak_flops"]), "user"
            return
        for var, scale in (("PERFMON_PEAK_TFLOPS", 1e12), ("PERFMON_PEAK_FLOPS", 1.0)):
            try:
                value = float(os.environ.get(var) or "nan") * scale
            except ValueError:
                continue
            if value > 0:
                self.peak, self.peak_source = value, var
                return
        if self.device_type == "cuda":
            name = self.probe.device.get("name") if isinstance(self.probe.device, dict) else None
            if self.device_index is not None and gpu_cuda.backend.ready():
                name = _safe(lambda: gpu_cuda.backend.device_name(self.device_index)) or name
            self.peak = flops.peak_flops(name, self.dtype)
            self.peak_source = "table" if self.peak is not None else None
        else:
            self.peak, self.peak_source = None, None

    def _attach_comm(self, model: Any) -> None:
        state = self.comm_state or comm.install(self.probe)
        if state is None:
            return
        if self.comm_state is None:
            layout.install(state)        # the rank's place, and a pipeline stage's compute (probe.layout)
        self.comm_state = state
        if state.event_backend is None and self.device_type == "cuda":
            state.event_backend = gpu_cuda.backend
        if model is not None and type(model).__name__ == "DistributedDataParallel":
            if state.tracker.nccl_timing:
                comm.enable_nccl_timing(model.process_group, state)
            why_not = comm.attach_ddp(state, model)
            if why_not:
                state.say(why_not, unmeasured="comm")

    def _ensure_sources(self) -> None:
        sampler = getattr(self.probe, "sampler", None)
        if sampler is None:
            return
        if not self.sources_added:
            self.sources_added = True
            sampler.add(ComputeSource(self))
        if self.memory_source is None and self.options["memory"] and self.device_type is not None:
            if self.device_type == "cpu":
                self.meter = SavedTensorMeter(lambda: self.walker.param_keys, self.probe.report_error)
            gpu = self.probe.attached.gpu
            self.memory_source = MemorySource(self.probe.emit, self.walker, device_type=self.device_type,
                                              index=self.device_index, cuda=gpu_cuda.backend,
                                              nvml=gpu.nvml if gpu is not None else None,
                                              nvml_device=self._nvml_device(), activations=self.meter)
            sampler.add(self.memory_source)
        if self.comm_state is not None and not self.comm_source_added:
            self.comm_source_added = True
            sampler.add(comm.CommSource(self.comm_state, self.probe.emit))

    # -- hooks (training thread) --------------------------------------------------------------
    # The hot path: a few attribute reads per call (bench/bench_watch.py measures it).
    def _fwd_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        if _is_compiling():
            return None
        try:
            if self.fwd_depth == 0:
                now = _perf_counter()
                if self.deferred:
                    self._run_deferred()
                if self.bwd_open:
                    self.bwd += now - self.last_fwd_end
                    self.bwd_open = False
                self.fwd_t0 = now
                if self.dtype is None:
                    self.dtype = flops.compute_dtype(self.param_dtype, self.device_type or "cpu",
                                                    self.probe.report_error)
                    self._update_peak()
                if self.count_flops:
                    self.flops.before_forward(module, args, kwargs)
                meter = self.meter
                if (meter is not None and now >= meter.next_due and meter.ctx is None and self.flops.live is None
                        and self.grad_enabled() and not dynamo_has_compiled()):   # no saved-tensor hooks under compile
                    meter.start()
            self.fwd_depth += 1
        except Exception as exc:
            self.probe.report_error("forward pre-hook", exc)
        return None

    def _fwd_post(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if _is_compiling():
            return None
        try:
            depth = self.fwd_depth - 1
            if depth <= 0:
                now = _perf_counter()
                self.fwd_depth = 0
                self.fwd += now - self.fwd_t0
                self.last_fwd_end = now
                self.bwd_open = self.grad_enabled()
                self.n_fwd += 1
                if self.timer is not None:
                    self.timer.forward_end()
                elif now >= self.step_device_due:     # a CPU-placed model computing on CUDA (CPU offload)
                    self.step_device_due = now + STEP_DEVICE_EVERY
                    self.step_device = output_placement(output)
                if self.meter is not None and self.meter.ctx is not None:
                    self.meter.stop(now)
            else:
                self.fwd_depth = depth
        except Exception as exc:
            self.probe.report_error("forward hook", exc)
        return None

    def _opt_pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if _is_compiling():
            return None
        try:
            now = _perf_counter()
            if self.bwd_open:
                self.bwd += now - self.last_fwd_end
                self.bwd_open = False
            if self.opt_depth == 0:
                self.opt_t0 = now
                if self.timer is not None:
                    self.timer.backward_end()
                if self.walker.need_grads:
                    self.walker.capture_grads()
            self.opt_depth += 1
        except Exception as exc:
            self.probe.report_error("optimizer pre-hook", exc)
        return None

    def _opt_post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if _is_compiling():
            return None
        try:
            if self.opt_depth > 0:
                self.opt_depth -= 1
                if self.opt_depth == 0:
                    self.opt += _perf_counter() - self.opt_t0
        except Exception as exc:
            self.probe.report_error("optimizer post-hook", exc)
        return None

    # -- step boundaries ------------------------------------------------------------------------
    def _begin(self) -> None:
        if self.pending_device is not None:
            self._set_device(self.pending_device)
        if self.deferred:
            self._run_deferred()
        self._reset_step()
        self.flops.reset()
        if self.syncs is not None:
            self.syncs.ensure_first()
        if self.timer is not None:
            self.timer.begin()

    def _end(self, extras: dict[str, Any], phases: dict[str, float]) -> None:
        p = self.probe
        now = _perf_counter()
        if self.bwd_open:
            self.bwd += now - self.last_fwd_end
            self.bwd_open = False
        if self.opt_depth > 0:           # the step ended inside the optimizer's step (zero-code ordering)
            self.opt += now - self.opt_t0
            self.opt_t0 = now
        elif self.walker.need_grads and self.n_fwd:   # no watched optimizer: backward is over by now
            self.walker.capture_grads()
        if self.phases_on and not phases:
            if self.fwd:
                phases["forward"] = self.fwd
            if self.bwd:
                phases["backward"] = self.bwd
            if self.opt:
                phases["optimizer"] = self.opt
            if not self.hidden.done and self.models:
                self.hidden.step(phases, ("forward", "backward", "optimizer") if self.optimizer_ids
                                 else ("forward", "backward"))
        state = self.comm_state
        if state is not None:
            summary = state.tracker.drain()
            if summary is not None:
                extras["comm"] = summary
            ops = state.tracker.take_ops()
            if ops is not None:
                extras["ops"], extras["ops_dropped"] = ops      # made relative to the step's start on the sender
            layout.step_end(state)
        if self.syncs is not None:
            count, site = self.syncs.take()
            extras["syncs"] = count
            if site is not None:
                extras["sync_site"] = site
        if self.flops_on:
            self.flops.end_step(extras, self.n_fwd, self.n_params, self.options["flops_per_step"])
        if self.timer is not None:
            self.timer.end(p.steps)
            result = self.timer.take()
            if result is not None:
                extras.update(result)

    def close(self, deadline: float) -> None:
        """Probe.close(): remove every hook; wait for a running FLOP count until ``deadline``
        (time.monotonic()); after that it finishes on its own (daemon thread)."""
        handles, self.handles = self.handles, []
        remove_all(handles)
        self.deferred = []
        if self.comm_state is not None:
            self.comm_state.close()
        if self.syncs is not None:       # sync debug mode back to off, our filter out
            gpu_cuda.disable_sync_counting(gpu_cuda.backend, self.syncs)
            self.syncs = None
        self.flops.close(deadline)

def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


# hooks never compiled as frames of their own (probe.tracing)
run_eagerly(Watcher._fwd_pre, Watcher._fwd_post, Watcher._opt_pre, Watcher._opt_post)
