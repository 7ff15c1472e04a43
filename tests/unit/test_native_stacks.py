"""py-spy for the stack of a rank that cannot report it (the stuck screen's ``d``): offered when
installed, never required, and every way it can fail is one line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tui.stream import native


def fake_pyspy(directory: Path, body: str) -> None:
    exe = directory / "py-spy"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_without_py_spy_it_is_not_offered_and_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not native.available()
    assert native.dump(123) == "py-spy is not installed (pip install py-spy) to read a stack from outside the process"


@pytest.mark.slow
def test_the_dump_is_py_spys_nonblocking_output_for_that_pid(monkeypatch, tmp_path):
    fake_pyspy(tmp_path, 'echo "args: $*"; echo "Thread 1 (idle): MainThread"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert native.available()
    assert native.dump(4711) == "args: dump --nonblocking --pid 4711\nThread 1 (idle): MainThread"


@pytest.mark.slow
def test_a_failing_py_spy_gives_its_last_error_line(monkeypatch, tmp_path):
    fake_pyspy(tmp_path, 'echo "Error: first" >&2; echo "Error: Permission denied (os error 13)" >&2; exit 1')
    monkeypatch.setenv("PATH", str(tmp_path))
    assert native.dump(9) == ("py-spy dump --pid 9: Error: Permission denied (os error 13) "
                              "(another user's process, or ptrace not allowed?)")
