"""``PerfmonCallback`` for PyTorch Lightning: ``Trainer(callbacks=[PerfmonCallback()])``.

Steps are Lightning's optimizer steps (``trainer.global_step``, gradient accumulation included);
validation time is a pause between steps, not data wait; perfmon's numbers go to
``pl_module.log`` as ``perfmon/...`` every step, so they reach whatever logger the trainer has.
"""

from __future__ import annotations

import time
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
        self._validation: float | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.steps.attach(pl_module, list(trainer.optimizers), trainer.global_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.steps.batch_start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps.batch_end(trainer.global_step, batch_size(batch))
        metrics = self.steps.metrics() if self.log else {}
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=batch_size(batch) or 1)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._validation = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._validation is not None:
            self.steps.pause(time.perf_counter() - self._validation)
            self._validation = None
