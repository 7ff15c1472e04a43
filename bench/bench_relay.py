"""A job across nodes at scale: NODES simulated nodes x RANKS ranks at RATE steps/s per
rank, each node read by a real ``perfmon relay --stdio`` (started through a local transport, as
``attach --hosts`` starts them through ssh), all of them viewed by the real TUI (``PerfmonApp``
headless at 120x36: feed, run model, verdict and rendering at 4 Hz).

The ranks are ``bench/sim_node.py`` processes (one per node, serving each rank's socket with
probe-shaped records), so 1,024 ranks fit on a laptop; what is measured is everything that reads
them. Prints, per configuration: the time to the first full screen (every rank with a step time
and a verdict), then over ``--seconds``: CPU of the viewer and of each relay (share of one core),
the steps per second the viewer's ranks advanced by, and the viewer's and relays' RSS at the start
and end of the window (flat memory: the window starts ``--warmup`` s after the first screen, when
the relays' step buffers are full).

    python bench/bench_relay.py --nodes 16 --ranks 64 --rate 50 --seconds 30
    python bench/bench_relay.py --nodes 1 --ranks 64 --rate 50 --seconds 20   # one relay on its own
    python bench/bench_relay.py --relay-start --ranks 64     # what one relay's start costs
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def view(base: Path, job: str, nodes: int, ranks: int, seconds: float, warmup: float,
               profile: str | None = None) -> dict:
    from perfmon_analysis.analysis import Analysis
    from tui.app.perfmon_app import PerfmonApp
    from tui.stream.remote import RelayFeed

    hosts = [f"node{k + 1:02d}" for k in range(nodes)]
    # the relays and the simulated nodes run at nice 10: on a cluster they have their own nodes, here they
    # share two cores with the viewer, which must still get its share to be measured at its real rate
    feed = RelayFeed(Analysis(), job, hosts, f"nice -n 10 env PERFMON_DIR={base}/{{host}}",
                     relay=(sys.executable, "-m", "tui.cli", "relay", "--stdio"))
    app = PerfmonApp(feed, watch_terminal=False)
    refreshes = [0]
    refresh = app.refresh_view

    def counted() -> None:
        refreshes[0] += 1
        refresh()

    app.refresh_view = counted          # the 4 Hz timer: how many it managed is part of the result
    world = nodes * ranks
    t0 = time.monotonic()
    async with app.run_test(size=(120, 36)) as pilot:
        while True:
            await pilot.pause(0.05)
            v, verdict = app.view, app.verdict
            if (v is not None and len(v.ranks) == world and all(r.step_time_median_s for r in v.ranks)
                    and verdict is not None and verdict.bottleneck != "warming_up"):
                break
            if time.monotonic() - t0 > 120:
                raise SystemExit(f"no full screen after 120 s: {len(v.ranks) if v else 0} ranks")
        first = time.monotonic() - t0
        await pilot.pause(warmup)          # the relays' step buffers fill (2,048 steps per rank): memory then flat
        relays = {h: p.pid for h, p in feed._procs.items()}
        steps0, refreshes0 = sum(r.steps for r in app.view.ranks), refreshes[0]
        cpu0, rcpu0 = self_cpu(), {h: proc_cpu(p) for h, p in relays.items()}
        rss0, rrss0 = proc_rss(os.getpid()), {h: proc_rss(p) for h, p in relays.items()}
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()       # the viewer is one thread: feed, model, verdict and rendering on its loop
        w0 = time.monotonic()
        await pilot.pause(seconds)
        wall = time.monotonic() - w0
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        cpu1, rcpu1 = self_cpu(), {h: proc_cpu(p) for h, p in relays.items()}
        rss1, rrss1 = proc_rss(os.getpid()), {h: proc_rss(p) for h, p in relays.items()}
        steps1, refresh_hz = sum(r.steps for r in app.view.ranks), (refreshes[0] - refreshes0) / wall
        verdict = app.verdict
        heat = "slowest rank" in "\n".join(s.text for s in app.screen._compositor.render_strips())
        await app.action_quit()
    relay_cpu = [(rcpu1[h] - rcpu0[h]) / wall for h in relays]
    return {
        "nodes": nodes, "ranks_per_node": ranks, "ranks": world, "first_full_screen_s": round(first, 2),
        "viewer_cpu": round((cpu1 - cpu0) / wall, 3), "viewer_refresh_hz": round(refresh_hz, 2),
        "relay_cpu_max": round(max(relay_cpu), 3),
        "relay_cpu_mean": round(sum(relay_cpu) / len(relay_cpu), 3),
        "steps_per_s_seen": round((steps1 - steps0) / wall),
        "relay_us_per_step": round(1e6 * sum(relay_cpu) / max(1.0, (steps1 - steps0) / wall), 1),
        "viewer_rss_mb": [round(rss0 / 1e6), round(rss1 / 1e6)],
        "relay_rss_mb_max": [round(max(rrss0.values()) / 1e6), round(max(rrss1.values()) / 1e6)],
        "verdict": verdict.bottleneck if verdict else None,
        "straggler": verdict.straggler_rank if verdict else None, "heatmap_on_screen": heat,
    }


def relay_start(ranks: int, rate: float) -> dict:
    """One relay on its own, as on a node of its own: from its start to a summary with a step time
    for each of its ranks (what the first full screen waits for), and the CPU it took to get there."""
    from probe import wire
    from tui.stream.sources import viewer_hello

    with tempfile.TemporaryDirectory(prefix="pm-relaystart-") as tmp:
        node = Path(tmp) / "node"
        node.mkdir(mode=0o700)
        sim = subprocess.Popen([sys.executable, str(ROOT / "bench" / "sim_node.py"), str(node), "relaystart", "0",
                                str(ranks), str(ranks), str(rate)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        relay = None
        try:
            assert sim.stdout.readline().strip() == "ready"
            time.sleep(2.0)                     # a backlog to backfill, as in the full run
            t0 = time.monotonic()
            relay = subprocess.Popen([sys.executable, "-m", "tui.cli", "relay", "--stdio", "relaystart"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PERFMON_DIR": str(node)})
            relay.stdin.write(viewer_hello())
            relay.stdin.flush()
            decoder, timed = wire.FrameDecoder(), set()
            while len(timed) < ranks and time.monotonic() - t0 < 30:
                for rec in decoder.feed(os.read(relay.stdout.fileno(), 1 << 16)):
                    if rec["k"] == "summary" and not rec["stats"].get("warming_up", True):
                        timed.add(rec["src"])
            return {"ranks": ranks, "every_rank_timed_s": round(time.monotonic() - t0, 3),
                    "relay_cpu_s": round(proc_cpu(relay.pid), 3), "ranks_timed": len(timed)}
        finally:
            for p in (relay, sim):
                if p is not None:
                    p.kill()
                    p.wait()


def run(nodes: int, ranks: int, rate: float, seconds: float, warmup: float, history: float,
        profile: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="pm-relaybench-") as tmp:
        base = Path(tmp)
        world = nodes * ranks
        sims = []
        try:
            for k in range(nodes):
                node = base / f"node{k + 1:02d}"
                node.mkdir(mode=0o700)
                sims.append(subprocess.Popen(
                    ["nice", "-n", "10", sys.executable, str(ROOT / "bench" / "sim_node.py"), str(node), "relaybench",
                     str(k * ranks), str(ranks), str(world), str(rate), "--slow", str(world * 37 // 64),
                     "--history", str(history)],
                    stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}))
            for s in sims:
                assert s.stdout.readline().strip() == "ready"
            time.sleep(2.0)                     # (and --history) a backlog of steps to backfill, as on a real attach
            sim_cpu0 = sum(proc_cpu(s.pid) for s in sims)
            t = time.monotonic()
            result = asyncio.run(view(base, "relaybench", nodes, ranks, seconds, warmup, profile))
            result["sim_nodes_cpu"] = round((sum(proc_cpu(s.pid) for s in sims) - sim_cpu0)
                                            / (time.monotonic() - t), 3)
            result["offered_steps_per_s"] = round(world * rate)
            result["loadavg_1m"] = os.getloadavg()[0]
            return result
        finally:
            for s in sims:
                s.kill()
                s.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=64, help="ranks per node")
    ap.add_argument("--rate", type=float, default=50.0, help="steps/s per rank")
    ap.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=45.0, help="after the first full screen, before the window")
    ap.add_argument("--history", type=float, default=0.0,
                    help="seconds of steps each rank has made before the viewer starts (40 s: a full backfill)")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the viewer over the window into FILE (pstats)")
    ap.add_argument("--relay-start", action="store_true",
                    help="only: one relay's start to a step time for each of --ranks ranks, and its CPU")
    args = ap.parse_args()
    if args.relay_start:
        print(json.dumps(relay_start(args.ranks, args.rate)))
        return
    result = run(args.nodes, args.ranks, args.rate, args.seconds, args.warmup, args.history, args.profile)
    print(json.dumps({**result, "history_s": args.history}))


if __name__ == "__main__":
    main()
