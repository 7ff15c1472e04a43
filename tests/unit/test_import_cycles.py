"""No import cycle inside ``tui/``, ``perfmon_analysis/`` or ``probe/``, found by reading import statements (``ast``).

A cycle makes the import order matter and hides which room depends on which; every
import counts, including the lazy ones inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_graph(package: str) -> dict[str, set[str]]:
    """``module -> modules of the same package it imports``, packages named by their ``__init__``."""
    files = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        files[".".join(parts)] = (path, is_pkg)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in files.items():
        here = name if is_pkg else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:   # `import a.b.c` where c is not a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}   # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_cycle_finder_sees_a_cycle_and_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_resolves_from_imports_to_modules():
    assert "perfmon_analysis.views" in module_graph("perfmon_analysis")["perfmon_analysis.verdict"]
    graph = module_graph("tui")
    assert "tui.stream.discovery" in graph["tui.stream.feed"]


@pytest.mark.parametrize("package", ["tui", "perfmon_analysis", "probe"])
def test_no_import_cycle(package):
    assert find_cycle(module_graph(package)) is None
