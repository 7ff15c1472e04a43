"""The demo's scenario table: each name maps to the knobs that induce its bottleneck.

Every bottleneck comes from a real mechanism in a real training job (pure
Python tokenisation in the loader workers, storage latency on reads, a large
gradient all-reduce, uneven shards, a pipeline stage holding too many layers, predictions kept
for an epoch metric, blocking checkpoints, ``.item()`` logging, a blocking call to a metrics
service inside the step or after it); nothing fakes a record. Sizes are
chosen so the verdict is unambiguous on two CPU cores within ~10 s. This module
is pure Python: the launcher reads it without importing torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelSize:
    """A small GPT: token + position embeddings, pre-norm blocks, untied LM head."""

    vocab: int = 512
    d_model: int = 192
    layers: int = 2
    heads: int = 4
    max_seq: int = 256


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str                      # what the demo does to the job, one line
    expect: str                       # the verdict perfmon should reach (a vocabulary ID)
    finding: str | None = None        # a secondary finding it should list (step_gaps)
    ranks: int = 1
    needs_gpu: bool = False
    model: ModelSize = field(default_factory=ModelSize)
    batch: int = 16                   # sequences per optimizer step and rank
    seq: int = 128                    # tokens per sequence
    accumulate: int = 1               # micro-batches per optimizer step (DDP no_sync between)
    workers: int = 1                  # DataLoader worker processes
    source: str = "synthetic"         # synthetic | text (tokenised in the workers) | shards (files on slow storage)
    text_chars: int = 0               # raw characters tokenised per sequence (source=text)
    read_latency_s: float = 0.0       # storage latency per shard read (source=shards)
    straggler_seq_factor: float = 1.0  # the last rank's shard holds sequences this many times longer
    keep_predictions: bool = False    # keep every step's logits for an epoch-end metric (memory grows)
    memory_budget_mb: int = 0         # CPU: default limit = RSS at start + this (unless --memory-limit)
    checkpoint_every: int = 0         # blocking checkpoint every N steps (all ranks at the same step)
    checkpoint_mb_per_s: float = 0.0  # bandwidth of the (slow) checkpoint storage
    item_logging: bool = False        # per-parameter grad-norm .item() every step (host-device syncs)
    service_wait: float = 0.0         # a blocking metrics call between forward and backward, whose latency
                                      # is this many times the previous step's compute (0: none)
    service_after: bool = False       # ... made after the step instead, between steps (the loop's own wait)
    hang_after: int = 0               # the last rank stops before this step's all-reduce, for good
    stall_s: float | None = None      # PERFMON_STALL_S for the ranks (unless the user set it)
    gpu_model: ModelSize | None = None  # run alone on a GPU: this model and batch instead, so that the
    gpu_batch: int | None = None        # device's work, not the host's launches, bounds each step
    pipeline: bool = False            # one pipeline stage per rank (torch.distributed.pipelining, 1F1B)
    heavy_stage_factor: int = 1       # the last stage holds this many times the blocks of the others

    def on_gpu(self) -> Scenario:
        """The scenario as it runs alone on a GPU: the small model of a CPU run leaves a large GPU idle
        most of each step, waiting for the host to launch its kernels (an H200 read 11% busy:
        host_overhead), which is the truth about that job but not this scenario's."""
        if self.gpu_model is None:
            return self
        return replace(self, model=self.gpu_model, batch=self.gpu_batch or self.batch)


SMALL = ModelSize()
# Large gradients relative to the work per step: a wide vocabulary makes the embedding and
# the LM head ~2.6 M parameters each, ~26 MB of fp32 gradients (6.5 M parameters) per step.
WIDE = ModelSize(vocab=8192, d_model=320, layers=1, heads=4, max_seq=64)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "a small GPT trains on synthetic tokens; the loader keeps up, nothing else in the way",
             expect="healthy", gpu_model=ModelSize(vocab=8192, d_model=1024, layers=6, heads=16, max_seq=256),
             gpu_batch=32),
    Scenario("data_preprocessing", "the loader worker tokenises raw text in pure Python for every sample: "
             "its CPU is saturated and the step waits for batches",
             expect="data_preprocessing", source="text", text_chars=30000),
    Scenario("data_loading", "the loader worker reads token shards from storage with 0.5 s latency per read: "
             "it sleeps on I/O while the step waits",
             expect="data_loading", source="shards", read_latency_s=0.5),
    Scenario("communication", "2 ranks (gloo) train a wide-vocabulary model on one sequence each: "
             "~26 MB of gradients are all-reduced after every tiny step",
             expect="communication", ranks=2, model=WIDE, batch=1, seq=16, workers=0),
    Scenario("load_imbalance", "2 ranks (gloo) with uneven shards: the last rank's sequences are 4x longer, "
             "so the others wait for it in the all-reduce",
             expect="load_imbalance", ranks=2, batch=8, seq=32, straggler_seq_factor=4.0, workers=0),
    Scenario("memory", "the loop keeps every step's logits for an epoch-end metric: memory grows "
             "until it nears the limit",
             expect="memory", model=replace(SMALL, vocab=2048), batch=8, keep_predictions=True,
             memory_budget_mb=400),
    Scenario("step_gaps", "every 15 steps the job blocks on a checkpoint of model and optimizer "
             "written to slow storage (16 MB/s)", expect="healthy", finding="step_gaps",
             checkpoint_every=15, checkpoint_mb_per_s=16.0),
    Scenario("host_wait", "between forward and backward, every step reports to a metrics service and "
             "blocks until it answers: the training thread waits off CPU ~40% of each step",
             expect="host_wait", service_wait=0.67),
    Scenario("host_wait_between", "after every step, outside it, the loop reports to a metrics service and "
             "blocks until it answers: the loop's own wait between steps, ~40% of each iteration",
             expect="host_wait", service_wait=0.67, service_after=True),
    Scenario("stuck", "2 ranks (gloo): after 30 steps the last rank blocks before its all-reduce "
             "(a lock that is never released) and the other waits in it for ever",
             expect="stuck", ranks=2, batch=4, seq=32, workers=0, hang_after=30, stall_s=5.0),
    Scenario("slow_stage", "2 ranks (gloo) train the small GPT as a 2-stage pipeline (torch.distributed."
             "pipelining, 1F1B): the last stage holds 3x the blocks, so the first waits for it in its bubble",
             expect="slow_stage", ranks=2, model=replace(SMALL, layers=1), batch=8, seq=64, accumulate=4,
             workers=0, pipeline=True, heavy_stage_factor=3),
    Scenario("host_sync", "every step logs each parameter's gradient norm with .item(): the host "
             "waits for the device dozens of times per step", expect="host_sync", needs_gpu=True,
             item_logging=True),
)}

TOUR_NAME = "tour"
# Long enough for the verdict window (last 50 steps or 30 s) to fill with the new phase's
# steps and show its verdict for a good part of the phase.
TOUR_PHASE_S = 40.0
PHASE_ENV = "PERFMON_DEMO_PHASE_SECONDS"   # overrides TOUR_PHASE_S (tests, slow machines)


def tour_phase_seconds() -> float:
    try:
        value = float(os.environ.get(PHASE_ENV) or TOUR_PHASE_S)
    except ValueError:
        return TOUR_PHASE_S
    return value if value > 0 else TOUR_PHASE_S


def tour(ranks: int) -> tuple[Scenario, ...]:
    """The tour's phases for one live job of ``ranks`` processes: one model throughout.

    Multi-rank phases (communication, load imbalance) join when the job has peers; they use
    the small model with tiny batches rather than the wide one, since the model cannot change.
    """
    single = (
        replace(SCENARIOS["healthy"], accumulate=4),
        replace(SCENARIOS["data_preprocessing"], accumulate=4),
        replace(SCENARIOS["data_loading"], accumulate=4),
        replace(SCENARIOS["host_wait"], accumulate=4),
    )
    peers = (
        replace(SCENARIOS["communication"], model=SMALL, batch=2, seq=64,
                summary="tiny batches (2 sequences per rank): every step all-reduces the model's ~4.5 MB "
                        "of gradients for very little compute"),
        replace(SCENARIOS["load_imbalance"]),
    ) if ranks > 1 else ()
    rest = (
        replace(SCENARIOS["memory"], model=SMALL, batch=16),
        replace(SCENARIOS["step_gaps"], accumulate=4),
    )
    return tuple(replace(s, ranks=ranks) for s in single + peers + rest)


def names() -> list[str]:
    return [TOUR_NAME, *SCENARIOS]


def get(name: str) -> Scenario | None:
    return SCENARIOS.get(name)
