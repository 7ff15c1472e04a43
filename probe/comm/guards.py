"""When a collective wrapper must stand aside, and how big a call is.

Every wrapper first checks ``is_compiling`` (dynamo must never trace perfmon: probe.tracing says
why) and the re-entry depth (a collective called from inside our own DDP hook or another
wrapper is counted once, by the outer one)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from probe.tracing import compiling_check

is_compiling = compiling_check()
tls = threading.local()     # .depth: collective wrappers on this thread's stack


def in_hook() -> bool:
    return getattr(tls, "depth", 0) > 0


def nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def list_bytes(ts: Any) -> int:
    return sum(nbytes(t) for t in ts) if ts else 0


def first_tensor(args: tuple) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for value in args:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def as_wrapper(wrapper: Callable[..., Any], orig: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Give ``wrapper`` the name and doc of ``orig``, and the ``_perfmon`` mark that keeps it from
    being wrapped twice (not ``functools.wraps``: copying ``orig.__dict__`` would copy torch's marks)."""
    wrapper.__wrapped__ = orig   # type: ignore[attr-defined]
    wrapper.__name__ = getattr(orig, "__name__", name)
    wrapper.__qualname__ = getattr(orig, "__qualname__", name)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper._perfmon = True      # type: ignore[attr-defined]
    return wrapper
