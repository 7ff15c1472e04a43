"""Simulated node relays for the relay-tree benchmark: NODES nodes x PER_NODE ranks, each node a
``perfmon relay --tcp`` as its group relay sees it, listening on a loopback address of its own
(127.1.x.y, one port for all), so one process stands for hundreds of nodes.

Each connection gets what a real node relay sends a 1.5 viewer: its hello, each rank's hello, and
once a second each rank's ``sample`` and ``summary`` (window statistics of a DDP step at RATE
steps/s: compute 10 ms +-5%, the rest waiting in all-reduce); the ranks a ``subscribe`` names get
their ``step`` records too. A control file (JSON, re-read every second) plants the faults:
``slow``: that rank computes 1.6x longer, its window's median moving once half the window has
passed (as a real rank's median does); ``stuck``: that rank stops inside a step for good, and
after ``STALL_S`` (the probe's stall threshold) every rank sends ``stall`` records every 2 s, the
stuck one outside the all-reduce the others wait in. It simulates what a node relay sends, not a
job: the benchmark is of what reads it.

    python bench/sim_relays.py JOB PORT FIRST_NODE COUNT PER_NODE WORLD RATE CONTROL START
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

from perfmon_analysis.buffers import WINDOW_STEPS
from probe import wire

STALL_S = 3.0          # the probe's stall threshold (PERFMON_STALL_S) in this simulation
STALL_EVERY_S = 2.0    # a stalled probe repeats its stall record this often


def address(node: int) -> str:
    """The loopback address standing for node ``node``."""
    return f"127.1.{node // 250}.{node % 250 + 1}"


class Control:
    """The planted faults, from the control file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.slow: int | None = None
        self.slow_since = 0.0
        self.stuck: int | None = None
        self.stuck_since = 0.0
        self.stuck_step = 0

    def read(self, start: float, rate: float) -> None:
        """The control file: ``{"slow": rank, "stuck": rank, "at": unix time}`` (one clock for every
        simulation process, so every rank's sequence numbers agree)."""
        try:
            spec = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        at = spec.get("at") or time.time()
        if spec.get("slow") != self.slow:
            self.slow, self.slow_since = spec.get("slow"), at
        if spec.get("stuck") != self.stuck:
            self.stuck, self.stuck_since, self.stuck_step = spec.get("stuck"), at, int((at - start) * rate)


class SimNode:
    sent = 0           # records sent by every node of this process (written beside the control file)

    def __init__(self, job: str, node: int, per_node: int, world: int, rate: float, control: Control,
                 start: float) -> None:
        self.job, self.node, self.rate, self.control, self.start = job, node, rate, control, start
        self.host = address(node)
        self.ranks = list(range(node * per_node, (node + 1) * per_node))
        self.world = world
        self.jitter = {r: random.Random(r).uniform(-0.05, 0.05) for r in self.ranks}
        self.src = {r: f"{job}.r{r}.x0.p{100000 + node}" for r in self.ranks}

    def steps(self, now: float) -> int:
        c = self.control
        end = c.stuck_since if c.stuck is not None else now
        return int((end - self.start) * self.rate)

    def hello(self, rank: int) -> dict:
        return {"k": "hello", "t": self.start, "proto": list(wire.PROTO), "job": self.job, "rank": rank,
                "local_rank": rank % len(self.ranks), "world_size": self.world, "host": self.host,
                "pid": 100000 + self.node, "restart": 0, "src": self.src[rank],
                "device": {"type": "cpu", "name": "simulated node relay (bench/sim_relays.py)", "count": 1}}

    def summary(self, rank: int, now: float) -> dict:
        c = self.control
        step = 1.0 / self.rate
        window = WINDOW_STEPS / self.rate
        slow = c.slow == rank and now - c.slow_since >= window / 2
        compute = (0.016 if slow else 0.010) * (1 + self.jitter[rank])
        wait = max(0.0, step - 0.001 - compute)
        steps = self.steps(now)
        return {"k": "summary", "t": now, "v": 1, "src": self.src[rank], "steps": steps,
                "stats": {"n": WINDOW_STEPS, "span": window, "warming_up": False, "step_median": step,
                          "gap_frac": 0.0, "compute_median": compute, "arrive_median": compute + 0.001,
                          "data_frac": 0.001 / step, "comm_frac": (wait + 0.001) / step, "exposed_frac": wait / step,
                          "device_busy": compute / step, "busy_source": "thread_cpu", "samples_per_s": 32 * self.rate,
                          "tokens_per_s": 32 * 512 * self.rate},
                "memory": {"source": "host", "rank": rank, "peak_bytes": 3 << 30, "limit_bytes": 512 << 30,
                           "peak_frac": 3 / 512},
                "comm": {"all_reduce": [WINDOW_STEPS, 8_000_000 * WINDOW_STEPS, wait * WINDOW_STEPS, None]},
                "first_start": self.start, "last_end": self.start + steps * step, "inside": steps * step,
                "unseen": 0.0, "loader_seen": False}

    def sample(self, rank: int, now: float) -> dict:
        return {"k": "sample", "t": now, "src": self.src[rank],
                "host": {"cpu": 0.9, "cpu_count": 64, "sys_cpu": 0.5, "rss": 3 << 30, "mem_limit": 512 << 30},
                "gpu_status": "no NVIDIA GPU: NVML library not found"}

    def stall(self, rank: int, now: float) -> dict:
        c = self.control
        stuck = rank == c.stuck
        rec = {"k": "stall", "t": now, "src": self.src[rank], "since": c.stuck_since,
               "seconds": now - c.stuck_since, "threshold": STALL_S, "step": c.stuck_step - 1, "where": "step",
               "seq": {"world": c.stuck_step if stuck else c.stuck_step + 1}}
        if stuck:
            rec["stack"] = ["train.py:40 in main", "train.py:21 in forward"]
        else:
            rec["stack"] = ["train.py:44 in main", "torch/distributed/distributed_c10d.py:2050 in all_reduce"]
            rec["inflight"] = [{"op": "all_reduce", "group": "world", "group_rank": rank, "group_size": self.world,
                                "seq": c.stuck_step + 1, "bytes": 8_000_000, "since": c.stuck_since}]
        return rec

    def step(self, rank: int, n: int, now: float) -> dict:
        dur = 1.0 / self.rate
        return {"k": "step", "t": now, "src": self.src[rank], "step": n, "start": now - dur, "dur": dur, "samples": 32,
                "phases": {"data": 0.001, "forward": 0.004, "backward": 0.005, "optimizer": 0.001}}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = wire.FrameDecoder(wire.VIEWER_MAX_FRAME)
        followed: set[str] = set()

        async def read_viewer() -> None:
            while data := await reader.read(4096):
                for rec in decoder.feed(data):
                    if rec["k"] == "subscribe":
                        followed.clear()
                        followed.update(s for s in rec["srcs"] if isinstance(s, str))

        try:
            while True:                                             # the group relay's hello (and token)
                data = await reader.read(4096)
                if not data:
                    raise ConnectionError("closed before its hello")
                if list(decoder.feed(data)):
                    break
        except (ConnectionError, wire.ProtocolError):
            writer.close()
            return
        task = asyncio.ensure_future(read_viewer())
        enc = wire.Encoder()
        out = bytearray(enc.frame({"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "role": "relay",
                                   "job": self.job, "host": self.host, "pid": 100000 + self.node}))
        for rank in self.ranks:
            out += enc.frame(self.hello(rank))
        next_stall, last_step = 0.0, self.steps(time.time())
        next_second = 0.0          # the first summaries at once, as a relay whose ranks have a window sends them
        first = True
        try:
            while not task.done():
                now = time.time()
                c = self.control
                if now >= next_second:
                    next_second = now + (random.random() if first else 1.0)     # nodes' seconds do not line up
                    first = False
                    for rank in self.ranks:
                        out += enc.frame(self.sample(rank, now))
                        if c.stuck is None:                         # a stalled rank's summary stops changing
                            out += enc.frame(self.summary(rank, now))
                if c.stuck is not None and now - c.stuck_since >= STALL_S and now >= next_stall:
                    next_stall = now + STALL_EVERY_S
                    for rank in self.ranks:
                        out += enc.frame(self.stall(rank, now))
                steps = self.steps(now)
                for rank in self.ranks:
                    if self.src[rank] in followed:
                        for n in range(last_step, steps):
                            out += enc.frame(self.step(rank, n, now))
                last_step = steps
                if out:
                    SimNode.sent += out.count(b"\xa1k")         # one "k" key per record
                    writer.write(bytes(out))
                    out.clear()
                    await writer.drain()
                # wake for the next second's records (or the next stall record); every 0.1 s only while a
                # rank is followed: 2,048 connections polling at 10 Hz would starve what is measured
                due = min(next_second, max(next_stall, c.stuck_since + STALL_S)) if c.stuck is not None else next_second
                await asyncio.sleep(0.1 if followed else max(0.01, min(1.0, due - time.time())))
        except ConnectionError:
            pass
        finally:
            task.cancel()
            writer.close()


async def main(args: argparse.Namespace) -> None:
    control = Control(Path(args.control))
    start = args.start                                 # the job's start, the same in every simulation process
    nodes = [SimNode(args.job, n, args.per_node, args.world, args.rate, control, start)
             for n in range(args.first, args.first + args.count)]
    servers = [await asyncio.start_server(node.serve, host=node.host, port=args.port) for node in nodes]
    print("ready", flush=True)
    counter = Path(f"{args.control}.sent.{args.first}")
    parent = os.getppid()
    while os.getppid() == parent:                      # the benchmark went away: so do we
        control.read(start, args.rate)
        counter.write_text(str(SimNode.sent))
        await asyncio.sleep(1.0)
        assert servers


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("job",):
        ap.add_argument(name)
    for name in ("port", "first", "count", "per_node", "world"):
        ap.add_argument(name, type=int)
    ap.add_argument("rate", type=float)
    ap.add_argument("control")
    ap.add_argument("start", type=float, help="unix time the simulated job started")
    try:
        asyncio.run(main(ap.parse_args()))
    except KeyboardInterrupt:
        pass
    os._exit(0)
