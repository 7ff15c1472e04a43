"""The report ``perfmon report`` prints, from a run model, and the schema it follows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from perfmon_analysis.report import build
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.verdict import evaluate

REPORT_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "tui" / "schemas" / "report.schema.json").read_text())
REPORT_VALIDATOR = jsonschema.Draft202012Validator(REPORT_SCHEMA)


def report_of(model: RunModel) -> dict[str, Any]:
    """The report ``perfmon report`` prints for this model: its view, judged, built as
    ``Analysis.report`` builds it."""
    view = model.view()
    return build(view, evaluate(view), retired=model.retired)
