"""The fault suite at CI size (issue 12); bench/bench_faults.py runs the same functions long.

Each test prints its figures (``pytest -s`` shows them)."""

from __future__ import annotations

import os
import shutil

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


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_another_user_is_refused_with_one_line():
    results = faults.other_user("nobody")
    print(results)
    for name, r in results.items():
        assert r["rc"] != 0, name
        assert r["stdout"] == "", name                       # nothing of the job is shown
        assert len(r["stderr"].splitlines()) == 1 and "Traceback" not in r["stderr"], (name, r["stderr"])
        assert "permission denied" in r["stderr"] or "refusing" in r["stderr"], (name, r["stderr"])


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
