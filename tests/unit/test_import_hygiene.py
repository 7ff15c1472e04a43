"""The probe never pulls in the UI; the viewer commands never pull in torch.

Checked in a fresh interpreter, because only a subprocess proves that an import
is really absent (Harlequin's approach).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

VIEWER_MODULES = ["tui.cli", "tui.discovery", "tui.sources", "tui.record", "tui.report", "tui.runmodel",
                  "tui.verdict", "tui.attach", "tui.app"]


def modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_probe_import_and_start_do_not_import_textual_or_rich(tmp_path):
    loaded = modules_after(f"import probe\nmon = probe.start(job='hygiene', record={str(tmp_path)!r})\n"
                           "with mon.step():\n    pass\nmon.close()")
    assert "probe" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich")}


@pytest.mark.parametrize("module", VIEWER_MODULES)
def test_viewer_modules_do_not_import_torch(module):
    loaded = modules_after(f"import importlib.util\n"
                           f"if importlib.util.find_spec({module!r}) is None: raise SystemExit('missing {module}')\n"
                           f"import {module}")
    assert module in loaded
    assert not {m for m in loaded if m.split(".")[0] == "torch"}
