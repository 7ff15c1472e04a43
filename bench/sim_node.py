"""A simulated node for the relay benchmark: N ranks' probe sockets served by one process.

Each rank listens on its own socket in DIR under the probe's name (``<job>.r<rank>.x0.p<pid>.sock``)
and speaks the probe's side of the wire protocol to whoever connects (a relay): it reads the
viewer's hello, sends its own, the steps it has made so far (at most 2,000, as the probe
backfills), then every new record. Records are shaped like a DDP CPU job's: a step with phases
and comm at RATE steps/s, a sample each second, cumulative comm every 10 steps. One rank
(``--slow``) computes 1.6x longer. It simulates the probe's output, not a GPU or a job: the
benchmark is of what reads it.

    python bench/sim_node.py DIR JOB FIRST_RANK COUNT WORLD RATE [--slow RANK] [--history SECONDS]

``--history``: each rank starts with that many seconds of steps already made (a job that has run
a while: its first viewer gets the full 2,000-step backfill).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import socket
import time
from pathlib import Path

from probe import paths, wire

TICK_S = 0.1
BACKFILL = 2000


class SimRank:
    def __init__(self, job: str, rank: int, world: int, slow: bool) -> None:
        self.rank, self.world = rank, world
        self.compute = 0.016 if slow else 0.010
        self.step = 0
        self.comm = [0, 0, 0.0]      # cumulative all_reduce count, bytes, seconds
        self.ring: collections.deque[bytes] = collections.deque(maxlen=BACKFILL)
        self.viewers: list[asyncio.StreamWriter] = []
        self.hello = wire.encode({
            "k": "hello", "t": time.time(), "proto": list(wire.PROTO), "job": job, "rank": rank,
            "local_rank": rank % 64, "world_size": world, "host": socket.gethostname(), "pid": os.getpid(),
            "restart": 0, "device": {"type": "cpu", "name": "simulated node (bench/sim_node.py)", "count": 1}})

    def make(self, now: float, dur: float) -> list[bytes]:
        """The records of one step ending at ``now``."""
        wait = max(0.0, dur - 0.001 - self.compute)
        out = [wire.encode({
            "k": "step", "t": now, "step": self.step, "start": now - dur, "dur": dur, "samples": 32,
            "phases": {"data": 0.001, "forward": self.compute * 0.4, "backward": self.compute * 0.5,
                       "optimizer": self.compute * 0.1},
            "comm": {"seconds": wait + 0.001, "exposed": wait, "bytes": 8_000_000, "ops": 1}})]
        self.comm = [self.comm[0] + 1, self.comm[1] + 8_000_000, self.comm[2] + wait + 0.001]
        if self.step % 10 == 9:
            out.append(wire.encode({"k": "comm", "t": now, "backend": "gloo", "world_size": self.world, "ops": [
                {"op": "all_reduce", "count": self.comm[0], "bytes": self.comm[1], "seconds": self.comm[2],
                 "busbytes": self.comm[1] * 2 * (self.world - 1) / self.world}]}))
        self.step += 1
        return out

    def sample(self, now: float) -> bytes:
        return wire.encode({"k": "sample", "t": now, "host": {"cpu": 0.9, "cpu_count": 64, "sys_cpu": 0.5,
                                                              "rss": 3 << 30, "mem_limit": 512 << 30},
                            "gpu_status": "no NVIDIA GPU: NVML library not found"})     # as a CPU probe says

    def send(self, frames: list[bytes]) -> None:
        data = b"".join(frames)
        for w in list(self.viewers):
            if w.is_closing():
                self.viewers.remove(w)
            else:
                w.write(data)


async def serve(args: argparse.Namespace) -> None:
    directory = Path(args.dir)
    ranks = [SimRank(args.job, r, args.world, r == args.slow) for r in range(args.first, args.first + args.count)]
    servers = []
    for sim in ranks:
        path = directory / f"{paths.base_name(args.job, sim.rank, 0, os.getpid())}{paths.SOCKET_SUFFIX}"

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sim: SimRank = sim) -> None:
            decoder = wire.FrameDecoder(wire.VIEWER_MAX_FRAME)
            try:
                while not list(decoder.feed(await reader.read(4096))):
                    pass                                # the viewer's hello
            except (ConnectionError, wire.ProtocolError):
                writer.close()
                return
            writer.write(sim.hello + b"".join(sim.ring))
            sim.viewers.append(writer)
            try:
                while await reader.read(4096):
                    pass
            except ConnectionError:
                pass
            finally:
                if writer in sim.viewers:
                    sim.viewers.remove(writer)
                writer.close()

        servers.append(await asyncio.start_unix_server(connected, path=str(path)))
    if args.history > 0:
        dur = 1.0 / args.rate
        start = time.time() - args.history
        for sim in ranks:
            for i in range(int(args.history * args.rate)):
                t = start + (i + 1) * dur
                sim.ring.extend(sim.make(t, dur) + ([sim.sample(t)] if i % int(args.rate) == 0 else []))
    print("ready", flush=True)
    per_tick = args.rate * TICK_S
    owed = 0.0
    next_sample = time.time()
    while True:
        await asyncio.sleep(TICK_S)
        now = time.time()
        owed += per_tick
        n, owed = int(owed), owed - int(owed)
        for sim in ranks:
            dur = 1.0 / args.rate
            frames = [f for i in range(n) for f in sim.make(now - (n - 1 - i) * dur, dur)]
            if now >= next_sample:
                frames.append(sim.sample(now))
            sim.ring.extend(frames)
            sim.send(frames)
        if now >= next_sample:
            next_sample = now + 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("job")
    ap.add_argument("first", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("world", type=int)
    ap.add_argument("rate", type=float)
    ap.add_argument("--slow", type=int, default=-1)
    ap.add_argument("--history", type=float, default=0.0)
    try:
        asyncio.run(serve(ap.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
