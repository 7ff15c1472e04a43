"""Fixed recordings for the TUI tests: one per verdict state, written in the real recording format.

Every record has a fixed time (T0 + offsets), so a replay ingested at once
(``ReplayFeed(speed=None)``) gives the same screen on every run: that is what
the snapshot tests compare. The GPU scenario's device is named as a simulation
(no GPU result is claimed from it). Numbers are chosen to sit clearly on one
side of each flowchart threshold; the live end-to-end test uses a real job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe import paths, wire
from probe.recording import RecordingWriter
from tests.helpers import records as R

T0 = 1_700_000_000.0
HOST = "node-a"
SIM_GPU = "SIMULATED GPU (test fixture, not a real device)"
GB = 1 << 30


def _hello(job: str, rank: int, world: int, device: dict[str, Any]) -> dict[str, Any]:
    return R.hello(rank, t=T0, job=job, world_size=world, host=HOST, pid=4000 + rank, device=device,
                   argv=["train.py"], torch="2.13.0", name=paths.base_name(job, rank, 0, 4000 + rank))


CPU = {"type": "cpu", "name": "Test CPU @ 2.0GHz", "count": 8,
       "status": "no NVIDIA GPU: NVML library not found"}


def _steps(n: int, dur: Callable[[int], float], phases: Callable[[int], dict[str, float]],
           extra: Callable[[int], dict[str, Any]] | None = None, samples: int = 32) -> list[dict[str, Any]]:
    out = []
    t = T0 + 1.0
    for i in range(n):
        d = dur(i)
        out.append(R.step(i, start=t, dur=d, phases=phases(i), samples=samples, **(extra(i) if extra else {})))
        t += d
    return out


def _host_samples(t_end: float, cpu: float, extra: dict[str, Any] | None = None, rss: int = 2 * GB,
                  limit: int = 16 * GB, source: str = "machine", step: float = 1.0) -> list[dict[str, Any]]:
    out = []
    t = T0 + 1.0
    i = 0
    while t <= t_end:
        host = {"cpu": cpu + 0.05 * (i % 3), "cpu_count": 8, "sys_cpu": 0.4, "rss": rss, "mem_used": 6 * GB,
                "mem_total": 16 * GB, "mem_limit": limit, "mem_limit_source": source}
        host.update(extra or {})
        out.append({"k": "sample", "t": t, "host": host, "gpu_status": "no NVIDIA GPU: NVML library not found"})
        t += step
        i += 1
    return out


def _phases(data: float, fwd: float, bwd: float, opt: float, dur: float) -> dict[str, float]:
    return {"data": data, "forward": fwd, "backward": bwd, "optimizer": opt,
            "other": max(0.0, dur - data - fwd - bwd - opt)}


def data_preprocessing() -> dict[int, list[dict[str, Any]]]:
    """One CPU rank whose 2 loader workers are CPU-bound: the step waits ~40% for data."""
    job = "tokenize-heavy"
    steps = _steps(80, lambda i: 0.20 + 0.01 * (i % 4),
                   lambda i: _phases(0.08 + 0.01 * (i % 4), 0.05, 0.06, 0.01, 0.20 + 0.01 * (i % 4)))
    samples = _host_samples(steps[-1]["t"], 1.0, {"loader_workers": 2, "loader_cpu": 0.97, "loader_cpu_max": 0.99})
    return {0: _merge([_hello(job, 0, 1, CPU)], steps, samples)}


def load_imbalance() -> dict[int, list[dict[str, Any]]]:
    """Four CPU ranks (gloo); rank 3 computes twice as long and the others wait in all-reduce."""
    job = "ddp-uneven"
    out = {}
    for rank in range(4):
        slow = rank == 3
        compute = 0.20 if slow else 0.10
        wait = 0.005 if slow else 0.105
        dur = 0.003 + compute + wait

        def extra(i: int, wait: float = wait) -> dict[str, Any]:
            return {"comm": {"seconds": wait + 0.004, "exposed": wait, "bytes": 44_000_000, "ops": 3}}

        steps = _steps(80, lambda i, d=dur: d,
                       lambda i, c=compute, d=dur: _phases(0.003, c * 0.4, c * 0.5, c * 0.1, d), extra)
        comm = []
        for j, s in enumerate(steps):
            if j % 10 == 9:
                n = j + 1
                comm.append({"k": "comm", "t": s["t"], "backend": "gloo", "world_size": 4, "ops": [
                    {"op": "all_reduce", "count": 3 * n, "bytes": 44_000_000 * n, "seconds": (wait + 0.004) * n,
                     "busbytes": 1.5 * 44_000_000 * n},                    # 2(n-1)/n for the 4-rank group
                    {"op": "broadcast", "count": 1, "bytes": 4_000_000, "seconds": 0.01, "busbytes": 4e6}]})
        samples = _host_samples(steps[-1]["t"], 1.0 if slow else 0.9, {"loader_workers": 1, "loader_cpu": 0.2})
        out[rank] = _merge([_hello(job, rank, 4, CPU)], steps, samples, comm)
    return out


def many_nodes(nodes: int = 8, per_node: int = 8, slow_rank: int = 37,
               steps: int = 40) -> dict[int, list[dict[str, Any]]]:
    """``nodes`` x ``per_node`` CPU ranks, a node each per ``per_node`` ranks (n01, n02, ...);
    ``slow_rank`` computes 1.6x longer and the others wait for it in all-reduce."""
    job = "fsdp-64"
    out = {}
    world = nodes * per_node
    for rank in range(world):
        slow = rank == slow_rank
        compute = 0.16 if slow else 0.10 + 0.002 * (rank % 5)
        wait = 0.004 if slow else 0.16 - compute + 0.004
        dur = 0.002 + compute + wait

        def extra(i: int, wait: float = wait) -> dict[str, Any]:
            return {"comm": {"seconds": wait + 0.003, "exposed": wait, "bytes": 50_000_000, "ops": 2}}

        recs = _steps(steps, lambda i, d=dur: d, lambda i, c=compute, d=dur: _phases(0.002, c * 0.4, c * 0.5,
                                                                                       c * 0.1, d), extra)
        hello = dict(_hello(job, rank, world, CPU), host=f"n{rank // per_node + 1:02d}", local_rank=rank % per_node)
        out[rank] = _merge([hello], recs, _host_samples(recs[-1]["t"], 1.0))
    return out


def memory_gpu() -> dict[int, list[dict[str, Any]]]:
    """One rank on a simulated GPU whose allocator peak is 95% of the device: memory."""
    job = "gpt-big-batch"
    device = {"type": "cuda", "name": SIM_GPU, "count": 1, "memory_total": 16 * GB,
              "peak_flops": {"bf16": 100e12, "fp32": 20e12}}
    steps = _steps(80, lambda i: 0.30, lambda i: _phases(0.003, 0.1, 0.16, 0.03, 0.30),
                   lambda i: {"gpu_time": 0.28, "flops": 0.3 * 40e12, "syncs": 0,
                              "mem": {"allocated": 11 * GB, "peak": int(15.2 * GB), "reserved": int(15.4 * GB)}})
    mem = {"k": "memory", "t": steps[40]["t"], "device": 0, "params": 2 * GB, "grads": 2 * GB, "optimizer": 4 * GB,
           "activations": int(5.5 * GB), "cache": int(1.4 * GB), "fragmentation": int(0.6 * GB),
           "other": int(0.3 * GB), "limit": 16 * GB, "peak": int(15.2 * GB), "reserved": int(15.4 * GB),
           "allocated": 11 * GB, "alloc_retries": 0, "ooms": 0}
    samples = []
    for k, t in enumerate(range(int(T0) + 1, int(steps[-1]["t"]) + 1)):
        samples.append({"k": "sample", "t": float(t), "host": {"cpu": 1.1, "cpu_count": 8, "sys_cpu": 0.2,
                                                               "rss": 3 * GB, "loader_workers": 4, "loader_cpu": 0.3},
                        "gpus": [{"index": 0, "name": SIM_GPU, "util": 90 + (k % 3) * 3, "mem_used": int(15.4 * GB),
                                  "mem_total": 16 * GB, "power_w": 250.0 + k % 4 * 10, "power_limit_w": 300.0,
                                  "sm_clock": 1410, "sm_clock_max": 1410, "temp_c": 71, "throttle": [],
                                  "sm_active": 0.72, "tensor_active": 0.41}]})
    return {0: _merge([_hello(job, 0, 1, device)], steps, samples, [mem])}


def healthy() -> dict[int, list[dict[str, Any]]]:
    """Two CPU ranks computing 90%+ of each step; the loader and the all-reduce keep up."""
    job = "resnet-cpu"
    out = {}
    for rank in range(2):
        def extra(i: int) -> dict[str, Any]:
            return {"comm": {"seconds": 0.012, "exposed": 0.004, "bytes": 8_000_000, "ops": 2}}

        steps = _steps(80, lambda i, rank=rank: 0.25 + 0.002 * ((i + rank) % 5),
                       lambda i, rank=rank: _phases(0.003, 0.09, 0.13, 0.02, 0.25 + 0.002 * ((i + rank) % 5)), extra)
        comm = [{"k": "comm", "t": s["t"], "backend": "gloo", "world_size": 2, "ops": [
            {"op": "all_reduce", "count": 2 * (j + 1), "bytes": 8_000_000 * (j + 1), "seconds": 0.012 * (j + 1),
             "busbytes": 8e6 * (j + 1)}]}
            for j, s in enumerate(steps) if j % 10 == 9]
        samples = _host_samples(steps[-1]["t"], 1.9, {"loader_workers": 2, "loader_cpu": 0.35})
        for s in samples:    # perfmon's own cost (wire 1.4): 40 µs of each step, 0.6% of the CPU
            elapsed = s["t"] - T0
            done = int(elapsed / 0.252)
            s["cost"] = {"train_s": 40e-6 * done, "train_steps": done, "hooks": {},
                         "threads": {"sender": 0.004 * elapsed, "sampler": 0.002 * elapsed, "where": 0.006 * elapsed},
                         "process_cpu": 1.9 * elapsed, "queue_items": 2, "viewer_bytes": 0,
                         "backfill_bytes": 40_000, "sent_bytes": 900 * done, "why": {"recorded_bytes": "not recording"}}
        out[rank] = _merge([_hello(job, rank, 2, CPU)], steps, samples, comm)
    return out


def stuck() -> dict[int, list[dict[str, Any]]]:
    """Two CPU ranks; after 40 steps rank 1 sleeps before its next all-reduce and rank 0 waits in it."""
    job = "stuck-demo"
    out = {}
    script = "/home/user/train.py"
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    for rank in range(2):
        steps = _steps(40, lambda i: 0.2, lambda i: _phases(0.005, 0.08, 0.1, 0.015, 0.2))
        end = steps[-1]["t"]
        samples = _host_samples(end + 45, 1.0)
        base = {"k": "stall", "t": end + 45, "since": end, "seconds": 45.0, "threshold": 15.0, "step": 39,
                "n": 16, "where": "step"}
        if rank == 0:
            base.update(stack=[f"{script}:80 in <module>", f"{script}:61 in train", f"{script}:44 in sync_grads",
                               f"{c10d}:3252 in all_reduce"],
                        inflight=[{"op": "all_reduce", "group": "world", "group_rank": 0, "group_size": 2,
                                   "seq": 41, "bytes": 4_000_000, "since": end}], seq={"world": 41})
        else:
            base.update(stack=[f"{script}:80 in <module>", f"{script}:58 in train",
                               f"{script}:30 in load_shard"], seq={"world": 40})
        out[rank] = _merge([_hello(job, rank, 2, CPU)], steps, samples, [base])
    return out


def host_wait() -> dict[int, list[dict[str, Any]]]:
    """One CPU rank whose training thread sleeps 40 ms of each 100 ms step in a metrics call (wire 1.3:
    thread CPU time per step, in-step stack samples every 2 s)."""
    job = "metrics-call"
    script = "/home/user/train.py"
    steps = _steps(80, lambda i: 0.1, lambda i: _phases(0.0, 0.05, 0.04, 0.01, 0.1),
                   lambda i: {"cpu": 0.06, "cpu_span": "body"})
    where = []
    t = T0 + 1.0
    while t < steps[-1]["t"]:
        where.append({"k": "where", "t": t + 2.0, "t0": t, "t1": t + 2.0, "hz": 20.0, "samples": 40, "other": 2,
                      "lines": [
                          {"file": script, "line": 21, "function": "fetch_from_service",
                           "call": "requests.post(METRICS_URL, json=stats)", "lib": "socket.socket.recv_into",
                           "state": "waiting", "n": 16},
                          {"file": script, "line": 44, "function": "train", "call": "loss = model(x).sum()",
                           "lib": "torch.nn.modules.module._call_impl", "state": "busy", "n": 12},
                          {"file": script, "line": 46, "function": "train", "call": "loss.backward()",
                           "lib": "torch.autograd.backward", "state": "busy", "n": 10}]})
        t += 2.0
    samples = _host_samples(steps[-1]["t"], 0.6)
    return {0: _merge([_hello(job, 0, 1, CPU)], steps, samples, where)}


def trends(ranks: int = 2, steps: int = 3000, per_node: int = 8) -> dict[int, list[dict[str, Any]]]:
    """A run whose story the history must keep: 100 ms steps; from the middle on the loader falls
    behind (+60 ms data wait a step, then ``data_loading``); one 3 s spike at 23% of the run; a 2 s
    checkpoint before 40% and 80%; memory creeping from 2 to 14 GB of a 16 GB limit. ``per_node``
    ranks share a host (n01, n02, ...); the last rank computes 30% longer in the second half."""
    job = "gpt-trends"
    out = {}
    half, spike = steps // 2, int(steps * 0.23)
    checkpoints = {int(steps * 0.4), int(steps * 0.8)}
    for rank in range(ranks):
        slow = rank == ranks - 1 and ranks > 1

        def dur(i: int, slow: bool = slow) -> float:
            base = 0.1 * (1.3 if slow and i >= half else 1.0) + (0.06 if i >= half else 0.0)
            return base + (3.0 if i == spike else 0.0) + (2.0 if i in checkpoints else 0.0)

        def phases(i: int) -> dict[str, float]:
            data = 0.062 if i >= half else 0.002
            return {"data": data, "forward": 0.04, "backward": 0.05, "optimizer": 0.008}

        def extra(i: int) -> dict[str, Any]:
            return {"gap": 2.0} if i in checkpoints else {}

        recs = _steps(steps, dur, phases, extra)
        memory = [{"k": "memory", "t": r["t"], "device": "cpu", "rss": int(2 * GB + 12 * GB * r["step"] / steps),
                   "limit": 16 * GB, "limit_source": "cgroup"} for r in recs[::max(1, steps // 200)]]
        hello = dict(_hello(job, rank, ranks, CPU), host=f"n{rank // per_node + 1:02d}", local_rank=rank % per_node)
        out[rank] = _merge([hello], recs, memory, _host_samples(recs[-1]["t"], 1.0, step=max(1.0, steps / 400)))
    return out


def _merge(*groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    records = [r for g in groups for r in g]
    return sorted(records, key=lambda r: (r["k"] != "hello", r["t"]))


SCENARIOS: dict[str, Callable[[], dict[int, list[dict[str, Any]]]]] = {
    "data_preprocessing": data_preprocessing,
    "load_imbalance": load_imbalance,
    "memory": memory_gpu,
    "healthy": healthy,
    "stuck": stuck,
    "many_nodes": many_nodes,
    "host_wait": host_wait,
    "trends": trends,
}


def write(name: str, directory: Path, bye: bool = True, **params: Any) -> Path:
    """Write scenario ``name`` (called with ``params``) as one recording file per rank under
    ``directory/name``; return that dir."""
    out = directory / name
    out.mkdir(parents=True, exist_ok=True)
    encoder = wire.Encoder()
    for _rank, records in SCENARIOS[name](**params).items():
        hello = records[0]
        writer = RecordingWriter(out / f"{hello['name']}{paths.RECORD_SUFFIX}")
        try:
            frames = [encoder.frame(r) for r in records]
            if bye:
                frames.append(encoder.frame({"k": "bye", "t": records[-1]["t"] + 0.1}))
            writer.write(b"".join(RecordingWriter.wrap(f) for f in frames))
        finally:
            writer.close()
    return out


def replay_app(recording: Path, verdicts: int = 0):
    """The app replaying ``recording`` ingested at once (the clock is the recording's), judged at
    ``verdicts`` instants on the way (``ReplayFeed``)."""
    from perfmon_analysis.analysis import Analysis
    from tui.app.perfmon_app import PerfmonApp
    from tui.stream.feed import ReplayFeed
    from tui.stream.sources import load_recordings
    return PerfmonApp(ReplayFeed(Analysis(), load_recordings(recording), speed=None, verdicts=verdicts),
                      watch_terminal=False)


async def wait_until(pilot, cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``cond()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.05)


async def settle(pilot) -> None:
    """Wait until a replay is fully ingested and the verdict is confirmed, then draw once more."""
    app = pilot.app
    await wait_until(pilot, lambda: app.feed is not None and app.feed.ended and app.verdict is not None
                     and app.verdict.pending is None and app.verdict.bottleneck != "warming_up",
                     what="a settled verdict")
    app.refresh_view()
    await pilot.pause()


def screen_text(app) -> str:
    """What the terminal shows now, as plain text (one line per row)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())
