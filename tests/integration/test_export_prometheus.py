"""``perfmon export --prometheus`` on a live 2-rank job: scraped over HTTP, parsed with
prometheus_client's own parser, and checked against ``perfmon report --json`` of the same job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.net import free_port
from tests.integration.streamutil import kill_tree, wait_for

API_JOB = Path(__file__).parent / "jobs" / "api_job.py"


def _scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _ranks_scraped(port: int) -> dict[str, list] | None:
    try:
        metrics = _scrape(port)
    except OSError:
        return None
    ranks = {s.labels["rank"] for s in metrics.get("perfmon_step_time_median_seconds", [])}
    return metrics if ranks == {"0", "1"} else None


@pytest.mark.slow
def test_the_endpoint_of_a_live_job_agrees_with_its_report():
    job, port = "prom", free_port()
    ranks = [subprocess.Popen([sys.executable, str(API_JOB), job, "3000", "20", "5", "5"],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for r in range(2)]
    exporter = None
    try:
        wait_for(lambda: len(list(Path(os.environ["PERFMON_DIR"]).glob(f"{job}.*.sock"))) == 2, 30, "both ranks")
        exporter = subprocess.Popen([sys.executable, "-m", "tui.cli", "export", "--prometheus", f"127.0.0.1:{port}",
                                     job], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        wait_for(lambda: _ranks_scraped(port) is not None, 60, "both ranks on the endpoint")
        report = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "report", job, "--json", "--seconds", "3"],
                                           capture_output=True, text=True, timeout=60, check=True).stdout)
        metrics = _scrape(port)
    finally:
        for proc in ranks + ([exporter] if exporter else []):
            kill_tree(proc)
    by_rank = {name: {s.labels["rank"]: s for s in samples if "rank" in s.labels} for name, samples in metrics.items()}
    for r in report["ranks"]:
        rank = str(r["rank"])
        step = by_rank["perfmon_step_time_median_seconds"][rank]
        assert step.labels["job"] == job and step.labels["Hostname"] == r["host"]
        assert step.value == pytest.approx(r["step_time_median_s"], rel=0.2)
        assert by_rank["perfmon_data_wait_ratio"][rank].value == pytest.approx(r["data_wait_frac"], abs=0.1)
        assert by_rank["perfmon_samples_per_second"][rank].value == pytest.approx(r["samples_per_s"], rel=0.2)
        assert by_rank["perfmon_steps"][rank].value > 0          # the counter (exposed as perfmon_steps_total)
    verdict = metrics["perfmon_verdict_info"][0]       # an info metric: a gauge of 1 with the labels
    assert verdict.name == "perfmon_verdict_info" and verdict.value == 1.0
    assert verdict.labels["bottleneck"] == report["verdict"]["bottleneck"]
    # unknown is left out, never 0: a CPU job without FLOPs has no MFU sample
    assert not metrics.get("perfmon_mfu_ratio") and report["metrics"]["mfu"] is None
    names = {s.name for samples in metrics.values() for s in samples}
    assert "perfmon_steps_total" in names and all(n.startswith("perfmon_") for n in names)
