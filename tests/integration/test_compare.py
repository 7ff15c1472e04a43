"""``perfmon compare`` on real CPU jobs under ``perfmon run``: a job whose loader costs 2/3 of each
step against its fixed twin (the batches cached in memory), and the fixed job recorded twice
(tests/integration/scripts/loader_pair.py, recorded once for this file and test_gains.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "tui" / "schemas" / "compare.schema.json").read_text()))
PY = sys.executable


def _compare(*argv: str) -> tuple[int, dict]:
    out = subprocess.run([PY, "-m", "tui.cli", "compare", *argv, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    result = json.loads(out.stdout)
    assert not list(VALIDATOR.iter_errors(result))
    return out.returncode, result


@pytest.fixture
def runs(loader_pair) -> dict[str, str]:
    return {name: str(path) for name, path in loader_pair.items()}


@pytest.mark.slow
def test_the_slow_loader_is_what_moved_and_fails_a_10_percent_limit(runs):
    code, out = _compare(runs["fixed"], runs["slow"], "--max-regression", "10")
    assert out["decision"] == "regression", out["summary"]
    assert out["moved"][0]["loss"] == "data_wait" and out["moved"][0]["points"] >= 0.10, out["moved"]
    assert "data wait +" in out["summary"]
    assert code == 1 and out["over_limit"]


@pytest.mark.slow
def test_the_fix_is_an_improvement_and_passes_the_limit(runs):
    code, out = _compare(runs["slow"], runs["fixed"], "--max-regression", "10")
    assert out["decision"] == "improvement" and out["moved"][0]["loss"] == "data_wait", out["summary"]
    assert code == 0


@pytest.mark.slow
def test_the_same_job_recorded_twice_is_no_significant_change(runs):
    code, out = _compare(runs["fixed"], runs["fixed2"])
    assert out["decision"] == "no significant change", out["summary"]
    assert code == 0
