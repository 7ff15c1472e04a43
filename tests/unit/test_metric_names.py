"""Every metric output name is spelled once, in ``perfmon_analysis/metrics.py`` (issue 40): a Prometheus
family, a trainer callback key (``perfmon/...``) or a report metric key read back by its string
anywhere else would be a second name list that a rename in the table leaves behind."""

from __future__ import annotations

import ast
from pathlib import Path

from perfmon_analysis import metrics as M

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("perfmon_analysis", "probe", "tui")      # tests, bench, scripts and docs read the outputs as users do
TABLE = "perfmon_analysis/metrics.py"

# Where the same spelling is not the output name (each with why):
FAMILY_EXEMPT = {
    # Perfetto trace metadata (``perfmon export --trace``): a trace argument, not a scrape family
    ("tui/export/trace.py", "perfmon_steps"), ("tui/commands/export.py", "perfmon_steps"),
}
KEY_EXEMPT_DIRS = (
    "perfmon_analysis/readings/",   # wire keys: the probe spells a few samples as the metric is named
    "probe/",                       # the probe writes those wire keys (probe/wire.py and its writers)
)
KEY_EXEMPT_FILES = {
    "perfmon_analysis/profile.py": "the profile's own JSON (Profile.as_json: its FLOP/s, peak, steps)",
    "perfmon_analysis/overhead.py": "the overhead's own JSON (Overhead.as_json)",
    "perfmon_analysis/layout_report.py": "the straggling JSON's stages (their own compute_s) and step counts",
    "perfmon_analysis/summary.py": "the relay summary's payload keys: a wire between relays",
    "perfmon_analysis/groups.py": "the relay summary's sums by payload key",
    "perfmon_analysis/questions.py": "the flowchart's questions keyed by the quantity they ask about",
    "perfmon_analysis/outcomes.py": "the walk's answers keyed by question id",
}


# Every component counts its steps under "steps" (the window, a capture, a profile, a memory growth,
# a relay group): that key is not the ``steps`` metric read back.
GENERIC = {"steps"}


def _families() -> set[str]:
    names = {m.prometheus for m in M.METRICS}
    names |= {name for table in (M.GROUP_QUANTITIES, M.GROUP_COUNTS, M.GROUP_SUMS, M.GAIN_FAMILIES)
              for name, _ in table.values()}
    names |= {M.GROUP_EXTREME_RANK, M.GROUP_RELAYS_DOWN, M.GROUP_PREFIX}
    names |= {family[0] for family in (M.MEMORY_FAMILY, M.COMM_BUSBW_FAMILY, M.COMM_SECONDS_FAMILY, M.VERDICT_FAMILY)}
    return names


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """The module's string literals less its docstrings (prose may name a metric)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _key_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """String keys a module reads by: ``x["key"]`` and ``x.get("key", ...)``."""
    out = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if isinstance(key, str):
            out.append((node.lineno, key))
    return out


def violations(root: Path = ROOT) -> list[str]:
    families, report_keys = _families(), {m.name for m in M.METRICS}
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == TABLE:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in _strings(tree):
                s = node.value
                if (s in families and (rel, s) not in FAMILY_EXEMPT) or s.startswith(M.CALLBACK_PREFIX):
                    found.append(f"{rel}:{node.lineno}: {s!r}")
            if rel.startswith(KEY_EXEMPT_DIRS) or rel in KEY_EXEMPT_FILES:
                continue
            found += [f"{rel}:{line}: reads {key!r}" for line, key in _key_reads(tree) if key in report_keys - GENERIC]
    return found



def test_no_metric_output_name_is_spelled_outside_the_table():
    assert violations() == []
