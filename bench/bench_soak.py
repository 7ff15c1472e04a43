"""Soak: a training loop at >= 1,000 steps/s with a viewer attached for a long time.

    python bench/bench_soak.py [--seconds 1800] [--rate 1500]

The job is a real ``probe.start()`` process (socket served, sender and sampler threads
running) whose loop times a tiny CPU torch step (``mon.loader`` + ``mon.step`` + two
phases) paced at ``--rate`` steps/s. The viewer is the TUI's data path without Textual:
``tui.stream.feed.follow`` (the viewer's reader) feeding a ``RunModel``, with ``view()`` + ``evaluate()`` at
4 Hz like the app's refresh timer. Every 10 s the parent reads both processes' RSS
from /proc; at the end it prints the RSS slope (least squares over the samples after a
60 s warm-up, in KiB per minute) and the step accounting: steps the job made = steps
the viewer received + steps announced lost in ``drops`` records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

JOB = "bench-soak"


def job(seconds: float, rate: float, out: str) -> None:
    import torch

    import probe

    torch.set_num_threads(1)
    mon = probe.start(job=JOB, sample_hz=1.0)
    x = torch.ones(8)
    period = 1.0 / rate
    n = 0
    t_end = time.monotonic() + seconds
    next_t = time.monotonic()
    batches = iter(lambda: x, None)
    for batch in mon.loader(batches):
        with mon.step(samples=8):
            with mon.phase("forward"):
                y = (batch * 2.0).sum()
            with mon.phase("optimizer"):
                y.add_(1.0)
        n += 1
        next_t += period
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.1:
            next_t = time.monotonic()
        if n % 1000 == 0 and time.monotonic() >= t_end:
            break
    mon.close()
    Path(out).write_text(json.dumps({"steps": n}))


def viewer(socket_path: str, out: str) -> None:
    from perfmon_analysis.runmodel import RunModel
    from perfmon_analysis.verdict import evaluate
    from tui.stream.discovery import resolve_live
    from tui.stream.feed import LiveFeed, follow

    model = RunModel()
    counts = {"steps": 0, "dropped": 0, "drops_records": 0}
    last_view = [0.0]

    def tap(stream: str, rec: dict) -> None:
        kind = rec["k"]
        if kind == "step":
            counts["steps"] += 1
        elif kind == "drops":
            counts["drops_records"] += 1
            counts["dropped"] += int(rec.get("count") or 0)
        now = time.monotonic()
        if now - last_view[0] >= 0.25:
            last_view[0] = now
            evaluate(model.view())

    feed = LiveFeed(model, None, resolve_live(socket_path), rescan=False)
    feed.tap = tap
    follow(feed)
    Path(out).write_text(json.dumps(counts))


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope in KiB per minute."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return sxy / sxx * 60.0 if sxx else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1800.0)
    ap.add_argument("--rate", type=float, default=1500.0)
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--role", choices=["job", "viewer"])
    ap.add_argument("--out")
    ap.add_argument("--socket")
    args = ap.parse_args()
    if args.role == "job":
        job(args.seconds, args.rate, args.out)
        return 0
    if args.role == "viewer":
        viewer(args.socket, args.out)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="perfmon-soak-"))
    env = dict(os.environ, PERFMON_DIR=str(tmp / "sock"), PYTHONPATH=str(ROOT))
    job_p = subprocess.Popen([sys.executable, __file__, "--role", "job", "--seconds", str(args.seconds),
                              "--rate", str(args.rate), "--out", str(tmp / "job.json")], env=env)
    sock_dir = tmp / "sock"
    deadline = time.monotonic() + 60
    sock = None
    while time.monotonic() < deadline and sock is None:
        found = sorted(sock_dir.glob("*.sock")) if sock_dir.exists() else []
        sock = str(found[0]) if found else None
        time.sleep(0.05)
    if sock is None:
        job_p.kill()
        print("job never opened its socket")
        return 1
    view_p = subprocess.Popen([sys.executable, __file__, "--role", "viewer", "--socket", sock,
                               "--out", str(tmp / "viewer.json")], env=env)
    t0 = time.monotonic()
    job_rss: list[tuple[float, int]] = []
    view_rss: list[tuple[float, int]] = []
    while job_p.poll() is None:
        time.sleep(10.0)
        t = time.monotonic() - t0
        for pid, series in ((job_p.pid, job_rss), (view_p.pid, view_rss)):
            v = rss_kib(pid)
            if v is not None:
                series.append((t, v))
        if job_rss:
            print(f"t={t:6.0f}s job RSS {job_rss[-1][1]} KiB viewer RSS {view_rss[-1][1] if view_rss else '?'} KiB",
                  flush=True)
    view_p.wait(timeout=60)
    j = json.loads((tmp / "job.json").read_text())
    v = json.loads((tmp / "viewer.json").read_text())
    elapsed = time.monotonic() - t0
    late_j = [p for p in job_rss if p[0] >= args.warmup]
    late_v = [p for p in view_rss if p[0] >= args.warmup]
    print(f"steps made {j['steps']} in {elapsed:.0f} s ({j['steps'] / elapsed:.0f} steps/s)")
    print(f"viewer received {v['steps']} step records, {v['dropped']} announced lost in {v['drops_records']} "
          f"drops records; unaccounted: {j['steps'] - v['steps'] - v['dropped']}")
    for name, series, late in (("job", job_rss, late_j), ("viewer", view_rss, late_v)):
        if late:
            print(f"{name} RSS: {late[0][1]} KiB at {late[0][0]:.0f} s -> {late[-1][1]} KiB at {late[-1][0]:.0f} s; "
                  f"slope after warm-up {slope(late):+.1f} KiB/min (max {max(x for _, x in series)} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
