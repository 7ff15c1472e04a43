"""``PerfmonCallback`` for PyTorch Lightning: ``Trainer(callbacks=[PerfmonCallback()])``.

Steps are Lightning's optimizer steps (``trainer.global_step``, gradient accumulation included);
data wait is the time spent fetching the steps' batches (``probe.integrations.steps``): logging,
validation and checkpoints are time between steps; perfmon's numbers go to
``pl_module.log`` as ``perfmon/...`` every step, so they reach whatever logger the trainer has.
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:           # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]

from probe.integrations.steps import TrainerSteps, batch_size


class PerfmonCallback(pl.Callback):
    def __init__(self, job: str | None = None, log: bool = True) -> None:
        super().__init__()
        self.steps = TrainerSteps(job)
        self.log = log

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.steps.attach(pl_module, list(trainer.optimizers), trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.steps.detach()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.steps.batch_start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps.batch_end(trainer.global_step, batch_size(batch))
        metrics = self.steps.metrics() if self.log else {}
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=batch_size(batch) or 1)
