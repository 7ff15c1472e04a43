"""perfmon's in-process probe: ``import probe; mon = probe.start(job="name")``.

This package never imports textual (a test proves it); torch is only touched
when the training script has already imported it.
"""

from probe.core import Probe
from probe.lifecycle import current, start
from probe.wire import PROTO

__all__ = ["PROTO", "Probe", "current", "start"]
