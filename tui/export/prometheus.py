"""``perfmon export --prometheus``: the analysis's window numbers as Prometheus metrics.

Names follow Prometheus conventions: the ``perfmon_`` prefix, base units (seconds, bytes),
``_ratio`` for 0..1 shares, ``_total`` on counters. Labels: ``job`` and ``rank``, and for the
rank's GPU the dcgm-exporter labels ``Hostname``, ``UUID``, ``modelName``, so a dashboard can
join perfmon's series with DCGM's. Nothing is per step: the series count is ranks x metrics.
An unknown value is left out of the scrape (never exported as 0).

The per-rank series are the metric table's Prometheus metrics (``perfmon_analysis.metrics``, listed
in docs/metrics.md), the same numbers as the report's rank rows. ``families`` is pure over a
``JobView`` and its ``Verdict`` (what the TUI and the report read); ``serve`` refreshes one
snapshot a second through the feed's ``Analysis`` on its asyncio loop, and the HTTP thread of
``prometheus_client`` only reads that snapshot, never the analysis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from perfmon_analysis.analysis import Snapshot
from perfmon_analysis.groups import GroupReduction, RankRow, reduce_rows
from perfmon_analysis.metrics import (
    COMM_BUSBW_FAMILY,
    COMM_SECONDS_FAMILY,
    GAIN_FAMILIES,
    GROUP_COUNTS,
    GROUP_EXTREME_RANK,
    GROUP_PREFIX,
    GROUP_QUANTITIES,
    GROUP_RELAYS_DOWN,
    GROUP_STATS,
    GROUP_SUMS,
    MEMORY_FAMILY,
    VERDICT_FAMILY,
    Surface,
    on,
)
from perfmon_analysis.stuck import HEARTBEAT_S
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView, RankView
from tui.stream.feed import Feed

REFRESH_SECONDS = 1.0
RANK_LABELS = ("job", "rank", "Hostname", "UUID", "modelName")

MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "cache", "other", "fragmentation", "reserved",
                "allocated", "peak", "limit")


def families(view: JobView, verdict: Verdict) -> list[Any]:
    """Every metric family of one snapshot (pure); the per-rank ones are the table's Prometheus metrics."""
    job = view.job or ""
    labels = {r.rank: _rank_labels(view, r) for r in view.ranks}
    out: list[Any] = []
    for metric in on(Surface.PROMETHEUS):
        family_of = CounterMetricFamily if metric.counter else GaugeMetricFamily
        family = family_of(metric.prometheus, metric.help, labels=RANK_LABELS)
        for r in view.ranks:
            value = metric.rank_value(r)
            if value is not None:
                family.add_metric(labels[r.rank], float(value))
        out.append(family)
    mem = view.metrics.memory
    memory = GaugeMetricFamily(*MEMORY_FAMILY, labels=("job", "rank", "kind", "source"))
    for kind in MEMORY_KINDS:
        value = getattr(mem, f"{kind}_bytes", None)
        if value is not None and mem.rank is not None:
            memory.add_metric([job, str(mem.rank), kind, mem.source or ""], float(value))
    out.append(memory)
    busbw = GaugeMetricFamily(*COMM_BUSBW_FAMILY, labels=("job", "op"))
    comm_seconds = GaugeMetricFamily(*COMM_SECONDS_FAMILY, labels=("job", "op"))
    for op in view.comm_ops:
        if op.busbw is not None:
            busbw.add_metric([job, op.op], op.busbw)
        comm_seconds.add_metric([job, op.op], op.seconds)
    out += [busbw, comm_seconds]
    info = InfoMetricFamily(*VERDICT_FAMILY, labels=("job",))
    info.add_metric([job], {"bottleneck": verdict.bottleneck, "severity": verdict.severity,
                            "straggler_rank": "" if verdict.straggler_rank is None else str(verdict.straggler_rank)})
    out.append(info)
    out.extend(_gain_families(job, verdict))
    groups = view.groups or tuple(red for host, rows in rows_of_views(view.ranks).items()
                                  for red in reduce_rows(rows, host, HEARTBEAT_S))
    out.extend(group_families(job, [g for g in groups if g.key[0] != "job"]))
    return out


def rows_of_views(ranks: list[RankView]) -> dict[str, list[RankRow]]:
    """The ranks of a view without a tree, by node: each node is a group (``perfmon export``)."""
    out: dict[str, list[RankRow]] = {}
    for r in ranks:
        stats = {"warming_up": r.warming_up, "step_median": r.step_time_median_s, "compute_median": r.compute_s,
                 "data_frac": r.data_wait_frac, "exposed_frac": r.comm_exposed_frac, "device_busy": r.device_busy,
                 "samples_per_s": r.samples_per_s, "tokens_per_s": r.tokens_per_s}
        out.setdefault(r.host or "", []).append(RankRow(src=r.stream, rank=r.rank, stats=stats, steps=r.steps,
                                                        stalled=r.stall is not None, silent_s=r.silent_s))
    return out


def group_families(job: str, reductions: list[GroupReduction]) -> list[Any]:
    """Per-group series (the relay tree's reductions; a node is a group without a tree): a few
    dozen series per group, whatever its size (docs/tree.md)."""
    labels = ("job", "group", "dimension")
    quantities = {name: GaugeMetricFamily(prom, text, labels=(*labels, "stat"))
                  for name, (prom, text) in GROUP_QUANTITIES.items()}
    extreme = GaugeMetricFamily(GROUP_EXTREME_RANK, "The rank holding each quantity's extreme in the group",
                                labels=(*labels, "quantity", "end"))
    counts = {name: GaugeMetricFamily(prom, text, labels=labels) for name, (prom, text) in GROUP_COUNTS.items()}
    sums = {name: GaugeMetricFamily(prom, text, labels=labels) for name, (prom, text) in GROUP_SUMS.items()}
    down = GaugeMetricFamily(GROUP_RELAYS_DOWN, "Node relays of the group not running", labels=labels)
    for red in reductions:
        key = [job, red.key[1], red.key[0]]
        for name, family in counts.items():
            family.add_metric(key, float(getattr(red, name)))
        for name, value in red.sums.items():
            if name in sums:
                sums[name].add_metric(key, value)
        if red.key[0] == "group":
            down.add_metric(key, float(len(red.relays_down)))
        for name, q in red.quantities.items():
            if name not in quantities or q.n == 0:
                continue
            for stat, at in GROUP_STATS:
                got = q.quantile(at) if at is not None else getattr(q, stat)
                if got is not None:
                    quantities[name].add_metric([*key, stat], got)
            for end in ("min", "max"):
                rank = getattr(q, f"{end}_rank")
                if rank is not None:
                    extreme.add_metric([*key, name, end], float(rank))
    return [*quantities.values(), extreme, *counts.values(), *sums.values(), down]


def tree_families(view: JobView, verdict: Verdict, group: str, reductions: list[GroupReduction]) -> list[Any]:
    """A group relay's ``/metrics``: the families of its representatives (its worst ranks: the
    per-rank series stay bounded) with a ``group`` label, the group's verdict, and its reductions."""
    out = []
    for family in families(dataclasses.replace(view, groups=tuple(reductions)), verdict):
        if family.name.startswith(GROUP_PREFIX):
            out.append(family)
            continue
        relabelled = type(family)(family.name, family.documentation)
        relabelled.samples = [s._replace(labels={**s.labels, "group": group}) for s in family.samples]
        out.append(relabelled)
    return out


def _gain_families(job: str, verdict: Verdict) -> list[Any]:
    """What fixing each loss (and the combination, ``loss="combined"``) buys; unknown figures are
    left out. Money is these hours times a price: a dashboard multiplies by its own."""
    out = {field: GaugeMetricFamily(*family, labels=("job", "loss")) for field, family in GAIN_FAMILIES.items()}
    gains = verdict.gains
    every = (*gains.per_loss, *((gains.combined,) if gains.combined is not None else ())) if gains else ()
    for g in every:
        for field, family in out.items():
            value = getattr(g, field)
            if value is not None:
                family.add_metric([job, g.loss], value)
    return list(out.values())


def _rank_labels(view: JobView, r: RankView) -> list[str]:
    gpu = next((row.gpu for row in view.gpus if row.rank == r.rank), None)
    model = (gpu.name if gpu is not None else None) or (view.device_name if view.device_type == "cpu" else None)
    return [view.job or "", str(r.rank), r.host or "", (gpu.uuid if gpu is not None else None) or "", model or ""]


class _SnapshotCollector(Collector):
    def __init__(self, holder: _Holder) -> None:
        self.holder = holder

    def collect(self) -> Iterator[Any]:
        snap = self.holder.snapshot
        if snap is not None:
            yield from families(snap.view, snap.verdict)


class _Holder:
    snapshot: Snapshot | None = None


def registry_for(holder: _Holder) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(holder))
    return registry


def serve(feed: Feed, host: str, port: int, ready: threading.Event | None = None) -> None:
    """Serve ``/metrics`` on ``host:port`` until the job ends (every stream finished)."""
    from prometheus_client import start_http_server

    holder = _Holder()
    server, thread = start_http_server(port, addr=host, registry=registry_for(holder))
    try:
        asyncio.run(_refresh(feed, holder, ready))
    finally:
        server.shutdown()
        thread.join(5)


async def _refresh(feed: Feed, holder: _Holder, ready: threading.Event | None) -> None:
    task = asyncio.ensure_future(feed.run())
    try:
        await feed.first_data.wait()
        while True:
            holder.snapshot = feed.analysis.snapshot(time.time(), clock=feed.clock(), steady=True)
            if ready is not None:
                ready.set()
            if feed.ended:
                return
            await asyncio.sleep(REFRESH_SECONDS)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
