"""FLOPs per module of one call of a model, on a meta-device copy (``probe.module_profile``).

Each op's FLOPs (torch's own formulas, ``probe.flops``) go to every module it ran in: a module's
forward between its forward hooks, its backward between the moment the gradient of its outputs
is ready and the moment that of its inputs is, the attribution ``torch.utils.module_tracker``
makes, without its process-global hooks (they would fire on the training thread too).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from probe import flops


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
                on_first_grad(torch, grad_tensors(torch, (args, kwargs)), leave(name))
        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(mod: Any, args: tuple, kwargs: dict, output: Any) -> None:
            leave(name)()
            if torch.is_grad_enabled():
                on_first_grad(torch, grad_tensors(torch, output), enter(name))
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


def on_first_grad(torch: Any, tensors: list[Any], fn: Callable[[Any], None]) -> None:
    """Call ``fn`` once, when the gradient of the first of ``tensors`` is computed (a plain tensor
    hook for one tensor, the common case and the cheaper one; a multi-grad hook for several)."""
    if len(tensors) == 1:
        tensors[0].register_hook(fn)
    elif tensors:
        torch.autograd.graph.register_multi_grad_hook(tensors, fn, mode="any")


def grad_tensors(torch: Any, tree: Any) -> list[Any]:
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
