"""The report ``perfmon report`` prints, from a run model, and the schema it follows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.report import build, render_text
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.verdict import evaluate

REPORT_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "tui" / "schemas" / "report.schema.json").read_text())
REPORT_VALIDATOR = jsonschema.Draft202012Validator(REPORT_SCHEMA)


def report_of(model: RunModel) -> dict[str, Any]:
    """The report ``perfmon report`` prints for this model: its view, judged, built as
    ``Analysis.report`` builds it."""
    return report_and_text(model)[0]


def report_and_text(model: RunModel) -> tuple[dict[str, Any], str]:
    """The report of ``report_of`` and its text, from the same view and verdict."""
    view = model.view()
    verdict = evaluate(view)
    return build(view, verdict, retired=model.retired), render_text(view, verdict, retired=model.retired)


def analysed(analysis: Analysis) -> tuple[dict[str, Any], str]:
    """``perfmon report``'s JSON and text of one snapshot of ``analysis``."""
    snapshot = analysis.snapshot()
    return analysis.report(snapshot=snapshot), analysis.text_report(snapshot)
