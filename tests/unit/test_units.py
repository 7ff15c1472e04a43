"""One formatter for every number a person reads: ``perfmon_analysis.units``, and no other place
in the verdict, its explanations and the app's panes and screens formats a number itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from perfmon_analysis import units

ROOT = Path(__file__).resolve().parents[2]
# the modules whose numbers a person reads in the TUI and the verdict
READ_BY_PEOPLE = sorted([*(ROOT / "perfmon_analysis" / f"{m}.py"
                           for m in ("verdict", "explain", "flowchart", "losses", "compare", "gains")),
                         *(ROOT / "tui" / "app" / "widgets").glob("*.py"),
                         *(ROOT / "tui" / "app" / "screens").glob("*.py")])
NUMBER_SPEC = re.compile(r"\.\d|[efgn%]$")     # a precision or a float presentation type: formatting a number


def hand_formatted(path: Path, root: Path = ROOT) -> list[str]:
    """f-string fields in ``path`` that format a number themselves (``{x:.1f}``, ``{x:.0%}``), with their line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FormattedValue) and isinstance(node.format_spec, ast.JoinedStr):
            spec = "".join(p.value for p in node.format_spec.values if isinstance(p, ast.Constant))
            if NUMBER_SPEC.search(spec):
                out.append(f"{path.relative_to(root)}:{node.lineno} {{...:{spec}}}")
    return out


def test_no_pane_screen_or_verdict_module_formats_a_number_itself():
    assert READ_BY_PEOPLE and [x for p in READ_BY_PEOPLE for x in hand_formatted(p)] == []


def test_the_check_finds_a_hand_formatted_number(tmp_path):
    planted = tmp_path / "pane.py"
    planted.write_text('def f(x, w):\n    return f"{x:>{w}} {x:.1f}GB {x:.0%} {x:>6}"\n')
    assert hand_formatted(planted, tmp_path) == ["pane.py:2 {...:.1f}", "pane.py:2 {...:.0%}"]


@pytest.mark.parametrize("fmt,value,shown", [
    (units.bandwidth, 1.5e3, "1.5kB/s"), (units.bandwidth, 12.34e9, "12.3GB/s"), (units.bandwidth, None, "n/a"),
    (units.nbytes, 16.5e9, "16.5GB"), (units.seconds, 0.254, "254ms"), (units.rate, 989e12, "989T/s"),
    (units.ratio, 0.5, "0.50"), (units.ratio, None, "n/a"), (units.fixed, 349.6, "350"), (units.fixed, None, "n/a"),
])
def test_formatters(fmt, value, shown):
    assert fmt(value) == shown


def test_fixed_readings_carry_their_unit_and_places():
    assert units.fixed(65.4, "°C") == "65°C" and units.fixed(3.26, digits=1) == "3.3" and \
        units.rate(989e12, "FLOP") == "989TFLOP/s"
