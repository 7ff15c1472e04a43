"""Viewer cost: CPU and memory of ``perfmon attach`` following 8 ranks at 200 steps/s each,
and the time from launching ``perfmon attach`` to its first full screen.

    python bench/bench_viewer.py [--seconds 60] [--ranks 8] [--rate 200] [--launches 5]

A simulator process serves ``--ranks`` probe endpoints through the real sender
(``probe.server.Sender``: same sockets, framing, backfill and drop accounting
as a training process) and pushes step records at ``--rate`` per second per
rank plus 1 Hz samples and periodic comm records. The viewer runs in a private
tmux server at 120x36 like a user's pane; its CPU comes from psutil
(user+system time over wall time, 1.0 = one core) and its RSS is sampled every
5 s. First-screen time is measured from the outside: launch, then poll the
tmux screen every 20 ms until the verdict bar and every rank's row are drawn.
Budgets (issue #6): under 15% of one core, flat memory, first screen under 1 s.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

JOB = "bench-8x200"


# -- simulator (child process) ---------------------------------------------------------------

def simulate(ranks: int, rate: float) -> None:
    from probe import paths, wire
    from probe.server import Sender

    directory = paths.ensure_dir()
    pid = os.getpid()
    queues = []
    senders = []
    for rank in range(ranks):
        name = paths.base_name(JOB, rank, 0, pid)
        path = directory / f"{name}{paths.SOCKET_SUFFIX}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(8)
        q: collections.deque = collections.deque(maxlen=65_536)
        hello = {"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "job": JOB, "rank": rank,
                 "local_rank": rank, "world_size": ranks, "host": socket.gethostname(), "pid": pid, "restart": 0,
                 "argv": ["bench"], "torch": None, "name": name,
                 "device": {"type": "cpu", "name": "simulated ranks (bench)", "count": os.cpu_count()}}
        sender = Sender(queue=q, build=lambda item: item, hello=hello, listener=sock)
        sender.start()
        queues.append(q)
        senders.append(sender)
    print("ready", flush=True)
    period = 1.0 / rate
    step = 0
    next_t = time.monotonic()
    last_sample = 0.0
    comm_totals = [0.0] * ranks
    while True:
        now = time.time()
        for rank, q in enumerate(queues):
            dur = period * (1.0 + 0.1 * (rank == ranks - 1))
            comm = 0.2 * dur
            comm_totals[rank] += comm
            q.append({"k": "step", "t": now, "step": step, "start": now - dur, "dur": dur, "samples": 32,
                      "phases": {"data": 0.1 * dur, "forward": 0.25 * dur, "backward": 0.45 * dur,
                                 "optimizer": 0.1 * dur, "other": 0.1 * dur},
                      "comm": {"seconds": comm, "exposed": 0.3 * comm, "bytes": 4_000_000, "ops": 2}})
        if now - last_sample >= 1.0:
            last_sample = now
            for rank, q in enumerate(queues):
                q.append({"k": "sample", "t": now, "host": {"cpu": 0.9, "cpu_count": os.cpu_count(), "sys_cpu": 0.5,
                                                            "rss": 1 << 30, "mem_limit": 16 << 30,
                                                            "mem_limit_source": "machine", "loader_workers": 2,
                                                            "loader_cpu": 0.3}})
                q.append({"k": "comm", "t": now, "backend": "gloo", "world_size": ranks, "ops": [
                    {"op": "all_reduce", "count": 2 * (step + 1), "bytes": 4_000_000 * (step + 1),
                     "seconds": comm_totals[rank]}]})
        step += 1
        next_t += period
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_t = time.monotonic()   # behind: do not burst to catch up


# -- measurement ---------------------------------------------------------------------------

class Tmux:
    def __init__(self, sock: str) -> None:
        self.sock = sock

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.sock, *args], capture_output=True, text=True, timeout=10).stdout


def attach_command(env_dir: str) -> str:
    return f"exec env PERFMON_DIR={env_dir} TERM=xterm-256color {sys.executable} -m tui.cli attach {JOB}"


def full_screen(text: str, ranks: int) -> bool:
    """The verdict bar shows a confirmed verdict and the ranks pane accounts for every rank."""
    from tui.app.widgets.verdictbar import LABEL
    verdict_line = next((line for line in text.splitlines() if any(f" {lab} " in line for lab in LABEL.values())), "")
    if not verdict_line or "WARMING UP" in verdict_line or "checking:" in verdict_line:
        return False
    cells = [line.split("│")[-2].split() for line in text.splitlines() if line.count("│") >= 2]
    rows = {c[0] for c in cells if c and c[0].isdigit() and len(c) > 3}
    more = sum(int(c[0][1:]) for c in cells if c and c[0].startswith("+") and c[0][1:].isdigit())
    return len(rows & {str(r) for r in range(ranks)}) + more >= ranks


def first_screen_times(tmux: Tmux, env_dir: str, ranks: int, launches: int) -> tuple[list[float], list[float]]:
    """Wall seconds from launch to the first full screen, and the viewer's CPU seconds by then
    (the second does not depend on what else the machine is doing)."""
    import psutil
    times, cpus = [], []
    for _ in range(launches):
        start = time.monotonic()
        tmux("-f", "/dev/null", "new-session", "-d", "-s", "fs", "-x", "120", "-y", "36", attach_command(env_dir))
        proc = psutil.Process(int(tmux("display-message", "-p", "-t", "fs", "#{pane_pid}").strip()))
        while True:
            if full_screen(tmux("capture-pane", "-p", "-t", "fs"), ranks):
                times.append(time.monotonic() - start)
                cpu = proc.cpu_times()
                cpus.append(cpu.user + cpu.system)
                break
            if time.monotonic() - start > 15:
                raise SystemExit("no full screen within 15 s:\n" + tmux("capture-pane", "-p", "-t", "fs"))
            time.sleep(0.02)
        tmux("kill-session", "-t", "fs")
        time.sleep(0.5)
    return times, cpus


def follow(tmux: Tmux, env_dir: str, seconds: float) -> dict:
    import psutil
    tmux("-f", "/dev/null", "new-session", "-d", "-s", "run", "-x", "120", "-y", "36", attach_command(env_dir))
    time.sleep(3.0)   # startup and backfill are not part of the steady state
    proc = psutil.Process(int(tmux("display-message", "-p", "-t", "run", "#{pane_pid}").strip()))
    cpu0 = proc.cpu_times()
    t0 = time.monotonic()
    rss = [(0.0, proc.memory_info().rss)]
    while time.monotonic() - t0 < seconds:
        time.sleep(5.0)
        rss.append((time.monotonic() - t0, proc.memory_info().rss))
    cpu1 = proc.cpu_times()
    wall = time.monotonic() - t0
    screen = tmux("capture-pane", "-p", "-t", "run")
    tmux("kill-session", "-t", "run")
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"cpu_core_frac": used / wall, "wall": wall, "rss": rss, "screen": screen}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0, help="steps per second per rank")
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate:
        simulate(args.ranks, args.rate)
        return 0
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is needed (apt-get install tmux)")
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = Path(tmp) / "sock"
        env_dir.mkdir(mode=0o700)
        env = {**os.environ, "PERFMON_DIR": str(env_dir)}
        sim = subprocess.Popen([sys.executable, __file__, "--simulate", "--ranks", str(args.ranks),
                                "--rate", str(args.rate)], stdout=subprocess.PIPE, text=True, env=env)
        tmux = Tmux(str(Path(tmp) / "tmux.sock"))
        try:
            assert sim.stdout.readline().strip() == "ready"
            time.sleep(2.0)   # let the senders' backfill fill up
            firsts, first_cpus = first_screen_times(tmux, str(env_dir), args.ranks, args.launches)
            result = follow(tmux, str(env_dir), args.seconds)
        finally:
            tmux("kill-server")
            sim.kill()
            sim.wait()
    rss = result["rss"]
    mib = [r / (1 << 20) for _, r in rss]
    drops = next((line for line in result["screen"].splitlines() if "drops" in line), "")
    print(f"viewer following {args.ranks} ranks x {args.rate:g} steps/s for {result['wall']:.0f} s (tmux 120x36):")
    print(f"  CPU {result['cpu_core_frac'] * 100:.1f}% of one core (budget 15%)")
    print(f"  RSS {mib[0]:.1f} MiB after start -> {mib[-1]:.1f} MiB at the end "
          f"(min {min(mib):.1f}, max {max(mib):.1f}; growth over the run {mib[-1] - mib[0]:+.1f} MiB)")
    print(f"  header: {drops.strip()}")
    print(f"first full screen after launch ({args.launches} launches): median {statistics.median(firsts):.2f} s, "
          f"max {max(firsts):.2f} s (budget 1 s); viewer CPU by then: median {statistics.median(first_cpus):.2f} s")
    print("machine: " + f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
