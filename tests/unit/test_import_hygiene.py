"""Each room imports only what it may: the probe never pulls in the viewer (``tui``), the viewer
never pulls in torch, the stream readers never pull in Textual, and the analysis core
(``perfmon_analysis``, shared by the viewer and the probe's trainer callbacks) pulls in neither
the viewer, Textual, torch nor socket/asyncio I/O.

Checked in a fresh interpreter, because only a subprocess proves that an import
is really absent (Harlequin's approach).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

VIEWER_MODULES = ["tui.cli", "tui.stream.discovery", "tui.stream.sources", "tui.stream.feed", "tui.commands.ls",
                  "tui.commands.record", "tui.commands.report", "perfmon_analysis.runmodel", "perfmon_analysis.verdict",
                  "tui.commands.attach", "tui.app.perfmon_app", "tui.commands.relay", "tui.stream.remote",
                  "tui.commands.inject.inject", "tui.commands.inject.detach"]
ROOT = Path(__file__).resolve().parents[2]
MODEL_MODULES = ["perfmon_analysis.runmodel", "perfmon_analysis.verdict", "perfmon_analysis.readings",
                 "perfmon_analysis.flowchart", "perfmon_analysis.explain", "perfmon_analysis.units",
                 "perfmon_analysis.losses", "perfmon_analysis.stuck"]
STREAM_MODULES = ["tui.stream.discovery", "tui.stream.sources", "tui.stream.feed", "tui.stream.native",
                  "tui.stream.hosts", "tui.stream.remote", "tui.stream.connect", "tui.commands.relay"]
UI = ("textual", "rich")
# Checked in the model's own source: the interpreter's own start-up loads socket and selectors
# modules, so sys.modules cannot tell whether the model itself does I/O.
MODEL_SOURCE_FORBIDDEN = (*UI, "torch", "asyncio", "socket", "selectors", "tui")


def modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.mark.slow
def test_probe_import_and_start_do_not_import_textual_or_rich(tmp_path):
    loaded = modules_after(f"import probe\nmon = probe.start(job='hygiene', record={str(tmp_path)!r})\n"
                           "with mon.step():\n    pass\nmon.close()")
    assert "probe" in loaded
    assert not {m for m in loaded if m.split(".")[0] in UI}


@pytest.mark.slow
@pytest.mark.parametrize("module", VIEWER_MODULES)
def test_viewer_modules_do_not_import_torch_or_the_probe_core(module):
    """The viewer reads the probe's wire, paths and recording modules only: a copy of perfmon without
    torch or psutil (another user's, a login node's) runs ``attach`` and ``report``."""
    loaded = modules_after(f"import importlib.util\n"
                           f"if importlib.util.find_spec({module!r}) is None: raise SystemExit('missing {module}')\n"
                           f"import {module}")
    assert module in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("torch", "psutil")}
    assert "probe.core" not in loaded


@pytest.mark.slow
def test_no_command_loads_the_ptrace_injector_into_perfmon_itself():
    loaded = modules_after("import tui.commands.attach, tui.commands.inject.inject, tui.commands.inject.detach")
    assert not {m for m in loaded if m.split(".")[0] in ("hypno", "pyinjector")}


@pytest.mark.slow
def test_model_imports_no_ui_or_torch():
    loaded = modules_after("\n".join(f"import {m}" for m in MODEL_MODULES))
    assert set(MODEL_MODULES) <= loaded
    assert not {m for m in loaded if m.split(".")[0] in (*UI, "torch")}


def imports_in(package: str, forbidden: tuple[str, ...]) -> set[tuple[str, str]]:
    """(file, module) for every import statement in ``package``'s source, lazy ones included, of a
    module in ``forbidden`` (or under one)."""
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found |= {(str(path.relative_to(ROOT)), n) for n in names
                      if any(n == bad or n.startswith(bad + ".") for bad in forbidden)}
    return found


def test_model_source_imports_no_io_ui_or_viewer():
    assert imports_in("perfmon_analysis", MODEL_SOURCE_FORBIDDEN) == set()


def test_probe_source_never_imports_the_viewer():
    """The arrow goes one way: the viewer reads the probe's wire schema; the probe (trainer callbacks
    included) gets its numbers from the analysis core, never from ``tui``."""
    assert imports_in("probe", ("tui", *UI)) == set()


@pytest.mark.slow
def test_stream_imports_no_textual():
    loaded = modules_after("\n".join(f"import {m}" for m in STREAM_MODULES))
    assert set(STREAM_MODULES) <= loaded
    assert not {m for m in loaded if m.split(".")[0] in UI}
