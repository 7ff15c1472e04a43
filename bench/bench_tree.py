"""The relay tree at scale: RANKS simulated ranks (8 a node) through real group relays into the
real TUI (``PerfmonApp`` headless at 120x36: feed, run model, verdict, rendering), docs/tree.md.

The node relays are simulated (``bench/sim_relays.py``: a few processes serve every node's relay on
a loopback address of its own, as ``perfmon relay --tcp`` would), because this 2-core machine
cannot hold thousands of relay processes; the group relays are the real ``perfmon relay --nodes``
(one per ``--group-size`` nodes, started by the viewer's ``TreeFeed`` through a local transport),
reaching their nodes over TCP. Everything runs at the bench's own priority: on a machine shared
with other work a simulation at nice 10 is starved and delivers a fraction of its records
(``node_records_per_s`` against ``offered_records_per_s`` says how much). Measured, in order:

* ``first_screen_s``: viewer start to every rank counted and past warm-up, with a verdict;
* over ``--seconds`` after ``--warmup``: ``viewer_cpu`` (share of one core), ``group_relay_cpu_max``
  (the busiest group relay), ``viewer_bytes_per_rank_step`` (bytes the viewer read / ranks x steps);
* ``--trials`` planted stragglers (a rank computing 1.6x longer), each to the verdict naming it:
  ``straggler_named_s`` (the median) and how many within 20 s;
* a group relay killed: ``relay_death_noticed_s``, and the time until its subtree re-joined;
* a planted stuck rank (stopped inside a step; the simulated probes say so after their 3 s stall
  threshold): ``stuck_named_s``, to the stuck diagnosis naming it.

The last line is one JSON object with all of them.

    python bench/bench_tree.py --ranks 16384 --json
    python bench/bench_tree.py --relay-start      # one group relay's start, as on a node of its own
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_relay import proc_cpu, proc_rss, self_cpu  # noqa: E402
from sim_relays import address  # noqa: E402

PER_NODE = 8
SIM_PROCS = 4
TOKEN = "bench-tree"
STRAGGLER_LIMIT_S = 20.0


async def view(args: argparse.Namespace, port: int, control: Path, log, sims: list[int]) -> dict:
    from perfmon_analysis.analysis import Analysis
    from tui.app.perfmon_app import PerfmonApp
    from tui.stream.tree import TreeFeed, plan_groups

    world = args.ranks
    hosts = [address(n) for n in range(world // PER_NODE)]
    feed = TreeFeed(Analysis(), "treebench", plan_groups(hosts, args.group_size),
                    f"env PERFMON_TOKEN={TOKEN}", relay=(sys.executable, "-m", "tui.cli", "relay", "--stdio"),
                    nodes_port=port)
    app = PerfmonApp(feed, watch_terminal=False)
    out: dict = {"ranks": world, "nodes": len(hosts), "group_relays": len(feed.hosts), "group_size": args.group_size}

    def job():
        view = app.view
        return next((g for g in view.groups if g.key == ("job", "")), None) if view is not None else None

    async def until(cond, limit: float) -> float | None:
        t = time.monotonic()
        while not cond():
            if time.monotonic() - t > limit:
                return None
            await pilot.pause(0.1)
        return round(time.monotonic() - t, 2)

    def plant(slow: int | None = None, stuck: int | None = None) -> None:
        control.write_text(json.dumps({"slow": slow, "stuck": stuck, "at": time.time()}))

    plant()
    t0 = time.monotonic()
    async with app.run_test(size=(120, 36)) as pilot:
        first = await until(lambda: (j := job()) is not None and j.timed == world and app.verdict is not None
                            and app.verdict.bottleneck != "warming_up", 300)
        out["first_screen_s"] = round(time.monotonic() - t0, 2) if first is not None else None
        log(f"first screen {out['first_screen_s']} s")
        await pilot.pause(args.warmup)
        pids = {h: p.pid for h, p in feed._procs.items()}
        cpu0, rcpu0, bytes0 = self_cpu(), {h: proc_cpu(p) for h, p in pids.items()}, feed.received
        sim0, sent0 = sum(proc_cpu(p) for p in sims), _sent(control)
        w0 = time.monotonic()
        await pilot.pause(args.seconds)
        wall = time.monotonic() - w0
        cpu1, rcpu1, bytes1 = self_cpu(), {h: proc_cpu(p) for h, p in pids.items()}, feed.received
        out["sim_relays_cpu"] = round((sum(proc_cpu(p) for p in sims) - sim0) / (time.monotonic() - w0), 3)
        out["node_records_per_s"] = round((_sent(control) - sent0) / wall)      # what the node relays delivered
        out["offered_records_per_s"] = 2 * world                               # a sample and a summary per rank
        relay_cpu = [(rcpu1[h] - rcpu0[h]) / wall for h in pids]
        out.update(viewer_cpu=round((cpu1 - cpu0) / wall, 3), group_relay_cpu_max=round(max(relay_cpu), 3),
                   group_relay_cpu_mean=round(statistics.mean(relay_cpu), 3),
                   viewer_bytes_per_s=round((bytes1 - bytes0) / wall),
                   viewer_bytes_per_rank_step=round((bytes1 - bytes0) / wall / (world * args.rate), 4),
                   viewer_rss_mb=round(proc_rss(os.getpid()) / 1e6),
                   group_relay_rss_mb_max=round(max(proc_rss(p) for p in pids.values()) / 1e6),
                   verdict=app.verdict.bottleneck if app.verdict else None,
                   ranks_shown=len(app.view.ranks) if app.view else None)
        log(f"window: {out}")
        named = []
        for i in range(args.trials):
            rank = (9472 + i * 1637) % world
            plant(slow=rank)
            took = await until(lambda rank=rank: app.verdict is not None and app.verdict.straggler_rank == rank, 60)
            named.append(took)
            log(f"straggler {rank}: named after {took} s")
            plant()
            await until(lambda: app.verdict is not None and app.verdict.straggler_rank is None, 60)
        found = [t for t in named if t is not None]
        out["straggler_named_s"] = round(statistics.median(found), 2) if found else None
        out["straggler_named_max_s"] = max(found) if found else None
        out["straggler_named_within_20s"] = f"{sum(t <= STRAGGLER_LIMIT_S for t in found)}/{args.trials}"
        victim = feed.hosts[len(feed.hosts) // 2]
        feed._procs[victim].kill()
        out["relay_death_noticed_s"] = await until(lambda: feed.relays[victim].state in ("restarting", "error"), 30)
        out["relay_rejoined_s"] = await until(lambda: feed.relays[victim].state == "live"
                                              and (j := job()) is not None and j.ranks == world, 60)
        log(f"relay {victim} killed: noticed {out['relay_death_noticed_s']} s, re-joined {out['relay_rejoined_s']} s")
        stuck = 5000 % world
        plant(stuck=stuck)
        out["stuck_named_s"] = await until(lambda: app.view is not None and app.view.stuck is not None
                                           and app.view.stuck.culprit_ranks == (stuck,), 90)
        out["stuck_headline"] = app.view.stuck.headline if app.view and app.view.stuck else None
        log(f"stuck {stuck}: named after {out['stuck_named_s']} s")
        await app.action_quit()
    return out


def _sent(control: Path) -> int:
    """Records the simulated node relays have sent so far (each process counts its own)."""
    return sum(int(p.read_text() or 0) for p in control.parent.glob(f"{control.name}.sent.*"))


def run(args: argparse.Namespace) -> dict:
    from tests.helpers.prometheus import free_port

    port = free_port()
    nodes = args.ranks // PER_NODE
    with tempfile.TemporaryDirectory(prefix="pm-treebench-") as tmp:
        control = Path(tmp) / "control.json"
        control.write_text("{}")
        sims = []
        start = time.time() - 60.0               # the job has run a minute
        try:
            per = -(-nodes // SIM_PROCS)
            for first in range(0, nodes, per):
                sims.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "bench" / "sim_relays.py"), "treebench", str(port),
                     str(first), str(min(per, nodes - first)), str(PER_NODE), str(args.ranks), str(args.rate),
                     str(control), str(start)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)}))
            for s in sims:
                assert s.stdout.readline().strip() == "ready"
            log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else (lambda m: None)
            result = asyncio.run(view(args, port, control, log, [s.pid for s in sims]))
            result["rate"] = args.rate
            result["loadavg_1m"] = round(os.getloadavg()[0], 2)
            return result
        finally:
            for s in sims:
                s.kill()
                s.wait()


def relay_start(args: argparse.Namespace) -> dict:
    """One group relay on its own, as on a node of its own: from its start to a ``group`` record
    with every rank of its ``--group-size`` nodes past warm-up, and the CPU it took (a cluster
    starts its group relays in parallel: this, not the sum, is their share of the first screen)."""
    from probe import wire
    from tests.helpers.prometheus import free_port
    from tui.stream.sources import viewer_hello

    port, ranks = free_port(), args.group_size * PER_NODE
    with tempfile.TemporaryDirectory(prefix="pm-treestart-") as tmp:
        control = Path(tmp) / "control.json"
        control.write_text("{}")
        sim = subprocess.Popen([sys.executable, str(ROOT / "bench" / "sim_relays.py"), "treestart", str(port), "0",
                                str(args.group_size), str(PER_NODE), str(ranks), str(args.rate), str(control),
                                str(time.time() - 60)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        relay = None
        try:
            assert sim.stdout.readline().strip() == "ready"
            t0 = time.monotonic()
            relay = subprocess.Popen([sys.executable, "-m", "tui.cli", "relay", "--stdio", "--nodes",
                                      ",".join(address(n) for n in range(args.group_size)), "--relay-port", str(port),
                                      "treestart"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PERFMON_TOKEN": TOKEN})
            relay.stdin.write(viewer_hello())
            relay.stdin.flush()
            decoder, timed = wire.FrameDecoder(), 0
            while timed < ranks and time.monotonic() - t0 < 60:
                for rec in decoder.feed(os.read(relay.stdout.fileno(), 1 << 16)):
                    if rec["k"] == "group":
                        timed = rec.get("timed", 0)
            return {"group_size": args.group_size, "ranks": ranks,
                    "every_rank_timed_s": round(time.monotonic() - t0, 3),
                    "relay_cpu_s": round(proc_cpu(relay.pid), 3), "loadavg_1m": round(os.getloadavg()[0], 2)}
        finally:
            for p in (relay, sim):
                if p is not None:
                    p.kill()
                    p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384, help="simulated ranks, 8 a node")
    ap.add_argument("--group-size", type=int, default=32, help="nodes per group relay")
    ap.add_argument("--rate", type=float, default=50.0, help="steps/s per rank")
    ap.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=20.0, help="after the first full screen, before the window")
    ap.add_argument("--trials", type=int, default=10, help="planted stragglers")
    ap.add_argument("--json", action="store_true", help="end with the result as one JSON line")
    ap.add_argument("--verbose", action="store_true", help="progress on stderr")
    ap.add_argument("--relay-start", action="store_true",
                    help="only: one group relay's start to every rank of its group timed, and its CPU")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # killed: the simulations are stopped too
    result = relay_start(args) if args.relay_start else run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
