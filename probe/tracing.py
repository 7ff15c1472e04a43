"""Keeping perfmon out of ``torch.compile``'s graphs.

Dynamo traces the module hooks, optimizer hooks and patched functions it meets
inside a compiled region. Traced, perfmon's code would read clocks (a graph
break), touch weak-keyed state (dynamo's mutation tracking trips on it and the
user's job dies) and bake perfmon's Python state into guards (recompilations).
So every hook and wrapper perfmon installs begins with ``if _is_compiling():
return``: while dynamo traces, ``torch.compiler.is_compiling()`` is a constant
True, the rest of the hook is never traced, and the graph is exactly the one the
user would get without perfmon; in eager code the check is one C call.

What a compiled region hides (forward hooks inside it never run) is measured
from outside it where possible and otherwise reported as not visible.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


def _never() -> bool:
    return False


def compiling_check() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` itself (dynamo constant-folds it), or a stand-in without torch."""
    torch = sys.modules.get("torch")
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return check if callable(check) else _never


def dynamo_has_compiled() -> bool:
    """True once dynamo compiled any frame in this process (cheap: a counter read)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return bool(counters is not None and counters["frames"].get("ok"))
    except Exception:
        return False


def contains_compiled(module: object) -> bool:
    """Whether ``module`` is, or holds, a compiled module (``torch.compile(m)`` or ``m.compile()``)."""
    try:
        for sub in module.modules():  # type: ignore[attr-defined]
            if hasattr(sub, "_orig_mod") or getattr(sub, "_compiled_call_impl", None) is not None:
                return True
    except Exception:
        return True     # cannot tell: assume the worst
    return False


# -- frames dynamo must not compile ---------------------------------------------------------------
# Inside a compiled function, after a graph break, eager code runs with dynamo's frame
# callback still set: a perfmon hook or wrapper called there would be compiled as a frame
# of its own, with its ``is_compiling()`` bail-out baked in, and go silent for good. Marking
# its code SKIP makes dynamo run that frame as plain Python (inlining while tracing a user
# frame is not affected: there the bail-out applies). ``recursive`` also runs the frames it
# calls as plain Python; wrappers around user or torch code are marked non-recursively, so
# what they wrap is compiled exactly as without perfmon.
_marks: list[tuple[Any, bool]] = []
_finder_installed = False


def run_eagerly(*functions: Callable[..., Any], recursive: bool = True) -> None:
    """Have dynamo never compile these functions' frames (applied once dynamo is imported)."""
    for fn in functions:
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is not None:
            _marks.append((code, recursive))
    if "torch._dynamo.eval_frame" in sys.modules:
        _apply_marks()
    else:
        _install_finder()


def _apply_marks() -> None:
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except Exception:       # an older dynamo without per-code strategies: the bail-outs still hold
        _marks.clear()
        return
    while _marks:
        code, recursive = _marks.pop()
        try:
            set_code_exec_strategy(code, FrameExecStrategy(
                FrameAction.SKIP, FrameAction.SKIP if recursive else FrameAction.DEFAULT))
        except Exception:
            pass


class _DynamoImportWatch(importlib.abc.MetaPathFinder):
    """Applies the marks right after ``torch._dynamo.eval_frame`` is imported, then steps aside."""

    name = "torch._dynamo.eval_frame"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        remove_finder()
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_mark(module: Any) -> None:
            exec_module(module)
            _apply_marks()

        loader.exec_module = exec_then_mark      # type: ignore[union-attr]
        return spec


def _install_finder() -> None:
    global _finder_installed
    if not _finder_installed:
        _finder_installed = True
        sys.meta_path.insert(0, _DynamoImportWatch())


def remove_finder() -> None:
    global _finder_installed
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DynamoImportWatch)]
    _finder_installed = False


class HiddenPhases:
    """Says once which phases no hook has seen for several steps in a row.

    Hooks inside a compiled region never run, so a compiled forward (or a compiled
    train step) shows no forward/backward/optimizer phase; the time is still in the
    step, unattributed (``other``). The stream says so instead of showing nothing.
    """

    AFTER = 3   # consecutive steps without a phase before it is called not visible

    def __init__(self, say: Callable[[str], None], hint: str = "") -> None:
        self.say = say
        self.hint = hint
        self.misses: dict[str, int] = {}
        self.hidden: dict[str, str] = {}
        self.done = False

    def step(self, seen: Any, expected: tuple[str, ...]) -> None:
        if self.done:
            return
        for name in expected:
            self.misses[name] = 0 if name in seen else self.misses.get(name, 0) + 1
        missing = [name for name in expected if self.misses.get(name, 0) >= self.AFTER]
        if not missing:
            return
        self.done = True
        where = ("they run inside a torch.compile region, where no hook runs" if dynamo_has_compiled()
                 else "no hook saw them")
        self.hidden = {name: where for name in missing}
        hint = f"; {self.hint}" if self.hint and "forward" in missing and dynamo_has_compiled() else ""
        self.say(f"phases not visible: {', '.join(missing)} ({where}); their time is in 'other'{hint}")
