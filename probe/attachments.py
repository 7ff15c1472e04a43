"""What instrumentation modules attach to a ``Probe``: typed slots, one owner each.

``probe.gpu.attach`` fills ``gpu`` before the hello; ``probe.watch.watch`` creates the
``watcher``; ``probe.gpu.cuda.poller_for`` creates the ``poller`` (device-completion
thread, shared by the step timer and the communication pollers); ``probe.requests`` creates the
``profiler`` and the ``capture`` at the first request of each. Nothing else writes
them, and no module writes a ``Probe``'s private attributes. ``close()`` releases them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probe.capture import ProfilerCapture
    from probe.gpu import GpuAttachment
    from probe.gpu.cuda import Poller
    from probe.module_profile import ModuleProfiler
    from probe.watch import Watcher


@dataclass
class Attachments:
    gpu: GpuAttachment | None = None
    watcher: Watcher | None = None
    poller: Poller | None = None
    profiler: ModuleProfiler | None = None      # created by the first ``profile`` request
    capture: ProfilerCapture | None = None      # created by the first ``capture`` request
    # sampler sources added by device extensions before the sampler starts; one per
    # extension module (bounded by the number of extensions, today one: probe.gpu)
    sources: list[Any] = field(default_factory=list)

    def release(self) -> None:
        """At ``close()``: stop the poller thread and drop every reference."""
        poller, self.poller = self.poller, None
        if poller is not None:
            try:
                poller.stop(0.2)
            except Exception:
                pass
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiler.remove_hooks()
        capture, self.capture = self.capture, None
        if capture is not None:
            capture.abandon()
        self.watcher = None
        self.gpu = None
        self.sources = []
