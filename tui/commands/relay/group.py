"""``perfmon relay --nodes LIST JOB``: a group relay, the middle level of the relay tree (docs/tree.md).

It reads the node relays of its nodes exactly as a viewer does (``tui.stream.remote.RelayFeed``,
the same transport template, started again when one fails) and, once a second, sends its viewer
(``--stdio``) one ``group`` record (wire 1.5: ``perfmon_analysis.groups``) instead of its ranks: the
counts, the extremes of each quantity with their holders and a quantile sketch per quantity. The
ranks that hold an extreme, stall outside the call the others wait in, or fall silent
(``groups.representatives``) travel on in full: their hello, samples, stall records and summaries,
so the viewer's verdict runs on the worst ranks of the whole job. A rank the viewer follows (its
``subscribe``: by ``src``, or by rank number for any rank of the job) has every record forwarded,
steps included, and requests reach it through its node's relay.

``--prometheus [HOST:]PORT`` serves the group's numbers on ``/metrics``: per-group series and
the per-rank series of the representatives only, so the series count does not grow with the
group (``tui.export.prometheus.tree_families``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
import urllib.parse
from typing import Any

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.groups import GroupReduction, RankRow, reduce_rows, representatives
from perfmon_analysis.readings import num
from perfmon_analysis.stuck import HEARTBEAT_S
from probe import wire
from tui.commands.relay.node import FLUSH_S, HELLO_WAIT_S, StdoutRelay, ViewerInput
from tui.errors import UserError
from tui.stream.hosts import RELAY_ARGV, expand_hostlist, transport
from tui.stream.remote import RelayFeed

GROUP_S = 1.0          # a group record this often
NEW_RANK_S = 0.2       # ... and this soon after a rank's first timed summary (the first screen waits for it)
FULL_ONLY = frozenset({"step", "memory", "comm"})    # a representative's kinds sent only when it is followed


class RankSlot:
    """The newest records of one rank of the group, as its node relay sent them."""

    __slots__ = ("hello", "summary", "sample", "stall", "clock", "ended")

    def __init__(self) -> None:
        self.hello: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.sample: dict[str, Any] | None = None
        self.stall: dict[str, Any] | None = None
        self.clock = time.monotonic()
        self.ended = False

    def row(self, src: str, now: float) -> RankRow | None:
        hello = self.hello
        if hello is None or not isinstance(hello.get("rank"), int):
            return None
        summary = self.summary or {}
        stats = dict(summary.get("stats") or {})
        memory = found if isinstance(found := summary.get("memory"), dict) else {}
        if num(memory.get("peak_frac")) is not None:
            stats["peak_frac"] = memory["peak_frac"]
        call = None
        if self.stall is not None:
            inflight = self.stall.get("inflight")
            first = inflight[0] if isinstance(inflight, list) and inflight and isinstance(inflight[0], dict) else {}
            if isinstance(first.get("group"), str) and isinstance(first.get("seq"), int):
                call = (first["group"], first["seq"])
        steps = summary.get("steps")
        return RankRow(src=src, rank=hello["rank"], stats=stats, steps=steps if isinstance(steps, int) else 0,
                       hello=hello, stalled=self.stall is not None, call=call,
                       silent_s=None if self.ended else now - self.clock)


class NodesFeed(RelayFeed):
    """The group's node relays, read as a viewer reads them; their records go to the group
    relay's table of ranks (``GroupRelay.take``), not into a run model of every rank."""

    def __init__(self, group: GroupRelay, job: str, nodes: list[str], via: str, relay: tuple[str, ...],
                 port: int | None, token: str | None) -> None:
        super().__init__(Analysis(), job, nodes, via, relay=relay, port=port, token=token, restart=True)
        self.group = group

    def ingest(self, stream_id: str, records: Any) -> None:
        status = self.streams[stream_id]
        for rec in records:
            self.group.take(stream_id, rec)
            status.records += 1
            if rec["k"] == "bye":
                status.state = "exited"
        self.first_data.set()


class GroupRelay:
    """One group of nodes: their ranks reduced for the viewer and for Prometheus."""

    def __init__(self, job: str, name: str, nodes: list[str], via: str, relay: tuple[str, ...],
                 port: int | None, token: str | None) -> None:
        self.job, self.name = job, name
        self.slots: dict[str, RankSlot] = {}
        self.feed = NodesFeed(self, job, nodes, via, relay, port, token)
        self.out: StdoutRelay | None = None
        self.reps: set[str] = set()
        self.sent: set[str] = set()           # ranks whose backlog the viewer has had
        self.followed: set[str] | None = set()   # by src; None: every rank
        self.followed_ranks: set[int] = set()
        self.held = Analysis()           # the representatives only: the Prometheus families read it
        self.reductions: list[GroupReduction] = []
        self.news = False                # a rank's first summary past warm-up came since the last tick

    # -- the node relays' records -------------------------------------------------------------
    def take(self, sid: str, rec: dict[str, Any]) -> None:
        slot = self.slots.get(sid)
        if slot is None:
            slot = self.slots[sid] = RankSlot()
        slot.clock = time.monotonic()
        kind = rec["k"]
        if kind == "hello":
            slot.hello, slot.ended = rec, False
            if isinstance(rec.get("rank"), int) and rec["rank"] in self.followed_ranks:
                self._follow_inner()
        elif kind == "summary":
            if slot.summary is None or slot.summary.get("stats", {}).get("warming_up", True) is not False:
                self.news = True
            slot.summary = rec
            steps = rec.get("steps")
            if slot.stall is not None and isinstance(steps, int) and steps > _stall_step(slot.stall) + 1:
                slot.stall = None        # progress again
        elif kind == "sample":
            slot.sample = rec
        elif kind == "stall":
            slot.stall = rec
        elif kind == "resumed":
            slot.stall = None
        elif kind == "bye":
            slot.ended = True
        if sid in self.sent and (kind not in FULL_ONLY or self._follows(sid)):
            self._send(sid, rec)

    def _follows(self, sid: str) -> bool:
        slot = self.slots.get(sid)
        rank = slot.hello.get("rank") if slot is not None and slot.hello is not None else None
        return self.followed is None or sid in self.followed or rank in self.followed_ranks

    def _send(self, sid: str, rec: dict[str, Any]) -> None:
        """``rec`` of a rank sent on (``sent``: a representative or followed) to the viewer, and into
        the model of those ranks that the Prometheus families read."""
        if rec["k"] in ("hello", "summary", "sample", "stall", "resumed"):
            self.held.ingest(sid, rec)
        if self.out is not None:
            self.out.send({**rec, "src": sid})

    def _followed_set(self) -> set[str]:
        return {sid for sid in self.slots if self._follows(sid)}

    # -- once a second ------------------------------------------------------------------------
    def tick(self) -> dict[str, Any]:
        """Reduce the group, send the backlog of new representatives, and the ``group`` record."""
        now = time.monotonic()
        self.news = False
        live = {sid: slot for sid, slot in self.slots.items()
                if self.feed.streams.get(sid) is None or self.feed.streams[sid].state not in ("lost",)}
        rows = [row for sid, slot in live.items() if (row := slot.row(sid, now)) is not None]
        self.reductions = reduce_rows(rows, self.name, HEARTBEAT_S)
        down = tuple(sorted(h for h, s in self.feed.relays.items() if s.state in ("error", "restarting")))
        self.reductions[0].relays_down = down
        reps = representatives(rows, self.reductions, self.reps, HEARTBEAT_S)
        for sid in self.reps - reps:
            if not self._follows(sid):
                self.held.forget(sid)
                self.sent.discard(sid)
        self.reps = reps
        for sid in sorted(reps | self._followed_set()):
            if sid not in self.sent and sid in live:
                self._backlog(sid, live[sid])
        own, *others = self.reductions
        record = {"k": "group", "t": time.time(), **own.wire(), "reps": sorted(reps),
                  "silent_s": {sid: round(now - self.slots[sid].clock, 3) for sid in sorted(reps)},
                  "keys": [red.wire() for red in others]}
        if self.out is not None:
            self.out.send(record)
        return record

    def _backlog(self, sid: str, slot: RankSlot) -> None:
        """A rank newly sent on: its hello, newest sample and stall, and summary."""
        self.sent.add(sid)
        for rec in (slot.hello, slot.sample, slot.stall, slot.summary):
            if rec is not None:
                self._send(sid, rec)

    # -- the viewer's records -----------------------------------------------------------------
    def subscribe(self, rec: dict[str, Any]) -> None:
        srcs = found if isinstance(found := rec.get("srcs"), list) else []
        self.followed = None if "*" in srcs else {s for s in srcs if isinstance(s, str)}
        ranks = rec.get("ranks")
        self.followed_ranks = {r for r in ranks if isinstance(r, int)} if isinstance(ranks, list) else set()
        window = rec.get("window")
        if isinstance(window, list) and len(window) == 2 and all(isinstance(x, (int, float)) for x in window):
            self.feed.analysis.set_window(int(window[0]), float(window[1]))
        for sid in self._followed_set():
            self.sent.discard(sid)          # backfilled again with the node relay's buffer
        self._follow_inner()

    def _follow_inner(self) -> None:
        self.feed.follow(None if self.followed is None else self._followed_set())

    async def request(self, rec: dict[str, Any]) -> None:
        """A viewer's request for the rank ``rec["src"]`` ("node/src"), through that node's relay."""
        sid = rec.get("src")
        node, _, src = sid.partition("/") if isinstance(sid, str) else ("", "", "")
        answer: dict[str, Any] = {"k": "answer", "t": time.time(), "id": rec.get("id"), "op": rec.get("op"),
                                  "src": sid}
        if node not in self.feed.relays:
            answer.update(ok=False, reason=f"no node {node!r} in the group of {self.name}")
        else:
            try:
                got = await self.feed.request(node, src, {k: v for k, v in rec.items() if k != "src"})
                answer.update({k: v for k, v in got.items() if k not in ("src", "t")})
            except UserError as exc:
                answer.update(ok=False, reason=str(exc))
        if self.out is not None:
            self.out.send(answer)


class GroupInput(ViewerInput):
    """The viewer's hello, subscriptions and requests, for a group relay."""

    def __init__(self, out: StdoutRelay, group: GroupRelay) -> None:
        super().__init__(out)
        self.group = group

    def take(self, rec: dict[str, Any]) -> None:
        kind = rec["k"]
        if kind == "hello" and not self.greeted.done():
            self.greeted.set_result(None)
        elif kind == "subscribe":
            self.group.subscribe(rec)
        elif kind == "request":
            asyncio.ensure_future(self.group.request(rec))


def hello(job: str, name: str, nodes: list[str]) -> dict[str, Any]:
    return {"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "role": "group", "job": job,
            "host": socket.gethostname(), "pid": os.getpid(), "group": name, "nodes": nodes}


async def serve(group: GroupRelay, stdin_fd: int | None, prometheus: str | None) -> None:
    """Read the node relays and reduce them until the viewer goes away (``--stdio``), or until the
    job leaves every node (only ``--prometheus``)."""
    loop = asyncio.get_running_loop()
    viewer: GroupInput | None = None
    if group.out is not None:
        group.out.send(hello(group.job, group.name, group.feed.hosts))
        group.out.flush()
        viewer = GroupInput(group.out, group)
        if stdin_fd is not None:
            loop.add_reader(stdin_fd, viewer.on_readable, stdin_fd)
            await asyncio.wait([viewer.greeted], timeout=HELLO_WAIT_S)
    stop_http = _serve_prometheus(group, prometheus) if prometheus else None
    task = asyncio.ensure_future(group.feed.run())
    next_group, last_group = 0.0, 0.0
    try:
        while not task.done():
            if viewer is not None and (viewer.gone.done() or (group.out is not None and group.out.broken)):
                break
            now = time.monotonic()
            if now >= next_group or (group.news and now >= last_group + NEW_RANK_S):
                group.tick()
                last_group, next_group = now, now + GROUP_S
            if group.out is not None:
                group.out.flush()
            await asyncio.sleep(FLUSH_S)
    finally:
        if stdin_fd is not None and viewer is not None:
            loop.remove_reader(stdin_fd)
        await group.feed.aclose()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if stop_http is not None:
            stop_http()


def _serve_prometheus(group: GroupRelay, spec: str) -> Any:
    """``/metrics`` on ``spec`` from the group's latest tick; returns the function that stops it."""
    from prometheus_client import start_http_server
    from prometheus_client.registry import Collector, CollectorRegistry

    from tui.export.prometheus import tree_families

    class _Collector(Collector):
        def collect(self) -> Any:
            snap = group.held.snapshot(time.time(), clock=time.monotonic())
            yield from tree_families(snap.view, snap.verdict, group.name, group.reductions)

    host, _, port = spec.rpartition(":")
    if not port.isdigit():
        raise UserError(f"--prometheus {spec!r}: expected [HOST:]PORT")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    try:
        server, thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
    except OSError as exc:
        raise UserError(f"--prometheus {spec}: cannot listen: {exc.strerror or exc}") from None
    print(f"perfmon relay: group {group.name} on http://{host or '0.0.0.0'}:{port}/metrics", file=sys.stderr,
          flush=True)

    def stop() -> None:
        server.shutdown()
        thread.join(5)
    return stop


def _stall_step(stall: dict[str, Any]) -> int:
    step = stall.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


def main(args: Any) -> int:
    """``perfmon relay [--stdio] --nodes LIST [--nodes-via T] [--relay-port P] [--prometheus [HOST:]PORT] JOB``."""
    nodes = expand_hostlist(args.nodes)
    if not nodes:
        raise UserError("--nodes: no nodes given")
    if not args.stdio and not args.prometheus:
        raise UserError("a group relay needs --stdio (started by a viewer) or --prometheus [HOST:]PORT, or both")
    via = urllib.parse.unquote(args.nodes_via) if args.nodes_via else transport(None)
    relay = tuple(args.relay_argv.split(",")) if args.relay_argv else RELAY_ARGV
    token = os.environ.get("PERFMON_TOKEN") if args.relay_port else None
    if args.relay_port and not token:
        raise UserError("--relay-port needs the node relays' token in PERFMON_TOKEN")
    group = GroupRelay(args.job, args.group or nodes[0], nodes, via, relay, args.relay_port, token)
    stdin_fd = None
    if args.stdio:
        group.out = StdoutRelay(sys.stdout.buffer)
        stdin_fd = sys.stdin.fileno() if not sys.stdin.isatty() else None
    try:
        asyncio.run(serve(group, stdin_fd, args.prometheus))
    except KeyboardInterrupt:
        pass
    return 0
