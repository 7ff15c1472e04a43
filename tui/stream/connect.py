"""What the commands share to reach a job's records: the relay feed for ``--hosts`` and the
one-shot load of recordings or a live window into an ``Analysis``.

Kept on the stream side so no command imports another: ``attach``, ``record``, ``report``,
``export``, ``capture`` and ``profile`` all name a job the same way.
"""

from __future__ import annotations

import heapq
import os
import sys
from typing import Any

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.readings import record_time
from probe.paths import RECORD_SUFFIX, SOCKET_SUFFIX
from tui.errors import UserError


def remote_feed(args: Any, analysis: Analysis | None = None) -> Any:
    """A ``RelayFeed`` (into ``analysis``, else a new one) when ``--hosts``/``--hostfile``/
    ``--slurm``/``--k8s`` name the job's nodes, else None."""
    from tui.stream import hosts
    k8s, namespace = getattr(args, "k8s", None), getattr(args, "namespace", None)
    found = hosts.choose_hosts(getattr(args, "hosts", None), getattr(args, "hostfile", None),
                               getattr(args, "slurm", None), k8s, namespace)
    if found is None:
        return None
    if not args.target:
        raise UserError("name the job to follow on those hosts (perfmon ls on a node lists them)")
    from tui.stream import tree
    from tui.stream.remote import RelayFeed
    into = analysis or Analysis()
    via = hosts.transport(args.via, k8s, namespace)
    port = getattr(args, "relay_port", None)
    size = getattr(args, "group_size", None)
    if size is not None and size < 0:
        raise UserError(f"--group-size {size}: give a number of hosts per group relay (0: no tree)")
    if size or (size is None and len(found) >= tree.TREE_MIN_HOSTS):
        if port is not None:
            raise UserError("--relay-port with a relay tree: the group relays start the node relays through the "
                            "transport (--group-size 0 for one relay per host over TCP)")
        return tree.TreeFeed(into, args.target, tree.plan_groups(found, size or tree.GROUP_NODES), via)
    if port is None:
        return RelayFeed(into, args.target, found, via)
    if not 0 < port < 65536:
        raise UserError(f"--relay-port {port}: must be 1..65535")
    token = getattr(args, "token", None) or os.environ.get("PERFMON_TOKEN")
    if not token:
        raise UserError("--relay-port needs the relays' token: --token TOKEN or PERFMON_TOKEN "
                        "(set the same PERFMON_TOKEN for 'perfmon relay --tcp' on every host)")
    return RelayFeed(into, args.target, found, via, port=port, token=token)


def load(target: str, seconds: float, args: Any = None, *, prog: str = "perfmon report",
         analysis: Analysis | None = None, verdicts: int = 0) -> tuple[Analysis, dict[str, Any]]:
    """An ``Analysis`` of recording files, of a live job followed for ``seconds``, or (``args``
    naming hosts) of the job's ranks on several hosts through their relays; and the source it
    came from. Each stream problem (torn tail, corruption, a failed host) is one line on stderr:
    what was intact is still analysed. ``analysis``: the one to fill (another window), else a new one.
    ``verdicts``: replay recordings in time order and judge the window at that many instants, so
    the run's history holds the verdict's changes."""
    from tui.stream import sources
    from tui.stream.feed import follow

    analysis = analysis if analysis is not None else Analysis()
    remote = remote_feed(args, analysis) if args is not None else None
    if remote is not None:
        try:
            follow(remote, seconds)
        except sources.StreamError as exc:    # a host that failed: the others' ranks still make a report
            if not analysis.view().ranks:
                raise UserError(str(exc)) from None
        for problem in analysis.problems:
            print(f"{prog}: {problem}", file=sys.stderr)
        return analysis, {"kind": "live", "hosts": getattr(remote, "nodes", remote.hosts), "seconds": seconds}
    looks_like_file = target.endswith(RECORD_SUFFIX) or ("/" in target and not target.endswith(SOCKET_SUFFIX))
    if sources.is_recording_target(target) or looks_like_file:
        loaded = sources.load_recordings(target)
        if verdicts > 0:
            _replay(analysis, [(str(rec.path), rec.records) for rec in loaded], verdicts)
        for rec in loaded:
            stream = str(rec.path)
            if verdicts <= 0:
                for record in rec.records:
                    analysis.ingest(stream, record)
            analysis.end_stream(stream)
            if rec.problem:
                analysis.add_problem(rec.problem)
                print(f"{prog}: {rec.problem}", file=sys.stderr)
        for record in sources.load_exits(target):
            analysis.note_exit(record)
        return analysis, {"kind": "recording", "paths": [str(r.path) for r in loaded]}
    from tui.stream import discovery
    from tui.stream.feed import LiveFeed

    endpoints = discovery.resolve_live(target)
    try:
        follow(LiveFeed(analysis, endpoints[0].job, endpoints, rescan=False), seconds)
    except sources.StreamError as exc:
        raise UserError(str(exc)) from None
    return analysis, {"kind": "live", "paths": [ep.socket for ep in endpoints], "seconds": seconds}


JUDGED_RANKS = 20_000     # rank-windows a replay's judgements may compute: fewer instants for many ranks


def _replay(analysis: Analysis, streams: list[tuple[str, list[dict[str, Any]]]], instants: int) -> None:
    """Ingest every stream's records merged by time, judging the window at ``instants`` evenly
    spaced record times (each judgement notes a changed verdict in the run's history); at least 8,
    at most ``JUDGED_RANKS`` / streams, as each judgement computes every rank's window afresh."""
    instants = max(8, min(instants, JUDGED_RANKS // max(1, len(streams))))
    times = [t for _, records in streams for t in (_first_time(records), _first_time(reversed(records)))
             if t is not None]
    if not times:
        for stream, records in streams:
            for record in records:
                analysis.ingest(stream, record)
        return
    start, end = min(times), max(times)
    every = (end - start) / instants or 1.0
    mark = start + every
    timed = (_timed(i, stream, records) for i, (stream, records) in enumerate(streams))
    for t, _, _, stream, record in heapq.merge(*timed):
        if t >= mark:
            analysis.snapshot(mark)
            mark = t + every - (t - start) % every
        analysis.ingest(stream, record)
    analysis.snapshot()


def _first_time(records: Any) -> float | None:
    return next((t for t in map(record_time, records) if t is not None), None)


def _timed(order: int, stream: str, records: list[dict[str, Any]]) -> Any:
    """(time, stream order, place, stream, record) of each record; one without a time takes its
    predecessor's."""
    t = _first_time(records) or 0.0
    for place, record in enumerate(records):
        t = record_time(record) or t
        yield t, order, place, stream, record
