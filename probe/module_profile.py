"""Per-module profile of a few steps, on request (``profile`` request, DESIGN §4; seed 002).

A viewer asks for N steps to depth D. At the end of the step during which the request
arrived, the training thread puts a forward pre/post hook on every module of the watched
model down to depth D; the next N steps are timed; at the end of the N-th the hooks are
removed on that same thread, so no step outside the profile runs a hook. Times:

* forward of a module: its forward pre-hook to its forward hook;
* backward: from the moment the gradient of any of its outputs is ready (a multi-grad hook
  on the outputs: autograd is about to run the module's backward) to the moment the gradient
  of any of its inputs is (the backward left it), else the end of the backward pass (a
  module whose inputs need no gradient, such as an embedding of token ids).

Marks are ``perf_counter`` on CPU and CUDA events on GPU (the device timeline, read on the
finishing thread once the events completed: never a synchronisation on the training thread).

FLOPs per module are counted on a background thread while the steps are timed: one forward
and backward of a meta-device copy of the model (``probe.flops``) with the first profiled call's
input shapes, each op's FLOPs added to the modules it ran in. Where a meta copy cannot stand for
the model (FSDP, DTensor) or its replay fails (a model that calls ``.item()`` in its forward),
the hooks stay for one more step, which is counted live on the training thread with a
thread-local dispatch mode (that step is slower, and not among the timed ones). The ``profile``
record carries raw per-step seconds and FLOPs; shares, rates and the marked row are the viewer's
(``tui.model.profile``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from probe import flops
from probe.hooks import Hook
from probe.tracing import compiling_check, contains_compiled, run_eagerly

MAX_STEPS = 50           # a profile is a look, not a mode: bounded in steps
MAX_DEPTH = 8
MAX_ROWS = 2000          # modules profiled at most (the largest record stays far below a frame)
MAX_SPANS = 200_000      # timed calls kept in one profile; beyond, the rest is not timed (said)
ARMED_SECONDS = 60.0     # an armed profile no step has started yet is replaced by a new request
EVENT_WAIT_SECONDS = 10.0
MAX_META_SECONDS = 30.0  # the finishing thread waits this long at most for the meta-device count

_is_compiling = compiling_check()
_perf_counter = time.perf_counter


class _CpuClock:
    name = "perf_counter"

    @staticmethod
    def mark() -> float:
        return _perf_counter()

    @staticmethod
    def seconds(a: Any, b: Any) -> float | None:
        return b - a


class _EventClock:
    """CUDA events on the current stream: a span is the device timeline between two records."""

    name = "cuda_events"

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda

    def mark(self) -> Any:
        event = self.cuda.new_event()
        self.cuda.record_on(event)
        return event

    def seconds(self, a: Any, b: Any) -> float | None:
        deadline = time.monotonic() + EVENT_WAIT_SECONDS
        while not b.query():          # the finishing thread waits, never the training thread
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)
        return a.elapsed_time(b) / 1e3


class _Module:
    """Timing state of one profiled module (training thread; read after the hooks are gone)."""

    __slots__ = ("name", "type", "depth", "module", "open_fwd", "open_bwd", "fwd", "bwd", "calls")

    def __init__(self, name: str, module: Any, depth: int) -> None:
        self.name = name
        self.type = type(module).__name__
        self.depth = depth
        self.module = module
        self.open_fwd: list[Any] = []
        self.open_bwd: list[Any] = []
        self.fwd: list[tuple[Any, Any]] = []
        self.bwd: list[tuple[Any, Any]] = []
        self.calls = 0


class ModuleProfiler:
    """One profile at a time for one probe. ``request`` runs on the sender thread; the step-end
    hook and the module hooks on the training thread; ``_finish`` on a thread of its own."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self._lock = threading.Lock()
        self.state = "idle"            # idle | armed | running | counting | finishing
        self.request_id: int | None = None
        self.steps = 0
        self.depth = 0
        self.armed_at = 0.0
        self.done = 0
        self.first_step = 0
        self.t_start = 0.0
        self.root: Any = None
        self.modules: list[_Module] = []
        self.handles: list[Any] = []
        self.spans = 0
        self.truncated = False
        self.clock: Any = _CpuClock()
        self.root_calls = 0
        self.meta_call: tuple[tuple, dict, bool] | None = None
        self.meta_thread: threading.Thread | None = None
        self.counted: dict[str, tuple[float, float]] | None = None   # (forward, backward) FLOPs by module
        self.counted_per_call = False                  # ``counted`` is per root call (meta), else per step (live)
        self.live_totals: dict[str, list[float]] = {}
        self.flops_note: str | None = None
        self.live: flops.FlopCount | None = None      # the live-count step's dispatch mode
        self.active: dict[str, int] = {}               # modules the live count attributes to now
        self.t_timed = 0.0                             # end of the timed steps
        self.backward_open = False
        self.torch: Any = None
        self.hooked = False            # our step-end hook is registered

    # -- sender thread ----------------------------------------------------------------------
    def request(self, request_id: int, steps: Any, depth: Any) -> str | None:
        """Arm a profile of the next ``steps`` steps; the reason it cannot be, else None."""
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
            return f"steps must be 1..{MAX_STEPS}"
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= MAX_DEPTH:
            return f"depth must be 0..{MAX_DEPTH}"
        root, why_not = self._model()
        if root is None:
            return why_not
        with self._lock:
            if self.state == "armed" and time.monotonic() - self.armed_at < ARMED_SECONDS:
                return (f"a profile (request {self.request_id}) is waiting for the current step to end "
                        f"({time.monotonic() - self.armed_at:.0f} s so far)")
            if self.state in ("running", "counting", "finishing"):
                return (f"a profile is already running (request {self.request_id}, "
                        f"{self.done} of {self.steps} steps done)")
            self.state = "armed"
            self.request_id, self.steps, self.depth = request_id, steps, depth
            self.armed_at = time.monotonic()
            self.root = root
        if not self.hooked:
            self.hooked = True
            self.probe.add_step_hooks(end=self._on_step_end)
        return None

    def _model(self) -> tuple[Any, str]:
        watcher = self.probe.attached.watcher
        models = [ref() for ref in watcher.models] if watcher is not None else []
        models = [m for m in models if m is not None]
        if not models:
            return None, ("no model to profile: the job did not pass one to probe.watch(model=...) and "
                          "zero-code mode (perfmon run) has not found one")
        model = models[0]
        if contains_compiled(model):
            return None, ("the model is compiled (torch.compile): hooks on its modules would make dynamo "
                          "recompile it, so it is not profiled; profile an eager run")
        return flops.unwrap_module(model), ""

    # -- training thread --------------------------------------------------------------------
    def _on_step_end(self, extras: dict[str, Any], phases: dict[str, float]) -> None:
        state = self.state
        if state == "armed":
            self._start()
        elif state == "running":
            self.done += 1
            if self.done >= self.steps:
                self.t_timed = _perf_counter()
                if self._live_count_needed():
                    self.state = "counting"        # the next step, from its beginning (``_on_step_begin``)
                    self.probe.add_step_hooks(begin=self._on_step_begin)
                else:
                    self._stop()
        elif state == "counting":
            self._end_live_count()
            self._stop()

    def _on_step_begin(self) -> None:
        if self.state == "counting" and self.live is None:
            self._begin_live_count()

    def _start(self) -> None:
        torch = self.torch = sys.modules["torch"]
        watcher = self.probe.attached.watcher
        if watcher is not None and watcher.device_type == "cuda":
            from probe.gpu import cuda as gpu_cuda
            self.clock = _EventClock(gpu_cuda.backend)
        else:
            self.clock = _CpuClock()
        self.modules, self.handles = [], []
        self.spans, self.truncated, self.root_calls, self.meta_call = 0, False, 0, None
        self.meta_thread, self.counted, self.flops_note, self.live, self.active = None, None, None, None, {}
        self.counted_per_call = False
        self.backward_open = False
        for name, module in self.root.named_modules():
            depth = 0 if not name else name.count(".") + 1
            if depth > self.depth:
                continue
            if len(self.modules) >= MAX_ROWS:
                self.truncated = True
                break
            entry = _Module(name, module, depth)
            self.modules.append(entry)
            self.handles.append(module.register_forward_pre_hook(Hook(self._pre(entry)), with_kwargs=True))
            self.handles.append(module.register_forward_hook(Hook(self._post(entry)), with_kwargs=True,
                                                             always_call=True))
        self.done = 0
        self.first_step = self.probe.steps + 1
        self.t_start = _perf_counter()
        self.state = "running"

    def _stop(self) -> None:
        self.remove_hooks()
        self.probe.remove_step_hooks(begin=self._on_step_begin, end=self._on_step_end)
        self.hooked = False
        self.state = "finishing"
        thread = threading.Thread(target=self._finish, args=(self.t_timed,), name="perfmon-profile", daemon=True)
        thread.start()

    def _live_count_needed(self) -> bool:
        """The meta replay could not count this model (and is done saying so): count the next step live."""
        meta = self.meta_thread
        return self.meta_call is not None and self.counted is None and (meta is None or not meta.is_alive())

    def _begin_live_count(self) -> None:
        self.active = {}
        self.live = flops.FlopCount(self._attribute_live)
        self.live_totals = {e.name: [0.0, 0.0] for e in self.modules}
        self.live.__enter__()

    def _attribute_live(self, n: int) -> None:
        phase = 1 if self.backward_open else 0
        for name in self.active:
            self.live_totals[name][phase] += n

    def _end_live_count(self) -> None:
        live, self.live = self.live, None
        if live is None:
            self.flops_note = f"no step began after the profile to count live ({self.flops_note})"
            return
        try:
            live.__exit__(None, None, None)
            self.counted = {name: (f, b) for name, (f, b) in self.live_totals.items()}
            self.flops_note = (f"counted live in step {self.probe.steps} ({self.flops_note}); "
                               "that step was slower and is not among the timed ones")
        except Exception as exc:
            self.flops_note = f"the live count failed ({exc!r}) after {self.flops_note}"[:300]

    def _start_meta_count(self, args: tuple, kwargs: dict, grad: bool) -> None:
        """At the first profiled forward: its input shapes, counted on a meta copy on a thread of its own."""
        self.meta_call = (flops.to_meta(args), flops.to_meta(kwargs), grad)
        self.meta_thread = threading.Thread(target=self._count_meta, args=self.meta_call,
                                            name="perfmon-profile-flops", daemon=True)
        self.meta_thread.start()

    def _count_meta(self, margs: tuple, mkwargs: dict, grad: bool) -> None:
        """The meta-device count."""
        blocker = flops.meta_replay_blocker(self.root)
        if blocker is not None:
            self.flops_note = f"{blocker}: a meta-device copy would not be the real computation"
            return
        try:
            per_call = count_by_module(self.root, self.depth, margs, mkwargs, grad)
        except Exception as exc:
            self.flops_note = f"the meta-device replay failed: {exc!r}"[:200]
            return
        self.counted_per_call = True
        self.counted = {name: (float(f), float(b)) for name, (f, b) in per_call.items()}

    def remove_hooks(self) -> None:
        """Every module hook of the profile off (and a live count's dispatch mode, on the thread that
        entered it: ``Probe.close`` at exit runs there)."""
        live, self.live = self.live, None
        if live is not None and threading.get_ident() == self.probe.progress()[3]:
            try:
                live.__exit__(None, None, None)
            except Exception:
                pass
        handles, self.handles = self.handles, []
        for handle in handles:
            try:
                handle.remove()
            except Exception:
                pass

    def _pre(self, entry: _Module) -> Callable[..., None]:
        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            if _is_compiling():
                return
            try:
                grad = self.torch.is_grad_enabled()
                if self.live is not None:          # the live-count step: attribution only, no timing
                    self.active[entry.name] = self.active.get(entry.name, 0) + 1
                elif self.state == "running":
                    entry.open_fwd.append(self.clock.mark())
                    entry.calls += 1
                    if entry.depth == 0:
                        self.root_calls += 1
                        if self.meta_call is None:
                            self._start_meta_count(args, kwargs, grad)
                else:
                    return
                if grad:
                    _on_first_grad(self.torch, _grad_tensors(self.torch, (args, kwargs)), self._left(entry))
            except Exception as exc:
                self.probe.report_error("profile hook", exc)
        return pre

    def _post(self, entry: _Module) -> Callable[..., None]:
        def post(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            if _is_compiling():
                return
            try:
                if self.live is not None:
                    self._leave(entry.name)
                elif entry.open_fwd:
                    self._span(entry.fwd, entry.open_fwd.pop())
                else:
                    return                         # between the timed steps and a live count: nothing
                if self.torch.is_grad_enabled():
                    _on_first_grad(self.torch, _grad_tensors(self.torch, output), self._entered(entry))
            except Exception as exc:
                self.probe.report_error("profile hook", exc)
        return post

    def _entered(self, entry: _Module) -> Callable[[Any], None]:
        def entered(_grad: Any) -> None:      # autograd is about to run this module's backward
            try:
                if self.live is not None:
                    self.active[entry.name] = self.active.get(entry.name, 0) + 1
                else:
                    entry.open_bwd.append(self.clock.mark())
                if not self.backward_open:
                    self.backward_open = True
                    self.torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            except Exception as exc:
                self.probe.report_error("profile hook", exc)
        return entered

    def _left(self, entry: _Module) -> Callable[[Any], None]:
        def left(_grad: Any) -> None:         # the gradient of the module's inputs is ready
            try:
                if self.live is not None:
                    self._leave(entry.name)
                elif entry.open_bwd:
                    self._span(entry.bwd, entry.open_bwd.pop())
            except Exception as exc:
                self.probe.report_error("profile hook", exc)
        return left

    def _backward_done(self) -> None:
        """End of a backward pass: modules whose inputs needed no gradient leave here."""
        try:
            self.backward_open = False
            self.active = {}
            mark = None
            for entry in self.modules:
                while entry.open_bwd:
                    mark = mark if mark is not None else self.clock.mark()
                    self._span(entry.bwd, entry.open_bwd.pop(), mark)
        except Exception as exc:
            self.probe.report_error("profile hook", exc)

    def _leave(self, name: str) -> None:
        count = self.active.get(name, 0) - 1
        if count > 0:
            self.active[name] = count
        else:
            self.active.pop(name, None)

    def _span(self, into: list, start: Any, end: Any = None) -> None:
        if self.spans >= MAX_SPANS:
            self.truncated = True
            return
        self.spans += 1
        into.append((start, end if end is not None else self.clock.mark()))

    # -- finishing thread -------------------------------------------------------------------
    def _finish(self, t_end: float) -> None:
        try:
            record = self._result(t_end)
        except Exception as exc:
            record = {"k": "profile", "t": time.time(), "id": self.request_id, "steps": self.steps,
                      "error": f"profile failed: {exc!r}"[:300], "modules": []}
        for entry in self.modules:
            entry.module = None
        self.modules = []
        self.root = None
        self.probe.emit(record)
        self.state = "idle"

    def _result(self, t_end: float) -> dict[str, Any]:
        n = max(1, self.done)
        meta = self.meta_thread
        if meta is not None:
            meta.join(MAX_META_SECONDS)
        counted = self.counted
        scale = self.root_calls / n if self.counted_per_call else 1.0
        if counted is None:
            note = self.flops_note or ("still counting after the profile" if meta is not None and meta.is_alive()
                                       else "the model's forward did not run during the profile")
            why_no_flops: str | None = f"not counted: {note}"
        else:
            why_no_flops = None if self.counted_per_call else self.flops_note
        rows = []
        for entry in self.modules:
            fwd = _total(self.clock, entry.fwd)
            bwd = _total(self.clock, entry.bwd)
            row: dict[str, Any] = {
                "name": entry.name, "type": entry.type, "depth": entry.depth, "params": _params(entry.module),
                "calls": entry.calls / n, "fwd_s": None if fwd is None else fwd / n,
                "bwd_s": None if bwd is None else bwd / n}
            if counted is not None:
                f_fwd, f_bwd = counted.get(entry.name, (0.0, 0.0))
                row["fwd_flops"] = f_fwd * scale
                row["flops"] = (f_fwd + f_bwd) * scale
            rows.append(row)
        watcher = self.probe.attached.watcher
        return {"k": "profile", "t": time.time(), "id": self.request_id, "steps": self.done,
                "first_step": self.first_step, "last_step": self.first_step + self.done - 1, "depth": self.depth,
                "step_s": (t_end - self.t_start) / n, "timer": self.clock.name, "truncated": self.truncated,
                "peak_flops": getattr(watcher, "peak", None), "peak_source": getattr(watcher, "peak_source", None),
                "flops_note": why_no_flops, "modules": rows}


def count_by_module(module: Any, depth: int, meta_args: tuple, meta_kwargs: dict,
                    backward: bool) -> dict[str, tuple[int, int]]:
    """(forward, backward) FLOPs of one call of ``module`` for each module name down to ``depth``.

    Runs on a meta-device copy (nothing computed, the training model untouched) on the calling
    thread. An op's FLOPs go to every module it ran in: the module's forward between its hooks,
    its backward between the gradient of its outputs and that of its inputs (as
    ``torch.utils.module_tracker`` attributes them, without its process-global hooks)."""
    torch = sys.modules["torch"]
    replica = flops.meta_replica(module)
    active: dict[str, int] = {}
    totals: dict[str, list[int]] = {}
    phase = [0]                          # 0: forward, 1: backward

    def attribute(n: int) -> None:
        for name in active:
            totals[name][phase[0]] += n

    def enter(name: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            active[name] = active.get(name, 0) + 1
        return hook

    def leave(name: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            count = active.get(name, 0) - 1
            if count > 0:
                active[name] = count
            else:
                active.pop(name, None)
        return hook

    def pre(name: str) -> Callable[..., None]:
        def hook(mod: Any, args: tuple, kwargs: dict) -> None:
            enter(name)()
            if phase[0] == 0 and torch.is_grad_enabled():
                _on_first_grad(torch, _grad_tensors(torch, (args, kwargs)), leave(name))
        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(mod: Any, args: tuple, kwargs: dict, output: Any) -> None:
            leave(name)()
            if torch.is_grad_enabled():
                _on_first_grad(torch, _grad_tensors(torch, output), enter(name))
        return hook

    for name, sub in replica.named_modules():
        if (0 if not name else name.count(".") + 1) <= depth:
            totals[name] = [0, 0]
            sub.register_forward_pre_hook(pre(name), with_kwargs=True)
            sub.register_forward_hook(post(name), with_kwargs=True)
    counter = flops.FlopCount(attribute)
    with counter:
        with torch.enable_grad() if backward else torch.no_grad():
            out = replica(*meta_args, **meta_kwargs)
        if backward:
            phase[0] = 1
            active.clear()
            loss = flops.sum_outputs(out)
            wanted = [p for p in replica.parameters() if p.requires_grad]
            if loss is not None and wanted and loss.requires_grad:
                torch.autograd.grad(loss, wanted, allow_unused=True)
    return {name: (fwd, bwd) for name, (fwd, bwd) in totals.items()}


def _on_first_grad(torch: Any, tensors: list[Any], fn: Callable[[Any], None]) -> None:
    """Call ``fn`` once, when the gradient of the first of ``tensors`` is computed (a plain tensor
    hook for one tensor, the common case and the cheaper one; a multi-grad hook for several)."""
    if len(tensors) == 1:
        tensors[0].register_hook(fn)
    elif tensors:
        torch.autograd.graph.register_multi_grad_hook(tensors, fn, mode="any")


def _grad_tensors(torch: Any, tree: Any) -> list[Any]:
    """The tensors in ``tree`` (containers up to three levels deep) that need a gradient."""
    found: list[Any] = []
    stack = [(tree, 0)]
    Tensor = torch.Tensor
    while stack:
        value, level = stack.pop()
        if isinstance(value, Tensor):
            if value.requires_grad:
                found.append(value)
        elif level < 3:
            if isinstance(value, (list, tuple)):
                stack.extend((v, level + 1) for v in value)
            elif isinstance(value, dict):      # Hugging Face's ModelOutput is one
                stack.extend((v, level + 1) for v in value.values())
    return found


def _total(clock: Any, spans: list[tuple[Any, Any]]) -> float | None:
    total = 0.0
    for start, end in spans:
        seconds = clock.seconds(start, end)
        if seconds is None:
            return None
        total += seconds
    return total


def _params(module: Any) -> int:
    try:
        return int(sum(p.numel() for p in module.parameters()))
    except Exception:
        return 0


run_eagerly(ModuleProfiler._on_step_end)
