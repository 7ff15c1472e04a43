"""``PerfmonCallback`` for the Hugging Face ``Trainer``.

    trainer = Trainer(...)
    probe.integrations.hf.attach(trainer)      # or Trainer(callbacks=[PerfmonCallback()])

Steps are the trainer's optimizer steps (``state.global_step``, gradient accumulation included),
tokens come from ``state.num_input_tokens_seen`` when the trainer counts them, data wait is the
time spent fetching the steps' batches (``probe.integrations.steps``): logging, evaluation and
checkpoints are time between steps, and perfmon's numbers are added to every ``on_log``
as ``perfmon/...`` (in ``state.log_history`` too). Callbacks run in order and the reporting ones
(W&B, TensorBoard, MLflow) come first in a ``Trainer``, so ``attach`` puts this one before them.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from probe.integrations.steps import TrainerSteps


class PerfmonCallback(TrainerCallback):
    def __init__(self, job: str | None = None) -> None:
        self.steps = TrainerSteps(job)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self.steps.attach(model, optimizer, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.detach()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.batch_start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.steps.batch_end(state.global_step, samples, getattr(state, "num_input_tokens_seen", None) or None)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        metrics = self.steps.metrics()
        if not metrics or logs is None or "loss" not in logs:      # training logs only
            return
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)


def attach(trainer: Any, job: str | None = None) -> PerfmonCallback:
    """Add a ``PerfmonCallback`` to ``trainer`` ahead of its reporting callbacks."""
    callback = PerfmonCallback(job)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
