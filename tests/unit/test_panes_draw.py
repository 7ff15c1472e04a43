"""Panes draw, the verdict judges: no module of the app or the exports compares a number with a
threshold of its own (a float literal) or imports one of the flowchart's thresholds; what they
mark (a judged number, a stalled rank, the slowest rank on the heatmap) comes judged from the
verdict or the view."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRAWING = [*sorted((ROOT / "tui" / "app").rglob("*.py")), *sorted((ROOT / "tui" / "export").rglob("*.py"))]
THRESHOLD_HOMES = {"perfmon_analysis.flowchart", "perfmon_analysis.questions", "perfmon_analysis.comm_stats"}


def judgements(source: str) -> list[str]:
    """Each comparison against a float literal, and each upper-case name imported from where the
    thresholds live."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and isinstance(c.value, float)
                                                 for c in (node.left, *node.comparators)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and node.module in THRESHOLD_HOMES:
            found += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name.isupper()]
    return found


def test_no_pane_or_export_judges_a_number_itself():
    assert len(DRAWING) > 20
    assert {str(p.relative_to(ROOT)): j for p in DRAWING if (j := judgements(p.read_text()))} == {}


def test_the_check_finds_a_planted_judgement():
    planted = "from perfmon_analysis.flowchart import DATA_WAIT_MIN\ndef f(r):\n    return r.x > 5.0\n"
    assert judgements(planted) == ["1: imports DATA_WAIT_MIN", "3: r.x > 5.0"]
