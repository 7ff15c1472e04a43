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


# each formatter at both sides of each of its boundaries, its sign, and unknown
SHOWN = [
    (units.pct, 0.381, "38%"), (units.pct, None, "n/a"), (lambda v: units.pct(v, 1), 0.3814, "38.1%"),
    (units.seconds, None, "n/a"), (units.seconds, 0.000_5, "500µs"), (units.seconds, -0.000_5, "-500µs"),
    (units.seconds, 0.001, "1ms"), (units.seconds, 0.999, "999ms"), (units.seconds, -0.25, "-250ms"),
    (units.seconds, 1.0, "1s"), (units.seconds, 119.0, "119s"), (units.seconds, 120.0, "2m"),
    (units.seconds, 7199.0, "120m"), (units.seconds, 7200.0, "2.0h"), (units.seconds, -7200.0, "-2.0h"),
    (units.age, None, "n/a"), (units.age, -5.0, "0s"), (units.age, 59.9, "59s"), (units.age, 60.0, "1m00s"),
    (units.age, 3599.0, "59m59s"), (units.age, 3600.0, "1h00m"), (units.age, 4_830.0, "1h20m"),
    (units.nbytes, None, "n/a"), (units.nbytes, 999.0, "999B"), (units.nbytes, 999.5, "1.0kB"),
    (units.nbytes, 1.5e3, "1.5kB"), (units.nbytes, 2.5e6, "2.5MB"), (units.nbytes, 3.2e9, "3.2GB"),
    (units.nbytes, 4e12, "4.0TB"), (units.nbytes, 5e15, "5000.0TB"), (units.nbytes, -2e3, "-2.0kB"),
    (units.rate, None, "n/a"), (units.rate, 12.0, "12/s"), (units.rate, 1520.0, "1.52k/s"),
    (units.rate, 2.5e6, "2.5M/s"), (units.rate, 3e9, "3G/s"),
    (units.count, None, "n/a"), (units.count, 16512.0, "16.5k"), (units.count, 7e15, "7P"),
    (units.count, 7e18, "7e+03P"), (units.count, 999.0, "999"),
    (units.bandwidth, 5e12, "5TB/s"), (units.bandwidth, 800.0, "800B/s"),
    (units.number, None, "n/a"), (units.number, 3.14159, "3.14"), (lambda v: units.number(v, 5), 3.14159, "3.1416"),
    (lambda v: units.ratio(v, 3), 0.5, "0.500"),
    (units.speedup, None, "n/a"), (units.speedup, 1.053, "1.05×"), (units.speedup, 1.1, "1.1×"),
    (units.speedup, 1.43, "1.4×"), (units.speedup, 9.96, "10.0×"), (units.speedup, 10.0, "10×"),
    (units.speedup, 12.5, "12×"),
    (units.hours, None, "n/a"), (units.hours, 3.14, "3.1"), (units.hours, 0.042, "0.042"),
    (units.hours, 99.0, "99"), (units.hours, 100.4, "100"), (units.hours, 1234.0, "1234"),
    (units.hours, -150.0, "-150"),
    (units.money, None, "n/a"), (units.money, 31.24, "31.2"), (units.money, 999.0, "999"),
    (units.money, 1000.0, "1,000"), (units.money, 1234567.0, "1,234,567"), (units.money, -2000.0, "-2,000"),
    (units.energy, None, "n/a"), (units.energy, 0.35, "350mJ"), (units.energy, -0.5, "-500mJ"),
    (units.energy, 1.0, "1J"), (units.energy, 1520.0, "1.52kJ"), (units.energy, 3e6, "3MJ"),
    (units.energy, 4e9, "4GJ"), (units.energy, 5e12, "5e+03GJ"),
    (units.change, None, "n/a"), (units.change, 0.41, "+41%"), (units.change, -0.032, "-3%"),
    (lambda v: units.change(v, 1), 0.0125, "+1.2%"),
    (units.age, 7_140.0, "1h59m"), (units.bandwidth, 2.5e6, "2.5MB/s"), (units.count, 2.5e6, "2.5M"),
    (units.count, 3e9, "3G"), (units.count, 4e12, "4T"), (units.energy, 0.999, "999mJ"), (units.hours, 100.0, "100"),
    (units.seconds, 3.6e6, "1000.0h"), (units.seconds, 5e-7, "0µs"),
    (units.points, None, "n/a"), (units.points, 0.25, "+25 pts"), (units.points, -0.1, "-10 pts"),
    (lambda v: units.points(v, 1), 0.125, "+12.5 pts"),
]


@pytest.mark.parametrize("fmt,value,shown", SHOWN)
def test_every_formatter_at_its_bounds(fmt, value, shown):
    assert fmt(value) == shown
