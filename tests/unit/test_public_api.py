"""The analysis core's public modules say what they export: every ``perfmon_analysis`` module that the
viewer (``tui``) or the probe imports has an ``__all__``, every name in it is defined there, and every
name those packages import from it is in it. A name the TUI starts to use without it becoming public,
or one removed while still listed, fails here."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "perfmon_analysis"


def imports_from_core() -> dict[str, set[str]]:
    """Module -> names that ``tui`` and ``probe`` import from it (``from perfmon_analysis.m import n``,
    or ``from perfmon_analysis import m`` / ``import perfmon_analysis.m as x`` and then ``x.n``)."""
    found: dict[str, set[str]] = {}
    for path in [*(ROOT / "tui").rglob("*.py"), *(ROOT / "probe").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(CORE) and not node.level:
                if node.module == CORE:
                    for a in node.names:
                        found.setdefault(a.name, set())
                        aliases[a.asname or a.name] = a.name
                else:
                    module = node.module.split(".")[1]
                    found.setdefault(module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith(CORE + ".") and a.asname:
                        aliases[a.asname] = a.name.split(".")[1]
                        found.setdefault(aliases[a.asname], set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                found[aliases[node.value.id]].add(node.attr)
    return found


def test_every_core_module_the_viewer_or_probe_imports_lists_what_it_exports():
    used = imports_from_core()
    assert {"analysis", "verdict", "views", "metrics"} <= set(used)
    problems = []
    for module, names in sorted(used.items()):
        mod = importlib.import_module(f"{CORE}.{module}")
        exported = getattr(mod, "__all__", None)
        if exported is None:
            problems.append(f"{module}: no __all__")
            continue
        problems += [f"{module}: __all__ lists {n}, which it does not define" for n in exported if not hasattr(mod, n)]
        problems += [f"{module}: {n} is imported from outside the core but not in __all__"
                     for n in sorted(names - set(exported)) if not (hasattr(mod, n) and isinstance(getattr(mod, n),
                                                                                            type(ast)))]
    assert problems == []


def test_the_check_finds_a_name_used_but_not_exported(monkeypatch):
    from perfmon_analysis import verdict
    monkeypatch.setattr(verdict, "__all__", [n for n in verdict.__all__ if n != "evaluate"])
    with pytest.raises(AssertionError, match="verdict: evaluate is imported from outside the core but not in __all__"):
        test_every_core_module_the_viewer_or_probe_imports_lists_what_it_exports()
