"""Fixes that follow the job's own stack (docs/verdict.md, "Advice follows the stack"): memory fixes
for what is large (and for what grows), communication fixes for the parallelism the job's collectives
show, loader fixes that fit its loader. Pure: the view in, words out.

The parallelism is read from the window's collectives (``JobView.comm_ops``), the only place the
stream names it: FSDP (FSDP2's ``fully_shard``, ZeRO-3) all-gathers parameters and reduce-scatters
gradients; DDP all-reduces gradients (so does tensor parallelism inside its layers: the all-reduce
is DDP's unless the job says otherwise); a pipeline sends activations between stages; expert
parallelism exchanges tokens all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmon_analysis import units
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.views import CommOpRow, JobView, MemoryMetrics

LARGE_SHARE = 0.20        # a memory kind at or over 20% of the peak gets its own fixes
PARALLEL_SHARE = 0.20     # a family of collectives with 20% of the collective time or more is in use

_FAMILY = {"all_gather": "fsdp", "reduce_scatter": "fsdp", "all_reduce": "ddp", "send": "pipeline",
           "recv": "pipeline", "all_to_all": "expert"}
PARALLELISM = {"fsdp": "FSDP", "ddp": "DDP", "pipeline": "pipeline parallelism", "expert": "expert parallelism"}


# -- memory ------------------------------------------------------------------------------------
_KIND_FIXES = {
    "activations": ["activation checkpointing (torch.utils.checkpoint) on the largest blocks",
                    "mixed precision (bf16 autocast) to halve activations",
                    "smaller micro-batch with gradient accumulation to keep the global batch"],
    "optimizer": ["shard optimizer state (FSDP2 fully_shard, ZeroRedundancyOptimizer)",
                  "a lighter optimizer state: 8-bit Adam (bitsandbytes) or Adafactor"],
    "params": ["shard parameters and gradients (FSDP2 fully_shard)",
               "bf16 parameters (MixedPrecisionPolicy(param_dtype=torch.bfloat16))"],
    "grads": ["shard gradients (FSDP2 fully_shard); zero_grad(set_to_none=True) frees them between steps"],
    "cache": ["the allocator caches freed blocks: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
              "torch.cuda.empty_cache() only between phases (it slows every step)"],
    "other": ["memory outside the model's tensors: the data pipeline (num_workers x prefetch_factor batches "
              "in flight), Python objects and tensors the loop keeps, libraries' own buffers"],
}
_GENERIC = ["activation checkpointing (torch.utils.checkpoint) on the largest blocks",
            "mixed precision (bf16 autocast) to halve activations",
            "smaller micro-batch with gradient accumulation to keep the global batch",
            "shard optimizer state and gradients (FSDP / ZeRO)"]
_KEPT = ("tensors the loop keeps every step: a loss or an output appended to a list with its graph "
         "(keep loss.item() or loss.detach()), metrics accumulated as tensors, a cache that never evicts")
_LEAK_KIND = {
    "activations": "a graph kept alive across steps: retain_graph=True, or a hidden state carried into the next "
                   "step without .detach() (RNNs, truncated BPTT)",
}


def memory_breakdown(mem: MemoryMetrics) -> list[tuple[str, int]]:
    """The memory kinds the probe measured, largest first."""
    kinds = [("params", mem.params_bytes), ("grads", mem.grads_bytes), ("optimizer", mem.optimizer_bytes),
             ("activations", mem.activations_bytes), ("cache", mem.cache_bytes), ("other", mem.other_bytes)]
    return sorted(((k, v) for k, v in kinds if v), key=lambda kv: -kv[1])


def memory_fixes(mem: MemoryMetrics, growth: MemoryGrowth | None) -> list[str]:
    """A leak's fixes first (what keeps growing), then the fixes of each kind that is large (at least
    ``LARGE_SHARE`` of what is measured), largest first; the usual list when nothing is broken down."""
    fixes: list[str] = []
    if growth is not None and growth.steady:
        fixes.append(f"find what the loop keeps every step ({growth.label} grows {units.nbytes(growth.per_step)} "
                     f"per step{f', most in {growth.kind}' if growth.kind else ''}): "
                     + _LEAK_KIND.get(growth.kind or "", _KEPT))
        fixes.append("torch.cuda.memory._record_memory_history() then _dump_snapshot() shows which call "
                     "allocated what stays" if growth.series != "rss" else
                     "tracemalloc snapshots a few hundred steps apart show the Python lines whose memory grows")
    parts = memory_breakdown(mem)
    total = sum(v for _, v in parts)
    large = [k for k, v in parts if total and v / total >= LARGE_SHARE]
    if not large:
        return fixes + [f for f in _GENERIC if f not in fixes]
    for kind in large:
        for fix in _KIND_FIXES[kind]:
            if fix not in fixes:
                fixes.append(fix)
    return fixes


# -- communication -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CommShare:
    """One collective's part of the exposed communication: its share of the collective time times
    the exposed share (the probe times exposure per step, not per collective)."""

    op: str
    share: float


def exposed_split(view: JobView) -> list[CommShare]:
    """The exposed share of the step split by collective, largest first (empty without both)."""
    exposed = view.metrics.comm_exposed_frac
    total = sum(c.seconds for c in view.comm_ops)
    if exposed is None or total <= 0:
        return []
    return [CommShare(c.op, exposed * c.seconds / total) for c in view.comm_ops if c.seconds > 0]


def parallelism(ops: list[CommOpRow]) -> list[str]:
    """The parallelism families the window's collectives show, most collective time first."""
    total = sum(c.seconds for c in ops)
    by: dict[str, float] = {}
    for c in ops:
        family = _FAMILY.get(c.op)
        if family is not None:
            by[family] = by.get(family, 0.0) + c.seconds
    return [f for f, s in sorted(by.items(), key=lambda kv: -kv[1]) if total > 0 and s / total >= PARALLEL_SHARE]


def comm_fixes(view: JobView, op: str) -> list[str]:
    """Fixes for the parallelism in use (DDP's when the collectives say nothing else)."""
    families = parallelism(view.comm_ops) or ["ddp"]
    fixes: list[str] = []
    for family in families:
        fixes += _FAMILY_FIXES[family](op)
    return fixes


def _ddp(op: str) -> list[str]:
    return [f"overlap {op} with backward (DDP bucket_cap_mb; no sync inside backward)",
            "gradient accumulation with no_sync() to communicate every N micro-batches",
            "gradient compression hooks (bf16/fp16 compress, PowerSGD)"]


def _fsdp(op: str) -> list[str]:
    return ["fully_shard(block, reshard_after_forward=False) keeps each block's parameters gathered from forward "
            "to backward: one all-gather per block instead of two, for the memory of the gathered block "
            "(an int reshards to a smaller group instead)",
            "prefetch the next blocks' all-gathers: block.set_modules_to_forward_prefetch([next blocks]) and "
            "set_modules_to_backward_prefetch([previous blocks])",
            "with gradient accumulation, model.set_requires_gradient_sync(False) on all but the last micro-batch: "
            "one reduce-scatter per step instead of one per micro-batch",
            "MixedPrecisionPolicy(param_dtype=torch.bfloat16) halves the all-gather bytes; "
            "reduce_dtype=torch.bfloat16 halves the reduce-scatter's",
            "fully_shard each transformer block, not each layer: fewer, larger collectives; across nodes, "
            "HSDP (a 2-D mesh: shard within a node, replicate across) keeps the all-gathers on the fast links"]


def _pipeline(op: str) -> list[str]:
    return ["more micro-batches per step (n_microbatches) shrink the pipeline bubble",
            "an interleaved schedule (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble) with several "
            "stages per rank",
            "balance the stages: the slowest stage sets the pace of every send and recv"]


def _expert(op: str) -> list[str]:
    return ["all-to-all carries each token to its experts: a higher capacity factor drops fewer tokens but "
            "sends more; keep the expert-parallel group inside a node",
            "overlap the token exchange with the shared experts' or attention's compute"]


_FAMILY_FIXES = {"ddp": _ddp, "fsdp": _fsdp, "pipeline": _pipeline, "expert": _expert}


def comm_what(view: JobView, op: str) -> str:
    """'exposed all-gather 9% + reduce-scatter 8%' where the window has several collectives; else
    'exposed all-reduce 25%'."""
    split = [s for s in exposed_split(view) if round(s.share, 2) > 0]
    if len(split) < 2:
        return f"exposed {op} is {units.pct(view.metrics.comm_exposed_frac)}"
    parts = " + ".join(f"{s.op.replace('_', '-')} {units.pct(s.share)}" for s in split[:3])
    return f"exposed communication is {units.pct(view.metrics.comm_exposed_frac)} ({parts})"


# -- loader ------------------------------------------------------------------------------------
def loader_fixes(view: JobView, preprocessing: bool) -> list[str]:
    """Loader fixes that fit the loader: no ``persistent_workers`` without workers, no ``pin_memory``
    without a GPU."""
    w = view.metrics.loader_workers
    gpu = view.device_type == "cuda"
    if preprocessing:
        fixes = ([f"raise num_workers from {w} (up to the free cores)"] if w else
                 ["use DataLoader(num_workers=N): loading runs in the training process now"])
        fixes += ["move per-sample transforms to the device or batch them",
                  "preprocess offline (cache decoded/tokenized data)"]
        if w != 0:
            fixes.append("persistent_workers=True so workers are not re-forked every epoch")
        return fixes
    fixes = [f"raise num_workers from {w} and prefetch_factor to hide read latency" if w is not None
             else "raise num_workers and prefetch_factor to hide read latency"]
    if gpu:
        fixes.append("pin_memory=True and non_blocking copies")
    if w != 0:
        fixes.append("persistent_workers=True")
    fixes.append("faster or local storage; cache the dataset in RAM or on local SSD")
    return fixes
