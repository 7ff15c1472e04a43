"""Plain PyTorch jobs (no perfmon API) shaped like large-model training, tiny, over gloo on CPU; run with
torchrun under ``perfmon run``. Each rank writes what it measured of itself to ``--out`` (JSON per rank).

* ``pipeline``  ``torch.distributed.pipelining`` over all ranks (one stage each), ``--schedule gpipe|1f1b``;
                stage ``--heavy`` holds 3x the layers of the others. Each rank records its training
                thread's CPU time per step (``time.thread_time()``) plus the time it was runnable with no
                free core (Linux schedstat: the machine's other work, not the job's waiting), over the
                step's wall time: the stage's own busy share.
* ``mesh``      a 2-D ``DeviceMesh`` (dp x tp): tensor-parallel layers whose activations are summed over
                the tp group, gradients averaged over the dp group; ``--slow-rank`` sleeps in its forward.
* ``ddp``       DDP over the world; on each step one rank, a different one at random (every rank in
                turn, in a shuffled order), sleeps between its forward and backward: uneven batches.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

torch.set_num_threads(1)
WIDTH = 512


def schedstat_wait() -> float:
    """Seconds this thread has waited on a run queue (runnable, no core free); 0 where unreadable."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def pipeline(args: argparse.Namespace) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    layers = args.layers * (3 if rank == args.heavy else 1)
    torch.manual_seed(rank)
    stage_mod = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(layers)])
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = cls(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)   # every stage
    opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-4)
    x, y = torch.randn(args.batch, WIDTH), torch.randn(args.batch, WIDTH)
    shares = []
    for step in range(args.steps):
        t0, c0, q0 = time.perf_counter(), time.thread_time(), schedstat_wait()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        if step >= 2:
            shares.append((time.thread_time() - c0 + schedstat_wait() - q0) / wall)
    shares.sort()
    return {"rank": rank, "layers": layers, "busy_share": shares[len(shares) // 2]}


def mesh(args: argparse.Namespace) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    m = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = m.get_group("tp"), m.get_group("dp")
    torch.manual_seed(0)
    shard = nn.Linear(WIDTH, WIDTH)
    opt = torch.optim.SGD(shard.parameters(), lr=1e-3)
    x = torch.randn(32, WIDTH)
    for _ in range(args.steps):
        out = shard(x)
        if rank == args.slow_rank:
            time.sleep(args.sleep)
        summed = out.detach().clone()
        dist.all_reduce(summed, group=tp)                    # the tensor-parallel layer's output
        loss = ((out - summed.detach()) ** 2).mean()
        loss.backward()
        for p in shard.parameters():
            dist.all_reduce(p.grad, group=dp)                # the gradients over the replicas
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"rank": rank, "coordinate": list(m.get_coordinate() or ())}


def ddp(args: argparse.Namespace) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                                                              nn.Linear(WIDTH, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    order = random.Random(args.seed)
    slow = [r for _ in range(args.steps // world + 1) for r in order.sample(range(world), world)]
    x, y = torch.randn(32, WIDTH), torch.randn(32, 1)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        if slow[step] == rank:          # inside the step (zero-code steps begin at the first forward)
            time.sleep(args.sleep)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"rank": rank, "slow": slow[:args.steps]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("job", choices=("pipeline", "mesh", "ddp"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    parser.add_argument("--heavy", type=int, default=1)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--slow-rank", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.04)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    result = {"pipeline": pipeline, "mesh": mesh, "ddp": ddp}[args.job](args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
