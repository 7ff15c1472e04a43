"""What the DDP hook and the functional-collective timing need from the process-wide
``CommState``: a Protocol, so those modules never import the one that installs them."""

from __future__ import annotations

from typing import Any, Protocol

from probe.comm.pollers import WorkPoller
from probe.comm.tracker import CommTracker


class CommHost(Protocol):
    probe: Any              # the receiving Probe (``closed`` says whether to stand aside)
    tracker: CommTracker

    def say(self, message: str) -> None:
        """A warning event, once per distinct message."""

    def work_poller(self) -> WorkPoller:
        """The poller that times async works once they complete (created on first use)."""
