"""One cell of the compatibility matrix as a real training job: ``python job.py CELL [--api]``.

Without ``--api`` the job knows nothing of perfmon (run it bare, or under
``perfmon run``); with ``--api`` it uses ``probe.start()`` + ``watch()`` and
``mon.step()`` around each optimizer step, as the README shows. Every rank
prints one JSON line: ``{"cell", "rank", "steps", "loss"}``, the loss as
``float.hex`` so that runs can be compared bit for bit.

Distributed cells are launched by torchrun (or ``accelerate launch``) with 2
gloo ranks; everything is CPU, small and seeded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 24

parser = argparse.ArgumentParser()
parser.add_argument("cell")
parser.add_argument("--api", action="store_true")
parser.add_argument("--steps", type=int, default=STEPS)
parser.add_argument("--requests", action="store_true",
                    help="with --api: ask for a module profile at step 3 and a profiler capture at step 14, "
                         "as a viewer would; a refusal becomes a 'request_refused' event")
ARGS = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
MON: Any = None
if ARGS.api:
    import probe
    MON = probe.start(job=f"compat-{ARGS.cell}")
    if ARGS.requests:
        def _ask_at_steps(extras: dict, phases: dict) -> None:
            op = {3: "profile", 14: "capture"}.get(MON.steps)
            if op is not None:
                refused = MON.handle_request({"k": "request", "t": 0.0, "id": MON.steps, "op": op, "steps": 3,
                                              "depth": 2})
                if refused:
                    MON.event("request_refused", op=op, reason=refused)

        MON.add_step_hooks(end=_ask_at_steps)


def watch(model: Any = None, optimizer: Any = None) -> None:
    if MON is not None:
        MON.watch(model=model, optimizer=optimizer)


def step(samples: int) -> Any:
    return MON.step(samples=samples) if MON is not None else contextlib.nullcontext()


def report(steps: int, loss: torch.Tensor | float, rank: int = 0) -> None:
    value = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)
    line = json.dumps({"cell": ARGS.cell, "rank": rank, "steps": steps, "loss": value.hex()})
    os.write(1, (line + "\n").encode())    # one write: ranks share stdout
    if MON is not None:
        MON.close()


def batches(n: int, dim: int = 32, bs: int = 16, seed: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield torch.randn(bs, dim, generator=g), torch.randn(bs, 1, generator=g)


def mlp(dim: int = 32, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))


def train(model: nn.Module, opt: torch.optim.Optimizer, forward: Callable[..., torch.Tensor] | None = None,
          rank: int = 0) -> None:
    """The plain loop most cells share: one optimizer step per batch."""
    forward = forward or model
    loss = torch.tensor(0.0)
    steps = 0
    for x, y in batches(ARGS.steps):
        with step(len(x)):
            loss = F.mse_loss(forward(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
    report(steps, loss, rank)


# -- single process -----------------------------------------------------------------------------

def compile_model() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch(model, opt)                  # before compiling, as most scripts would
    train(model, opt, forward=torch.compile(model))


def compile_step() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch(model, opt)

    @torch.compile
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    loss = torch.tensor(0.0)
    steps = 0
    for x, y in batches(ARGS.steps):
        with step(len(x)):
            loss = train_step(x, y)
        steps += 1
    report(steps, loss)


def compile_optimizer() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3))
    watch(model, opt)

    @torch.compile(fullgraph=False)
    def opt_step() -> None:
        opt.step()

    loss = torch.tensor(0.0)
    steps = 0
    for x, y in batches(ARGS.steps):
        with step(len(x)):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt_step()
        steps += 1
    report(steps, loss)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(x)


class Stack(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 3, checkpointed: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(x)


def activation_checkpointing() -> None:
    model = Stack(checkpointed=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch(model, opt)
    train(model, opt)


def autocast_bf16() -> None:
    model = Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch(model, opt)

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float()
    train(model, opt, forward)


# -- two gloo ranks -------------------------------------------------------------------------------

def _init() -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_rank()


def _done() -> None:
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    _exit_before_finalization()


def _exit_before_finalization() -> None:
    """Run the exit handlers (the probe's close among them), then leave without finalising the interpreter.

    DDP keeps its gloo group alive past ``destroy_process_group``, so the group's worker threads
    outlive ``main``. A work created during backward carries a Python object in its thread-local
    state; when a worker drops the last reference to one while the interpreter finalises, taking
    the GIL ends the thread inside a ``noexcept`` destructor and the process aborts ("terminate
    called without an active exception"). torch 2.13 does this to the bare job too, a few times in
    ten on a loaded 2-core machine; it is a torch teardown bug, not a difference between the runs
    this matrix compares, so the job's last act is the same in every mode.
    """
    import atexit

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(0)


def ddp_no_sync_accum() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = _init()
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    watch(model, opt)
    accum = 4
    loss = torch.tensor(0.0)
    steps = 0
    data = list(batches(ARGS.steps * accum, seed=1 + rank))
    for i in range(ARGS.steps):
        with step(16 * accum):
            for j, (x, y) in enumerate(data[i * accum:(i + 1) * accum]):
                ctx = model.no_sync() if j < accum - 1 else contextlib.nullcontext()
                with ctx:
                    loss = F.mse_loss(model(x), y) / accum
                    loss.backward()
            opt.step()
            opt.zero_grad()
        steps += 1
    report(steps, loss, rank)
    _done()


def compile_ddp() -> None:
    """``torch.compile(DDP(model))``: dynamo's DDPOptimizer splits the graph at bucket boundaries."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = _init()
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    watch(model, opt)
    data = batches(ARGS.steps, seed=1 + rank)
    loss = torch.tensor(0.0)
    compiled = torch.compile(model)
    steps = 0
    for x, y in data:
        with step(len(x)):
            loss = F.mse_loss(compiled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
    report(steps, loss, rank)
    _done()


def fsdp2_mixed_precision() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank = _init()
    model = Stack(dim=64, depth=2)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch(model, opt)
    loss = torch.tensor(0.0)
    steps = 0
    for x, y in batches(ARGS.steps, dim=64, seed=1 + rank):
        with step(len(x)):
            loss = F.mse_loss(model(x).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
    report(steps, loss, rank)
    _done()


def fsdp2_comm_bound() -> None:
    """FSDP2 with wide blocks and tiny batches: gathering the weights dominates each step."""
    from torch.distributed.fsdp import fully_shard

    rank = _init()
    model = Stack(dim=512, depth=4)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    watch(model, opt)
    loss = torch.tensor(0.0)
    steps = 0
    for x, y in batches(ARGS.steps, dim=512, bs=2, seed=1 + rank):
        with step(len(x)):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
    report(steps, loss, rank)
    _done()


def dtensor_tp() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank = _init()
    mesh = init_device_mesh("cpu", (2,))
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    watch(model, opt)
    loss = torch.tensor(0.0)
    steps = 0
    g = torch.Generator().manual_seed(1)          # tensor parallel: every rank sees the same batch
    for _ in range(ARGS.steps):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
        with step(len(x)):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
    report(steps, loss, rank)
    _done()


def accelerate() -> None:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    acc = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(1)
    n = ARGS.steps * 16 * acc.num_processes
    data = TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=16))
    watch(model, opt)
    loss = torch.tensor(0.0)
    steps = 0
    for x, y in loader:
        with step(len(x)):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            acc.backward(loss)
            opt.step()
        steps += 1
    report(steps, loss, acc.process_index)
    acc.wait_for_everyone()
    acc.end_training()
    _exit_before_finalization()


# -- trainers -------------------------------------------------------------------------------------

def _step_callback_hf() -> Any:
    """API mode for the HF Trainer: one ``mon.step()`` from each step's begin to its end."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        ctx: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                           **kw: Any) -> None:
            watch(model, optimizer)

        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            self.ctx = MON.step()
            self.ctx.__enter__()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            if self.ctx is not None:
                self.ctx.__exit__(None, None, None)
                self.ctx = None

    return Steps()


def hf_trainer() -> None:
    import tempfile

    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(Dataset):
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(1)
            self.ids = torch.randint(0, 128, (n, 16), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=ARGS.steps, per_device_train_batch_size=8,
                                 gradient_accumulation_steps=2, report_to=[], save_strategy="no",
                                 logging_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
                                 disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(ARGS.steps * 16),
                          callbacks=[_step_callback_hf()] if MON is not None else None)
        result = trainer.train()
    report(trainer.state.global_step, result.training_loss)


def lightning_trainer() -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    L.seed_everything(0, verbose=False)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()
            self.last = torch.tensor(0.0)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            self.last = F.mse_loss(self.net(x), y)
            return self.last

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Steps(L.Callback):
        ctx: Any = None

        def on_train_start(self, trainer: Any, module: Any) -> None:
            watch(module, trainer.optimizers[0])

        def on_train_batch_start(self, *a: Any) -> None:
            self.ctx = MON.step()
            self.ctx.__enter__()

        def on_train_batch_end(self, *a: Any) -> None:
            if self.ctx is not None:
                self.ctx.__exit__(None, None, None)
                self.ctx = None

    g = torch.Generator().manual_seed(1)
    n = ARGS.steps * 16
    data = TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))
    module = Module()
    trainer = L.Trainer(max_steps=ARGS.steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Steps()] if MON is not None else None)
    trainer.fit(module, DataLoader(data, batch_size=16))
    report(trainer.global_step, module.last)


# -- GPU only ------------------------------------------------------------------------------------

def cuda_graphs() -> None:
    """torch.compile(mode="reduce-overhead"): the compiled forward replays CUDA graphs."""
    model = mlp().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch(model, opt)
    compiled = torch.compile(model, mode="reduce-overhead")
    train(model, opt, forward=lambda x: compiled(x.cuda()).cpu())


def nccl_ddp() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    model = DDP(mlp().cuda(), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    watch(model, opt)
    train(model, opt, forward=lambda x: model(x.cuda()).cpu(), rank=rank)
    _done()


CELLS = {f.__name__: f for f in (cuda_graphs, nccl_ddp, compile_model, compile_step, compile_optimizer,
                                  activation_checkpointing, autocast_bf16, ddp_no_sync_accum, compile_ddp,
                                  fsdp2_mixed_precision, fsdp2_comm_bound, dtensor_tp, accelerate, hf_trainer,
                                  lightning_trainer)}

if __name__ == "__main__":
    if ARGS.cell not in CELLS:
        sys.exit(f"unknown cell {ARGS.cell!r}; cells: {', '.join(CELLS)}")
    CELLS[ARGS.cell]()
