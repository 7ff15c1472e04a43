"""Run a plain script under ``perfmon run`` and read what it says of itself and what perfmon says of it.

The scripts (tests/integration/scripts) know nothing of perfmon and print their own clock as JSON lines;
``run_and_report`` returns those lines and the ``perfmon report --json`` of the recording, checked
against the report's schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.helpers.cli import perfmon
from tests.helpers.reports import REPORT_VALIDATOR

ROOT = Path(__file__).parents[2]
SCRIPTS = ROOT / "tests" / "integration" / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def script(name: str) -> str:
    return str(SCRIPTS / name)


def run_and_report(rec: Path, *cmd: str, timeout: float = 180) -> tuple[list[dict], dict]:
    """(the JSON lines the job printed, the report JSON) for ``cmd`` run under ``perfmon run``."""
    run = perfmon("run", "--no-tui", "--record", str(rec), "--", *cmd, timeout=timeout, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    own = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    out = perfmon("report", str(rec), "--json", timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    REPORT_VALIDATOR.validate(report)
    return own, report


def share(report: dict, loss_id: str) -> float | None:
    """The share of the verdict's loss ``loss_id``: the value of the metric it names."""
    loss = next(x for x in report["verdict"]["losses"] if x["id"] == loss_id)
    return report["metrics"][loss["metric"]]


def losses_sum(report: dict) -> float:
    """The measured losses added up: shares of one whole, never more than it."""
    return sum(s for x in report["verdict"]["losses"] if (s := share(report, x["id"])) is not None)


def line_of(path: str, text: str) -> int:
    """The line of ``path`` that holds ``text`` (reports name lines by number)."""
    return next(i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line)
