"""The stuck diagnosis: stall records and silence in, the culprit rank, the waiters, the call and
where each rank is out, through the run model, the verdict and the report JSON."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.readings import FlightEntry, InFlight, LoaderWorker, stall_reading
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.stuck import CALL_STATES, HEARTBEAT_S, NO_HELLO_S, diagnose, is_library, user_frame
from probe import flight as F
from tests.helpers import records as R
from tests.helpers.reports import REPORT_SCHEMA, report_of
from tests.unit.verdict_synth import T0, Rank, job

END = T0 + 30 * 0.1          # the synthetic ranks' last step ends here
SITE = "/home/u/train.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def stall(t: float, seconds: float, *, where: str = "step", stack=(), inflight=(), seq=None, loader=None,
          step: int = 29, **extra) -> dict:
    rec = {"k": "stall", "t": t, "since": t - seconds, "seconds": seconds, "threshold": 15.0, "step": step,
           "where": where, "n": 1, "stack": list(stack), "inflight": list(inflight), "seq": dict(seq or {})}
    if loader is not None:
        rec["loader"] = loader
    rec.update(extra)
    return rec


def in_all_reduce(seq: int) -> dict:
    return {"op": "all_reduce", "group": "world", "group_rank": 0, "group_size": 2, "seq": seq, "bytes": 4000,
            "since": END}


WAITER = stall(END + 45, 45, stack=[f"{SITE}:11 in <module>", f"{TORCH}:3252 in all_reduce"],
               inflight=[in_all_reduce(20)], seq={"world": 20})
SLEEPER = stall(END + 45, 45, stack=[f"{SITE}:30 in <module>", f"{SITE}:10 in load_batch"], seq={"world": 19})


def two_ranks(rank0_extra=(), rank1_extra=()) -> RunModel:
    return job(Rank(0, extra_records=list(rank0_extra)), Rank(1, extra_records=list(rank1_extra)))


def test_the_rank_that_never_reached_the_collective_is_named_with_its_line_and_the_waiters_with_the_call():
    v = V.evaluate(two_ranks([WAITER], [SLEEPER]).view())
    assert (v.bottleneck, v.severity, v.straggler_rank) == ("stuck", "crit", 1)
    assert v.headline == ("Stuck: rank 1 never reached all_reduce #20 (train.py:10 in load_batch); "
                          "1 rank waits in it for 45s")
    stuck = v.as_json()["stuck"]
    assert {k: stuck[k] for k in ("kind", "culprit_ranks", "waiting_ranks", "op", "group", "seq")} == {
        "kind": "collective", "culprit_ranks": [1], "waiting_ranks": [0], "op": "all_reduce", "group": "world",
        "seq": 20}
    assert stuck["since_s"] == 45.0
    assert stuck["where"]["1"][-1] == f"{SITE}:10 in load_batch"
    assert stuck["where"]["0"][-1] == f"{TORCH}:3252 in all_reduce"


def test_a_member_that_has_not_reported_yet_is_the_culprit_by_elimination():
    v = V.evaluate(two_ranks([WAITER]).view())
    assert v.stuck.culprit_ranks == (1,) and v.stuck.waiting_ranks == (0,)
    assert v.headline.startswith("Stuck: rank 1 never reached all_reduce #20 (no stall reported)")


def test_ranks_in_the_same_call_are_not_culprits_and_a_subgroup_names_its_group():
    in_tp = dict(in_all_reduce(7), group="3")
    waiting = [stall(END + 20, 20, inflight=[in_tp], seq={"3": 7}) for _ in range(2)]
    behind = stall(END + 20, 20, stack=[f"{SITE}:5 in f"], seq={"3": 6, "world": 40})
    model = job(Rank(0, extra_records=[waiting[0]]), Rank(1, extra_records=[waiting[1]]),
                Rank(2, extra_records=[behind]), Rank(3))
    d = model.view().stuck
    assert (d.culprit_ranks, d.waiting_ranks, d.group, d.seq) == ((2,), (0, 1), "3", 7)
    assert d.headline.startswith("rank 2 never reached all_reduce #7 of group 3 (train.py:5 in f); 2 ranks wait")


def test_a_silent_live_rank_is_unresponsive_and_the_culprit(monkeypatch):
    model = two_ranks([WAITER])
    clock = 1000.0
    for _stream, state in model._streams.items():   # rank 1's newest record arrived 25 s ago
        state.recv_clock = clock - (25.0 if state.rank == 1 else 0.5)
    view = model.view(END + 45, clock=clock)
    v = V.evaluate(view)
    assert v.stuck.culprit_ranks == (1,)
    assert "rank 1 never reached all_reduce #20 (no record for 25s (a process holding the GIL" in v.headline
    assert [r.role for r in v.stuck.ranks] == ["waiting", "unresponsive"]
    assert v.as_json()["stuck"]["unresponsive_ranks"] == [1]


def test_silence_alone_is_unresponsive_and_short_silence_or_a_recording_is_not():
    model = two_ranks()
    for state in model._streams.values():
        state.recv_clock = 1000.0 - (HEARTBEAT_S + 2 if state.rank == 0 else 1.0)
    d = model.view(END, clock=1000.0).stuck
    assert d.kind == "unresponsive" and d.culprit_ranks == (0,)
    assert d.headline == "rank 0 unresponsive: no record for 12s (a process holding the GIL in C code, or stopped)"
    for state in model._streams.values():
        state.recv_clock = 1000.0 - (HEARTBEAT_S - 1)
    assert model.view(END, clock=1000.0).stuck is None
    assert model.view(END + 3600).stuck is None        # a recording has no silence, however old


def test_every_rank_waiting_in_the_loader_names_the_awaited_worker_and_its_cpu():
    loader = {"waiting": True, "awaited_pid": 4711,
              "workers": [{"pid": 4711, "alive": True, "cpu": 0.0}, {"pid": 4712, "alive": True, "cpu": 0.0}]}
    other = {"waiting": True, "workers": [{"pid": 5000, "alive": True, "cpu": None}]}
    stack = [f"{SITE}:20 in <module>", "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:700 in "
             "__next__"]
    model = two_ranks([stall(END + 30, 30, where="loader", stack=stack, loader=loader)],
                      [stall(END + 30, 30, where="loader", stack=stack, loader=other)])
    v = V.evaluate(model.view())
    assert v.stuck.kind == "data" and v.stuck.loader_pid == 4711 and v.stuck.culprit_ranks == (0, 1)
    assert v.headline == "Stuck: all ranks wait in data loading for 30s: worker 4711 of rank 0 is idle at 0% CPU"


@pytest.mark.parametrize("worker, said", [
    ({"pid": 9, "alive": False, "cpu": None}, "worker 9 of rank 0 is gone (its batch never comes)"),
    ({"pid": 9, "alive": True, "cpu": 0.97}, "worker 9 of rank 0 is busy at 97% CPU"),
    ({"pid": 9, "alive": True, "cpu": None}, "rank 0 waits for worker 9"),
])
def test_the_awaited_worker_is_described_as_gone_busy_or_not_yet_measured(worker, said):
    model = job(Rank(0, extra_records=[stall(END + 30, 30, where="loader",
                                             loader={"waiting": True, "awaited_pid": 9, "workers": [worker]})]))
    assert model.view().stuck.headline == f"rank 0 waits in data loading for 30s: {said}"


def test_stuck_between_steps_names_the_library_call_and_the_users_line():
    stack = [f"{SITE}:90 in <module>", f"{SITE}:88 in save_ckpt",
             "/venv/lib/python3.11/site-packages/torch/serialization.py:900 in save",
             "/venv/lib/python3.11/site-packages/torch/serialization.py:700 in _save"]
    model = job(Rank(0, extra_records=[stall(END + 180, 180, where="between", stack=stack)]))
    v = V.evaluate(model.view())
    assert v.stuck.kind == "between_steps"
    assert v.headline == "Stuck: rank 0 stuck between steps in save called at train.py:88 in save_ckpt for 3m00s"


def test_stuck_inside_a_step_names_the_step_and_outranks_warming_up():
    model = job(Rank(0, steps=2, extra_records=[stall(T0 + 100, 99.8, step=1, stack=[f"{SITE}:3 in spin"])]))
    v = V.evaluate(model.view())
    assert v.bottleneck == "stuck"
    assert v.headline == "Stuck: rank 0 stuck inside step 2 at train.py:3 in spin for 1m39s"


def test_resumed_or_a_later_step_ends_the_stall_and_a_stall_lasts_on_the_probes_clock():
    resumed = {"k": "resumed", "t": END + 50, "seconds": 50.0, "step": 30}
    assert two_ranks([WAITER, resumed], [SLEEPER, resumed]).view().stuck is None
    later = R.step(30, start=END + 50.9, dur=0.1)
    model = two_ranks([WAITER, later], [SLEEPER])
    d = model.view().stuck
    assert d.culprit_ranks == (1,) and d.waiting_ranks == ()        # rank 0 moved on; rank 1 still stalled
    assert model.view(END + 45 + 10).ranks[1].stalled_s == pytest.approx(55.0)


def test_the_report_json_carries_the_diagnosis_and_validates():
    report = report_of(two_ranks([WAITER], [SLEEPER]))
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["verdict"]["bottleneck"] == "stuck"
    assert report["verdict"]["stuck"]["culprit_ranks"] == [1]
    assert report["verdict"]["stuck"]["calls"] == {"0": "enqueued", "1": "never_enqueued"}
    healthy = report_of(two_ranks())
    jsonschema.validate(healthy, REPORT_SCHEMA)
    assert healthy["verdict"]["stuck"] is None


def test_a_stream_without_its_hello_holds_the_ranks_place_until_the_hello_fills_it():
    model = RunModel()
    model.expect("/s/j.r1.x0.p7.sock", 1, "j", 7, 0, clock=100.0)
    assert model.view(T0, clock=100.0 + NO_HELLO_S - 0.5).stuck is None
    view = model.view(T0, clock=100.0 + NO_HELLO_S + 0.5)     # a probe answers a connect at once
    assert [r.rank for r in view.ranks] == [1] and view.stuck.culprit_ranks == (1,)
    assert view.stuck.headline.startswith("rank 1 unresponsive: no record for 3s")
    model.ingest("/s/j.r1.x0.p7.sock", R.hello(1, t=T0, proto=[1, 1], pid=7), received=200.0)
    view = model.view(T0, clock=201.0)
    assert view.ranks[0].host == "n1" and view.ranks[0].generation == 0 and view.stuck is None
    model.expect("/s/j.r1.x0.p7.sock", 1, "j", 7, 0, clock=300.0)     # a re-attach does not reset it
    assert model.view(T0, clock=301.0).ranks[0].host == "n1"


def test_user_frame_skips_python_installed_packages_and_the_probe():
    probe_core = str(Path(__file__).parents[2] / "probe" / "core.py")
    stack = (f"{SITE}:5 in main", f"{probe_core}:210 in loader", "/usr/lib/python3.11/queue.py:180 in get")
    assert user_frame(stack) == ("train.py:5 in main", "loader")
    assert user_frame(("<frozen runpy>:88 in _run_code",)) == ("<frozen runpy>:88 in _run_code", None)
    assert user_frame(()) == (None, None)


def test_odd_stall_records_parse_to_what_is_known():
    r = stall_reading({"k": "stall", "t": 5.0, "seconds": 2.0, "inflight": [{"op": 3}, "x"], "seq": {"w": True},
                       "loader": {"workers": ["x", {"pid": "p"}]}, "device": {"pending": 1}, "stack": [1, "a:1 in f"]})
    assert r.inflight[0].op == "3" and r.inflight[0].group == "world" and r.seq == {}
    assert r.workers[0].pid is None and r.device_pending is None and r.stack == ("a:1 in f",)
    assert stall_reading({"k": "stall", "t": 5.0}) is None
    assert diagnose([]) is None


def test_a_rank_long_without_a_step_but_moving_is_busy_not_stuck_unless_others_wait_for_it():
    evaluating = stall(END + 60, 60, where="between", stack=[f"{SITE}:70 in evaluate"], moving=True,
                       seq={"world": 19})
    assert job(Rank(0, extra_records=[evaluating])).view().stuck is None
    v = V.evaluate(two_ranks([WAITER], [evaluating]).view())
    assert v.stuck.culprit_ranks == (1,)
    assert v.headline.startswith("Stuck: rank 1 never reached all_reduce #20 (busy between steps, now at "
                                 "train.py:70 in evaluate)")
    hung = dict(evaluating, moving=False)
    assert job(Rank(0, extra_records=[hung])).view().stuck.kind == "between_steps"


# -- each branch's words and roles (written against the mutants scripts/mutation.py left alive) --------

def roles(d) -> list[tuple[int, str]]:
    return [(r.rank, r.role) for r in d.ranks]


def test_ranks_behind_are_culprits_and_a_rank_that_issued_the_call_is_not_even_when_elsewhere():
    waiting = [stall(END + 30, 30, inflight=[in_all_reduce(7)], seq={"world": 7}) for _ in range(2)]
    reached = stall(END + 30, 30, stack=[f"{SITE}:9 in g"], seq={"world": 7})     # issued #7: not behind
    behind = stall(END + 45, 45, stack=[f"{SITE}:5 in f"], seq={"world": 6})
    d = job(Rank(0, extra_records=[waiting[0]]), Rank(1, extra_records=[waiting[1]]),
            Rank(2, extra_records=[reached]), Rank(3, extra_records=[behind])).view().stuck
    assert (d.culprit_ranks, d.waiting_ranks, d.since_s) == ((3,), (0, 1), 45.0)   # aged to the newest record
    assert roles(d) == [(0, "waiting"), (1, "waiting"), (2, "other"), (3, "culprit")]
    assert d.headline == "rank 3 never reached all_reduce #7 (train.py:5 in f); 2 ranks wait in it for 45s"


def test_several_ranks_behind_are_all_named_and_the_longest_wait_is_the_stuck_time():
    first = stall(END + 30, 30, inflight=[in_all_reduce(7)], seq={"world": 7})
    longer = stall(END + 45, 45, inflight=[in_all_reduce(7)], seq={"world": 7})
    behind = stall(END + 45, 45, stack=[f"{SITE}:5 in f"], seq={"world": 6})
    d = job(Rank(0, extra_records=[first]), Rank(1, extra_records=[longer]), Rank(2, extra_records=[behind]),
            Rank(3, extra_records=[dict(behind)])).view().stuck
    assert d.culprit_ranks == (2, 3) and d.since_s == 45.0
    assert d.headline == "ranks 2, 3 never reached all_reduce #7; 2 ranks wait in it for 45s"


def test_when_every_known_member_is_in_the_call_none_is_blamed():
    in_tp = dict(in_all_reduce(5), group="3")
    ranks = [Rank(r, extra_records=[stall(END + 20, 20, inflight=[in_tp], seq={"3": 5})]) for r in (0, 1)]
    outside = stall(END + 20, 20, stack=[f"{SITE}:2 in h"], seq={"world": 3})   # not in group 3
    d = job(*ranks, Rank(2, extra_records=[outside]), Rank(3)).view().stuck
    assert d.culprit_ranks == () and d.waiting_ranks == (0, 1)
    assert d.headline == ("every rank enqueued all_reduce #5 of group 3, none completed it (the device or the "
                          "network); 2 ranks wait in it for 20s")
    assert d.calls == {0: "enqueued", 1: "enqueued"}


def test_a_silent_rank_beside_stalled_ones_without_a_collective_is_the_culprit_and_they_are_said():
    model = two_ranks([], [stall(END + 30, 30, stack=[f"{SITE}:3 in spin"])])
    for state in model._streams.values():
        state.recv_clock = 1000.0 - (HEARTBEAT_S if state.rank == 0 else 0.5)   # exactly the heartbeat
    d = model.view(END + 30, clock=1000.0).stuck
    assert (d.kind, d.culprit_ranks, d.waiting_ranks, d.since_s) == ("unresponsive", (0,), (1,), HEARTBEAT_S)
    assert d.headline.endswith("or stopped); 1 rank stalled for 30s")
    assert roles(d) == [(0, "culprit"), (1, "waiting")]


def test_the_loader_culprit_is_the_rank_that_knows_which_worker_it_waits_for():
    unknown = {"waiting": True, "workers": [{"pid": 70, "alive": True, "cpu": 0.5}]}
    known = {"waiting": True, "awaited_pid": 81, "workers": [{"pid": 81, "alive": True, "cpu": 0.0}]}
    d = two_ranks([stall(END + 30, 30, where="loader", loader=unknown)],
                  [stall(END + 30, 30, where="loader", loader=known)]).view().stuck
    assert d.loader_pid == 81 and d.headline.endswith("worker 81 of rank 1 is idle at 0% CPU")
    assert roles(d) == [(0, "culprit"), (1, "culprit")]
    one = job(Rank(0, extra_records=[stall(END + 30, 30, where="loader", loader=unknown)])).view().stuck
    assert one.headline == "rank 0 waits in data loading for 30s: rank 0 waits in DataLoader next() (workers 70)"


def test_a_loader_wait_on_one_rank_and_a_step_on_another_is_not_a_data_stall():
    d = two_ranks([stall(END + 30, 30, where="loader", stack=[f"{SITE}:1 in a"])],
                  [stall(END + 30, 30, stack=[f"{SITE}:2 in b"])]).view().stuck
    assert d.kind == "in_step" and d.culprit_ranks == (0, 1)
    assert d.headline == "ranks 0, 1 stuck inside step 30 at train.py:1 in a for 30s"


def test_inside_a_step_without_a_step_number_and_between_steps_name_the_rank_and_roles():
    d = job(Rank(0, extra_records=[stall(END + 9, 9, step=None, stack=[f"{SITE}:4 in k"])])).view().stuck
    assert d.headline == "rank 0 stuck inside step at train.py:4 in k for 9s" and roles(d) == [(0, "culprit")]
    assert (d.kind, d.waiting_ranks, d.op, d.group, d.seq) == ("in_step", (), None, None, None)


def test_on_several_nodes_the_culprit_is_named_with_its_node():
    model = job(Rank(0, extra_records=[WAITER]), Rank(1, extra_records=[SLEEPER]))
    for state in model._streams.values():
        state.set_hello(dict(state.hello, host=f"n0{state.rank + 1}"))
    assert model.view().stuck.headline.startswith("rank 1 on n02 never reached all_reduce #20")


def test_a_full_stall_record_is_read_field_by_field():
    rec = stall(END + 5, 5.5, step=7, where="loader", stack=["a:1 in f"],
                inflight=[{"op": "broadcast", "group": "2", "seq": 3, "since": 12.5}], seq={"2": 3},
                loader={"waiting": True, "awaited_pid": 9, "workers": [{"pid": 9, "alive": True, "cpu": 0.25}]},
                device={"pending": True}, moving=False,
                flight={"source": "torch", "sources": ["generic"], "groups": {"2": {"enqueued": 3, "backend": "gloo"}},
                        "entries": [{"op": "broadcast", "group": "2", "seq": 3, "state": "enqueued", "backend": "gloo"},
                                    "x"], "note": "n"})
    r = stall_reading(rec)
    assert (r.t, r.seconds, r.threshold, r.step, r.where, r.stack) == (END + 5, 5.5, 15.0, 7, "loader", ("a:1 in f",))
    assert r.inflight[0] == InFlight("broadcast", "2", 3, 12.5) and r.seq == {"2": 3}
    assert (r.loader_waiting, r.awaited_pid, r.device_pending, r.flight_source, r.moving) == (True, 9, True, "torch",
                                                                                               False)
    assert r.workers == (LoaderWorker(9, True, 0.25),) and r.awaited_worker == LoaderWorker(9, True, 0.25)
    assert r.flight == (FlightEntry("broadcast", "2", 3, "enqueued", "gloo"),)
    assert (r.flight_sources, r.flight_enqueued, r.flight_note) == (("generic",), {"2": 3}, "n")
    assert r.lasted(END + 7) == 7.5 and r.lasted(END) == 5.5       # never less than at the record
    bare = stall_reading({"k": "stall", "t": 1.0, "seconds": 2.0})
    assert (bare.where, bare.step, bare.threshold, bare.loader_waiting, bare.moving, bare.flight_source) == (
        "step", None, None, False, None, None)
    assert (bare.flight, bare.flight_sources, bare.flight_enqueued, bare.flight_note) == ((), (), {}, None)
    odd = stall_reading({"k": "stall", "t": 1.0, "seconds": 2.0, "flight": {"sources": "nccl", "groups": [1]}})
    assert (odd.flight_sources, odd.flight_enqueued) == ((), {})


def test_the_json_rounds_the_time_and_lists_the_roles_of_silent_ranks():
    model = two_ranks([dict(WAITER, seconds=45.12345)])
    for state in model._streams.values():
        state.recv_clock = 1000.0 - (25.0 if state.rank == 1 else 0.0)
    out = model.view(END + 45, clock=1000.0).stuck.as_json()
    assert out["since_s"] == 45.123 and out["unresponsive_ranks"] == [1] and out["culprit_ranks"] == [1]
    assert list(out["where"]) == ["0"] and len(out["where"]["0"]) == 2


def test_user_frames_and_short_names():
    assert user_frame(("/u/t.py:3 in main", "/u/t.py:9 in step")) == ("t.py:9 in step", None)
    assert user_frame(("/u/t.py:3 in main", "/venv/lib/python3.11/site-packages/x.py:1 in a",
                       "/venv/lib/python3.11/site-packages/x.py:2 in b")) == ("t.py:3 in main", "a")
    assert is_library("<string>:1 in <module>") and not is_library("/u/t.py:1 in f")


def test_each_ranks_row_for_the_stuck_screen_says_what_it_does_and_carries_its_stack():
    busy_step = stall(END + 40, 40, where="step", stack=[f"{SITE}:12 in train"], moving=True, seq={"world": 19})
    model = job(Rank(0, extra_records=[WAITER]), Rank(1, extra_records=[SLEEPER]), Rank(2, extra_records=[busy_step]),
                Rank(3, extra_records=[stall(END + 45, 45, stack=[], seq={"world": 19})]),
                Rank(4, extra_records=[stall(END + 45, 45, where="loader", seq={"world": 19},
                                             loader={"waiting": True, "workers": []})]),
                Rank(5, extra_records=[dict(WAITER, inflight=[dict(in_all_reduce(20), seq=None)])]),
                Rank(6))
    for state in model._streams.values():
        state.recv_clock = 1000.0 - (30.0 if state.rank == 6 else 0.0)
    d = model.view(END + 45, clock=1000.0).stuck
    rows = {r.rank: r for r in d.ranks}
    assert [(r.rank, r.host, r.pid) for r in d.ranks] == [(n, "node1", 1000 + n) for n in range(7)]
    assert rows[0].doing == "in all_reduce #20" and rows[0].stack == tuple(WAITER["stack"])
    assert rows[0].seconds == 45.0 and rows[6].seconds == 30.0          # stalled for, or silent for
    assert rows[1].doing == "train.py:10 in load_batch" and rows[1].role == "culprit"
    assert rows[2].doing == "busy, now at train.py:12 in train"
    assert rows[3].doing == "stalled (no stack)" and rows[3].stack == ()
    assert rows[4].doing == "rank 4 waits in DataLoader next()"
    assert rows[5].doing == "in all_reduce" and rows[5].role == "other"  # no sequence number: not in #20
    assert rows[6].role == "unresponsive" and rows[6].doing.startswith("no record for 30s") and rows[6].stack == ()


def test_between_steps_the_row_says_so_busy_or_inside_a_call():
    inside = stall(END + 9, 9, where="between", stack=[f"{SITE}:88 in save_ckpt", TORCH + ":1 in save"])
    busy = stall(END + 9, 9, where="between", stack=[f"{SITE}:70 in evaluate"], moving=True)
    d = two_ranks([WAITER], [inside]).view().stuck
    assert d.ranks[1].doing == "between steps, in save from train.py:88 in save_ckpt"
    d = two_ranks([WAITER], [busy]).view().stuck
    assert d.ranks[1].doing == "busy between steps, now at train.py:70 in evaluate"


def test_a_rank_with_no_record_is_named_only_when_no_rank_is_provably_behind():
    behind = stall(END + 45, 45, stack=[f"{SITE}:5 in f"], seq={"world": 19})
    d = job(Rank(0, extra_records=[WAITER]), Rank(1, extra_records=[behind]), Rank(2)).view().stuck
    assert d.culprit_ranks == (1,) and [r.role for r in d.ranks] == ["waiting", "culprit", "other"]


def test_a_silent_rank_outside_the_group_is_still_shown_unresponsive():
    in_tp = dict(in_all_reduce(5), group="3")
    model = job(Rank(0, extra_records=[stall(END + 20, 20, inflight=[in_tp], seq={"3": 5})]),
                Rank(1, extra_records=[stall(END + 20, 20, stack=[f"{SITE}:1 in a"], seq={"3": 4})]), Rank(2))
    for state in model._streams.values():
        state.recv_clock = 1000.0 - (20.0 if state.rank == 2 else 0.0)
    d = model.view(END + 20, clock=1000.0).stuck
    assert d.culprit_ranks == (1,) and [r.role for r in d.ranks] == ["waiting", "culprit", "unresponsive"]
    assert d.as_json()["where"] == {"0": [], "1": [f"{SITE}:1 in a"]}


def test_missing_pieces_are_said_plainly():
    d = job(Rank(0, extra_records=[stall(END + 9, 9, where="between", stack=[])])).view().stuck
    assert d.headline == "rank 0 stuck between steps (no stack) for 9s"
    r = stall_reading(stall(END, 1, inflight=[{"seq": 2}], loader={"workers": [{"pid": 70}, {"pid": 71}]}))
    assert r.inflight[0].op == "collective"
    one = job(Rank(0, extra_records=[stall(END + 9, 9, where="loader",
                                           loader={"waiting": True, "workers": [{"pid": 70}, {"pid": 71}]})]))
    assert one.view().stuck.headline.endswith("rank 0 waits in DataLoader next() (workers 70, 71)")


# -- the flight recorders: never enqueued vs enqueued, not completed ------------------------------
# Records built as the probe builds them (probe.flight) from dumps torch 2.13 wrote in a 2-rank gloo
# job (tests/unit/flight_dumps.json: rank 0 waits in all_reduce #4, rank 1 stopped after #3).
DUMPS = json.loads((Path(__file__).parent / "flight_dumps.json").read_text())
WAITING, BEHIND = DUMPS["gloo_rank0_waits_in_world_4"], DUMPS["gloo_rank1_stopped_after_world_3"]
ITEM = f"{SITE}:12 in <module>"


def with_flight(rec: dict, dump: dict, source: str) -> dict:
    rec = dict(rec, seq=dict(rec["seq"]), inflight=list(rec["inflight"]),
               flight=F.merge([F.parse_flight(dump, source=source)]))
    F.fill_from_flight(rec)
    return rec


def nccl(dump: dict, pending: str) -> dict:
    """The same job on NCCL with start events: done entries completed, the pending one ``pending``."""
    out = json.loads(json.dumps(dump))
    for e in out["entries"]:
        e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
        done = e["retired"]
        e.update(state="completed" if done else pending,
                 time_discovered_started_ns=e["time_created_ns"] + 10 if done or pending == "started" else 0,
                 time_discovered_completed_ns=e["time_created_ns"] + 20 if done else 0)
    return out


def test_a_rank_that_never_enqueued_the_call_is_a_host_stall_and_the_waiter_enqueued_it():
    waiter = with_flight(stall(END + 45, 45, stack=[f"{SITE}:11 in <module>", f"{TORCH}:3252 in all_reduce"],
                               inflight=[in_all_reduce(4)], seq={"world": 4, "1": 1}), WAITING, "generic")
    sleeper = with_flight(stall(END + 45, 45, stack=[f"{SITE}:30 in <module>", f"{SITE}:10 in load_batch"],
                                seq={"world": 3, "1": 1}), BEHIND, "generic")
    d = two_ranks([waiter], [sleeper]).view().stuck
    assert (d.culprit_ranks, d.waiting_ranks, d.calls) == ((1,), (0,), {0: "enqueued", 1: "never_enqueued"})
    assert d.headline == "rank 1 never reached all_reduce #4 (train.py:10 in load_batch); 1 rank waits in it for 45s"
    assert [r.call for r in d.ranks] == [CALL_STATES["enqueued"], CALL_STATES["never_enqueued"]]
    assert d.ranks[1].call == "never enqueued it: a host/Python stall (its stack below)"
    assert d.ranks[0].flight == "flight recorder (generic): all_reduce #4 enqueued (gloo)"
    assert d.ranks[1].flight == "flight recorder (generic): all_reduce #1 of group 1 enqueued (gloo)"
    assert d.as_json()["calls"] == {"0": "enqueued", "1": "never_enqueued"}


def test_nccl_calls_enqueued_on_every_rank_and_not_completed_are_the_device_or_network():
    """NCCL returns once the call is enqueued: the ledger has nothing in flight, the training thread
    waits further on (``loss.item()``); the recorders hold the call. Rank 1's device never started
    it while rank 0's did."""
    ranks = [with_flight(stall(END + 45, 45, stack=[ITEM], seq={"world": 4, "1": 1}), nccl(WAITING, state), "nccl")
             for state in ("started", "scheduled")]
    d = two_ranks([ranks[0]], [ranks[1]]).view().stuck
    assert (d.kind, d.culprit_ranks, d.waiting_ranks, d.op, d.seq) == ("collective", (), (0, 1), "all_reduce", 4)
    assert d.calls == {0: "started", 1: "scheduled"}
    assert d.headline == ("every rank enqueued all_reduce #4, none completed it (the device of rank 1 never started "
                          "it); 2 ranks wait in it for 45s")
    assert d.ranks[1].call == "enqueued it; the device has not started it"
    both_started = [with_flight(stall(END + 45, 45, stack=[ITEM], seq={"world": 4, "1": 1}),
                                nccl(WAITING, "started"), "nccl") for _ in range(2)]
    d = two_ranks([both_started[0]], [both_started[1]]).view().stuck
    assert d.headline.startswith("every rank enqueued all_reduce #4, none completed it (the device or the network)")


def test_a_recorder_that_numbers_a_group_otherwise_than_the_ledger_is_not_read_for_it():
    """torch counts calls the probe does not wrap (a C++ broadcast at DDP's start): its #4 is not
    the ledger's #4, so the state comes from the ledger alone."""
    dump = nccl(WAITING, "started")
    dump["entries"][2]["retired"] = False           # its #3: completed, not yet retired
    waiter = with_flight(stall(END + 45, 45, inflight=[in_all_reduce(3)], seq={"world": 3}), dump, "nccl")
    behind = with_flight(stall(END + 45, 45, stack=[f"{SITE}:5 in f"], seq={"world": 2}), BEHIND, "generic")
    d = two_ranks([waiter], [behind]).view().stuck
    assert d.seq == 3 and d.calls == {0: "enqueued", 1: "never_enqueued"}    # not the recorder's #3 "completed"
