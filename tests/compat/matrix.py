"""The compatibility matrix: which training stacks perfmon has been run on, and what it sees there.

One row per cell of ``tests/compat/job.py``. ``test_matrix.py`` runs each CPU cell
bare, with the API (``--api``) and under ``perfmon run``, and asserts exactly what a
row claims; ``scripts/compat_doc.py`` renders ``docs/compatibility.md`` from these
rows, and a test keeps the two equal. GPU rows run only where a GPU is (``-m gpu``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL = frozenset({"forward", "backward", "optimizer"})


@dataclass(frozen=True)
class Cell:
    name: str
    stack: str                              # what the cell trains with, for the table
    launcher: str = "python"                # python | torchrun | accelerate
    ranks: int = 1
    comm: bool = False                      # collectives are measured (count, bytes, seconds, exposed)
    api_phases: frozenset[str] = ALL        # phases timed with probe.start() + watch()
    run_phases: frozenset[str] = ALL        # phases timed under perfmon run
    gpu: bool = False                       # needs CUDA: runs only with a GPU (pytest -m gpu)
    notes: str = ""
    min_gpus: int = 1
    extra: tuple[str, ...] = field(default_factory=tuple)   # pip packages the cell needs


CELLS: tuple[Cell, ...] = (
    Cell("compile_model", "`torch.compile(model)` (default mode), watched before compiling",
         api_phases=frozenset({"optimizer"}),
         notes="API: forward/backward run inside the compiled region and are reported as not visible "
               "(pass the compiled module to `watch()` to time them); `perfmon run` hooks the compiled "
               "wrapper and times them"),
    Cell("compile_step", "`torch.compile` of the whole train step (forward, backward, optimizer step)",
         api_phases=frozenset(), run_phases=frozenset({"backward"}),
         notes="steps from `mon.step()`; under `perfmon run` from parameter version counters, since the "
               "optimizer's hooks are compiled away; hidden phases are reported as not visible"),
    Cell("compile_optimizer", "`torch.compile` of `optimizer.step()` (tensor LR)",
         api_phases=frozenset({"forward", "backward"}), run_phases=frozenset({"forward", "backward"}),
         notes="the optimizer phase is inside the compiled region: reported as not visible"),
    Cell("activation_checkpointing", "`torch.utils.checkpoint` (non-reentrant) around each block"),
    Cell("autocast_bf16", "`torch.autocast('cpu', dtype=torch.bfloat16)` forward"),
    Cell("ddp_no_sync_accum", "DDP, 4 micro-batches per step with `no_sync()`", launcher="torchrun", ranks=2,
         comm=True),
    Cell("compile_ddp", "`torch.compile(DDP(model))` (dynamo's DDPOptimizer)", launcher="torchrun", ranks=2,
         comm=True,
         notes="dynamo compiles the module inside DDP, so the hooks on DDP itself run and time every phase; "
               "the gradient all-reduce is timed by perfmon's comm hook on the DDP inside the compiled wrapper"),
    Cell("fsdp2_mixed_precision", "FSDP2 `fully_shard` per block + root, bf16 params / fp32 reduce",
         launcher="torchrun", ranks=2, comm=True,
         notes="all-gather and reduce-scatter counted with their bytes (`all_gather_single`, "
               "`reduce_scatter_single`)"),
    Cell("dtensor_tp", "DTensor tensor parallel: `ColwiseParallel` + `RowwiseParallel` Linear pair",
         launcher="torchrun", ranks=2, comm=True,
         notes="functional collectives timed from launch to their `wait_tensor`"),
    Cell("accelerate", "Hugging Face Accelerate (`accelerate launch`, 2 processes, DDP over gloo)",
         launcher="accelerate", ranks=2, comm=True, extra=("accelerate",)),
    Cell("hf_trainer", "Hugging Face `Trainer` (tiny GPT-2 from a config, gradient accumulation 2)",
         extra=("transformers",)),
    Cell("lightning_trainer", "Lightning `Trainer` (CPU, 1 device)", extra=("lightning",),
         api_phases=frozenset({"optimizer"}),
         notes="API: `training_step` never calls the LightningModule's own forward, so `watch(module)` sees "
               "no forward (reported as not visible; watch the inner network instead); `perfmon run` finds "
               "the module that runs"),
    Cell("cuda_graphs", "`torch.compile(mode='reduce-overhead')` (CUDA graphs)", gpu=True,
         api_phases=frozenset({"optimizer"}),
         notes="needs a GPU; passed on one H200 (torch 2.11, API and `perfmon run`, 2026-11-26)"),
    Cell("nccl_ddp", "DDP over NCCL, 2 GPUs", launcher="torchrun", ranks=2, comm=True, gpu=True, min_gpus=2,
         notes="needs 2 GPUs; not run yet"),
)

BY_NAME = {cell.name: cell for cell in CELLS}


def _phases(phases: frozenset[str]) -> str:
    return ", ".join(p for p in ("forward", "backward", "optimizer") if p in phases) or "—"


def render() -> str:
    """``docs/compatibility.md``, from the rows above."""
    lines = [
        "# Compatibility matrix",
        "",
        "Generated by `python scripts/compat_doc.py` from `tests/compat/matrix.py`; "
        "`tests/compat/test_matrix.py` runs every CPU cell in CI and asserts each row.",
        "",
        "Each cell is a real training job (`tests/compat/job.py`), run three ways: bare, with the probe API "
        "(`probe.start()` + `watch()` + `mon.step()`), and under `perfmon run` (no code change). Every CPU cell "
        "checks that the job exits 0, that its final loss is bit-identical to the bare run on every rank, "
        "that perfmon counts exactly the loop's optimizer steps, that communication is measured where the "
        "job communicates, and that the phases listed below are timed while the others are reported as "
        "not visible (their time stays in the step, as `other`). Step time, data wait and memory are "
        "measured in every cell.",
        "",
        "| cell | stack | ranks | comm measured | phases timed (API) | phases timed (`perfmon run`) | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in CELLS:
        where = " (GPU only)" if c.gpu else ""
        lines.append(f"| `{c.name}`{where} | {c.stack} | {c.ranks} | {'yes' if c.comm else 'no comm'} | "
                     f"{_phases(c.api_phases)} | {_phases(c.run_phases)} | {c.notes} |")
    lines += [
        "",
        "GPU cells are marked `gpu` in the tests and run with `python -m pytest -m gpu` on a machine with "
        "CUDA; the CUDA graphs cell has run on one H200 (README, \"GPU: what is verified\"), the NCCL cell "
        "has not.",
        "",
        "## What a compiled region hides, and why",
        "",
        "Inside a `torch.compile` region no Python hook runs: dynamo either inlines a hook into the graph "
        "or, for perfmon's, drops it (every perfmon hook starts with `torch.compiler.is_compiling()`, so "
        "the graph is the one the user gets without perfmon: no graph break, no recompilation, no guard "
        "on perfmon's state). perfmon still measures from outside the region: step boundaries, data wait, "
        "communication (collectives are patched outside the graph), memory, and the phases whose hooks "
        "run eagerly. A phase no hook sees for 3 steps in a row is announced once as a `warning` event "
        "(`phases not visible: …`) and in the `compute` sample's `hidden_phases`.",
        "",
    ]
    return "\n".join(lines)
