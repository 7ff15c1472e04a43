"""The Prometheus families of one view (tui.export.prometheus.families, pure) and the shipped
Grafana dashboard, which must use exactly the names the exporter serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from perfmon_analysis.verdict import evaluate
from tests.unit.test_verdict_explain import VIEWS
from tui.export.prometheus import Snapshot, _Holder, registry_for

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-perfmon.json"


def _scrape(view) -> tuple[str, dict]:
    holder = _Holder()
    holder.snapshot = Snapshot(view, evaluate(view))
    text = generate_latest(registry_for(holder)).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def test_units_ratios_and_unknowns_follow_prometheus_conventions():
    view = VIEWS["compute_efficiency_mfu"]()
    text, families = _scrape(view)
    ranks = {s.labels["rank"]: s for s in families["perfmon_step_time_median_seconds"].samples}
    assert set(ranks) == {str(r.rank) for r in view.ranks}
    for r in view.ranks:
        assert ranks[str(r.rank)].value == r.step_time_median_s
    assert all(0 <= s.value <= 1 for name, f in families.items() if name.endswith("_ratio") for s in f.samples)
    assert families["perfmon_steps"].type == "counter" and "perfmon_steps_total{" in text
    assert families["perfmon_verdict_info"].samples[0].labels["bottleneck"] == "compute_efficiency"
    assert set(ranks["0"].labels) == {"job", "rank", "Hostname", "UUID", "modelName"}
    # a rank whose value is unknown has no sample at all (never a 0)
    unknown = [r.rank for r in view.ranks if r.tokens_per_s is None]
    assert unknown and not any(s.labels["rank"] in map(str, unknown)
                               for s in families["perfmon_tokens_per_second"].samples)


def test_the_dashboard_asks_only_for_series_the_exporter_serves():
    text, families = _scrape(VIEWS["compute_efficiency_mfu"]())
    served = {s.name for f in families.values() for s in f.samples} | {f"{n}_total" for n in families} | set(families)
    dashboard = json.loads(DASHBOARD.read_text())
    asked = {name for panel in dashboard["panels"] for t in panel["targets"]
             for name in re.findall(r"perfmon_[a-z_]+", t["expr"])}
    asked |= set(re.findall(r"perfmon_[a-z_]+", json.dumps(dashboard["templating"])))
    assert asked and asked <= served, asked - served
    assert len(asked) >= 12
