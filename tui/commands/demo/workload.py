"""The demo's training process: a small GPT on synthetic tokens, instrumented with the probe.

Run by the demo launcher once per rank (``python -m tui.commands.demo.workload``) with
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set for gloo (or NCCL
when every rank has its own GPU). Each scenario's bottleneck is produced by the
mechanism that causes it in real jobs (see ``tui.commands.demo.scenarios``); the probe
measures it like any other job. SIGTERM stops the loop at the next step
boundary and the process cleans up (probe socket, process group, loaders).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import ctypes.util
import io
import os
import random
import signal
import string
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import probe
from probe.host import memory_limit, parse_bytes
from tui.commands.demo import scenarios
from tui.commands.demo.scenarios import ModelSize, Scenario

MEMORY_HOLD = 0.92      # keep predictions up to here: over the 90% verdict mark, under the limit


# -- the model ------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.tok = nn.Embedding(size.vocab, size.d_model)
        self.pos = nn.Embedding(size.max_seq, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.heads) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


# -- data -----------------------------------------------------------------------------------
def _pattern(rng: random.Random, vocab: int, n: int) -> list[int]:
    """Learnable synthetic text: arithmetic runs mod vocab with a little noise."""
    start, stride = rng.randrange(vocab), rng.randrange(1, 8)
    return [(start + stride * i) % vocab if rng.random() > 0.05 else rng.randrange(vocab) for i in range(n)]


class SyntheticTokens(Dataset):
    """Sequences generated on the fly: cheap, so the loader is never the bottleneck."""

    def __init__(self, vocab: int, seq: int, seed: int) -> None:
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        start, stride = torch.randint(self.vocab, (1,), generator=g), torch.randint(1, 8, (1,), generator=g)
        seq = (start + stride * torch.arange(self.seq + 1)) % self.vocab
        noise = torch.rand(self.seq + 1, generator=g) < 0.05
        return torch.where(noise, torch.randint(self.vocab, (self.seq + 1,), generator=g), seq)


class Tokenizer:
    """Greedy longest-match subword tokenizer in pure Python (the slow kind many pipelines run per sample)."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        pieces = list(string.ascii_lowercase) + [" ", ".", ","]
        seen = set(pieces)
        while len(pieces) < vocab - 1:
            piece = "".join(rng.choice("etaoinshrdlucmfw") for _ in range(rng.randint(2, 4)))
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
        self.ids = {p: i + 1 for i, p in enumerate(pieces)}    # 0 = unknown
        self.longest = max(len(p) for p in pieces)

    def encode(self, text: str) -> list[int]:
        out, i, ids, longest = [], 0, self.ids, self.longest
        while i < len(text):
            for n in range(min(longest, len(text) - i), 0, -1):
                tok = ids.get(text[i:i + n])
                if tok is not None:
                    out.append(tok)
                    i += n
                    break
            else:
                out.append(0)
                i += 1
        return out


class RawText(Dataset):
    """Raw documents tokenised in ``__getitem__``, i.e. inside the loader workers."""

    def __init__(self, vocab: int, seq: int, chars: int, seed: int) -> None:
        self.seq, self.chars, self.seed = seq, chars, seed
        self.tokenizer = Tokenizer(vocab)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        rng = random.Random(self.seed * 1_000_003 + i)
        words = []
        size = 0
        while size < self.chars:
            word = "".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 9)))
            words.append(word)
            size += len(word) + 1
        text = " ".join(words).lower()
        ids = self.tokenizer.encode(text)[: self.seq + 1]
        ids += [0] * (self.seq + 1 - len(ids))
        return torch.tensor(ids)


def write_shards(directory: Path, vocab: int, seq: int, batch: int, count: int, seed: int) -> list[Path]:
    """Token shards on disk, one batch per file, as a pre-tokenised corpus would be stored."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    files = []
    for n in range(count):
        data = array("h")
        for _ in range(batch):
            data.extend(_pattern(rng, vocab, seq + 1))
        path = directory / f"shard-{seed}-{n:04d}.bin"
        path.write_bytes(data.tobytes())
        files.append(path)
    return files


class ShardReader(Dataset):
    """Reads one shard per item from storage that answers after ``latency`` (remote/object storage).

    The latency is the emulated part: the read itself is a real file read, and the
    worker sleeps while waiting, as a worker blocked on network I/O does.
    """

    def __init__(self, files: list[Path], seq: int, latency: float) -> None:
        self.files, self.seq, self.latency = files, seq, latency

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.latency)
        data = array("h")
        data.frombytes(self.files[i % len(self.files)].read_bytes())
        return torch.tensor(data, dtype=torch.long).view(-1, self.seq + 1)


def make_loader(sc: Scenario, vocab: int, seq: int, rank: int, scratch: Path) -> DataLoader:
    seed = 1 + rank
    common: dict[str, Any] = {"num_workers": sc.workers}
    if sc.workers:
        common["prefetch_factor"] = 2
    if sc.source == "shards":
        files = write_shards(scratch / "shards", vocab, seq, sc.batch, 16, seed)
        return DataLoader(ShardReader(files, seq, sc.read_latency_s), batch_size=None, **common)
    if sc.source == "text":
        return DataLoader(RawText(vocab, seq, sc.text_chars, seed), batch_size=sc.batch, **common)
    return DataLoader(SyntheticTokens(vocab, seq, seed), batch_size=sc.batch, **common)


# -- the job --------------------------------------------------------------------------------
@dataclass
class Job:
    rank: int
    world: int
    device: torch.device
    model: nn.Module          # DDP-wrapped when world > 1
    optimizer: torch.optim.Optimizer
    mon: Any
    scratch: Path
    memory_limit: int | None  # CPU memory the memory scenario grows towards
    stop: bool = False
    step: int = 0
    kept: list[torch.Tensor] = field(default_factory=list)   # predictions kept for the epoch metric
    last_loss: torch.Tensor | None = None
    floor: int = 0                    # memory in use at the start of the step (memory scenario)
    floor_limit: int | None = None
    grad_norms: dict[str, float] = field(default_factory=dict)
    compute_s: float = 0.0          # the previous step's time outside the metrics call (host_wait)
    pipeline: Any = None            # this rank's pipeline stage and schedule (tui.commands.demo.pipeline)


def setup_distributed(world: int) -> torch.device:
    """gloo on CPU; NCCL only when every local rank can have its own GPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return device


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW, fused where this torch build supports it for the device (several times faster on CPU)."""
    try:
        return torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.parameters(), lr=3e-4)


def memory_used(job: Job) -> tuple[int, int | None]:
    """(bytes in use, limit) for the memory scenario: device reserved on GPU, RSS on CPU."""
    if job.device.type == "cuda":
        return torch.cuda.memory_reserved(job.device), torch.cuda.mem_get_info(job.device)[1]
    return psutil.Process().memory_info().rss, job.memory_limit


def checkpoint(job: Job, mb_per_s: float) -> None:
    """A blocking checkpoint of model and optimizer, written at the storage's bandwidth.

    The bytes are real (``torch.save`` of both state dicts, fsynced); the storage
    bandwidth is emulated by pacing the writes, like a shared filesystem under load.
    """
    t0 = time.perf_counter()
    buf = io.BytesIO()
    model = job.model.module if isinstance(job.model, nn.parallel.DistributedDataParallel) else job.model
    torch.save({"model": model.state_dict(), "optimizer": job.optimizer.state_dict(), "step": job.step}, buf)
    data = buf.getbuffer()
    path = job.scratch / f"checkpoint-rank{job.rank}.pt"
    chunk = 1 << 20
    with open(path, "wb") as fh:
        for off in range(0, len(data), chunk):
            piece = data[off:off + chunk]
            started = time.perf_counter()
            fh.write(piece)
            budget = len(piece) / (mb_per_s * 1e6)
            time.sleep(max(0.0, budget - (time.perf_counter() - started)))
        fh.flush()
        os.fsync(fh.fileno())
    dt = time.perf_counter() - t0
    job.mon.event("checkpoint", seconds=dt, bytes=len(data), step=job.step)


def train_step(job: Job, sc: Scenario, batch: torch.Tensor) -> None:
    mon, model = job.mon, job.model
    batch = batch.to(job.device, non_blocking=True)
    if job.pipeline is not None:          # the stages' schedule does forward and backward
        with mon.step(samples=batch.shape[0], tokens=batch[:, :-1].numel()):
            job.pipeline.step(batch)
            with mon.phase("optimizer"):
                job.optimizer.step()
                job.optimizer.zero_grad(set_to_none=True)
        job.step += 1
        return
    if sc.keep_predictions:
        job.floor, job.floor_limit = memory_used(job)
    x, y = batch[:, :-1], batch[:, 1:]
    micro = max(1, min(sc.accumulate, x.shape[0]))
    xs, ys = x.chunk(micro), y.chunk(micro)
    ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else None
    with mon.step(samples=x.shape[0], tokens=x.numel()):
        began, waited = time.perf_counter(), 0.0
        for j, (xm, ym) in enumerate(zip(xs, ys)):
            last = j == len(xs) - 1
            sync = contextlib.nullcontext() if (last or ddp is None) else ddp.no_sync()
            with sync:
                with mon.phase("forward"):
                    logits = model(xm)
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ym.reshape(-1)) / len(xs)
                if sc.service_wait and not sc.service_after and last:
                    called = time.perf_counter()
                    report_to_metrics_service(sc.service_wait * (job.compute_s or called - began))
                    waited = time.perf_counter() - called
                with mon.phase("backward"):
                    loss.backward()
            if sc.keep_predictions:
                keep_prediction(job, logits)
        if sc.item_logging:
            # the anti-pattern: one host-device sync per parameter, every step
            job.grad_norms = {name: p.grad.norm().item() for name, p in model.named_parameters()
                              if p.grad is not None}
            job.grad_norms["loss"] = loss.item()
        with mon.phase("optimizer"):
            job.optimizer.step()
            job.optimizer.zero_grad(set_to_none=True)
        job.compute_s = time.perf_counter() - began - waited
    job.step += 1
    job.last_loss = loss.detach() * len(xs)


def report_to_metrics_service(latency_s: float) -> None:
    """The anti-pattern: a synchronous call to a remote metrics service in the loop. The sleep
    stands for its round trip; the training thread is off CPU for all of it, and perfmon hooks
    nothing here, so only the thread's CPU clock and its stack show the wait."""
    time.sleep(latency_s)


def keep_prediction(job: Job, logits: torch.Tensor) -> None:
    """Keep this micro-batch's logits for the epoch-end metric while memory is below the hold mark.

    ``job.floor`` is the memory in use at the start of the step (kept data, no activations), so
    the step's own transient activations land above the hold mark, not the kept data.
    """
    if job.floor_limit and job.floor < MEMORY_HOLD * job.floor_limit:
        job.kept.append(logits.detach())


def release_predictions(job: Job) -> None:
    """Free the kept predictions and hand the memory back (glibc keeps freed heap otherwise)."""
    job.kept.clear()
    if job.device.type == "cuda":
        torch.cuda.empty_cache()
        return
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass   # not glibc: RSS stays high until the allocator reuses it


def phases_for(name: str, world: int) -> tuple[Scenario, ...]:
    """The scenario itself, or the tour's phases for this many ranks."""
    if name == scenarios.TOUR_NAME:
        return scenarios.tour(world)
    sc = scenarios.get(name)
    if sc is None:
        raise SystemExit(f"unknown scenario {name!r}")
    return (sc,)


def phase_now(phases: tuple[Scenario, ...], t0: float) -> Scenario:
    """The phase in force now; every rank computes it from the launcher's shared ``t0``.

    Ranks may switch one step apart; each step still does exactly one all-reduce,
    so that never deadlocks DDP.
    """
    if len(phases) == 1:
        return phases[0]
    return phases[int((time.time() - t0) // scenarios.tour_phase_seconds()) % len(phases)]


def run(job: Job, phases: tuple[Scenario, ...], t0: float, seconds: float | None, parent_pid: int | None) -> None:
    current: Scenario | None = None
    loader_iter: Iterator[torch.Tensor] | None = None
    model_size = phases[0].model
    last_note = time.monotonic()
    deadline = None if seconds is None else time.monotonic() + seconds
    while not job.stop and (deadline is None or time.monotonic() < deadline):
        if parent_pid is not None and os.getppid() != parent_pid:
            note(job, "the demo launcher is gone; stopping")
            break
        sc = phase_now(phases, t0)
        if sc is not current:
            if current is not None and current.keep_predictions:
                release_predictions(job)   # the epoch metric is computed and its inputs freed
            current = sc
            seq = int(sc.seq * (sc.straggler_seq_factor if job.rank == job.world - 1 else 1.0))
            data_rank = 0 if sc.pipeline else job.rank     # every stage sees the same batches, in order
            loader_iter = iter(job.mon.loader(make_loader(sc, model_size.vocab, seq, data_rank, job.scratch)))
            job.mon.event("demo", message=f"demo scenario: {sc.name}: {sc.summary}", scenario=sc.name)
            note(job, f"scenario {sc.name}: {sc.summary}")
        batch = next(loader_iter)  # type: ignore[arg-type]
        if sc.hang_after and job.step == sc.hang_after and job.rank == job.world - 1:
            hang(job)
        train_step(job, sc, batch)
        if sc.service_wait and sc.service_after and job.compute_s:
            report_to_metrics_service(sc.service_wait * job.compute_s)   # after the step: between steps
        if sc.checkpoint_every and job.step % sc.checkpoint_every == 0:
            checkpoint(job, sc.checkpoint_mb_per_s)
        if time.monotonic() - last_note > 5.0 and job.last_loss is not None:
            last_note = time.monotonic()
            note(job, f"step {job.step} loss {float(job.last_loss):.3f}")


def hang(job: Job) -> None:
    """The stuck scenario: wait on a lock nobody releases; the launcher's SIGKILL ends it (and the
    ranks waiting in the all-reduce), as an operator ends a hung job."""
    note(job, f"rank {job.rank} blocks before step {job.step}'s all-reduce, for good")
    never = threading.Lock()
    never.acquire()
    while True:
        never.acquire(timeout=1.0)   # the stall line: perfmon names it as where this rank is


def note(job: Job, message: str) -> None:
    print(f"[rank {job.rank}] {message}", flush=True)


def cpu_memory_limit(phases: tuple[Scenario, ...], explicit: str | None) -> int | None:
    """The CPU limit the memory scenario grows towards: --memory-limit, else RSS now + the budget."""
    if explicit:
        return parse_bytes(explicit)
    budget = max((s.memory_budget_mb for s in phases if s.keep_predictions), default=0)
    if not budget:
        return None
    baseline = psutil.Process().memory_info().rss + budget * (1 << 20)
    return min(baseline, memory_limit()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tui.commands.demo.workload")
    parser.add_argument("--scenario", required=True, choices=scenarios.names())
    parser.add_argument("--job", required=True)
    parser.add_argument("--t0", type=float, default=None, help="tour clock origin (unix s), shared by ranks")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--memory-limit", default=None)
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this launcher is gone")
    args = parser.parse_args(argv)

    job_state: dict[str, Job] = {}
    stop_requested = []

    def on_term(signum: int, frame: Any) -> None:
        stop_requested.append(signum)
        if "job" in job_state:
            job_state["job"].stop = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    t0 = args.t0 if args.t0 is not None else time.time()
    phases = phases_for(args.scenario, world)
    # leave the loader workers their cores: oversubscribed OpenMP threads stall every op
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world - max(s.workers for s in phases)))
    torch.manual_seed(0)
    try:
        device = setup_distributed(world)
    except Exception:
        if stop_requested:   # stopped while the ranks were still meeting: nothing to clean up
            return 0
        raise
    if device.type == "cuda" and len(phases) == 1:
        phases = (phases[0].on_gpu(),)
    pipe = None
    if phases[0].pipeline:
        from tui.commands.demo.pipeline import Pipeline
        pipe = Pipeline(phases[0], rank, world, device, Block)
        model: nn.Module = pipe.module
    else:
        model = TinyGPT(phases[0].model).to(device)
        if world > 1:
            model = nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer(model)

    limit = cpu_memory_limit(phases, args.memory_limit) if device.type == "cpu" else None
    if limit:
        os.environ["PERFMON_MEMORY_LIMIT"] = str(limit)   # the probe judges RSS against this
    mon = probe.start(job=args.job)
    if hasattr(mon, "watch"):
        mon.watch(model=model, optimizer=optimizer, syncs=True)   # sync counting is opt-in; the demo shows it
    with tempfile.TemporaryDirectory(prefix=f"perfmon-demo-r{rank}-") as scratch:
        job = Job(rank, world, device, model, optimizer, mon, Path(scratch), limit, pipeline=pipe)
        job.stop = bool(stop_requested)
        job_state["job"] = job
        if limit:
            note(job, f"memory limit for this demo: {limit / (1 << 20):.0f} MiB")
        elif args.memory_limit and device.type == "cuda":
            note(job, "--memory-limit applies to CPU jobs; on a GPU the device's memory is the limit")
        try:
            run(job, phases, t0, args.seconds, args.parent_pid)
        except Exception as exc:
            if not _stopping(job, world):
                raise
            note(job, f"stopped while a peer was leaving ({type(exc).__name__})")
        finally:
            job.kept.clear()
            mon.close()
    if world > 1 and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


def _stopping(job: Job, world: int) -> bool:
    """A collective that fails because a peer exited is part of a clean stop, not an error."""
    if world == 1:
        return job.stop
    deadline = time.monotonic() + 2.0
    while not job.stop and time.monotonic() < deadline:
        time.sleep(0.05)
    return job.stop


def leave(code: int) -> None:
    """Exit after the exit handlers, without finalising the interpreter.

    DDP keeps its gloo group alive past ``destroy_process_group``. A gloo worker that drops the last
    reference to a work made during backward (its thread-local state holds a Python object) while
    the interpreter finalises aborts the rank: "terminate called without an active exception"
    (torch 2.13, a few exits in ten on a loaded machine, with or without perfmon).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
