"""probe/ without back doors: no import cycle (lazy imports included), no module
writing a Probe's private attributes, no module over ~500 lines without a stated reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "probe"
# over the limit, reason stated in the module docstring ("... lines on purpose ...")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in PROBE.rglob("*.py"):
        rel = path.relative_to(PROBE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):     # imports under `if TYPE_CHECKING:` never run
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def test_no_import_cycle_in_probe():
    mods = _modules()
    graph = {name: _imports(path, name, set(mods)) for name, path in mods.items()}
    # a package imports its submodules' parents implicitly: "probe.gpu.cuda" runs "probe.gpu" first
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if nxt == "probe" or nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt])
                                     if nxt in stack else f"{node} -> {nxt}")
            if state.get(nxt) is None:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in graph:
        if name != "probe" and state.get(name) is None:
            visit(name, [name])


def test_no_module_writes_a_probes_private_attributes():
    pattern = re.compile(r"\b(probe|mon|p)\._[a-z]\w*\s*(=|\.append|\.extend|\[)")
    offenders = [f"{path.name}:{i}" for name, path in _modules().items() if name != "probe.core"
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_modules_stay_small_or_say_why():
    for name, path in _modules().items():
        lines = len(path.read_text().splitlines())
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "lines on purpose" in doc, f"{name}: {lines} lines and no stated reason"
