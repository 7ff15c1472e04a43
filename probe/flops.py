"""FLOPs per step and the peak FLOP/s they are compared with (MFU).

FLOPs, in order of preference: the user's number (``step(flops=)``,
``watch(flops_per_step=)``); a count with torch's per-op formulas
(``torch.utils.flop_counter.flop_registry``, through a thread-local dispatch mode)
of one forward+backward on a meta-device copy of the model (no real compute, on a
background thread, cached per input-shape signature), or on one real step when a
meta copy cannot stand for the model (FSDP, DTensor) or cannot be made; else the
6·N·tokens rule (Kaplan et al. 2020; PaLM appendix B). The formulas count
matmuls, convolutions and attention, not elementwise ops: the MFU convention.

Peak: a device-name × dtype table of dense (not sparse) tensor-core numbers merged
from torchtitan ``get_peak_flops``, Lightning ``_CUDA_FLOPS``, Composer
``GPU_AVAILABLE_FLOPS`` and NVIDIA datasheets divided by two for sparsity.
Names are matched GB200 before B200, H200
before H20, L40S before L40 before L4, A100 before A10. No entry, no MFU: a peak
is never invented (CPU included), but the user may give one.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

T = 1e12
# (pattern on the lower-cased device name, {dtype: dense FLOP/s})
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"gb200", {"tf32": 1250 * T, "bf16": 2500 * T, "fp16": 2500 * T, "fp8": 5000 * T}),
    (r"b200", {"tf32": 1125 * T, "bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T}),
    (r"h200", {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989 * T, "fp16": 989 * T, "fp8": 1979 * T}),
    (r"h20\b", {"bf16": 148 * T, "fp16": 148 * T}),
    (r"h100.*nvl", {"bf16": 835 * T, "fp16": 835 * T}),   # per GPU, not the NVL pair
    (r"h100.*(pcie|hbm2e)", {"fp32": 51 * T, "tf32": 378 * T, "bf16": 756 * T, "fp16": 756 * T, "fp8": 1513 * T}),
    (r"h100", {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989 * T, "fp16": 989 * T, "fp8": 1979 * T}),
    (r"a100", {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T}),
    (r"l40s", {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362 * T, "fp16": 362 * T, "fp8": 733 * T}),
    (r"l40\b", {"fp32": 90.5 * T, "tf32": 90.5 * T, "bf16": 181 * T, "fp16": 181 * T}),
    (r"\bl4\b", {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T, "fp8": 242 * T}),
    (r"a10g?\b", {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T}),
    (r"v100s", {"fp32": 16.4 * T, "fp16": 130 * T}),
    (r"v100.*sxm", {"fp32": 15.7 * T, "fp16": 125 * T}),
    (r"v100", {"fp32": 14 * T, "fp16": 112 * T}),
    (r"\bt4\b", {"fp32": 8.1 * T, "fp16": 65 * T}),
    (r"mi355x", {"bf16": 2500 * T, "fp16": 2500 * T}),
    (r"mi325x", {"bf16": 1300 * T, "fp16": 1300 * T}),
    (r"mi300x", {"fp32": 163.4 * T, "tf32": 653.7 * T, "bf16": 1300 * T, "fp16": 1300 * T, "fp8": 2600 * T}),
)


def peak_table(device_name: str | None) -> dict[str, float]:
    """Dense peak FLOP/s by dtype for a device name, {} when unknown."""
    if not device_name:
        return {}
    name = device_name.lower()
    for pattern, table in PEAKS:
        if re.search(pattern, name):
            return dict(table)
    return {}


def peak_flops(device_name: str | None, dtype: str | None) -> float | None:
    if dtype is None:
        return None
    return peak_table(device_name).get(dtype)


def dtype_name(dtype: Any) -> str | None:
    """torch dtype -> the peak table's dtype name."""
    text = str(dtype).replace("torch.", "")
    if text == "float32":
        return "fp32"
    if text == "bfloat16":
        return "bf16"
    if text == "float16":
        return "fp16"
    if text.startswith("float8"):
        return "fp8"
    return None


def compute_dtype(param_dtype: Any, device_type: str,
                  on_error: Callable[[str, BaseException], None] | None = None) -> str | None:
    """The dtype matmuls run in: autocast's if active, TF32 for fp32 when torch allows it.

    When torch cannot answer (the autocast or TF32 query raises) the dtype is unknown: None,
    so no peak and no MFU, and ``on_error`` hears why. Falling back to the parameters' dtype
    would pick a peak up to 16 times off (fp32 against bf16 on an H100)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.is_autocast_enabled(device_type):
            return dtype_name(torch.get_autocast_dtype(device_type))
        name = dtype_name(param_dtype)
        if name == "fp32" and device_type == "cuda":
            if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
                return "tf32"
        return name
    except Exception as exc:
        if on_error is not None:
            on_error("compute dtype", exc)
        return None


def unwrap_module(module: Any) -> Any:
    """The plain module under DDP and torch.compile wrappers."""
    for _ in range(4):
        if type(module).__name__ == "DistributedDataParallel" and hasattr(module, "module"):
            module = module.module
        elif hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            break
    return module


def six_n(n_params: int, tokens: Any) -> Any:
    """Training FLOPs ≈ 6 · parameters · tokens (forward 2N, backward 4N per token).

    ``tokens`` still on the device (``records.DeviceScalar``) gives one too, read with it on the
    sender thread: reading it here, on the training thread, would synchronize with the device."""
    if tokens is None or not n_params:
        return None
    scaled = getattr(tokens, "scaled", None)
    if scaled is not None:
        return scaled(6.0 * n_params)
    if not tokens:
        return None
    return 6.0 * n_params * float(tokens)


# -- counting --------------------------------------------------------------------------------

def signature(args: tuple, kwargs: dict) -> tuple:
    """Shapes and dtypes of the tensors among a call's arguments (one container level deep)."""
    torch = sys.modules["torch"]
    Tensor = torch.Tensor
    sig: list = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            sig.append((tuple(value.shape), value.dtype))
        elif isinstance(value, (list, tuple)):
            sig.append(tuple((tuple(v.shape), v.dtype) for v in value if isinstance(v, Tensor)))
        elif isinstance(value, dict):
            sig.append(tuple((k, tuple(v.shape), v.dtype) for k, v in value.items() if isinstance(v, Tensor)))
        else:
            sig.append(type(value).__name__)
    return tuple(sig)


def to_meta(obj: Any) -> Any:
    """Replace every tensor in a pytree by an empty meta tensor of the same shape and dtype."""
    torch = sys.modules["torch"]
    from torch.utils._pytree import tree_map

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty(value.shape, dtype=value.dtype, device="meta", requires_grad=value.requires_grad)
        return value

    return tree_map(convert, obj)


def meta_replay_blocker(module: Any) -> str | None:
    """Why a meta-device replay of ``module`` would not be the real computation (None: fine).

    Sharded modules (FSDP, DTensor) compute through collectives and hooks that a
    hook-less meta copy does not reproduce; they are counted on a real step instead.
    """
    try:
        for sub in module.modules():
            cls = type(sub).__name__
            if "FSDP" in cls or "FullyShard" in cls:
                return f"{cls} module"
        for p in module.parameters():
            if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor":
                return "DTensor parameters"
    except Exception as exc:
        return f"cannot inspect the module: {exc!r}"
    return None


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
               "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")


def meta_replica(module: Any) -> Any:
    """An independent copy of ``module`` whose parameters and buffers are meta tensors.

    ``deepcopy`` with a memo that maps every parameter and buffer to an empty meta
    tensor: no tensor data is copied, and the copy shares nothing mutable with the
    training model, so it can be run on another thread. Hooks are dropped from the
    copy (ours would count a forward; the script's could act on meta tensors).
    """
    import copy

    torch = sys.modules["torch"]
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                         requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="meta")
    for sub in module.modules():      # hook dicts are copied as empty ones: hooks are never copied
        for name in _HOOK_DICTS:
            hooks = sub.__dict__.get(name)
            if hooks is not None:
                memo[id(hooks)] = type(hooks)()
    return copy.deepcopy(module, memo)


def count_meta(replica: Any, meta_args: tuple, meta_kwargs: dict, backward: bool) -> tuple[int, int]:
    """(forward FLOPs, forward+backward FLOPs) of one call of a ``meta_replica``.

    Nothing is computed, and the counting mode lives on this thread only, so this
    runs on a background thread while training goes on.
    """
    torch = sys.modules["torch"]
    with FlopCount() as counter:
        with torch.enable_grad() if backward else torch.no_grad():
            out = replica(*meta_args, **meta_kwargs)
        forward = counter.total
        if backward:
            loss = sum_outputs(out)
            wanted = [p for p in replica.parameters() if p.requires_grad]
            if loss is not None and wanted and loss.requires_grad:
                torch.autograd.grad(loss, wanted, allow_unused=True)
        total = counter.total
    return int(forward), int(total)


def sum_outputs(out: Any) -> Any:
    """A scalar to run backward from: the sum of every floating output that needs a gradient."""
    torch = sys.modules["torch"]
    from torch.utils._pytree import tree_leaves

    total = None
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            part = leaf.float().sum()
            total = part if total is None else total + part
    return total


class FlopCount:
    """Counts the FLOPs of the ops dispatched on *this thread* while entered (a context manager).

    A ``TorchDispatchMode`` with torch's own per-op formulas
    (``torch.utils.flop_counter.flop_registry``: matmuls, convolutions, attention).
    ``FlopCounterMode`` is not used: it also installs process-global module hooks
    (its ``ModuleTracker``), which fire on the training thread, slow every module
    call there and are traced by dynamo inside compiled modules. The dispatch-mode
    stack is thread-local and autograd carries it into the backward of this
    thread's graph only.
    """

    def __init__(self, attribute: Callable[[int], None] | None = None) -> None:
        self.total = 0
        self._attribute = attribute     # also told each op's FLOPs (per-module attribution)
        self._mode = _dispatch_counter_class()(self)

    def add(self, flops: int) -> None:
        self.total += flops
        if self._attribute is not None:
            self._attribute(flops)

    def __enter__(self) -> FlopCount:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


_COUNTER_CLASS: Any = None


def _dispatch_counter_class() -> Any:
    global _COUNTER_CLASS
    if _COUNTER_CLASS is None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        class _Counting(TorchDispatchMode):
            def __init__(self, sink: FlopCount) -> None:
                super().__init__()
                self.sink = sink

            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = kwargs or {}
                formula = flop_registry.get(func._overloadpacket)
                if formula is None:
                    # a composite op reaches the mode whole: count the ops it is made of
                    with self:
                        out = func.decompose(*args, **kwargs)
                    if out is not NotImplemented:
                        return out
                out = func(*args, **kwargs)
                if formula is not None:
                    self.sink.add(int(formula(*args, **kwargs, out_val=out)))
                return out

        _COUNTER_CLASS = _Counting
    return _COUNTER_CLASS


class LiveCount:
    """FLOPs of one real step, for models a meta replay cannot stand for (FSDP, DTensor).

    Entered in a forward pre-hook and left at the step's end on the same thread.
    Costs that one step roughly +40% (measured on CPU). Never used
    around compiled code: an active dispatch mode changes what dynamo traces.
    """

    def __init__(self) -> None:
        self.count = FlopCount()
        self.active = False

    def start(self) -> None:
        self.count.__enter__()
        self.active = True

    def stop(self) -> int:
        if not self.active:
            return 0
        self.active = False
        self.count.__exit__(None, None, None)
        return int(self.count.total)
