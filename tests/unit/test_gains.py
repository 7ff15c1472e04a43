"""What fixing each loss buys (perfmon_analysis.gains): the speedup bound, the combination, device-hours,
money and unknown inputs, checked against figures planted in synthetic jobs."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from perfmon_analysis import report
from perfmon_analysis.gains import NO_PRICE, PRICE_ENV, callback_values, estimate, speedup_bound
from perfmon_analysis.losses import Loss
from perfmon_analysis.verdict import evaluate
from tests.helpers.reports import REPORT_SCHEMA
from tests.unit.test_report import _write_recording
from tests.unit.verdict_synth import Rank, analysis_of, job, records
from tui.cli import main as cli_main
from tui.pricing import price_per_device_hour


def _cpu(rank: int = 0, **kw) -> Rank:
    """A CPU rank whose training thread is on CPU for the whole step body: no unexplained wait."""
    dur, data, gap = kw.get("dur", 0.1), kw.get("data", 0.0), kw.get("gap", 0.0)
    return Rank(rank=rank, cpu=dur - data - gap, cpu_span="body", **kw)


def test_the_bound_is_one_over_one_minus_the_share():
    assert speedup_bound(0.3) == pytest.approx(1 / 0.7)
    assert speedup_bound(0.0) == 1.0
    assert speedup_bound(None) is None            # unknown share: unknown bound, never 1x
    assert speedup_bound(1.0) is None             # the whole step: no finite bound


def test_a_30pct_data_wait_is_bounded_at_1_43x_and_costs_its_share_of_every_device_hour():
    view = job(_cpu(data=0.03), _cpu(rank=1, data=0.03)).view()
    verdict = evaluate(view)
    gain = verdict.gains.of("data_wait")
    assert view.metrics.data_wait_frac == pytest.approx(0.30)
    assert gain.speedup_bound == pytest.approx(1 / 0.7)
    assert gain.per_day == pytest.approx(2 * 24 * 0.30)                  # ranks x a day x the share
    hours = (view.now - view.started) / 3600
    assert gain.device_hours == pytest.approx(2 * hours * 0.30)
    assert verdict.gain_headline() == "fixing it: up to 1.4× faster, 14 CPU-h/day"


def test_every_share_is_of_the_iteration_so_a_losss_wall_share_is_its_share():
    """One whole (docs/verdict.md): 20 ms of data wait in a 100 ms iteration whose 20 ms between steps is the
    loop's own work: the data wait is 20% of the iteration and of the wall time, and so is the loop's work."""
    view = job(_cpu(data=0.02, gap=0.02)).view()
    gains = evaluate(view).gains
    data, loop = gains.of("data_wait"), gains.of("loop")
    assert data.share == pytest.approx(0.2) and data.speedup_bound == pytest.approx(1 / 0.8)
    assert data.wall_share == pytest.approx(0.2) and data.per_day == pytest.approx(24 * 0.2)
    assert loop.share == pytest.approx(0.2) and loop.wall_share == pytest.approx(0.2)


def test_the_combination_removes_every_loss_over_its_threshold_and_the_pauses_over_their_line():
    view = job(_cpu(data=0.02, gap=0.02)).view()
    losses = (Loss("data_wait", "data wait", 0.25, "planted"), Loss("comm_exposed", "comm", 0.04, "planted"),
              Loss("device_idle", "idle", 0.15, "planted"), Loss("step_gaps", "pauses", 0.2, "planted", "run"))
    gains = estimate(view, losses, over=("data_wait", "device_idle"))     # comm under its threshold
    c = gains.combined
    assert c.of == ("data_wait", "device_idle", "step_gaps")
    assert c.speedup_bound == pytest.approx(1 / (1 - 0.60))             # shares of one whole add up
    assert c.wall_share == pytest.approx(0.60) and c.per_day == pytest.approx(24 * 0.60)
    # pauses under their line (ETTR >= 90%) stay out of the combination
    small_gaps = losses[:3] + (Loss("step_gaps", "pauses", 0.05, "planted", "run"),)
    c = estimate(view, small_gaps, over=("data_wait", "device_idle")).combined
    assert c.of == ("data_wait", "device_idle") and c.speedup_bound == pytest.approx(1 / 0.6)
    assert estimate(view, small_gaps, over=()).combined is None


def test_communications_bound_counts_the_overlapped_collectives_too():
    base = job(_cpu(data=0.0)).view()
    losses = (Loss("comm_exposed", "exposed communication", 0.35, "planted"),)
    # 35% of the step exposed, 50% of it inside collectives: the overlapped part takes cores too
    view = dataclasses.replace(base, metrics=dataclasses.replace(base.metrics, comm_frac=0.50))
    gains = estimate(view, losses, over=("comm_exposed",))
    assert gains.of("comm_exposed").share == pytest.approx(0.35)
    assert gains.of("comm_exposed").speedup_bound == pytest.approx(2.0)
    assert gains.combined.speedup_bound == pytest.approx(2.0)
    # the total unknown: the exposed share's own bound
    unknown = dataclasses.replace(base, metrics=dataclasses.replace(base.metrics, comm_frac=None))
    assert estimate(unknown, losses, over=()).of("comm_exposed").speedup_bound == pytest.approx(1 / 0.65)


def test_money_is_device_hours_times_the_price_and_unknown_without_one():
    view = job(_cpu(data=0.03)).view()
    gain = evaluate(view).gains.of("data_wait")
    priced = gain.as_json(2.5)
    assert priced["price"] == {"per_device_hour": 2.5, "so_far": round(gain.device_hours * 2.5, 4),
                               "per_day": round(24 * 0.3 * 2.5, 4)}
    unpriced = gain.as_json(None)
    assert unpriced["price"] is None and unpriced["why_no_price"] == NO_PRICE
    assert evaluate(view).gain_headline(2.5) == "fixing it: up to 1.4× faster, 7.2 CPU-h/day (18/day)"


def test_an_unmeasured_loss_has_unknown_gains_never_zero():
    view = job(Rank(data=0.03)).view()                # no thread CPU time: the unexplained wait is unknown
    verdict = evaluate(view)
    idle = verdict.gains.of("device_idle")
    assert idle.share is None and idle.speedup_bound is None and idle.per_day is None and idle.device_hours is None
    assert idle.why_unknown == next(x.source for x in verdict.losses if x.id == "device_idle")
    entry = idle.as_json(3.0)
    assert entry["speedup_bound"] is None and entry["price"]["per_day"] is None and entry["why_unknown"]


def test_an_unknown_start_leaves_the_hours_so_far_unknown_but_not_the_rate():
    view = job(_cpu(data=0.03)).view()
    view = type(view)(**{**view.__dict__, "started": None})
    gain = estimate(view, evaluate(view).losses, over=("data_wait",)).of("data_wait")
    assert gain.device_hours is None and gain.per_day == pytest.approx(24 * 0.3)
    assert gain.why_unknown == "the job's start time is unknown: device-hours so far cannot be counted"


def test_a_gpu_job_counts_gpu_hours():
    view = job(Rank(data=0.03, gpu_util=60.0), device="cuda").view()
    verdict = evaluate(view)
    assert verdict.gains.device_unit == "GPU-h" and "GPU-h/day" in verdict.gain_headline()


def test_the_report_carries_the_gains_in_json_and_text():
    view = job(_cpu(data=0.03), _cpu(rank=1, data=0.03)).view()
    verdict = evaluate(view)
    out = report.build(view, verdict, price=2.0)
    jsonschema.validate(out, REPORT_SCHEMA)
    v = out["verdict"]
    data = next(g for g in v["gains"] if g["loss"] == "data_wait")
    assert data["speedup_bound"] == round(1 / 0.7, 4) and data["price"]["per_day"] == round(2 * 24 * 0.3 * 2.0, 4)
    assert v["gains_combined"]["of"] == ["data_wait"] and v["gains_basis"]["ranks"] == 2
    text = report.render_text(view, verdict, price=2.0)
    section = text[text.index("What fixing it buys"):].splitlines()
    assert section[2].split() == ["data", "wait", "1.4×", "14", section[2].split()[4], "28.8"]
    assert all(len(line) <= 80 for line in text.splitlines())


def test_price_comes_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.setenv(PRICE_ENV, "3.5")
    assert price_per_device_hour(None) == 3.5 and price_per_device_hour(1.0) == 1.0
    monkeypatch.delenv(PRICE_ENV)
    assert price_per_device_hour(None) is None


@pytest.mark.parametrize("env,flag,message", [("cheap", None, "is not a number"), (None, -1.0, "zero or more"),
                                              ("nan", None, "zero or more")])
def test_a_bad_price_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, env, flag, message):
    rec = _write_recording(tmp_path, records(_cpu(data=0.03)))
    if env is not None:
        monkeypatch.setenv(PRICE_ENV, env)
    argv = ["report", str(rec)] + (["--price-per-device-hour", str(flag)] if flag is not None else [])
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and captured.out == ""


def test_perfmon_report_prices_the_gains_from_the_flag(tmp_path, capsys):
    rec = _write_recording(tmp_path, records(_cpu(data=0.03)))
    assert cli_main(["report", str(rec), "--json", "--price-per-device-hour", "2"]) == 0
    v = json.loads(capsys.readouterr().out)["verdict"]
    data = next(g for g in v["gains"] if g["loss"] == "data_wait")
    assert data["price"]["per_day"] == pytest.approx(24 * 0.3 * 2, abs=1e-3)
    assert v["gain_headline"] == "fixing it: up to 1.4× faster, 7.2 CPU-h/day (14.4/day)"


def test_prometheus_serves_the_gains_and_leaves_unknown_ones_out():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tui.export.prometheus import Snapshot, _Holder, registry_for

    view = job(Rank(data=0.03), Rank(rank=1, data=0.03)).view()     # the unexplained wait is not measured
    holder = _Holder()
    holder.snapshot = Snapshot(view, evaluate(view))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry_for(holder)).decode())}
    bound = {s.labels["loss"]: s.value for s in families["perfmon_loss_speedup_bound"].samples}
    per_day = {s.labels["loss"]: s.value for s in families["perfmon_loss_device_hours_per_day"].samples}
    assert bound["data_wait"] == pytest.approx(1 / 0.7) and per_day["data_wait"] == pytest.approx(2 * 24 * 0.3)
    assert bound["combined"] == pytest.approx(1 / 0.7)
    assert "device_idle" not in bound and "device_idle" not in per_day


def test_on_a_gpu_the_energy_counter_prices_each_loss_in_joules():
    view = job(Rank(data=0.03, gpu_util=60.0, gpu_power_w=400.0, samples=32), device="cuda").view()
    m = view.metrics
    assert m.power_w == pytest.approx(400.0)                        # the counter's rise over time, not a reading
    assert m.energy_per_step_j == pytest.approx(400.0 * 0.1)        # 100 ms steps
    assert m.energy_per_sample_j == pytest.approx(400.0 / 320)      # 32 samples a step, 10 steps a second
    gain = evaluate(view).gains.of("data_wait")
    assert gain.energy == {"per_step_j": pytest.approx(40.0 * 0.3), "per_sample_j": pytest.approx(1.25 * 0.3),
                           "per_token_j": None, "per_day_kwh": pytest.approx(0.4 * 0.3 * 24)}


def test_energy_is_unknown_without_the_counter_and_on_a_cpu_never_zero():
    gpu = evaluate(job(Rank(data=0.03, gpu_util=60.0), device="cuda").view()).gains.of("data_wait")
    assert gpu.energy is None and "total-energy counter was not read" in gpu.why_no_energy
    cpu = evaluate(job(_cpu(data=0.03)).view()).gains.of("data_wait").as_json()
    assert cpu["energy"] is None and cpu["why_no_energy"].startswith("energy is measured on GPUs only")


def test_the_report_text_says_the_energy_each_loss_spends_on_a_gpu():
    view = job(Rank(data=0.03, gpu_util=60.0, gpu_power_w=400.0), device="cuda").view()
    text = report.render_text(view, evaluate(view))
    assert "  energy in data wait: at most 12J/step, 375mJ/sample, 2.88 kWh/day" in text.splitlines()


def test_a_restarted_energy_counter_leaves_the_power_unknown():
    view = job(Rank(data=0.03, gpu_util=60.0, gpu_power_w=-400.0), device="cuda").view()   # the counter falls
    assert view.metrics.power_w is None and view.metrics.energy_per_step_j is None


def test_the_trainer_callbacks_log_the_bound_and_the_hours_of_each_known_loss():
    analysis = analysis_of(Rank(data=0.03))          # the unexplained wait is not measured: not logged
    logged = analysis.callback_numbers(analysis.snapshot())
    assert logged["perfmon/speedup_bound/data_wait"] == pytest.approx(1 / 0.7)
    assert logged["perfmon/device_hours_per_day/data_wait"] == pytest.approx(24 * 0.3)
    assert logged["perfmon/speedup_bound/combined"] == pytest.approx(1 / 0.7)
    assert not any(key.endswith("/device_idle") for key in logged)
    assert logged["perfmon/data_wait_ratio"] == pytest.approx(0.3)       # beside the metric table's


def _view(world_size: int = 2, hours: float = 2.0, device: str = "cpu", **metrics):
    """A one-rank job's view, ``hours`` after its first probe started, with ``metrics`` changed
    (``comm_frac`` unknown unless given)."""
    base = job(_cpu()).view()
    assert base.started is not None
    return dataclasses.replace(base, world_size=world_size, now=base.started + hours * 3600.0, device_type=device,
                               metrics=dataclasses.replace(base.metrics, **{"comm_frac": None, **metrics}))


def test_each_gains_entry_is_its_bound_its_device_hours_and_its_price():
    losses = (Loss("data_wait", "data wait", 0.25, "planted"), Loss("device_idle", "idle", None, "no thread CPU"),
              Loss("loop", "loop", 1.0, "planted"))
    gains = estimate(_view(), losses, over=("data_wait",))     # 2 CPUs, 2 hours
    cpu_only = "energy is measured on GPUs only (NVML's total-energy counter)"

    def entry(loss: str, label: str, share, bound, hours, per_day, **extra) -> dict:
        return {"loss": loss, "label": label, "share": share, "speedup_bound": bound, "wall_share": share,
                "device_hours": hours, "per_day": per_day, "basis": "bound",
                "price": {"per_device_hour": 2.0, "so_far": None if hours is None else hours * 2.0,
                          "per_day": None if per_day is None else per_day * 2.0},
                "energy": None, "why_no_energy": cpu_only, **extra}

    assert gains.as_json(2.0) == {
        "gains": [entry("data_wait", "data wait", 0.25, 1.3333, 1.0, 12.0),
                  entry("device_idle", "idle", None, None, None, None, why_unknown="no thread CPU"),
                  entry("loop", "loop", 1.0, None, 4.0, 48.0,
                        why_unknown="the loss is the whole step: no finite bound")],
        "gains_combined": entry("combined", "every loss over threshold", 0.25, 1.3333, 1.0, 12.0, of=["data_wait"]),
        "gains_basis": {"ranks": 2, "hours": 2.0, "device_unit": "CPU-h", "power_w": None}}
    assert gains.headline("data_wait") == "fixing it: up to 1.3× faster, 12 CPU-h/day"
    assert gains.headline("data_wait", 2.0, compact=True) == "up to 1.3×, 12 CPU-h/day (24/day)"
    # no headline for a loss without a bound, one the job does not have, or none named
    assert gains.headline("device_idle") is None and gains.headline("stuck") is None and gains.headline(None) is None


def test_a_straggler_priced_by_the_whatif_is_simulated_and_the_combination_removes_the_simulated_share():
    losses = (Loss("slow_worker", "a slow worker", 0.3, "planted"), Loss("data_wait", "data wait", 0.1, "planted"),
              Loss("slow_stage", "a slow stage", 0.2, "planted"),
              Loss("rotating", "rotating imbalance", 0.15, "the exposed wait is not measured"))
    simulated = {"slow_worker": (1.2, ""), "slow_stage": (None, "too few steps to simulate"), "rotating": (None, "")}
    gains = estimate(_view(), losses, over=("slow_worker", "data_wait", "slow_stage"), simulated=simulated)
    worker = gains.of("slow_worker")
    assert worker is not None and worker.as_json() == {
        "loss": "slow_worker", "label": "a slow worker", "share": 0.1667, "speedup_bound": 1.2, "wall_share": 0.1667,
        "device_hours": 0.6667, "per_day": 8.0, "basis": "simulated", "price": None, "energy": None,
        "why_no_energy": "energy is measured on GPUs only (NVML's total-energy counter)", "why_no_price": NO_PRICE}
    for loss_id, why in (("slow_stage", "too few steps to simulate"), ("rotating", "the exposed wait is not measured")):
        gain = gains.of(loss_id)
        assert gain is not None and gain.basis == "simulated" and gain.why_unknown == why
        assert (gain.share, gain.speedup_bound, gain.per_day, gain.device_hours) == (None, None, None, None)
    # the slow worker's simulated 1 - 1/1.2 (not its measured 30%), the data wait's 10%, the slow stage's
    # measured 20% (its simulation unknown)
    assert gains.combined is not None and gains.combined.of == ("slow_worker", "data_wait", "slow_stage")
    assert gains.combined.share == pytest.approx(1 / 6 + 0.3) and gains.combined.speedup_bound == pytest.approx(1.875)
    assert gains.headline("slow_worker") == "fixing it: 1.2× faster (simulated), 8 CPU-h/day"
    assert gains.headline("slow_worker", 2.0, compact=True) == "1.2× (sim.), 8 CPU-h/day (16/day)"


def test_on_a_gpu_each_loss_is_priced_in_joules_per_step_sample_token_and_kwh_a_day():
    gains = estimate(_view(device="cuda", power_w=400.0, energy_per_step_j=40.0, energy_per_sample_j=0.000123456,
                           energy_per_token_j=0.000012345),
                     (Loss("data_wait", "data wait", 0.25, "planted"), Loss("device_idle", "idle", None, "unknown")),
                     over=())
    data, idle = gains.of("data_wait"), gains.of("device_idle")
    assert data is not None and idle is not None
    # a quarter of each, each to its own precision: small per-sample and per-token energies keep 8 places
    assert data.energy == {"per_step_j": 10.0, "per_sample_j": 0.00003086, "per_token_j": 0.00000309,
                           "per_day_kwh": 2.4}
    assert data.why_no_energy is None and gains.energy is not None and gains.energy.why_unknown is None
    assert idle.energy is None and idle.why_no_energy == "the loss's share of wall time is unknown"
    assert gains.as_json()["gains_basis"] == {"ranks": 2, "hours": 2.0, "device_unit": "GPU-h", "power_w": 400.0}
    assert gains.combined is None


def test_pauses_exactly_at_the_ettr_line_join_the_combination():
    from perfmon_analysis.flowchart import ETTR_MIN
    at_line = Loss("step_gaps", "pauses", 1.0 - ETTR_MIN, "planted", "run")
    combined = estimate(_view(), (at_line,), over=()).combined
    assert combined is not None and combined.of == ("step_gaps",)


def test_the_combination_never_removes_more_than_the_whole_step():
    losses = (Loss("data_wait", "data wait", 0.7, "planted"), Loss("device_idle", "idle", 0.5, "planted"))
    c = estimate(_view(), losses, over=("data_wait", "device_idle")).combined
    assert c is not None and (c.share, c.wall_share, c.speedup_bound) == (1.0, 1.0, None)
    assert c.per_day == pytest.approx(2 * 24.0) and c.why_unknown == "the loss is the whole step: no finite bound"


def test_a_job_that_started_just_now_has_lost_no_device_hours_yet_not_unknown_ones():
    gains = estimate(_view(hours=0.0), (Loss("data_wait", "data wait", 0.25, "planted"),), over=("data_wait",))
    assert gains.hours == 0.0
    for gain in (gains.of("data_wait"), gains.combined):
        assert gain is not None and gain.device_hours == 0.0 and gain.why_unknown is None


def test_device_hours_count_the_world_size_or_the_ranks_seen_and_at_least_one_device():
    loss = (Loss("data_wait", "data wait", 0.25, "planted"),)
    assert estimate(_view(world_size=4), loss, over=()).ranks == 4       # ranks not yet seen hold devices too
    three = _view(world_size=1)
    assert estimate(dataclasses.replace(three, ranks=three.ranks * 3), loss, over=()).ranks == 3
    none = _view(world_size=0)
    gains = estimate(dataclasses.replace(none, ranks=[]), loss, over=())
    assert gains.ranks == 1 and gains.of("data_wait").per_day == pytest.approx(24 * 0.25)


def test_the_callbacks_log_no_combination_when_no_loss_is_over_its_threshold():
    gains = estimate(_view(), (Loss("data_wait", "data wait", 0.25, "planted"),), over=())
    assert gains.combined is None
    assert callback_values(gains) == {"perfmon/speedup_bound/data_wait": pytest.approx(1 / 0.75),
                                      "perfmon/device_hours_per_day/data_wait": pytest.approx(12.0)}
    assert callback_values(None) == {}
