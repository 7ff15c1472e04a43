"""perfmon's in-process probe: ``import probe; mon = probe.start(job="name")``.

This package never imports textual (a test proves it); torch is only touched
when the training script has already imported it. The viewer imports the
probe's wire, paths and recording modules only, so ``Probe``, ``start`` and
``current`` load on first use: ``perfmon attach``/``report`` never load the
probe's core or its host readers (psutil).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from probe.wire import PROTO

if TYPE_CHECKING:
    from probe.core import Probe
    from probe.lifecycle import current, start

__all__ = ["PROTO", "Probe", "current", "start"]

_LAZY = {"Probe": "probe.core", "current": "probe.lifecycle", "start": "probe.lifecycle"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'probe' has no attribute {name!r}")
