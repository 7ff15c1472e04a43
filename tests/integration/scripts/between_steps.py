"""A plain PyTorch CPU training loop that knows nothing of perfmon, doing extra work between its steps.

No DataLoader: each iteration builds its batch itself, so under ``perfmon run`` a step runs from the
forward to the end of ``optimizer.step()`` and the rest of the iteration is time between steps.

``--mode lock``: after ``opt.step()`` the loop appends its metrics under a lock that a metrics-flusher
thread holds while it writes them out (a sleep stands for the write): the loop waits for it.
``--mode tokenize``: before the forward, the loop tokenizes its text in pure Python (busy).
``--mode log``: after the step, a logging call whose formatting is quick and whose flush sleeps (a
planted ~20% of the iteration).
``--mode gil``: inside the steps, a background thread named ``metrics-encoder`` encodes metrics in
pure Python forever: the training thread waits for the GIL after every op that released it.
``--mode pauses``: nothing each step; a checkpoint every ``--checkpoint-every`` steps and an
evaluation pass (forwards without grad over a held-out set) every ``--eval-every`` steps.

The last stdout line is JSON by the script's own clock over the last ``WINDOW`` iterations (an
iteration: from one iteration's forward to the next's, as a step's start to the next's): ``share``,
the extra work's share of the iterations; ``iter_median_s``; with ``--mode pauses`` ``ettr``, the share
of the whole run (the first step's start, warm-up included, to the last's end) not spent in checkpoints
and evaluation.
"""

import argparse
import json
import statistics
import threading
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["lock", "tokenize", "log", "gil", "pauses"], required=True)
parser.add_argument("--steps", type=int, default=0, help="iterations (default: 60)")
parser.add_argument("--min-seconds", type=float, default=4.0,
                    help="iterate for at least this long: the stack sampler's 19 looks a second need it")
parser.add_argument("--checkpoint-every", type=int, default=0)
parser.add_argument("--checkpoint-s", type=float, default=0.0)
parser.add_argument("--eval-every", type=int, default=0)
parser.add_argument("--eval-batches", type=int, default=0)
args = parser.parse_args()

WINDOW = 50
args.steps = args.steps or 60
torch.set_num_threads(1)
torch.manual_seed(0)
# gil: many small layers, each op of which gives the GIL up and waits to take it back from the encoder
width, depth = {"gil": (32, 12), "pauses": (128, 2), "log": (1024, 2)}.get(args.mode, (512, 2))
model = nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(width, width), nn.ReLU())],
                      nn.Linear(width, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x, y = torch.randn(256, width), torch.randn(256, 1)
TEXT = " ".join(f"word{i % 977} token{i % 131}" for i in range(400)).split()
lock = threading.Lock()
metrics: list[float] = []
stop = threading.Event()


def flush_forever() -> None:
    """The metrics flusher: holds the lock while it writes the metrics out (the sleep), then lets go."""
    while not stop.is_set():
        with lock:
            metrics.clear()
            time.sleep(0.02)
        time.sleep(0.001)


def encode_forever() -> None:
    """A metrics encoder in pure Python: holds the GIL whenever it runs."""
    out = []
    while not stop.is_set():
        out.append(",".join(f"{k}={v:.3f}" for k, v in zip("abcdefgh", range(8))))
        if len(out) > 1000:
            out.clear()


def tokenize(budget: float) -> list[int]:
    vocab: dict[str, int] = {}
    ids: list[int] = []
    deadline = time.perf_counter() + budget
    while time.perf_counter() < deadline:
        ids = [vocab.setdefault(w, len(vocab)) for w in TEXT]
    return ids


def log_metrics(loss: torch.Tensor, seconds: float) -> None:
    line = f"loss={loss.item():.4f}"
    time.sleep(seconds)                 # the log handler's flush to a slow disk
    del line


def evaluate() -> None:
    model.eval()
    with torch.no_grad():
        for _ in range(args.eval_batches):
            model(x)
    model.train()


def step() -> torch.Tensor:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


first = time.perf_counter()             # the first step: where perfmon's wall time starts
for _ in range(3):                      # warm up, then the step's own time: the extra work's budget
    step()
timed = []
for _ in range(5):
    t0 = time.perf_counter()
    step()
    timed.append(time.perf_counter() - t0)
compute = statistics.median(timed)

threads = {"lock": flush_forever, "gil": encode_forever}
if args.mode in threads:
    threading.Thread(target=threads[args.mode], name="metrics-encoder" if args.mode == "gil" else "metrics-flusher",
                     daemon=True).start()
starts, extras = [], []
paused = 0.0
began = time.perf_counter()
i = -1
while (i := i + 1) < args.steps or (args.mode != "pauses" and time.perf_counter() - began < args.min_seconds):
    starts.append(time.perf_counter())
    extra = 0.0
    if args.mode == "tokenize":
        t0 = time.perf_counter()
        # the batch's text, ~1/3 of the iteration and longer than the GIL's switch interval (5 ms), which a
        # stack sample of busy Python waits for: shorter work lands its samples on the next call releasing it
        ids = tokenize(max(0.5 * compute, 0.03))
        extra = time.perf_counter() - t0
    loss = step()
    if args.mode == "lock":
        t0 = time.perf_counter()
        with lock:                      # waits while the flusher writes
            metrics.append(float(loss))
        extra = time.perf_counter() - t0
    elif args.mode == "log":
        t0 = time.perf_counter()
        log_metrics(loss, 0.2 * compute)    # ~20% of the iteration
        extra = time.perf_counter() - t0
    elif args.mode == "pauses":
        t0 = time.perf_counter()
        if args.checkpoint_every and i % args.checkpoint_every == args.checkpoint_every - 1:
            torch.save(model.state_dict(), "/dev/null")
            time.sleep(args.checkpoint_s)
        if args.eval_every and i % args.eval_every == args.eval_every - 1:
            evaluate()
        paused += time.perf_counter() - t0
    extras.append(extra)
end = time.perf_counter()
stop.set()
spans = [b - a for a, b in zip(starts, starts[1:] + [end])]
own = {"mode": args.mode, "share": sum(extras[-WINDOW:]) / sum(spans[-WINDOW:]),
       "iter_median_s": statistics.median(spans), "ettr": 1 - paused / (end - first)}
print(json.dumps(own), flush=True)
