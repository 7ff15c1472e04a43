"""The fault suite at CI size; bench/bench_faults.py runs the same functions long.

Each test prints its figures (``pytest -s`` shows them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration import faults

pytestmark = pytest.mark.slow


def test_kill9_at_random_points_leaves_intact_prefixes_that_report_reads():
    f = faults.kill9(points=20, seed=12, report_every=4)
    print(f)
    assert f["files"] >= 8                                # most kills came after the file existed
    assert f["corrupt"] == 0 and f["bad_prefix"] == 0, f["failures"]
    assert f["report_failed"] == 0, f["failures"]
    assert f["report_ok"] + f["report_one_line"] >= 1


@pytest.mark.parametrize("method,workers", [("fork", 12), ("forkserver", 4), ("spawn", 4)])
def test_dataloader_worker_starts_with_viewers_attached_never_send(method, workers):
    f = faults.forks(method, workers, viewers=2, timeout=240)
    print({k: v for k, v in f.items() if k != "stderr"})
    assert not f["hang"], f.get("stderr")
    assert f["rc"] == 0, f["stderr"]
    assert f["workers"] == workers and f["viewers_bad"] == []


def test_viewer_storm_leaves_no_fd_behind_and_keeps_the_loop_running():
    f = faults.storm(cycles=1000, stalled=10, block_seconds=1.0, blocks=2)
    print(f)
    assert f["rc"] == 0 and f["viewers_after"] == 0
    assert f["fds_after"] == f["fds_before"]
    assert f["cycles"] == 1000
    # the loop kept stepping through the storm: each storm block made steps at a rate close to the quiet ones
    assert f["steps"] > 0 and f["ratio"] < 10


@pytest.fixture
def other_user() -> str:
    """``nobody``, where this run may act as it: root, setpriv, and an interpreter it can run."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    if faults.other_user_python("nobody") is None:
        pytest.skip("no interpreter nobody can run (the venv's base interpreter and python3 are private)")
    return "nobody"


def test_another_user_is_refused_with_one_line(other_user):
    """The other user runs perfmon from a world-readable copy (faults.other_user says why): what
    refuses it here is the job's socket directory, socket and recording modes, wherever the
    checkout lives and whatever its mode."""
    results = faults.other_user(other_user)
    print(results)
    control = results["control"]
    assert control["rc"] == 0 and control["schema"] == "perfmon.report/2", control   # the client works
    for name, (target, r) in results["refused"].items():
        assert r["rc"] != 0, name
        assert r["stdout"] == "", name                       # nothing of the job is shown
        assert len(r["stderr"].splitlines()) == 1 and "Traceback" not in r["stderr"], (name, r["stderr"])
        assert "permission denied" in r["stderr"] or "refusing" in r["stderr"], (name, r["stderr"])
        assert target in r["stderr"], (name, r["stderr"])    # refused for what it asked about
    assert results["written by the other user"] == []


def test_the_other_user_test_passes_from_a_private_checkout(other_user, tmp_path):
    """A clone in a 0700 directory (``mktemp -d``, a home like /root), its venv inside it, must pass
    the suite as a world-readable one does. The other-user test (the one that runs code as another
    user) runs from such a copy of this checkout: a venv made there reaches this venv's packages by a
    path entry (no pip install), and ours only from the copy."""
    import sysconfig
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    checkout = private / "perfmon"
    checkout.mkdir()
    for name in ("pyproject.toml", "probe", "perfmon_analysis", "tui", "tests"):
        src = faults.ROOT / name
        if src.is_dir():
            shutil.copytree(src, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, checkout / name)
    venv = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    ours = {"base": str(venv), "platbase": str(venv)}
    for key in ("purelib", "platlib"):
        Path(sysconfig.get_path(key, vars=ours), "deps.pth").write_text(sysconfig.get_path(key) + "\n")
    test_id = "tests/integration/test_faults.py::test_another_user_is_refused_with_one_line"
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "--no-cov", "-rA", test_id], capture_output=True, text=True, timeout=600, cwd=checkout)
    print(r.stdout[-3000:])
    assert f"rootdir: {checkout}" in r.stdout                   # the copy's suite ran, not this checkout's
    assert r.returncode == 0 and f"PASSED {test_id}" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def test_warnings_as_errors_runs_train_identically_with_and_without_the_probe():
    runs = faults.warnings_runs()
    print({k: {kk: vv for kk, vv in v.items() if kk != "losses"} for k, v in runs.items()})
    plain = runs["plain"]
    assert plain["rc"] == 0 and len(plain["losses"]) == 60
    for name, r in runs.items():
        assert r["rc"] == 0, (name, r["stderr"])
        assert r["losses"] == plain["losses"], name
    for name in ("probe+sim-cuda -W error", "probe+sim-cuda PYTHONWARNINGS=error"):
        assert runs[name]["steps_recorded"] == 60 and runs[name]["syncs"] == [1]   # one sync counted per step
