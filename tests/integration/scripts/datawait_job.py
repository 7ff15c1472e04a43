"""One small training job, the same under every way perfmon measures a job, with a known data wait
and a known pause for logging between steps.

    python datawait_job.py api|bare|lightning|hf STEPS

Every batch takes ``FETCH_S`` to load (its items' ``__getitem__`` sleep, on the training thread:
``num_workers=0``), a step is two micro-batches (gradient accumulation 2), and after each optimizer
step the job "logs" for ``LOG_S``. ``api``: a plain loop with ``mon.loader()`` and ``mon.step()``;
``bare``: the same loop knowing nothing of perfmon (run it under ``perfmon run``); ``lightning`` and
``hf``: the trainers with perfmon's callback, the logging a callback of the job's own that runs
after perfmon's (``hf bare``: the Hugging Face trainer without it, for ``perfmon run``).
"""

import contextlib
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 4
ACCUM = 2
ITEM_S = 0.01
FETCH_S = BATCH * ITEM_S      # one batch's load
LOG_S = 0.06                  # the logging after each optimizer step


class Slow(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> dict:
        time.sleep(ITEM_S)
        return {"x": torch.full((16,), float(i % 7)), "y": torch.ones(1)}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}


def log() -> None:
    time.sleep(LOG_S)


def loop(steps: int, api: bool) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Slow(), batch_size=BATCH)
    mon = None
    if api:
        import probe
        mon = probe.start(job="datawait-api")
    batches = mon.loader(loader) if mon is not None else iter(loader)
    for _ in range(steps):
        with mon.step(samples=BATCH * ACCUM) if mon is not None else contextlib.nullcontext():
            for _ in range(ACCUM):
                model(**next(batches))["loss"].backward()
            opt.step()
            opt.zero_grad()
        log()
    if mon is not None:
        mon.close()


def lightning(steps: int) -> None:
    import lightning as L

    from probe.integrations.lightning import PerfmonCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Net()

        def training_step(self, batch, batch_idx):
            return self.model(**batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Logging(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if (batch_idx + 1) % ACCUM == 0:      # after the optimizer step, as in the other modes
                log()

    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=ACCUM,
                        num_sanity_val_steps=0, callbacks=[PerfmonCallback(job="datawait-lightning"), Logging()])
    trainer.fit(Module(), DataLoader(Slow(), batch_size=BATCH))
    assert trainer.global_step == steps


def hf(steps: int, callback: bool) -> None:
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Logging(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs) -> None:
            log()

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH,
                                 gradient_accumulation_steps=ACCUM, report_to=[], save_strategy="no",
                                 logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
        trainer = Trainer(model=Net(), args=args, train_dataset=Slow(), callbacks=[Logging()])
        if callback:
            from probe.integrations.hf import attach
            attach(trainer, job="datawait-hf")
        trainer.train()
    assert trainer.state.global_step == steps


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, steps = sys.argv[1], int(sys.argv[2])
    if mode in ("api", "bare"):
        loop(steps, api=mode == "api")
    elif mode == "lightning":
        lightning(steps)
    else:
        hf(steps, callback=sys.argv[3:] != ["bare"])
