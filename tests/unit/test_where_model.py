"""Where the unexplained step time goes: thread CPU time per step and in-step stack samples (wire 1.3).

Records are shaped as the probe sends them (``step.cpu``/``cpu_span``, ``where`` intervals); the
model turns them into a measured CPU busy, a measured off-CPU loss, and a table of user lines with
shares and binomial error bars that the verdict, the report and the TUI read.
"""

from __future__ import annotations

import json
import math

import pytest

from perfmon_analysis import verdict as V
from perfmon_analysis.losses import by_id
from perfmon_analysis.readings import step_cpu, where_interval
from perfmon_analysis.summary import read_summary, summary_record
from perfmon_analysis.where_stats import wilson_half_width
from tests.helpers.reports import REPORT_VALIDATOR, report_and_text, report_of
from tests.unit.verdict_synth import T0, Rank, job

TRAIN = "/home/u/train.py"
SLEEP = {"file": TRAIN, "line": 21, "function": "fetch_from_service", "call": "time.sleep(0.04)",
         "state": "waiting"}
FORWARD = {"file": TRAIN, "line": 30, "function": "main", "call": "loss = model(x).sum()",
           "lib": "torch.nn.modules.module._call_impl", "state": "busy"}
TOKENIZE = {"file": TRAIN, "line": 12, "function": "tokenize", "call": "ids = [vocab[w] for w in text.split()]",
            "state": "busy"}


def where_rec(t0: float, t1: float, lines: list[tuple[dict, int]], other: int = 0, hz: float = 20.0) -> dict:
    """A ``where`` record as the probe sends it: counts for [t0, t1] only."""
    listed = [dict(line, n=n) for line, n in lines]
    return {"k": "where", "t": t1, "t0": t0, "t1": t1, "hz": hz,
            "samples": sum(n for _, n in lines) + other, "lines": listed, "other": other}


def intervals(steps: int, dur: float, lines: list[tuple[dict, int]], other: int = 0, every: float = 2.0) -> list:
    """One ``where`` record per ``every`` seconds of a job of ``steps`` steps starting at T0."""
    out, t = [], T0
    while t < T0 + steps * dur:
        out.append(where_rec(t, t + every, lines, other))
        t += every
    return out


def waiting_job(wait: float = 0.04, dur: float = 0.1, steps: int = 40, where: bool = True) -> Rank:
    """A CPU step of ``dur`` whose thread sleeps ``wait`` of it (off CPU) and computes the rest."""
    extra = intervals(steps, dur, [(SLEEP, int(400 * wait / dur)), (FORWARD, int(400 * (1 - wait / dur)))]) \
        if where else []
    return Rank(steps=steps, dur=dur, cpu=dur - wait, cpu_span="body", extra_records=extra)


# -- readings ------------------------------------------------------------------------------------
def test_where_record_is_read_and_malformed_lines_are_left_out():
    rec = where_rec(T0, T0 + 2, [(SLEEP, 30), (FORWARD, 10)], other=5)
    rec["lines"] += [{"file": TRAIN, "line": 3, "state": "sleeping", "n": 4},      # not a state
                     {"file": TRAIN, "line": "x", "state": "busy", "n": 4},         # no line number
                     {"file": TRAIN, "line": 9, "state": "busy", "n": 0}, "junk"]    # no samples
    iv = where_interval(rec)
    assert iv is not None and (iv.t0, iv.t1, iv.hz, iv.samples, iv.other) == (T0, T0 + 2, 20.0, 45, 5)
    assert [(c.line, c.state, c.n, c.lib) for c in iv.lines] == [(21, "waiting", 30, None),
                                                                 (30, "busy", 10, FORWARD["lib"])]
    # the probe could read neither the thread's CPU clock nor its scheduler statistics: no state, still counted
    unread = where_interval(where_rec(T0, T0 + 2, [({k: v for k, v in SLEEP.items() if k != "state"}, 7)]))
    assert [(c.line, c.state, c.n) for c in unread.lines] == [(21, None, 7)]
    assert where_interval({"k": "where", "t0": T0, "lines": []}) is None     # no interval end, no count


def test_step_cpu_takes_the_data_wait_out_of_a_zero_code_span_only():
    assert step_cpu({"cpu": 0.06, "cpu_span": "body", "data_cpu": 0.01}) == (0.06, False)
    assert step_cpu({"cpu": 0.06, "cpu_span": "active", "data_cpu": 0.01}) == (pytest.approx(0.05), True)
    assert step_cpu({"dur": 0.1}) == (None, False)


# -- the error bar ---------------------------------------------------------------------------------
def _wilson_by_roots(n: int, total: int, z: float = 1.959964) -> float:
    """Half the distance between the two p0 with |p - p0| = z sqrt(p0 (1 - p0) / total): the Wilson
    interval found from its definition, independently of the closed form under test."""
    p = n / total
    a = 1 + z * z / total
    b = -(2 * p + z * z / total)
    c = p * p
    disc = math.sqrt(b * b - 4 * a * c)
    return disc / (2 * a)


@pytest.mark.parametrize("n,total", [(40, 100), (0, 50), (50, 50), (3, 7), (300, 1000)])
def test_error_bar_is_the_wilson_interval(n, total):
    assert wilson_half_width(n, total) == pytest.approx(_wilson_by_roots(n, total), rel=1e-9)


def test_error_bar_shrinks_with_samples_and_never_claims_certainty():
    assert wilson_half_width(0, 20) > 0.05 and wilson_half_width(20, 20) > 0.05
    assert wilson_half_width(400, 1000) < wilson_half_width(40, 100) < wilson_half_width(4, 10)


# -- the window's table --------------------------------------------------------------------------
def test_shares_are_of_the_step_and_count_only_intervals_in_the_window():
    # 100 ms steps with a 20 ms data wait: the probe samples the 80 ms body. The window is the last
    # 50 steps, [T0+35, T0+40]: the intervals from T0+34 on overlap it, the one ending at T0+32 does not
    steps, dur = 400, 0.1
    old = [where_rec(T0 + 30, T0 + 32, [(TOKENIZE, 500)])]
    recent = intervals(steps, dur, [(SLEEP, 30), (FORWARD, 50)], other=20)[-3:]
    assert recent[0]["t0"] == T0 + 34
    r = Rank(steps=steps, dur=dur, data=0.02, cpu=0.05, cpu_span="body", extra_records=old + recent)
    view = job(r).view()
    table = view.where
    assert table is not None and table.samples == 3 * 100 and table.span_share == pytest.approx(0.8)
    fwd, sleep = table.lines           # the largest first
    assert (sleep.line, sleep.samples, sleep.state) == (21, 90, "waiting")
    assert sleep.share == pytest.approx(0.8 * 90 / 300)
    assert sleep.err == pytest.approx(0.8 * wilson_half_width(90, 300))
    assert fwd.share == pytest.approx(0.8 * 150 / 300) and fwd.lib == FORWARD["lib"]
    assert all(x.line != TOKENIZE["line"] for x in table.lines)
    assert view.metrics.host_wait_frac == pytest.approx(90 / 240)


def test_library_frames_fold_under_the_users_line():
    # the same user line reached three library functions: one row, named after the most sampled one
    lines = [(dict(FORWARD, lib="torch.nn.functional.linear"), 10), (dict(FORWARD, lib="torch.nn.functional.relu"), 3),
             (dict(FORWARD, lib="torch.nn.functional.linear"), 5), (SLEEP, 4)]
    r = Rank(steps=40, dur=0.1, cpu=0.08, extra_records=[where_rec(T0, T0 + 4, lines)])
    table = job(r).view().where
    assert [(x.line, x.samples, x.lib) for x in table.lines] == [(30, 18, "torch.nn.functional.linear"),
                                                                (21, 4, None)]


def test_a_line_seen_waiting_and_busy_is_two_rows():
    r = Rank(steps=40, dur=0.1, cpu=0.08, extra_records=[where_rec(T0, T0 + 4, [(SLEEP, 6),
                                                                               (dict(SLEEP, state="busy"), 2)])])
    table = job(r).view().where
    assert [(x.state, x.samples) for x in table.lines] == [("waiting", 6), ("busy", 2)]
    assert (table.waiting, table.busy) == (6, 2)


def test_top_lines_are_the_largest_and_the_report_keeps_five():
    lines = [(dict(FORWARD, line=100 + i, lib=None), 10 + i) for i in range(8)]
    r = Rank(steps=40, dur=0.1, cpu=0.1, extra_records=[where_rec(T0, T0 + 4, lines)])
    model = job(r)
    assert [x.line for x in model.view().where.lines] == [107, 106, 105, 104, 103, 102, 101, 100]
    report = report_of(model)
    assert [w["line"] for w in report["verdict"]["where"]] == [107, 106, 105, 104, 103]
    assert report["verdict"]["where"][0]["samples"] == 17


def test_no_where_records_is_null_and_an_empty_window_is_an_empty_list():
    assert report_of(job(Rank(steps=40, cpu=0.1)))["verdict"]["where"] is None
    stale = Rank(steps=400, dur=0.1, cpu=0.1, extra_records=[where_rec(T0, T0 + 2, [(SLEEP, 9)])])
    report = report_of(job(stale))
    assert report["verdict"]["where"] == []
    assert REPORT_VALIDATOR.is_valid(report)


# -- measured CPU busy and the off-CPU loss ------------------------------------------------------
def test_cpu_busy_and_off_cpu_loss_from_thread_cpu_time():
    m = job(Rank(steps=40, dur=0.1, data=0.02, data_cpu=0.015, cpu=0.05, cpu_span="body")).view().metrics
    assert m.device_busy == pytest.approx((0.05 + 0.015) / 0.1) and m.device_busy_source == "thread_cpu"
    assert m.off_cpu_frac == pytest.approx((0.08 - 0.05) / 0.1)


def test_exposed_communication_is_not_counted_twice():
    r0 = Rank(0, steps=40, dur=0.1, comm=0.02, exposed=0.02, cpu=0.05)
    m = job(r0, Rank(1, steps=40, dur=0.1, comm=0.02, exposed=0.02, cpu=0.05)).view().metrics
    assert m.off_cpu_frac == pytest.approx((0.1 - 0.05 - 0.02) / 0.1)


def test_zero_code_span_takes_the_loaders_cpu_out():
    # begin..end covered the data wait too: cpu = body CPU + CPU in the wait
    m = job(Rank(steps=40, dur=0.1, data=0.02, data_cpu=0.02, cpu=0.07, cpu_span="active")).view().metrics
    assert m.off_cpu_frac == pytest.approx((0.08 - 0.05) / 0.1)


def test_without_thread_cpu_a_cpu_job_keeps_step_accounting_and_the_loss_is_unknown():
    v = V.evaluate(job(Rank(steps=40, dur=0.1)).view())
    idle = by_id(v.losses)["device_idle"]
    assert idle.share is None and "not reported" in idle.source
    assert v.evidence["device_busy"] == 1.0 and v.bottleneck == "healthy"


# -- the verdict ---------------------------------------------------------------------------------
def test_cpu_job_waiting_forty_percent_in_step_is_host_wait_naming_the_line():
    model = job(waiting_job(wait=0.04))
    v = V.evaluate(model.view())
    assert v.bottleneck == "host_wait", (v.headline, v.path, v.evidence)
    assert v.path[-2:] == ["syncs", "host_waiting"] and "syncs" not in v.undecided
    idle = by_id(v.losses)["device_idle"]
    assert idle.share == pytest.approx(0.4) and idle.source == "training thread off CPU (thread CPU time)"
    assert "40% of each step waiting in time.sleep(0.04) at train.py:21 in fetch_from_service" in v.headline
    assert any("train.py:21" in s for s in v.suggestions)
    report, text = report_and_text(model)
    REPORT_VALIDATOR.validate(report)
    top, second = report["verdict"]["where"]       # a host wait lists its waiting lines first
    assert (top["file"], top["line"], top["state"]) == (TRAIN, 21, "waiting")
    assert (second["line"], second["state"]) == (30, "busy") and second["share"] > top["share"]
    assert top["share"] == pytest.approx(0.4) and 0 < top["err"] < 0.1
    assert "Where the unexplained time goes" in text and "train.py:21 in fetch_from_service" in text


def test_a_ten_percent_wait_opens_the_starved_gate_whatever_busy_says():
    v = V.evaluate(job(waiting_job(wait=0.011)).view())
    assert v.evidence["device_busy"] > 0.7 and v.bottleneck == "host_wait"


def test_compute_bound_cpu_job_stays_healthy():
    r = Rank(steps=40, dur=0.1, cpu=0.098, cpu_span="body",
             extra_records=intervals(40, 0.1, [(FORWARD, 390), (SLEEP, 2)]))
    v = V.evaluate(job(r).view())
    assert v.bottleneck == "healthy" and v.severity == "ok"
    assert by_id(v.losses)["device_idle"].share <= 0.05


def test_busy_python_in_the_step_is_told_apart_from_waiting():
    # tokenizing in the step keeps the thread on CPU: busy lines, no off-CPU loss, not a host wait
    r = Rank(steps=40, dur=0.1, cpu=0.099, extra_records=intervals(40, 0.1, [(TOKENIZE, 240), (FORWARD, 160)]))
    model = job(r)
    v = V.evaluate(model.view())
    assert v.bottleneck != "host_wait" and by_id(v.losses)["device_idle"].share < 0.05
    where = report_of(model)["verdict"]["where"]
    assert [(w["line"], w["state"]) for w in where] == [(12, "busy"), (30, "busy")]
    assert model.view().metrics.host_wait_frac == 0.0


def test_cpu_wait_without_stack_samples_still_names_the_loss():
    v = V.evaluate(job(waiting_job(wait=0.04, where=False)).view())
    assert v.bottleneck == "host_wait" and "no stack samples" in v.headline
    assert v.as_json()["where"] is None


def _gpu_idle(lines: list[tuple[dict, int]] | None) -> V.Verdict:
    """The GPU 40% busy, the host 2 ms ahead of 100 ms of device work a step: too little to hide the idle."""
    extra = intervals(40, 0.1, lines) if lines is not None else []
    return V.evaluate(job(Rank(steps=40, gpu_util=40, syncs=0, gpu_time=0.1, lead=0.002, extra_records=extra),
                          device="cuda").view())


def test_gpu_idle_with_a_waiting_host_is_host_wait():
    v = _gpu_idle([(SLEEP, 300), (FORWARD, 100)])
    assert v.bottleneck == "host_wait" and v.evidence["host_wait_frac"] == pytest.approx(0.75)
    assert "time.sleep(0.04) at train.py:21" in v.headline


def test_gpu_idle_with_a_busy_host_is_host_overhead():
    v = _gpu_idle([(SLEEP, 100), (FORWARD, 300)])
    assert v.bottleneck == "host_overhead" and v.evidence["host_wait_frac"] == pytest.approx(0.25)


def test_gpu_idle_without_stack_samples_skips_the_question_with_the_reason():
    v = _gpu_idle(None)
    assert v.bottleneck == "host_overhead" and "host_waiting" not in v.evidence
    assert "no stack samples" in v.evidence["skipped"]["host_waiting"]


# -- a relay's summary -----------------------------------------------------------------------------
def test_summary_carries_the_off_cpu_share_and_leaves_the_table_out():
    model = job(waiting_job(wait=0.04))
    state = model._ranks[0]
    st = model._stats(state)
    rec = summary_record(state, st, T0 + 10)
    assert rec["stats"]["off_cpu_frac"] == pytest.approx(0.4) and "where" not in rec["stats"]
    back = read_summary(json.loads(json.dumps(rec))).stats
    assert back.off_cpu_frac == pytest.approx(0.4) and back.where is None


def test_a_wait_beside_a_larger_loss_is_a_finding_that_says_where():
    # a 40 ms data wait is the largest loss; the 15 ms off CPU in the body is a finding with its line
    r = Rank(steps=40, dur=0.1, data=0.04, data_cpu=0.0, loader_workers=2, loader_cpu=0.02, cpu=0.045,
             extra_records=intervals(40, 0.1, [(SLEEP, 100), (FORWARD, 300)]))
    v = V.evaluate(job(r).view())
    assert v.bottleneck == "data_loading"
    found = next(f for f in v.findings if f["id"] == "device_idle")
    assert found["share"] == pytest.approx(0.15)
    assert found["message"] == ("waiting, no measured cause also takes 15% of each step (most waiting in "
                                "time.sleep(0.04) at train.py:21 in fetch_from_service)")


# -- CPU contention ------------------------------------------------------------------------------
def test_time_waiting_for_a_core_is_contention_not_an_unexplained_wait():
    # 100 ms steps: 50 ms on CPU, 20 ms runnable with no free core (runq 0.2), 30 ms asleep
    extra = [dict(rec, runq=0.2) for rec in intervals(40, 0.1, [(SLEEP, 120), (FORWARD, 280)])]
    view = job(Rank(steps=40, dur=0.1, cpu=0.05, extra_records=extra)).view()
    assert view.metrics.cpu_contention_frac == pytest.approx(0.2)
    v = V.evaluate(view)
    idle = by_id(v.losses)["device_idle"]
    assert idle.share == pytest.approx(0.3) and "waited for a core" in idle.source
    found = next(f for f in v.findings if f["id"] == "cpu_contention")
    assert found["share"] == pytest.approx(0.2) and "waits 20% of each step for a free core" in found["message"]


def test_contention_weights_each_interval_by_its_samples_and_stays_unknown_without_scheduler_stats():
    recs = [dict(where_rec(T0, T0 + 2, [(FORWARD, 30)]), runq=0.1),
            dict(where_rec(T0 + 2, T0 + 4, [(FORWARD, 10)]), runq=0.5)]
    assert job(Rank(steps=40, cpu=0.1, extra_records=recs)).view().where.runq == pytest.approx((3 + 5) / 40)
    plain = job(Rank(steps=40, cpu=0.1, extra_records=[where_rec(T0, T0 + 2, [(FORWARD, 30)])])).view()
    assert plain.where.runq is None and plain.metrics.cpu_contention_frac is None
    assert "cpu_contention" not in {f["id"] for f in V.evaluate(plain).findings}


@pytest.mark.parametrize("rec,body_cpu", [
    # the training thread waited 60 ms for its intra-op thread, which worked the whole 80 ms op
    ({"cpu": 0.020, "cpu_span": "body", "cpu_others": 0.080, "intra_threads": 2}, 0.080),
    # a sleep: the other thread was as idle as the training thread
    ({"cpu": 0.020, "cpu_span": "body", "cpu_others": 0.020, "intra_threads": 2}, 0.020),
    # four intra-op threads: 90 ms of their CPU is 30 ms of the op each
    ({"cpu": 0.010, "cpu_span": "body", "cpu_others": 0.090, "intra_threads": 4}, 0.030),
    # one intra-op thread: the others are perfmon's and the user's threads, never the step's work
    ({"cpu": 0.010, "cpu_span": "body", "cpu_others": 0.090, "intra_threads": 1}, 0.010),
    ({"cpu": 0.010, "cpu_span": "body"}, 0.010),
])
def test_a_steps_work_counts_the_intra_op_threads_per_thread(rec, body_cpu):
    from perfmon_analysis.readings import step_cpu
    assert step_cpu(rec)[0] == pytest.approx(body_cpu)
