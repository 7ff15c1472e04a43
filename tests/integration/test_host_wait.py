"""Where unexplained step time goes: real CPU loops nobody shaped for perfmon, under ``perfmon run``,
judged by ``perfmon report --json``. A loop that waits ~40% of each step on an unhooked call is not
healthy, its off-CPU loss matches the script's own clock within 0.1 and the top line is the wait's line;
a compute-bound loop stays healthy; pure-Python tokenizing in the step is busy work, not a wait."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from perfmon_analysis.buffers import WINDOW_STEPS
from tests.helpers.perfmon_jobs import run_and_report

SCRIPT = Path(__file__).parent / "scripts" / "inloop_work.py"
STEPS = WINDOW_STEPS + 10      # the report judges the last 50 steps (its window); 10 more to warm up

pytestmark = pytest.mark.slow


def _line_of(text: str) -> int:
    """The script's line that holds ``text`` (the report names lines by number)."""
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def run_loop(mode: str, tmp_path: Path) -> tuple[dict, dict]:
    """(the script's own numbers, the report JSON) for one loop run under ``perfmon run``."""
    own, report = run_and_report(tmp_path / mode, sys.executable, str(SCRIPT), "--mode", mode, "--steps", str(STEPS))
    return own[-1], report


def _loss(report: dict, loss_id: str) -> dict:
    """The verdict's loss with its share, the value of the metric it names."""
    loss = next(x for x in report["verdict"]["losses"] if x["id"] == loss_id)
    return {**loss, "share": report["metrics"][loss["metric"]]}


def test_a_wait_inside_the_step_is_a_host_wait_at_its_line(tmp_path):
    own, report = run_loop("wait", tmp_path)
    v = report["verdict"]
    assert 0.3 <= own["extra_share"] <= 0.45, own
    assert v["bottleneck"] == "host_wait", (v["headline"], v["losses"])
    idle = _loss(report, "device_idle")
    assert idle["share"] == pytest.approx(own["extra_share"], abs=0.1), (idle, own)
    top = v["where"][0]
    assert (Path(top["file"]).name, top["line"], top["state"]) == (SCRIPT.name, _line_of("time.sleep(latency)"),
                                                                   "waiting")
    assert f"{SCRIPT.name}:{top['line']} in fetch_from_service" in v["headline"]


def test_a_compute_bound_loop_stays_healthy(tmp_path):
    own, report = run_loop("compute", tmp_path)
    v = report["verdict"]
    assert v["bottleneck"] == "healthy", (v["headline"], v["losses"])
    assert _loss(report, "device_idle")["share"] <= 0.05
    assert report["metrics"]["device_busy_source"] == "thread_cpu"


def test_tokenizing_in_the_step_is_busy_not_waiting(tmp_path):
    own, report = run_loop("tokenize", tmp_path)
    v = report["verdict"]
    assert v["bottleneck"] != "host_wait", (v["headline"], v["losses"])
    assert _loss(report, "device_idle")["share"] <= 0.1
    busy_line = _line_of("ids = [vocab.setdefault(w, len(vocab))")
    share = {state: sum(w["share"] for w in v["where"] if w["line"] == busy_line and w["state"] == state)
             for state in ("busy", "waiting")}
    # mostly busy: a sample may land while the thread is descheduled on a loaded machine, never most
    assert share["busy"] >= 0.1 and share["waiting"] <= share["busy"] / 3, v["where"]
