"""What the DDP hook and the functional-collective timing need from the process-wide
``CommState``: a Protocol, so those modules never import the one that installs them."""

from __future__ import annotations

from typing import Any, Protocol

from probe.comm.pollers import WorkPoller
from probe.comm.tracker import CommTracker, Ledger


class CommHost(Protocol):
    probe: Any              # the receiving Probe (``closed`` says whether to stand aside)
    tracker: CommTracker
    ledger: Ledger          # sequence numbers and calls in flight, for stall records

    def group_identity(self, group: Any) -> tuple[str, int | None]:
        """(the group's name as every member knows it, this rank in it)."""

    def say(self, message: str, unmeasured: str | None = None) -> None:
        """A warning event, once per distinct message; ``unmeasured`` names the quantity it says
        the probe cannot measure ("comm"), for the verdict to give as the reason."""

    def work_poller(self) -> WorkPoller:
        """The poller that times async works once they complete (created on first use)."""
