"""The probe does not start inside DataLoader workers, and forked workers stay silent."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.streamutil import JOBS, connect, read_until


def test_dataloader_workers_get_no_probe_and_the_main_stream_is_intact():
    proc = subprocess.Popen([sys.executable, str(JOBS / "loader_workers_job.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    sock = connect(path)
    records = read_until(sock, lambda rs: any(r["k"] == "bye" for r in rs), timeout=60)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "ok 8"
    hellos = [r for r in records if r["k"] == "hello"]
    assert len(hellos) == 1 and hellos[0]["pid"] == proc.pid
    assert [r["step"] for r in records if r["k"] == "step"] == list(range(8))
