"""Hooks perfmon puts on a user's modules, left out of every copy and pickle of the module.

A module's hooks live in its ``__dict__``, so ``copy.deepcopy(model)`` (an EMA copy,
``torch.optim.swa_utils.AveragedModel``) and ``torch.save(model)`` copy them too. A bound method
of perfmon's would drag the probe (threads, locks, sockets) along and fail the user's call; a
module-level function would instrument the copy and make the saved model need perfmon to load.

So the first ``Hook`` wraps ``nn.Module.__getstate__`` (which ``copy``, ``pickle`` and
``torch.save`` all go through) to drop perfmon's hooks from the state it returns: the copy or
the file holds exactly what it would without perfmon, and ``torch.load(..., weights_only=True)``
with the user's own allow-list still loads it. A module class whose own ``__getstate__`` skips
``nn.Module``'s gets ``INERT`` in place of each hook instead: a standard-library callable that
takes any positional arguments, does nothing and returns None.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from probe.tracing import run_eagerly

INERT: Callable[..., None] = (0).__init__  # type: ignore[misc]  # int's object.__init__: any args, no effect; picklable


class Hook:
    """Calls ``fn``; a copy or a pickle of it is ``INERT``."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        if not _state_filtered:
            _filter_module_state()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return (getattr, (0, "__init__"))

    def __deepcopy__(self, memo: dict) -> Callable[..., None]:
        return INERT


def remove_all(handles: list[Any]) -> None:
    """Remove every hook handle in ``handles`` (emptied), whatever one of them raises."""
    while handles:
        try:
            handles.pop().remove()
        except Exception:
            pass


_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_state_filtered = False
_filter_code: Any = None


def _filter_module_state() -> None:
    """Wrap ``nn.Module.__getstate__`` once so that its state leaves perfmon's hooks out."""
    global _state_filtered, _filter_code
    torch = sys.modules.get("torch")
    if torch is None:
        return
    _state_filtered = True
    module_cls = torch.nn.Module
    original = module_cls.__getstate__

    def __getstate__(self: Any) -> dict:
        state = original(self)
        ours = {key for name in _HOOKS for key, hook in (state.get(name) or {}).items() if type(hook) is Hook}
        if ours:
            state = dict(state)     # already a copy of ``__dict__``: the module keeps its hooks
            for name in _HOOKS + _HOOK_FLAGS:
                hooks = state.get(name)
                if hooks and not ours.isdisjoint(hooks):
                    state[name] = OrderedDict((k, v) for k, v in hooks.items() if k not in ours)
        return state

    __getstate__.__wrapped__ = original     # type: ignore[attr-defined]
    module_cls.__getstate__ = __getstate__
    _filter_code = __getstate__.__code__


def unfilter_module_state() -> None:
    """Put ``nn.Module.__getstate__`` back (``perfmon detach``) when ours is still the one in place."""
    global _state_filtered
    torch = sys.modules.get("torch")
    if not _state_filtered or torch is None:
        return
    current = torch.nn.Module.__getstate__
    if getattr(current, "__code__", None) is _filter_code and hasattr(current, "__wrapped__"):
        torch.nn.Module.__getstate__ = current.__wrapped__
        _state_filtered = False


run_eagerly(Hook.__call__)    # never compiled as a frame of its own (probe.tracing)
