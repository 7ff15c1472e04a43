"""A wire key is read in the ``perfmon_analysis.readings`` package only: every other module of the analysis
core reads typed readings, so a key is spelled in the wire schema and one parser, and a renamed
key cannot leave a second reader behind. ``summary.py`` and ``groups.py`` write and read their own
payloads (a relay's ``summary``, a group relay's ``group``)."""

from __future__ import annotations

import ast
from pathlib import Path

import perfmon_analysis

PACKAGE = Path(perfmon_analysis.__file__).parent
PARSERS = {"readings", "summary.py", "groups.py"}    # the readings package, a relay's summary and a group relay's group

# Literal keys read outside the parsers on purpose, per module and function (None: any function).
ALLOWED: dict[tuple[str, str | None], tuple[frozenset[str] | None, str]] = {
    ("runmodel.py", "ingest"): (frozenset({"k"}), "ingest dispatches on the record's kind"),
    ("profile.py", "profile_lines"): (None, "the report's profile JSON (ModuleProfile.as_json), not a record"),
    ("profile.py", "_top"): (None, "rows of the report's profile JSON, not a record"),
    ("sketch.py", "read"): (frozenset({"z", "b"}), "a sketch's own wire form (Sketch.wire), inside a group record"),
    ("verdict.py", None): (frozenset({"skipped", "undecided", "id"}), "the verdict's own evidence and findings"),
    ("questions.py", None): (frozenset({"data_wait", "comm_exposed", "device_idle"}),
                             "the verdict's loss accounting by loss id"),
    ("outcomes.py", None): (frozenset({"loader_cpu", "device_idle", "comm_exposed", "device_busy", "host_ahead"}),
                            "the verdict's answers and losses by question and loss id"),
    ("explain.py", None): (frozenset({"name", "source", "rank", "count", "where"}),
                           "JobView.events: event records as the log pane lists them"),
    ("runmodel.py", "view"): (frozenset({"comm"}), "RankState.unmeasured, by the quantity the probe named"),
    ("metrics.py", "_idle"): (frozenset({"device_idle"}), "the loss accounting by loss id"),
    ("report.py", "render_text"): (frozenset({"seconds", "steps", "pid", "restart", "id", "message", "skipped"}),
                                   "the view's window, retired hellos, the verdict's findings and skipped questions"),
    ("layout_report.py", None): (None, "the report's layout and straggling JSON and its rank rows, not a record"),
    ("report.py", "gains_lines"): (None, "the report's verdict gains (Gains.as_json), not a record"),
    ("capture.py", "capture_reading"): (frozenset({"overhead", "baseline_step_s", "captured_step_s"}),
                                        "the report's captures entry (CaptureSummary.as_json), not a record"),
    ("compare.py", "render_text"): (None, "the comparison dict ``compare`` made, not a record"),
    ("compare.py", "summary"): (None, "the comparison dict ``compare`` made, not a record"),
    ("compare.py", "_moved_words"): (None, "the comparison dict ``compare`` made, not a record"),
    ("compare.py", "_fmt_change"): (None, "a row of the comparison dict, not a record"),
    ("overhead.py", "text_lines"): (None, "the report's overhead JSON (Overhead.as_json), not a record"),
    ("report.py", "_verdict_json"): (frozenset({"evidence"}), "the verdict's JSON, not a record"),
    ("report.py", "build"): (frozenset({"seconds", "steps", "pid", "restart"}),
                             "the view's window, and the hellos of retired processes the run model keeps"),
}
TYPE_NAMES = {"list", "dict", "tuple", "set", "frozenset", "type"}     # list["Name"]: an annotation


def literal_key_reads(source: str) -> list[tuple[str | None, str, int]]:
    """(enclosing function, key, line) of each ``x.get("key")`` and ``x["key"]`` read in ``source``."""
    tree = ast.parse(source)
    owner: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                owner[id(node)] = fn.name        # ast.walk is breadth first: the innermost function wins
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                and not (isinstance(node.value, ast.Name) and node.value.id in TYPE_NAMES):
            key = node.slice.value
        if key is not None:
            found.append((owner.get(id(node)), key, node.lineno))
    return found


def offences(module: str, source: str) -> list[str]:
    out = []
    for function, key, line in literal_key_reads(source):
        allowed = ALLOWED.get((module, function)) or ALLOWED.get((module, None))
        if allowed is None or (allowed[0] is not None and key not in allowed[0]):
            out.append(f"{module}:{line} {function or '<module>'} reads {key!r}")
    return out


def test_no_module_past_the_parsers_reads_a_record_key():
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in PARSERS)
    assert len(modules) > 8 and all(p.parent == PACKAGE for p in modules)
    found = [o for path in modules for o in offences(path.name, path.read_text())]
    assert found == []


def test_the_check_finds_a_planted_key_read_in_either_form():
    planted = '''
def window(state):
    first = state.steps[0]
    return first.get("dur"), first["gap"]


def ingest(self, record):
    kind = record.get("k")
    return record["t"]
'''
    assert sorted(offences("stats.py", planted)) == ["stats.py:4 window reads 'dur'", "stats.py:4 window reads 'gap'",
                                                     "stats.py:8 ingest reads 'k'", "stats.py:9 ingest reads 't'"]
    # ingest may dispatch on the kind, and read nothing else
    assert sorted(offences("runmodel.py", planted)) == ["runmodel.py:4 window reads 'dur'",
                                                       "runmodel.py:4 window reads 'gap'",
                                                       "runmodel.py:9 ingest reads 't'"]
    # an annotation's string is no key
    assert offences("views.py", "def f() -> list['Row']:\n    return []\n") == []
