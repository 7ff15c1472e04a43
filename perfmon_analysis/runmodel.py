"""The run model: ingests wire records into per-rank buffers and hands out ``JobView`` snapshots.

Shared by the TUI, ``perfmon report`` and the tests. ``RunModel.ingest`` only
appends to bounded deques (O(1)); ``RunModel.view`` derives a frozen
``JobView`` from the buffers. Per-rank window statistics are cached by a
version counter, so a view of a 64-rank job where nothing changed costs a few
dictionary look-ups and a view after new steps recomputes only those ranks.
Buffers live in ``perfmon_analysis.buffers``, the window statistics in ``perfmon_analysis.stats``, the
view dataclasses in ``perfmon_analysis.views``. No Textual, no torch, no I/O.

Window: the last ``window_steps`` steps or the steps that ended in
the last ``window_seconds`` (measured back from the rank's latest step, so a
replayed recording has a window too), whichever is fewer, but never fewer than
``MIN_STEPS``; a rank with fewer steps is warming up. The first step a rank
reports (lazy init, allocator warm-up) is left out while there are others.

The formulas (shares, busy, ETTR, busbw, MFU) and their sources are in docs/verdict.md §1 and
docs/metrics.md, and next to each function of ``perfmon_analysis.stats`` and the modules beside it;
they are not repeated here, where they would go stale.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from perfmon_analysis.buffers import EVENT_BUFFER, MIN_STEPS, WINDOW_SAMPLES, WINDOW_SECONDS, WINDOW_STEPS, RankState
from perfmon_analysis.capture import capture_reading, with_cost
from perfmon_analysis.comm_stats import comm_rows
from perfmon_analysis.groups import GroupReduction, merge_groups
from perfmon_analysis.health import job_health, rank_health
from perfmon_analysis.history import History
from perfmon_analysis.layout import Layout, assemble
from perfmon_analysis.overhead import worst
from perfmon_analysis.profile import ModuleProfile, profile_reading, with_overhead
from perfmon_analysis.readings import (
    CommReading,
    HostReading,
    JobExit,
    MemoryReading,
    StepOps,
    StepReading,
    comm_reading,
    dropped,
    event_reading,
    exit_reading,
    gpu_rows,
    hello_reading,
    layout_reading,
    memory_reading,
    record_time,
    sample_reading,
    stall_reading,
    step_ops,
    where_interval,
)
from perfmon_analysis.stats import RankStats, job_metrics, rank_stats, rank_view, summary_stats, window_of
from perfmon_analysis.stragglers import Straggling, analyse
from perfmon_analysis.stuck import diagnose
from perfmon_analysis.summary import apply_summary, summary_record
from perfmon_analysis.views import JobView
from perfmon_analysis.where_stats import job_where

STRAGGLING_PERIOD = 5.0    # s of probe time between two what-if analyses of a live job (each replays the window)


class RunModel:
    """Ingests wire records from any number of streams and derives ``JobView``s.

    A stream is one process's connection or recording file (``stream_id`` is its
    path). Its ``hello`` says which rank it is; a later hello for the same rank
    from another pid or restart count starts a new generation of that rank (the
    older one is kept only for the restart note). Records that arrive before a
    stream's hello are counted in ``orphans`` and ignored.
    """

    def __init__(self, window_steps: int = WINDOW_STEPS, window_seconds: float = WINDOW_SECONDS) -> None:
        self.window_steps = max(MIN_STEPS, int(window_steps))
        self.window_seconds = float(window_seconds)
        self._ranks: dict[int, RankState] = {}
        self._streams: dict[str, RankState] = {}
        self._retired: list[RankState] = []
        self._summaries: dict[RankState, RankStats] = {}     # ranks a relay summarises (wire 1.2)
        self._hosts: dict[RankState, HostReading] = {}       # each rank's newest host reading
        self.problems: list[str] = []
        self.orphans = 0
        self.last_t: float | None = None
        self.history = History()     # the whole run, downsampled (the trends screen, the HTML report)
        self.exit: JobExit | None = None     # how the job's command ended (``perfmon run``), when known
        self.groups: dict[str, list[GroupReduction]] = {}   # group relay -> its reductions (the relay tree)
        self._straggling: tuple[tuple[object, ...], float, Straggling | None] | None = None  # (key, when, result)

    # -- ingest -------------------------------------------------------------------------------
    def ingest(self, stream_id: str, record: dict[str, Any], received: float | None = None) -> None:
        """Add one validated wire record from ``stream_id``. O(1); never raises on odd values.

        ``received``: the viewer's monotonic clock when a live record arrived; with it, time
        judgements run on the probe's clock (see ``view``)."""
        kind = record.get("k")
        t = record_time(record)
        if t is not None and (self.last_t is None or t > self.last_t):
            self.last_t = t
        if kind == "hello":
            self._hello(stream_id, record)
            state = self._streams.get(stream_id)
            if state is not None and received is not None:
                state.recv_clock = received     # a sign of life (``view``'s silence), not a probe time
            return
        state = self._streams.get(stream_id)
        if state is None:
            self.orphans += 1
            return
        state.version += 1
        if t is not None:
            state.last_t = t
            state.recv_clock = received
        if kind == "step":
            step = state.parser.step(record)
            if step is not None:
                if state.summary_steps is not None:   # followed in full again (a relay's subscription)
                    state.summary_steps = None
                    self._summaries.pop(state, None)
                state.add_step(step)
                self.history.add_step(state.rank, state.info.host, step)
                ops = step_ops(record)
                if ops is not None:
                    state.ops.append(ops)
                if state.stall is not None and step.step > (state.stall.step if state.stall.step is not None else -1):
                    state.stall = None     # progress again (its ``resumed`` record may have been dropped)
        elif kind == "summary":
            self._summaries[state] = apply_summary(state, record)
        elif kind == "layout":
            state.layout = layout_reading(record)
        elif kind == "stall":
            state.stall = stall_reading(record)
        elif kind == "resumed":
            state.stall = None
        elif kind == "profile":
            state.profile = profile_reading(record, state.rank)
        elif kind == "capture":
            state.capture = capture_reading(record, state.rank)
        elif kind == "sample":
            sample = sample_reading(record)
            state.samples.append(sample)
            if sample.device is not None:      # the job's device now (probe.gpu.job)
                state.device = sample.device
            self._hosts[state] = sample.host
            state.cpu.append(sample.host.cpu)
            if sample.host.loader_workers is not None:
                state.loader_seen = True
        elif kind == "where":
            interval = where_interval(record)
            if interval is not None:
                state.where.append(interval)
        elif kind == "memory":
            memory = memory_reading(record)
            state.memory.append(memory)
            self.history.add_memory(state.rank, state.info.host, memory)
        elif kind == "comm":
            state.comm.append(comm_reading(record))
        elif kind == "event":
            event = event_reading(record)
            state.events.append(event)
            if event.unmeasured is not None:
                state.unmeasured[event.unmeasured] = event.message
            if event.name == "first_batch":
                state.loader_seen = True
            state.parser.event(event)
        elif kind == "drops":
            state.drops += dropped(record)
        elif kind == "bye":
            state.ended = True

    def expect(self, stream_id: str, rank: int, job: str, pid: int, restart: int, clock: float | None) -> None:
        """A live stream is connected but its hello has not come (it is the probe's first frame):
        hold the rank's place from the socket name, so a process that never answers (holding the
        GIL in C code, stopped) is seen, silent since ``clock``. Its hello fills the place in."""
        if rank in self._ranks or stream_id in self._streams:
            return
        state = RankState(rank, stream_id, {"job": job, "rank": rank, "pid": pid, "restart": restart}, 0)
        state.recv_clock = clock
        self._ranks[rank] = state
        self._streams[stream_id] = state

    def end_stream(self, stream_id: str) -> None:
        """The stream closed (EOF, or the end of a recording file) without necessarily a ``bye``."""
        state = self._streams.get(stream_id)
        if state is not None and not state.ended:
            state.ended = True
            state.version += 1

    def note_exit(self, record: dict[str, Any]) -> None:
        """How the job's command ended, as ``perfmon run`` wrote it (``perfmon_analysis.readings.exit_reading``)."""
        self.exit = exit_reading(record) or self.exit

    def forget(self, stream_id: str) -> None:
        """Drop a rank a group relay no longer sends on (no longer among its worst): it is held in
        that group's reductions only (``perfmon_analysis.groups``)."""
        state = self._streams.pop(stream_id, None)
        if state is None:
            return
        if self._ranks.get(state.rank) is state:
            del self._ranks[state.rank]
        self._summaries.pop(state, None)
        self._hosts.pop(state, None)

    def stream_ended(self, stream_id: str) -> bool:
        """The rank behind ``stream_id`` is held and has ended (bye, or its stream closed)."""
        state = self._streams.get(stream_id)
        return state is not None and state.ended

    def heard(self, stream_id: str, clock: float) -> None:
        """The rank's newest record reached its group relay at ``clock`` (the viewer's monotonic
        clock), earlier than it reached the viewer: its silence counts from then."""
        state = self._streams.get(stream_id)
        if state is not None:
            state.recv_clock = clock

    def set_groups(self, relay: str, reductions: list[GroupReduction]) -> None:
        """A group relay's latest reductions (its ``group`` record); ``[]`` when it is gone."""
        if reductions:
            self.groups[relay] = reductions
        else:
            self.groups.pop(relay, None)

    def add_problem(self, message: str) -> None:
        """A one-line stream problem (torn recording, bad frame) to show with the view."""
        if message not in self.problems:
            self.problems.append(message)

    def set_window(self, steps: int, seconds: float) -> None:
        """Change the window (the TUI's ``w`` key); cached per-rank statistics are recomputed."""
        self.window_steps = max(MIN_STEPS, int(steps))
        self.window_seconds = float(seconds)
        for state in list(self._ranks.values()) + self._retired:
            state._cache = None

    def _hello(self, stream_id: str, hello: dict[str, Any]) -> None:
        info = hello_reading(hello)
        rank = info.rank
        cur = self._ranks.get(rank)
        if cur is not None and cur.stream == stream_id and not cur.info.answered:   # the place ``expect`` held
            cur.set_hello(hello)
            return
        if cur is not None and cur.stream == stream_id and cur.info.same_process(info):
            cur.set_hello(hello)        # a repeated hello (re-attach): update only
            return
        if cur is not None and not cur.info.same_process(info):
            if (info.t or 0.0) < (cur.info.t or 0.0):
                # an older generation read after the newer one (recording order): keep it aside
                old = RankState(rank, stream_id, hello, max(0, cur.generation - 1))
                self._retired.append(old)
                self._streams[stream_id] = old
                cur.generation = max(cur.generation, len([s for s in self._retired if s.rank == rank]))
                cur.version += 1
                return
            self._retired.append(cur)
            state = RankState(rank, stream_id, hello, cur.generation + 1)
        elif cur is not None:
            cur.stream = stream_id
            cur.set_hello(hello)
            self._streams[stream_id] = cur
            return
        else:
            state = RankState(rank, stream_id, hello, 0)
        self._ranks[rank] = state
        self._streams[stream_id] = state

    # -- view ---------------------------------------------------------------------------------
    def view(self, now: float | None = None, *, clock: float | None = None) -> JobView:
        """Derive the current ``JobView``. ``now`` defaults to the newest record time seen
        (right for recordings); live viewers pass ``time.time()`` and ``clock``, their monotonic
        clock. With ``clock``, each rank's stall and ETTR are judged on that probe's clock: its
        newest record time plus the time since it arrived, never the viewer's wall clock (a viewer
        on another machine may be seconds off the node)."""
        if now is None:
            now = self.last_t if self.last_t is not None else time.time()
        states = [self._ranks[r] for r in sorted(self._ranks)]
        stats = [self._stats(s) for s in states]
        device = states[0].device if states else None
        world = _world_size(states)
        ranks = [rank_view(s, st, _probe_now(s, now, clock), _silence(s, clock)) for s, st in zip(states, stats)]
        healths = [rank_health(s, window_of(s, self.window_steps, self.window_seconds), st.memory.limit_bytes)
                   for s, st in zip(states, stats)]
        ranks = [dataclasses.replace(r, step_times=h.window, run_step_times=h.run) for r, h in zip(ranks, healths)]
        ready = [(s, st) for s, st in zip(states, stats) if not st.warming_up]
        metrics, straggler = job_metrics(ready, ranks, states, stats)
        window = {"steps": max((st.n for st in stats), default=0),
                  "seconds": round(max((st.span for st in stats), default=0.0), 3)}
        comm_ops = comm_rows([st.comm_delta for st in stats])
        layout = assemble({s.rank: s.layout for s in states if s.layout is not None}, world)
        events = [dict(e.record, rank=s.rank)
                  for s, e in sorted(((s, e) for s in states for e in s.events), key=lambda se: se[1].t or 0.0)]
        view = JobView(
            job=states[0].info.job if states else None,
            world_size=world,
            device_type=(device.type if device is not None else None) or "cpu",
            device_name=device.name if device is not None else None,
            now=now,
            ranks=ranks,
            metrics=metrics,
            window=window,
            warming_up=not ready,
            ended=bool(states) and all(s.ended for s in states),
            drops_total=sum(s.drops for s in states),
            traces={s.rank: st.trace for s, st in zip(states, stats)},
            comm_ops=comm_ops,
            gpus=gpu_rows((s.rank, s.info.host, s.info.local_rank, list(s.samples)[-WINDOW_SAMPLES:])
                          for s in states),
            hosts={s.rank: self._hosts[s] for s in states if s in self._hosts},
            device_status=_device_status(states),
            comm_status=next((s.unmeasured["comm"] for s in states if "comm" in s.unmeasured), None),
            started=min((s.info.t for s in states if s.info.t is not None), default=None),
            events=events[-EVENT_BUFFER:],
            straggler_rank=straggler,
            restarted=sorted(s.rank for s in states if s.generation > 0),
            problems=list(self.problems),
            stuck=diagnose(ranks),
            profile=_latest_profile(states),
            captures=tuple(with_cost(s.capture, ((n.step, n.dur) for n in s.steps))
                           for s in states if s.capture is not None),
            where=job_where([(st.where, st.off_cpu_frac) for _, st in ready]),
            overhead=worst(st.overhead for st in stats),
            health=job_health(healths, self.exit, max((r.steps for r in ranks), default=None)),
            layout=layout,
            straggling=self._analyse(states, layout, now, clock is not None, metrics.cpu_contention_frac),
        )
        return _with_groups(view, self.groups) if self.groups else view

    def _analyse(self, states: list[RankState], layout: Layout, now: float, live: bool,
                 contention: float | None) -> Straggling | None:
        """The what-if over the window's operations (``perfmon_analysis.stragglers``), None when no rank
        sends any. A replay of the whole window: redone when the window has new steps; for a live
        view at most every ``STRAGGLING_PERIOD`` s of probe time (at once when there is none yet)."""
        steps: dict[int, dict[int, StepOps]] = {}
        for s in states:
            if s.ops:
                window = {w.step for w in window_of(s, self.window_steps, self.window_seconds)}
                for ops in s.ops:
                    if ops.step in window:
                        steps.setdefault(ops.step, {})[s.rank] = ops
        if not steps:
            return None
        key = (tuple(sorted((s.rank, s.ops[-1].step) for s in states if s.ops)), layout.dims,
               tuple(sorted(layout.coords.items())), self.window_steps, self.window_seconds)
        cached = self._straggling
        if cached is not None and (cached[0] == key or (live and now - cached[1] < STRAGGLING_PERIOD)):
            return cached[2]
        result = analyse(layout, steps, noise=contention)
        self._straggling = (key, now, result)
        return result

    def steps_in_window(self) -> dict[int, list[StepReading]]:
        """Each rank's steps in the window, oldest first: the per-step samples behind the view's
        step statistics (``perfmon compare`` puts a confidence interval on them)."""
        return {r: window_of(s, self.window_steps, self.window_seconds) for r, s in sorted(self._ranks.items())}

    def _stats(self, state: RankState) -> RankStats:
        cache = state._cache
        if cache is not None and cache[0] == state.version:
            hit: RankStats = cache[1]
            return hit
        summary = self._summaries.get(state)
        if summary is not None:       # a relay summarises this rank (wire 1.2)
            st = summary_stats(state, summary)
        else:
            st = rank_stats(state, self.window_steps, self.window_seconds)
        state._cache = (state.version, st)
        return st

    # -- a relay's side of wire 1.2 (``perfmon relay``) -----------------------------------------
    def summary(self, stream_id: str, t: float, after: int = -1) -> tuple[int, dict[str, Any]] | None:
        """(version, ``summary`` record) of the rank behind ``stream_id``, or None when it has not
        said hello or has not changed since version ``after``."""
        state = self._streams.get(stream_id)
        if state is None or state.version == after or not state.info.answered:
            return None
        stats = rank_stats(state, self.window_steps, self.window_seconds, timeline=False)
        health = rank_health(state, window_of(state, self.window_steps, self.window_seconds), None)
        return state.version, summary_record(state, stats, t, (health.window, health.run))

    def buffered(self, stream_id: str) -> list[dict[str, Any]]:
        """The step, memory and comm records held for ``stream_id``, oldest first: what a viewer that
        starts following the rank in full gets first."""
        state = self._streams.get(stream_id)
        if state is None:
            return []
        readings: list[MemoryReading | CommReading | StepReading] = sorted([*state.memory, *state.comm, *state.steps],
                                                                           key=lambda r: r.t or 0.0)
        return [r.record for r in readings]

    @property
    def retired(self) -> list[tuple[int, dict[str, Any]]]:
        """(rank, hello) of every older generation seen (restarted workers)."""
        return [(s.rank, s.hello) for s in self._retired]


def _with_groups(view: JobView, groups: dict[str, list[GroupReduction]]) -> JobView:
    """The view of a job seen through group relays: its ranks are the groups' worst (every
    worst-rank quantity of ``Metrics`` is exact), its sums the groups' sums, and the reductions
    themselves, merged by key (``("job", "")``: every rank)."""
    merged = merge_groups(red for reds in groups.values() for red in reds)
    job = merged[("job", "")]
    metrics = dataclasses.replace(view.metrics, steps=max(view.metrics.steps, job.steps),
                                  samples_per_s=job.samples_per_s if job.timed else view.metrics.samples_per_s,
                                  tokens_per_s=job.tokens_per_s if job.timed else view.metrics.tokens_per_s)
    return dataclasses.replace(view, metrics=metrics, groups=tuple(merged.values()),
                               world_size=max(view.world_size, job.ranks))


def _latest_profile(states: list[RankState]) -> ModuleProfile | None:
    """The newest module profile of any rank, with its cost measured from that rank's steps."""
    newest = max((s for s in states if s.profile is not None), key=lambda s: s.profile.t, default=None)  # type: ignore[union-attr]
    if newest is None or newest.profile is None:
        return None
    return with_overhead(newest.profile, ((n.step, n.dur) for n in newest.steps))


def _probe_now(state: RankState, now: float, clock: float | None) -> float:
    """The rank's probe clock at this instant: its newest record time plus the time since it
    arrived (live), else the view's ``now`` (recordings, replay)."""
    if clock is None or state.recv_clock is None or state.last_t is None:
        return now
    return state.last_t + max(0.0, clock - state.recv_clock)


def _silence(state: RankState, clock: float | None) -> float | None:
    """Seconds since a live rank's newest record arrived (None for recordings and ended ranks)."""
    if clock is None or state.recv_clock is None or state.ended:
        return None
    return max(0.0, clock - state.recv_clock)


def _device_status(states: list[RankState]) -> str | None:
    """Why there are no GPU readings: the first rank's job device ``status``, else its hello's
    ``gpus.status`` (the host's GPUs), else the newest sample's ``gpu_status`` (the probe's own words)."""
    for s in states:
        if s.device.status:
            return s.device.status
        if s.info.gpus_status:
            return s.info.gpus_status
    for s in states:
        status = next((x.gpu_status for x in reversed(s.samples) if x.gpu_status), None)
        if status:
            return status
    return None


def _world_size(states: list[RankState]) -> int:
    sizes = [s.info.world_size for s in states if s.info.world_size is not None]
    return max(sizes + [len(states), 1])
