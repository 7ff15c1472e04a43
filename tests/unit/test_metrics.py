"""One metric table (perfmon_analysis.metrics) behind every surface: the report JSON, the Prometheus
scrape and the trainer callbacks each show exactly the table's metrics for them, with the same
value for the same records, and a name changed in the table changes on every surface."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from perfmon_analysis import metrics as M
from perfmon_analysis.analysis import Analysis
from probe.integrations import live
from tests.helpers.reports import REPORT_SCHEMA
from tests.unit.verdict_synth import Rank, analysis_of, records
from tui.export.prometheus import _Holder, registry_for

# Two GPU ranks with every exported number measured (so "absent" can only mean "not exported there").
BUSY = Rank(0, data=0.012, comm=0.021, exposed=0.0123, syncs=1.0, flops=2.2e12, tokens=4096, gpu_util=83,
            sm_active=0.71, loader_workers=2, loader_cpu=0.43, gap=0.002, probe_step_s=20e-6, probe_cores=0.004)
PEER = dataclasses.replace(BUSY, rank=1, data=0.017, exposed=0.0031, gpu_util=79, flops=2.1e12)
PEAK = 100e12


def _report() -> dict:
    return analysis_of(BUSY, PEER, device="cuda", peak=PEAK).report()


def _scrape() -> dict[str, dict[str, float]]:
    """Prometheus family name -> {rank: value}, as ``perfmon export --prometheus`` serves them."""
    holder = _Holder()
    holder.snapshot = analysis_of(BUSY, PEER, device="cuda", peak=PEAK).snapshot()
    text = generate_latest(registry_for(holder)).decode()
    return {f.name: {s.labels.get("rank"): s.value for s in f.samples if not s.name.endswith("_created")}
            for f in text_string_to_metric_families(text)}


class _Probe:
    def add_tap(self, fn):
        self.tap = fn


def _callbacks(monkeypatch) -> tuple[dict[str, float], dict]:
    """What the trainer callbacks log on rank 0, and the report of the same records."""
    monkeypatch.setattr(live, "EVERY_SECONDS", 0.0)        # a fresh reading at every step
    recs = records(BUSY, device="cuda", peak=PEAK)
    upto = max(i for i, r in enumerate(recs) if r["k"] == "step") + 1     # the last reading's records
    probe = _Probe()
    numbers = live.LiveNumbers(probe)
    for rec in recs[:upto]:
        probe.tap(rec)
    return numbers.metrics(), Analysis.of_records([("self", recs[:upto])]).report()


def test_every_metric_is_in_the_report_where_its_scope_says_and_nowhere_else():
    report = _report()
    assert set(report["metrics"]) - {"memory"} == {m.name for m in M.METRICS if m.job is not None}
    assert [row["rank"] for row in report["ranks"]] == [0, 1]
    for row in report["ranks"]:
        rank_metrics = {k for k in row if k in {m.name for m in M.METRICS}}
        assert rank_metrics == {m.name for m in M.METRICS if m.rank is not None}
    assert not list(jsonschema.Draft202012Validator(REPORT_SCHEMA).iter_errors(report))


def test_the_prometheus_scrape_has_exactly_the_tables_prometheus_metrics_with_the_reports_values():
    report, scraped = _report(), _scrape()
    exported = M.on(M.Surface.PROMETHEUS)
    assert exported and all(m.rank is not None for m in exported)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for m in exported:
        values = scraped[m.prometheus]
        assert values == {str(r["rank"]): r[m.name] for r in report["ranks"]}, m.name
    for m in M.METRICS:
        if m not in exported:
            assert m.prometheus not in scraped, m.name
    per_rank = {name for name, values in scraped.items() if set(values) == {"0", "1"}}
    assert per_rank == {m.prometheus for m in exported}


def test_the_callbacks_log_exactly_the_tables_callback_metrics_with_the_reports_values(monkeypatch):
    logged, report = _callbacks(monkeypatch)
    gain_keys = tuple(M.gain_callback(field, "") for field in M.GAIN_CALLBACKS)
    numbers = {k: v for k, v in logged.items() if not k.startswith((M.bottleneck_callback(""), *gain_keys))}
    wanted = M.on(M.Surface.CALLBACKS)
    assert numbers == {m.callback: report["metrics"][m.name] for m in wanted}
    # beside the table: what fixing each loss buys, the report's verdict.gains (rounded there)
    verdict = report["verdict"]
    gains = verdict["gains"] + ([verdict["gains_combined"]] if verdict["gains_combined"] else [])
    expected = {M.gain_callback(key, g["loss"]): g[key] for g in gains for key in M.GAIN_CALLBACKS
                if g[key] is not None}
    assert {k: v for k, v in logged.items() if k.startswith(gain_keys)} == pytest.approx(expected, abs=1e-4)
    assert all(report["metrics"][m.name] is not None for m in wanted)      # each one measured here
    assert logged[M.bottleneck_callback(report["verdict"]["bottleneck"])] == 1.0


def test_exported_names_follow_the_units():
    by = {m.name: m for m in M.METRICS}
    assert by["data_wait_frac"].prometheus == "perfmon_data_wait_ratio"
    assert by["data_wait_frac"].callback == "perfmon/data_wait_ratio"
    assert by["step_time_median_s"].prometheus == "perfmon_step_time_median_seconds"
    assert by["samples_per_s"].prometheus == "perfmon_samples_per_second"
    assert by["device_busy"].prometheus == "perfmon_device_busy_ratio"
    assert by["syncs_per_step"].prometheus == "perfmon_syncs_per_step"
    assert len({m.name for m in M.METRICS}) == len({m.prometheus for m in M.METRICS}) == len(M.METRICS)
    # a scrape and a scalar logger take numbers only: labels and flags stay in the report
    assert all(m.unit.numeric for m in (*M.on(M.Surface.PROMETHEUS), *M.on(M.Surface.CALLBACKS)))


def test_renaming_a_metric_in_the_table_renames_it_on_every_surface(monkeypatch):
    renamed = tuple(dataclasses.replace(m, name="input_stall_frac") if m.name == "data_wait_frac" else m
                    for m in M.METRICS)
    monkeypatch.setattr(M, "METRICS", renamed)
    report = _report()
    assert "input_stall_frac" in report["metrics"] and "data_wait_frac" not in report["metrics"]
    assert all("input_stall_frac" in r and "data_wait_frac" not in r for r in report["ranks"])
    loss = next(x for x in report["verdict"]["losses"] if x["id"] == "data_wait")
    assert loss["metric"] == "input_stall_frac"
    scraped = _scrape()
    assert "perfmon_input_stall_ratio" in scraped and "perfmon_data_wait_ratio" not in scraped
    logged, _ = _callbacks(monkeypatch)
    assert "perfmon/input_stall_ratio" in logged and "perfmon/data_wait_ratio" not in logged


def test_data_wait_is_stated_once_at_one_precision():
    """The loss and the evidence name the metric; the value lives only in ``metrics`` (and per rank)."""
    report = _report()
    m, v = report["metrics"], report["verdict"]
    assert m["data_wait_frac"] == pytest.approx(0.017 / 0.1, abs=1e-6)     # the worst rank, of its iteration
    assert all("share" not in loss for loss in v["losses"])
    assert "data_wait_frac" not in v["evidence"] and "data_wait_frac" in v["evidence_metrics"]
    # the gains table prices each loss at its share, by design: the losses and evidence do not repeat it
    said = {k: val for k, val in report.items() if k not in ("metrics", "ranks")}
    said["verdict"] = {k: val for k, val in v.items() if k not in ("gains", "gains_combined")}
    text = json.dumps(said)
    assert str(m["data_wait_frac"]) not in text
    floats = [x for x in [*m.values(), *(x for r in report["ranks"] for x in r.values())] if isinstance(x, float)]
    assert floats and all(x == round(x, M.DECIMALS) for x in floats)


def test_each_loss_is_the_share_the_verdict_judged():
    analysis = analysis_of(BUSY, PEER, device="cuda", peak=PEAK)
    snap = analysis.snapshot()
    report = analysis.report(snapshot=snap)
    assert snap.verdict.losses and len(report["verdict"]["losses"]) == len(snap.verdict.losses)
    for loss, entry in zip(snap.verdict.losses, report["verdict"]["losses"]):
        assert entry["id"] == loss.id
        assert report["metrics"][entry["metric"]] == M.rounded(loss.share)
    assert report["metrics"]["device_idle_frac"] is not None


def test_the_metrics_page_lists_the_table_as_it_is():
    page = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert page.endswith(M.markdown())


def test_the_metrics_page_has_a_row_of_each_metrics_key_unit_scope_names_and_meaning():
    page = M.markdown()
    lines = page.splitlines()
    assert page.endswith("\n") and len(lines) == 2 + len(M.METRICS)
    assert lines[:2] == ["| report key | unit | scope | Prometheus | callbacks | meaning |",
                         "|---|---|---|---|---|---|"]
    assert "| `steps` | count | job/rank | `perfmon_steps` (counter) |  | Steps the rank has completed |" in lines
    assert "| `data_wait_frac` | ratio | job/rank | `perfmon_data_wait_ratio` | `perfmon/data_wait_ratio` | " \
           "Share of the iteration blocked waiting for the next batch |" in lines
    assert "| `compute_s` | seconds | rank |  |  | " \
           "Median compute time per step: step - gaps - data wait - exposed comm |" in lines
    assert "| `power_w` | watts | job |  |  | " \
           "Mean power of the job's GPUs over the window, from NVML's total-energy counter |" in lines


def test_a_ranks_window_percentiles_read_its_window_and_its_run_percentiles_the_whole_run():
    from types import SimpleNamespace

    def times(scale: float) -> SimpleNamespace:
        return SimpleNamespace(p50=1.0 * scale, p90=2.0 * scale, p99=3.0 * scale, max=4.0 * scale)

    rank = SimpleNamespace(step_times=times(0.01), run_step_times=times(0.1))
    values = {name: M.by_name(name).rank_value(rank)
              for name in ("step_time_p90_s", "step_time_max_s", "run_step_time_p50_s", "run_step_time_max_s")}
    assert values == {"step_time_p90_s": 0.02, "step_time_max_s": 0.04, "run_step_time_p50_s": 0.1,
                      "run_step_time_max_s": 0.4}
    before = SimpleNamespace(step_times=None, run_step_times=None)       # no step yet: unknown
    assert M.by_name("step_time_max_s").rank_value(before) is None
    assert M.by_name("run_step_time_max_s").rank_value(before) is None


def test_a_metric_has_no_value_outside_its_scope():
    assert M.by_name("compute_s").job_value(object()) is None
    assert M.MEMORY_PEAK.rank_value(object()) is None


def test_callback_keys_are_spelled_under_the_prefix_with_slashes():
    assert M.callback_key("a", "b") == "perfmon/a/b"
    assert M.bottleneck_callback("data_loading") == "perfmon/bottleneck/data_loading"
    assert M.gain_callback("speedup_bound", "data_wait") == "perfmon/speedup_bound/data_wait"
    assert M.gain_callback("per_day", "combined") == "perfmon/device_hours_per_day/combined"
