"""Real Lightning and Hugging Face trainers with a slow (CPU-bound) collate, for the framework
callbacks.

    python trainers.py lightning|hf callback|bare OUT.json [STEPS]
``callback``: with perfmon's callback for that framework; ``bare``: without (run it under
``perfmon run`` for zero-code mode). Writes the trainer's global step and the metric keys the
trainer logged, with the values of the ``perfmon/`` ones.
"""

import json
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

COLLATE_S = 0.025


def slow_collate(items):
    end = time.thread_time() + COLLATE_S         # CPU work on the training thread (num_workers=0)
    while time.thread_time() < end:
        pass
    return torch.utils.data.default_collate(items)


def lightning(callback: bool, steps: int) -> dict:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    callbacks = []
    if callback:
        from probe.integrations.lightning import PerfmonCallback
        callbacks.append(PerfmonCallback(job="lightning-job"))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
                        callbacks=callbacks)
    trainer.fit(Module(), DataLoader(data, batch_size=16, collate_fn=slow_collate))
    logged = {k: float(v) for k, v in trainer.logged_metrics.items()}
    return {"global_step": trainer.global_step, "logged": logged}


def hf(callback: bool, steps: int) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(Dataset):
        def __len__(self) -> int:
            return 100_000

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(0, 128, (16,))
            return {"input_ids": ids, "labels": ids}

    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8,
                                 gradient_accumulation_steps=2, report_to=[], save_strategy="no", logging_steps=10,
                                 use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                                 include_num_input_tokens_seen=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(), data_collator=slow_collate)
        if callback:
            from probe.integrations.hf import attach
            attach(trainer, job="hf-job")
        trainer.train()
    logged: dict = {}
    for entry in trainer.state.log_history:
        logged.update({k: v for k, v in entry.items() if isinstance(v, (int, float))})
    return {"global_step": trainer.state.global_step, "logged": logged}


if __name__ == "__main__":
    framework, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 150
    result = (lightning if framework == "lightning" else hf)(mode == "callback", steps)
    with open(out, "w") as f:
        json.dump(result, f)
