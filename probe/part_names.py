"""The phase name of each optimizer's part of a zero-code step made of several (``probe.stepfinder``:
a GAN's discriminator and generator steps are one step): the class of the root module whose
parameters the optimizer updates (``Discriminator``), else the optimizer's class and its number."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def part_name(optimizer: Any, roots: Iterable[Any], taken: Iterable[str]) -> str:
    """``optimizer``'s name among the parts: ``roots`` are weak references to the training's root
    modules, ``taken`` the names given so far (a name already taken gets a number)."""
    taken = list(taken)
    name = f"{type(optimizer).__name__} {len(taken) + 1}"
    try:
        first = optimizer.param_groups[0]["params"][0]
        for ref in roots:
            module = ref()
            if module is not None and any(p is first for p in module.parameters()):
                name = type(module).__name__
                break
    except Exception:       # an optimizer without param groups, a module that fails to list them
        pass
    return name if name not in taken else f"{name} {len(taken) + 1}"
