"""The demo's pipeline-parallel job (scenario ``slow_stage``): the small GPT cut into one stage per rank
with ``torch.distributed.pipelining`` and trained with the 1F1B schedule over gloo.

The last stage holds ``heavy_stage_factor`` times the blocks of the others, as a partition that
counted layers but forgot that the last stage also holds the output layer would: every other stage
waits for it in its bubble on every step. The probe learns the layout from the stages themselves and
times each micro-batch's forward and backward and every send and receive (docs/layout.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tui.commands.demo.scenarios import ModelSize, Scenario


class FirstStage(nn.Module):
    """Token and position embeddings, then ``blocks``."""

    def __init__(self, size: ModelSize, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.tok = nn.Embedding(size.vocab, size.d_model)
        self.pos = nn.Embedding(size.max_seq, size.d_model)
        self.blocks = blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return x


class MiddleStage(nn.Module):
    def __init__(self, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class LastStage(MiddleStage):
    """``blocks``, the final norm and the output layer."""

    def __init__(self, size: ModelSize, blocks: nn.ModuleList) -> None:
        super().__init__(blocks)
        self.ln = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(super().forward(x)))


def stage_module(sc: Scenario, rank: int, world: int, block: Any) -> nn.Module:
    """This rank's part of the model: ``sc.model.layers`` blocks, the last stage ``heavy_stage_factor`` times
    as many."""
    count = sc.model.layers * (sc.heavy_stage_factor if rank == world - 1 else 1)
    blocks = nn.ModuleList(block(sc.model.d_model, sc.model.heads) for _ in range(count))
    if rank == 0:
        return FirstStage(sc.model, blocks)
    return LastStage(sc.model, blocks) if rank == world - 1 else MiddleStage(blocks)


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


class Pipeline:
    """One rank's stage and its schedule; ``step(batch)`` trains one optimizer step of ``sc.accumulate``
    micro-batches (at least the number of stages, so the pipeline fills)."""

    def __init__(self, sc: Scenario, rank: int, world: int, device: torch.device, block: Any) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        self.rank, self.world = rank, world
        self.module = stage_module(sc, rank, world, block).to(device)
        self.stage = PipelineStage(self.module, rank, world, device)
        self.schedule = Schedule1F1B(self.stage, n_microbatches=max(sc.accumulate, world), loss_fn=token_loss)

    def step(self, batch: torch.Tensor) -> None:
        x, y = batch[:, :-1], batch[:, 1:]
        if self.rank == 0:
            self.schedule.step(x)
        elif self.rank == self.world - 1:
            self.schedule.step(target=y)
        else:
            self.schedule.step()
