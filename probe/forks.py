"""At-fork callbacks that ``perfmon detach`` can disarm.

Python cannot unregister an ``os.register_at_fork`` callback, and a registered function keeps
its module, and through it all of the probe's code, alive for the life of the process. So each
callback is registered behind a standard-library callable over a list holding it: ``sorted``
calls its ``key`` on every element, here ``fn()``. Emptying the lists (``disarm_all``) leaves
registrations that call nothing and hold nothing of perfmon.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable

_holders: list[list[Callable[[], None]]] = []


def after_in_child(fn: Callable[[], None]) -> None:
    """``os.register_at_fork(after_in_child=fn)``, disarmable."""
    if not hasattr(os, "register_at_fork"):
        return
    holder = [fn]
    _holders.append(holder)
    os.register_at_fork(after_in_child=functools.partial(sorted, holder, key=operator.methodcaller("__call__")))


def disarm_all() -> None:
    """Every callback registered here stops being called (``perfmon detach``)."""
    for holder in _holders:
        holder.clear()
    _holders.clear()
