"""Per-rank summaries (wire 1.2): a viewer holding a relay's summaries sees the job as the relay does."""

from __future__ import annotations

import dataclasses
import io

import pytest

from perfmon_analysis.buffers import MIN_STEPS
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.summary import read_summary
from perfmon_analysis.verdict import evaluate
from perfmon_analysis.views import MemoryMetrics
from probe import wire
from tests.unit.verdict_synth import T0, Rank, job, records
from tui.commands.relay.node import StdoutRelay


def _comm_records(rank: int, steps: int, dur: float) -> list[dict]:
    """Cumulative all_reduce totals every 10 steps, as the probe's ``comm`` records."""
    return [{"k": "comm", "t": T0 + n * dur, "backend": "gloo", "world_size": 3, "ops": [
        {"op": "all_reduce", "count": 2 * n, "bytes": 4_000_000 * n, "seconds": 0.03 * n * (1 + rank),
         "busbytes": 5_000_000 * n}]} for n in range(10, steps + 1, 10)]


RANKS = (Rank(0, steps=80, dur=0.10, data=0.02, comm=0.03, exposed=0.01, flops=1e12,
              extra_records=_comm_records(0, 80, 0.10)),
         Rank(1, steps=80, dur=0.10, data=0.00, comm=0.03, exposed=0.03, flops=1e12, gap=0.01,
              extra_records=_comm_records(1, 80, 0.10)),
         Rank(2, steps=80, dur=0.25, data=0.01, comm=0.03, exposed=0.00, flops=1e12,
              extra_records=_comm_records(2, 80, 0.25)))


def stream(rank: int) -> str:
    return f"/tmp/synth.r{rank}.x0.p{1000 + rank}.sock"


def relayed(relay: RunModel, ranks: tuple[Rank, ...]) -> RunModel:
    """A viewer's model fed as a relay feeds a 1.2 viewer: each rank's hello, samples and a summary,
    every record through the wire codec."""
    viewer = RunModel()
    for r in ranks:
        sid = stream(r.rank)
        for rec in records(r, world=len(ranks)):
            if rec["k"] in ("hello", "sample"):
                viewer.ingest(sid, _wire(rec))
        got = relay.summary(sid, relay.last_t)
        assert got is not None
        viewer.ingest(sid, _wire(got[1]))
    return viewer


def _wire(rec: dict) -> dict:
    return next(iter(wire.FrameDecoder().feed(wire.encode(rec))))


def test_a_summarised_job_has_the_relays_metrics_ranks_and_verdict():
    relay = job(*RANKS)
    viewer = relayed(relay, RANKS)
    full, summed = relay.view(), viewer.view()
    assert summed.metrics == full.metrics
    assert summed.comm_ops == full.comm_ops and full.comm_ops[0].busbw is not None    # the window's collectives
    assert summed.straggler_rank == full.straggler_rank == 2
    assert [r.rank for r in summed.ranks] == [r.rank for r in full.ranks] == [r.rank for r in RANKS]
    for a, b in zip(full.ranks, summed.ranks):
        assert dataclasses.replace(b, stream=a.stream) == a       # steps, medians, shares, ETTR
    assert evaluate(summed).bottleneck == evaluate(full).bottleneck
    assert evaluate(summed).headline == evaluate(full).headline


def test_a_summarised_rank_has_no_step_history_but_its_cpu_from_the_samples():
    viewer = relayed(job(*RANKS), RANKS)
    trace = viewer.view().traces[0]
    assert trace.steps == () and trace.data_wait == ()      # the history comes when the rank is followed
    assert trace.cpu[-3:] == (1.0, 1.0, 1.0)                # the samples still come in full


def test_an_unchanged_rank_is_not_summarised_again():
    relay = job(Rank(0, steps=10))
    version, _ = relay.summary(stream(0), T0)
    assert relay.summary(stream(0), T0, after=version) is None
    relay.ingest(stream(0), {"k": "step", "t": T0 + 5, "step": 10, "dur": 0.1})
    assert relay.summary(stream(0), T0, after=version) is not None
    assert relay.summary("/tmp/unknown.sock", T0) is None and relay.buffered("/tmp/unknown.sock") == []


def test_subscribing_after_summaries_counts_no_step_twice():
    """The relay sends a summary, then (subscribed) its buffered steps, then new ones: ETTR and the
    step count are those of a viewer that saw every step: the loop's work between steps (20 ms each) is not
    lost, the pauses (100 ms every 5 steps) are."""
    r = Rank(0, steps=40, dur=0.1, gap=0.02, pause=0.1, pause_every=5)
    recs = records(r)
    relay, direct = RunModel(), RunModel()
    for rec in recs[:-20]:
        relay.ingest(stream(0), rec)
    viewer = RunModel()
    viewer.ingest(stream(0), recs[0])
    viewer.ingest(stream(0), _wire(relay.summary(stream(0), T0)[1]))
    for rec in relay.buffered(stream(0)) + [x for x in recs[-20:] if x["k"] == "step"]:
        viewer.ingest(stream(0), rec)
    for rec in recs:
        direct.ingest(stream(0), rec)
    got, want = viewer.view(now=T0 + 4.0).ranks[0], direct.view(now=T0 + 4.0).ranks[0]
    assert got.steps == want.steps == 40
    assert [b.step for b in viewer.view().traces[0].steps] == list(range(40))   # the relay's buffer came first
    assert got.ettr == pytest.approx(want.ettr) and got.ettr == pytest.approx(1 - 0.8 / 4.8)


def test_odd_summary_values_are_unknown_never_an_error():
    s = read_summary({"k": "summary", "t": T0, "stats": {"n": "many", "step_median": True, "data_frac": 0.5,
                                                         "warming_up": None, "loader_workers": 2.5},
                      "memory": {"peak_bytes": "1G", "ooms": 3}, "comm": {"allreduce": [1, 2], 7: [1, 2, 3, 4],
                                                                           "x": [1, 2, 0.5, None]},
                      "steps": -4})
    st = s.stats
    assert (st.n, st.step_median, st.data_frac, st.warming_up, st.loader_workers) == (0, None, 0.5, True, None)
    assert st.memory.peak_bytes is None and st.memory.ooms == 3
    assert st.comm_delta == {"x": (1, 2, 0.5, None)}
    assert s.steps == 0
    odd = read_summary({"k": "summary", "t": T0, "stats": {}, "memory": "x", "comm": [1], "steps": True})
    assert odd.stats.memory == MemoryMetrics() and odd.stats.comm_delta == {}
    assert odd.steps == 0 and odd.stats.n == 0
    assert read_summary({"k": "summary", "t": T0, "stats": {}, "steps": 7}).steps == 7
    assert read_summary({"k": "summary", "t": T0, "stats": {"busy_source": 5, "peak_source": "table"}}).stats \
        .busy_source is None
    assert read_summary({"k": "summary", "t": T0, "stats": [("n", 5)]}).stats.n == 0     # not through the wire
    assert read_summary({"k": "summary", "t": T0, "stats": {},
                         "comm": {"a": [None, 1, 2.0, 3.0]}}).stats.comm_delta == {}


def test_summary_and_subscribe_are_wire_1_2_kinds():
    assert wire.KIND_MINOR["summary"] == wire.KIND_MINOR["subscribe"] == 2 <= wire.PROTO[1]
    with pytest.raises(wire.ProtocolError):
        list(wire.FrameDecoder().feed(wire.encode({"k": "summary", "t": T0, "stats": [1]})))
    with pytest.raises(wire.ProtocolError):
        list(wire.FrameDecoder().feed(wire.encode({"k": "subscribe", "t": T0, "srcs": "all"})))


def test_steps_lost_to_drops_lower_no_summarised_ettr():
    """A rank whose steps 20-29 never arrived: the relay's ETTR leaves their time out (``unseen``),
    and so does the viewer holding its summary."""
    recs = [r for r in records(Rank(0, steps=60, dur=0.1, pause=0.1, pause_every=5))
            if not (r["k"] == "step" and 20 <= r["step"] < 30)]
    relay = RunModel()
    for rec in recs:
        relay.ingest(stream(0), rec)
    viewer = RunModel()
    viewer.ingest(stream(0), recs[0])
    viewer.ingest(stream(0), _wire(relay.summary(stream(0), relay.last_t)[1]))
    want = relay.view().ranks[0].ettr
    assert want == pytest.approx(5 / 6)           # 50 steps of 0.1 s and 10 pauses of 0.1 s; unseen: 1.2 s
    assert viewer.view(now=relay.last_t).ranks[0].ettr == pytest.approx(want)


def test_a_loader_seen_before_the_summary_keeps_the_data_wait_known_after_subscribing():
    """Steps with a data phase made the relay see the loader; once subscribed, the window's steps
    (no data phase now: an instant loader) still give a known data wait of 0, never unknown."""
    relay, viewer = RunModel(), RunModel()
    early = records(Rank(0, steps=20, dur=0.1, data=0.01))
    for rec in early:
        relay.ingest(stream(0), rec)
    viewer.ingest(stream(0), early[0])
    viewer.ingest(stream(0), _wire(relay.summary(stream(0), relay.last_t)[1]))
    later = [dict(r, step=r["step"] + 20, t=r["t"] + 2.0, start=r["start"] + 2.0)
             for r in records(Rank(0, steps=20, dur=0.1)) if r["k"] == "step"]
    for rec in later:
        viewer.ingest(stream(0), rec)
    assert viewer.view().ranks[0].data_wait_frac == 0.0


def test_a_rank_with_no_step_yet_is_summarised_as_none_done():
    relay = RunModel()
    relay.ingest(stream(0), records(Rank(0, steps=1))[0])
    rec = _wire(relay.summary(stream(0), T0)[1])
    assert rec["steps"] == 0 and rec["stats"]["warming_up"] is True
    assert "step_median" not in rec["stats"]   # unknown: left out


def _sent(buf: io.BytesIO) -> list[dict]:
    out = list(wire.FrameDecoder().feed(buf.getvalue()))
    buf.seek(0)
    buf.truncate()
    return out


def test_a_relay_summarises_a_warming_rank_on_every_flush_until_it_has_a_window():
    """The first full screen waits for each rank's step time: a rank still warming up (or not
    summarised yet) is summarised on every flush, the others once a second."""
    recs = records(Rank(0, steps=MIN_STEPS + 2))
    model, buf = RunModel(), io.BytesIO()
    out = StdoutRelay(buf)
    out.summaries = True                                    # a 1.2 viewer that follows no rank in full
    streams = [stream(0)]
    for rec in recs[:3]:                                    # hello and a step: warming up
        model.ingest(stream(0), rec)
    out.summarize(model, streams, warming_only=True)        # never summarised: sent on a flush
    out.flush()
    assert [r["stats"]["warming_up"] for r in _sent(buf)] == [True]
    steps = [r for r in recs if r["k"] == "step"]
    for rec in steps[1:MIN_STEPS + 1]:                     # the first step is not in the window
        model.ingest(stream(0), rec)
    out.summarize(model, streams, warming_only=True)        # out of warm-up: sent at once
    out.flush()
    first = _sent(buf)
    assert [r["stats"]["warming_up"] for r in first] == [False] and first[0]["steps"] == MIN_STEPS + 1
    model.ingest(stream(0), steps[MIN_STEPS + 1])
    out.summarize(model, streams, warming_only=True)        # warm now: waits for the once-a-second pass
    out.flush()
    assert _sent(buf) == []
    out.summarize(model, streams)
    out.flush()
    assert [r["steps"] for r in _sent(buf)] == [MIN_STEPS + 2]


def _undecided(cls: type, payload: tuple, not_sent: dict[str, str]) -> set[str]:
    """Fields of ``cls`` neither sent in ``payload`` nor listed as deliberately not sent."""
    return {f.name for f in dataclasses.fields(cls)} - {p.attr for p in payload} - set(not_sent)


def test_every_stats_and_memory_field_is_sent_or_deliberately_not():
    from perfmon_analysis.stats import RankStats
    from perfmon_analysis.summary import MEMORY_NOT_SENT, MEMORY_PAYLOAD, STATS_NOT_SENT, STATS_PAYLOAD
    assert _undecided(RankStats, STATS_PAYLOAD, STATS_NOT_SENT) == set()
    assert _undecided(MemoryMetrics, MEMORY_PAYLOAD, MEMORY_NOT_SENT) == set()
    assert not {p.attr for p in STATS_PAYLOAD} & set(STATS_NOT_SENT)
    for payload in (STATS_PAYLOAD, MEMORY_PAYLOAD):
        assert len({p.key for p in payload}) == len(payload) and len({p.attr for p in payload}) == len(payload)
    # a field added without deciding is caught
    grown = dataclasses.make_dataclass("Grown", [("straggle_frac", float | None, None)], bases=(RankStats,),
                                       frozen=True)
    assert _undecided(grown, STATS_PAYLOAD, STATS_NOT_SENT) == {"straggle_frac"}


def _planted(payload: tuple, seed: int) -> dict:
    """A distinct value of each key's type, so a key read into the wrong attribute shows."""
    values = {}
    for i, p in enumerate(payload):
        values[p.attr] = {int: seed + i, float: seed + i + 0.25, bool: not p.unknown if p.unknown is not None
                          else (i % 2 == 0), str: f"s{seed + i}"}[p.kind]
    return values


def test_each_sent_field_comes_back_under_its_own_name_through_the_wire():
    from perfmon_analysis.readings import RankTrace
    from perfmon_analysis.stats import RankStats
    from perfmon_analysis.summary import MEMORY_PAYLOAD, STATS_PAYLOAD, SUMMARY_VERSION, summary_record
    stats_in, mem_in = _planted(STATS_PAYLOAD, 10), _planted(MEMORY_PAYLOAD, 100)
    st = RankStats(**stats_in, trace=RankTrace((), (), ()), memory=MemoryMetrics(**mem_in),
                   comm_delta={"all_reduce": (3, 4, 0.5, 6.0)})
    model = RunModel()
    model.ingest(stream(0), records(Rank(0, steps=3), world=1)[0])
    rec = summary_record(model._streams[stream(0)], st, T0)
    assert rec["v"] == SUMMARY_VERSION == 1
    back = read_summary(_wire(rec)).stats
    assert {a: getattr(back, a) for a in stats_in} == stats_in
    assert {a: getattr(back.memory, a) for a in mem_in} == mem_in
    assert back.comm_delta == {"all_reduce": (3, 4, 0.5, 6.0)}


def test_a_newer_payload_keeps_what_this_viewer_knows_and_ignores_the_rest():
    rec = {"k": "summary", "t": T0, "v": 2, "stats": {"n": 12, "data_frac": 0.3, "queue_frac": 0.2},
           "memory": {"peak_bytes": 5, "pinned_bytes": 9}, "spill": [1, 2], "steps": 40}
    s = read_summary(_wire(rec))
    assert (s.stats.n, s.stats.data_frac, s.stats.memory.peak_bytes, s.steps) == (12, 0.3, 5, 40)
    with pytest.raises(wire.ProtocolError):     # the version is declared on the wire: an int
        list(wire.FrameDecoder().feed(wire.encode(dict(rec, v="2"))))
