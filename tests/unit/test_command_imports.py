"""The commands stand side by side: no ``tui/commands/<x>`` imports another ``tui/commands/<y>``
(what two commands share lives in ``tui/stream`` or ``tui/app``), and the commands, the exports,
the app and the trainer callbacks reach the run model and the verdict through the analysis facade
(``perfmon_analysis.analysis.Analysis``), never by building them and chaining them themselves.
Read from the import statements and calls (``ast``), lazy ones inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_import_cycles import ROOT, module_graph

COMMANDS = "tui.commands"
# Modules that take the view, the verdict and the report from ``Analysis``: everything outside the core.
FACADE_USERS = [*sorted((ROOT / "tui").rglob("*.py")), *sorted((ROOT / "probe").rglob("*.py"))]
# What only the facade chains: building a run model, the verdict's hysteresis, assembling a report.
CHAINED = {"RunModel", "VerdictTracker", "build"}


def command_of(module: str) -> str | None:
    """``tui.commands.demo.cli`` -> ``demo``; None outside the commands."""
    parts = module.split(".")
    return parts[2] if module.startswith(COMMANDS + ".") and len(parts) > 2 else None


def cross_command_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where one command's module imports another command's."""
    return sorted((src, dst) for src, targets in graph.items() for dst in targets
                  if command_of(src) and command_of(dst) and command_of(src) != command_of(dst))


def chained(path: Path) -> set[str]:
    """Names from ``CHAINED`` that the module calls (a ``RunModel(...)``) or imports from the
    verdict or the report (``VerdictTracker``, ``build``); "RunModel" too for an import of it, and
    ".model" for reaching into a feed's or an analysis's run model (``x.analysis.model``,
    ``feed.model``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "perfmon_analysis.runmodel":
            found.add("RunModel")
        if isinstance(node, ast.Attribute) and node.attr in ("model", "_model") and \
                any(word in ast.unparse(node.value).lower() for word in ("analysis", "feed")):
            found.add(".model")
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name == "RunModel":
                found.add(name)
        elif isinstance(node, ast.ImportFrom) and node.module in ("perfmon_analysis.verdict",
                                                                  "perfmon_analysis.report"):
            found |= {alias.name for alias in node.names} & CHAINED
    return found


def test_the_finder_sees_one_command_importing_another_and_allows_its_own_submodules():
    graph = {"tui.commands.report": {"tui.commands.attach", "tui.stream.connect"},
             "tui.commands.doctor": {"tui.commands.doctor.checks"}, "tui.cli": {"tui.commands.report"}}
    assert cross_command_imports(graph) == [("tui.commands.report", "tui.commands.attach")]


def test_no_command_imports_another():
    graph = module_graph("tui")
    assert "tui.stream.connect" in graph["tui.commands.report"]      # the graph sees the commands' imports
    assert cross_command_imports(graph) == []


def test_the_chain_finder_sees_a_model_built_by_hand(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("from perfmon_analysis.verdict import VerdictTracker\n"
                    "def f():\n    from perfmon_analysis import runmodel\n    return runmodel.RunModel()\n")
    assert chained(path) == {"RunModel", "VerdictTracker"}
    path.write_text("def g(feed):\n    return feed.analysis._model.history, feed.model\n")
    assert chained(path) == {".model"}


def test_commands_exports_app_and_callbacks_go_through_the_facade():
    offenders = {str(p.relative_to(ROOT)): found for p in FACADE_USERS if (found := chained(p))}
    assert offenders == {}
