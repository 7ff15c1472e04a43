"""The relay tree, the viewer's side: node relays -> group relays -> this viewer (docs/tree.md).

From ``TREE_MIN_HOSTS`` hosts on (or with ``--group-size``), ``attach``/``report``/``record
--hosts`` start one group relay per ``GROUP_NODES`` consecutive hosts of the host list (a SLURM
node list is in switch order; a host file in the order the user wrote it), on the group's first
host and through the same transport template as the node relays, which each group relay starts
in turn (``perfmon relay --stdio --nodes LIST JOB``, ``tui.commands.relay.group``). Each group
relay sends a ``group`` record a second (its ranks reduced) and the records of its worst ranks;
``Analysis`` holds those ranks and the reductions, so the verdict and the panes read them as they
read any job. A rank the viewer follows is sent in full by whichever group holds it; a rank
named by number (``follow_ranks``) is looked up by every group relay.

A group relay that dies is shown as lost (its ranks' streams ``lost``, its group's counts gone
from the view) and started again with a back-off; its subtree re-joins with its first records.
A group relay that stops talking is named in the header after ``SILENT_S``; no read of one group
waits on another.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from perfmon_analysis.groups import GroupReduction
from probe import wire
from tui.stream.hosts import RELAY_ARGV, encode_via, via_argv
from tui.stream.remote import RelayFeed, RelayTarget

if TYPE_CHECKING:
    from perfmon_analysis.analysis import Analysis
    from tui.stream.requests import Askable

TREE_MIN_HOSTS = 64     # from this many hosts on, a relay tree (below it: one relay per host, as before)
GROUP_NODES = 32        # nodes per group relay (256 ranks at 8 a node)
SILENT_S = 5.0          # a group relay that sent nothing this long is named in the header


def plan_groups(hosts: list[str], size: int) -> list[tuple[str, list[str]]]:
    """Consecutive runs of ``size`` hosts, each named by (and its relay run on) its first host."""
    size = max(1, size)
    return [(hosts[i], hosts[i:i + size]) for i in range(0, len(hosts), size)]


class TreeFeed(RelayFeed):
    """Every rank of ``job`` through one group relay per group of nodes."""

    def __init__(self, analysis: Analysis, job: str, groups: list[tuple[str, list[str]]], via: str,
                 relay: tuple[str, ...] = RELAY_ARGV, follow_all: bool = False, nodes_port: int | None = None) -> None:
        super().__init__(analysis, job, [name for name, _ in groups], via, relay=relay, follow_all=follow_all,
                         restart=True)
        nodes = sum(len(n) for _, n in groups)
        self.description = f"{job} on {nodes} host{'s' * (nodes != 1)} through {len(groups)} group relays"
        self.groups = dict(groups)
        self.node_group = {node: name for name, members in groups for node in members}
        self.nodes_port = nodes_port
        self.ranks_followed: set[int] = set()
        self._group_streams: dict[str, set[str]] = {name: set() for name, _ in groups}
        self._heard: dict[str, float] = {}

    @property
    def nodes(self) -> list[str]:
        """Every node of the job, in host-list order."""
        return [node for name in self.hosts for node in self.groups[name]]

    def _argv(self, host: str) -> list[str]:
        extra = ["--nodes", ",".join(self.groups[host]), "--nodes-via", encode_via(self.via)]
        if self.relay != RELAY_ARGV:
            extra += ["--relay-argv", ",".join(self.relay)]
        if self.nodes_port is not None:
            extra += ["--relay-port", str(self.nodes_port)]
        return via_argv(self.via, host, self.job, (*self.relay, *extra))

    def follow_ranks(self, ranks: set[int]) -> None:
        """Receive every record of these ranks, wherever they are (drill-down by rank number)."""
        self.ranks_followed = set(ranks)
        for host in self._writers:
            self._subscribe(host)

    def _subscribe(self, host: str) -> None:
        writer = self._linked(host)
        if writer is None:
            return
        wanted = self._wanted_streams
        srcs = ["*"] if wanted is None else sorted(s for s in wanted
                                                   if self.node_group.get(s.partition("/")[0]) == host)
        ranks = sorted(self.ranks_followed)
        ask = (tuple(srcs), tuple(ranks), *self.analysis.window)
        if self._following.get(host) == ask:
            return
        self._following[host] = ask
        try:
            writer.write(wire.encode({"k": "subscribe", "t": time.time(), "srcs": srcs, "ranks": ranks,
                                      "window": [*self.analysis.window]}))
        except (OSError, RuntimeError):
            pass

    def request_target(self, stream_id: str) -> Askable | str:
        group = self.node_group.get(stream_id.partition("/")[0])
        if group is None or self._linked(group) is None or self._loop is None:
            return f"the group relay of {stream_id.partition('/')[0]} is not running: no request can reach its ranks"
        label = self.streams[stream_id].label if stream_id in self.streams else stream_id
        return RelayTarget(self, group, stream_id, f"{label} on {stream_id.partition('/')[0]}")

    def _stream_id(self, host: str, src: str) -> str:
        self._group_streams.setdefault(host, set()).add(src)
        return src                       # "node/rank's src": the same name as without a tree

    def _rank_hello(self, host: str, sid: str, rec: dict[str, Any]) -> dict[str, Any]:
        status = self.streams.get(sid)
        if status is not None and status.state != "live":
            status.state = "live"
        if self.analysis.stream_ended(sid):
            self.analysis.forget(sid)       # its group relay came back: the rank re-joins afresh
        return {**rec, "host": sid.partition("/")[0]}

    def _other(self, host: str, rec: dict[str, Any]) -> None:
        if rec["k"] != "group":
            return
        self._heard[host] = now = time.monotonic()
        reductions = [red for obj in [rec, *(k for k in rec.get("keys") or () if isinstance(k, dict))]
                      if (red := GroupReduction.read(obj)) is not None]
        self.analysis.set_groups(host, reductions)
        reps = {s for s in rec.get("reps") or () if isinstance(s, str)}
        wanted = self._wanted_streams
        for sid in list(self._group_streams.get(host, ())):
            if sid not in reps and (wanted is not None and sid not in wanted) and not self._rank_followed(sid):
                self.analysis.forget(sid)
                self.streams.pop(sid, None)
                self._group_streams[host].discard(sid)
        for sid, silent in (rec.get("silent_s") or {}).items():
            if isinstance(silent, (int, float)) and not isinstance(silent, bool):
                self.analysis.heard(sid, now - max(0.0, float(silent)))

    def _rank_followed(self, sid: str) -> bool:
        status = self.streams.get(sid)
        return status is not None and status.rank in self.ranks_followed

    async def _host(self, host: str) -> None:
        await super()._host(host)          # cancelled (the viewer stops): its last reductions stay in the view
        self.analysis.set_groups(host, [])    # it ended or died: its ranks are no longer counted while it is gone

    def state_line(self) -> str:
        line = super().state_line()
        now = time.monotonic()
        quiet = [h for h, s in self.relays.items() if s.state == "live" and now - self._heard.get(h, now) > SILENT_S]
        return f"{line}; {len(quiet)} group relay(s) silent: {', '.join(quiet)}" if quiet else line
